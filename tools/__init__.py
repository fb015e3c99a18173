"""Developer tools, not part of the kafka_ledger package: the demo, the benchmark, the fault campaign.

Each runs from the project root with the project's Python, e.g. `python -m tools.demo` (see README.md's Layout).
"""
