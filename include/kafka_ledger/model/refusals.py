"""Refusals: errors no retry can change (a declaration, a request, a topic's identity), told apart from faults.

A task fails at once on a refusal, without its retries, saying why in one sentence; every other error (a service
away, a timeout, a killed process) is retried as before. A refusal writes nothing: it is raised before anything is
recorded, or inside the transaction it rolls back.
"""

from __future__ import annotations

# The exit code of a process that refused its work (the submit runtime's Spark job, the CLI).
EXIT_REFUSED = 3


class Refusal(Exception):  # noqa: N818 - a refusal is what it is, not an `...Error`
    """The work cannot be done as asked, and asking again cannot change that."""
