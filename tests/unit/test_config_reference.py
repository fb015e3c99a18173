"""What the settings' declarations generate (docs/configuration.md's tables, scripts/env.sh's and
docker-compose.yaml's kafka-ledger settings) is committed up to date, and says what the models say."""

from __future__ import annotations

import re
import shutil

import pytest
import yaml

from kafka_ledger.config import reference as config_reference
from kafka_ledger.config.pipeline import AssignedPartition, ColumnSpec, PipelineConfig
from kafka_ledger.config.settings import PROJECT_ROOT, Settings, env_name


def test_every_generated_file_holds_the_current_generation():
    assert config_reference.main(["--check"]) == 0, (
        "a generated block is out of date with the code: run `python -m kafka_ledger.config.reference` "
        "(with include/ on PYTHONPATH) and commit the files it rewrites")


@pytest.mark.parametrize("relative", list(config_reference.GENERATED))
def test_every_generated_block_is_in_its_file_once(relative):
    text = (PROJECT_ROOT / relative).read_text()
    found = [match["name"] for match in config_reference.BLOCK.finditer(text)]
    assert sorted(found) == sorted(config_reference.GENERATED[relative])


@pytest.mark.parametrize("model", [PipelineConfig, ColumnSpec, AssignedPartition, Settings], ids=lambda m: m.__name__)
def test_every_field_is_described(model):
    assert [name for name, field in model.model_fields.items() if not field.description] == []


def test_defaults_are_shown_as_written_in_the_pipelines_file():
    table = config_reference.fields_table(PipelineConfig, leave_out=("name",))
    assert "| `max_records_per_partition` | 100000 |" in table
    assert "| `delivery_mode` | `exactly_once` |" in table
    assert "| `output_table` | none |" in table and "| `sink` | `postgres` |" in table
    assert "| `spark_conf` | `{}` |" in table
    assert not any(line.startswith("| `name` |") for line in table.splitlines())  # the entry's key


def test_every_deployment_setting_is_in_one_generated_table_with_the_stacks_values():
    blocks = config_reference.GENERATED["docs/configuration.md"]
    deployment, timeouts = blocks["deployment settings"](), blocks["ledger timeouts"]()
    for name in Settings.model_fields:
        row = f"| `{env_name(name)}` |"
        assert (row in deployment) != (row in timeouts), name
    assert config_reference.TIMEOUTS == ["db_statement_timeout", "db_lock_timeout"]
    assert "| `KAFKA_LEDGER_SPARK_RUNTIME` | `submit` | `connect` | unset |" in deployment
    assert "| `KAFKA_LEDGER_DB_URL` | the Airflow connection `kafka_ledger_db` | `postgresql://" in deployment
    assert ("| `KAFKA_LEDGER_PIPELINES` | `config/pipelines.yaml` | `$KL_HOME/config/pipelines.yaml` | "
            "`/opt/kafka-ledger/config/pipelines.yaml` |") in deployment
    assert "| `KAFKA_LEDGER_DB_LOCK_TIMEOUT` | 600 |" in timeouts


def test_env_sh_sets_each_local_stack_value_as_a_default_and_exports_it():
    text = (PROJECT_ROOT / "scripts" / "env.sh").read_text()
    for name in Settings.model_fields:
        value = config_reference.stack_value(name, "local_stack")
        variable = env_name(name)
        if value is None:
            assert not re.search(rf"\b{variable}=", text), f"env.sh sets {variable}, which the model does not"
            continue
        assert f"\n{variable}=${{{variable}:-{value}}}\n" in text
        assert re.search(rf"^export .*\b{variable}\b", text, re.MULTILINE), f"env.sh does not export {variable}"


def test_compose_sets_each_compose_value_in_every_airflow_service():
    compose = yaml.safe_load((PROJECT_ROOT / "docker-compose.yaml").read_text())
    environment = compose["x-airflow-common"]["environment"]
    expected = {env_name(name): value for name in Settings.model_fields
                if (value := config_reference.stack_value(name, "compose"))}
    assert {key: value for key, value in environment.items() if key.startswith("KAFKA_LEDGER_")} == expected


def test_yaml_scalars_are_quoted_only_when_plain_ones_would_change():
    assert config_reference.yaml_scalar("kafka:9092") == "kafka:9092"
    assert config_reference.yaml_scalar("local[*]") == "local[*]"
    assert config_reference.yaml_scalar("[a]") == '"[a]"'
    assert config_reference.yaml_scalar("yes") == '"yes"'


def test_an_unknown_block_is_an_error_and_the_check_mode_reports_a_stale_file(tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown generated block 'nothing'"):
        config_reference.render("<!-- generated: nothing -->\n<!-- end generated -->", {})
    for relative in config_reference.GENERATED:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(PROJECT_ROOT / relative, tmp_path / relative)
    env_sh = tmp_path / "scripts" / "env.sh"
    text = env_sh.read_text()
    env_sh.write_text(re.sub(r"(# generated: kafka-ledger settings\n).*?(# end generated)", r"\1stale\n\2", text,
                             flags=re.DOTALL))
    assert config_reference.main(["--check", "--root", str(tmp_path)]) == 1
    assert "out of date: scripts/env.sh" in capsys.readouterr().err
    assert config_reference.main(["--root", str(tmp_path)]) == 0
    assert env_sh.read_text() == text
    assert config_reference.main(["--check", "--root", str(tmp_path)]) == 0
