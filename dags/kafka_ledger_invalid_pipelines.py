"""Reports the pipelines file's invalid entries as this Airflow DAG file's import error (it defines no DAG).

An import error is per file: raising it here, and not in kafka_ledger_pipelines.py, keeps every valid
pipeline's DAG while the UI's "DAG Import Errors" names each invalid pipeline and field.
"""

from kafka_ledger.config.pipeline import ConfigError, read_pipelines

try:
    _declarations = read_pipelines()
except ConfigError:
    # A file that cannot be read at all is kafka_ledger_pipelines.py's import error already.
    _declarations = None
if _declarations and _declarations.invalid:
    raise ConfigError(
        f"{len(_declarations.invalid)} pipeline(s) left out, their DAGs missing until fixed: "
        + ", ".join(_declarations.invalid) + "\n"
        + "\n".join(str(_declarations.problem(name)) for name in _declarations.invalid)
    )
