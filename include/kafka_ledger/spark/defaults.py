"""Spark's own settings file (spark-defaults.conf), as spark-submit and the Spark Connect server find it."""

from __future__ import annotations

import os
from pathlib import Path

from jproperties import Properties

# Every Spark process reads it (spark-submit, the Spark Connect server), and so does kafka-ledger: to reach the
# lake's catalogs without Spark, and to know what a submission carries to a driver in the cluster.
SPARK_DEFAULTS = "spark-defaults.conf"


def spark_conf_dir() -> Path | None:
    """Spark's configuration folder, as spark-submit finds it: $SPARK_CONF_DIR, else $SPARK_HOME/conf (None: neither
    is set)."""
    if os.environ.get("SPARK_CONF_DIR"):
        return Path(os.environ["SPARK_CONF_DIR"])
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"]) / "conf"
    return None


def spark_defaults(path: Path) -> dict[str, str]:
    """The settings of the spark-defaults.conf at `path` (Java properties); FileNotFoundError when there is none."""
    properties = Properties()
    with path.open("rb") as handle:
        properties.load(handle, "utf-8")
    return {key: properties[key].data for key in properties}
