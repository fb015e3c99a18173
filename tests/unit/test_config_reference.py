"""docs/configuration.md's reference tables are generated from the code's declarations and must be up to date."""

from __future__ import annotations

import pytest

from kafka_ledger import config_reference
from kafka_ledger.config import AssignedPartition, ColumnSpec, PipelineConfig
from kafka_ledger.settings import Settings, env_name


def test_the_configuration_page_holds_the_current_generation():
    text = config_reference.CONFIGURATION_PAGE.read_text()
    assert config_reference.render(text) == text, (
        "docs/configuration.md is out of date with the code: run `python -m kafka_ledger.config_reference` "
        "(with include/ on PYTHONPATH) and commit the page")


def test_every_generated_block_is_on_the_page():
    text = config_reference.CONFIGURATION_PAGE.read_text()
    found = [match["name"] for match in config_reference.BLOCK.finditer(text)]
    assert sorted(found) == sorted(config_reference.GENERATED)


@pytest.mark.parametrize("model", [PipelineConfig, ColumnSpec, AssignedPartition], ids=lambda m: m.__name__)
def test_every_field_is_described(model):
    assert [name for name, field in model.model_fields.items() if not field.description] == []


def test_defaults_are_shown_as_written_in_the_pipelines_file():
    table = config_reference.fields_table(PipelineConfig, leave_out=("name",))
    assert "| `max_records_per_partition` | 100000 |" in table
    assert "| `delivery_mode` | `exactly_once` |" in table
    assert "| `output_table` | required |" in table
    assert "| `spark_conf` | `{}` |" in table
    assert not any(line.startswith("| `name` |") for line in table.splitlines())  # the entry's key


def test_an_unknown_block_is_an_error_and_the_check_mode_reports_a_stale_page(tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown generated block 'nothing'"):
        config_reference.render("<!-- generated: nothing -->\n<!-- end generated -->")
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- generated: column fields -->\nstale\n<!-- end generated -->\nafter\n")
    assert config_reference.main(["--check", str(page)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert config_reference.main([str(page)]) == 0
    assert config_reference.main(["--check", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("before\n") and text.endswith("<!-- end generated -->\nafter\n") and "stale" not in text


def test_every_deployment_setting_is_in_one_generated_table_with_the_local_stacks_value():
    deployment = config_reference.GENERATED["deployment settings"]()
    timeouts = config_reference.GENERATED["ledger timeouts"]()
    for name in Settings.model_fields:
        row = f"| `{env_name(name)}` |"
        assert (row in deployment) != (row in timeouts), name
    assert config_reference.TIMEOUTS == ["db_statement_timeout", "db_lock_timeout"]
    assert "| `KAFKA_LEDGER_SPARK_RUNTIME` | `submit` | `connect` |" in deployment
    assert "| `KAFKA_LEDGER_DB_URL` | the Airflow connection `kafka_ledger_db` | `postgresql://" in deployment
    assert "| `KAFKA_LEDGER_PIPELINES` | `config/pipelines.yaml` | `$KL_HOME/config/pipelines.yaml` |" in deployment
    assert "| `KAFKA_LEDGER_DB_LOCK_TIMEOUT` | 600 |" in timeouts
