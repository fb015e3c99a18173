"""What the settings' declarations generate: docs/configuration.md's reference tables and the stacks' environment.

The pipeline fields come from config.PipelineConfig and ColumnSpec; the deployment settings from
settings.Settings, whose fields also say what the local stack (scripts/env.sh) and Docker Compose
(docker-compose.yaml) set each variable to. Each generated block sits between `generated: NAME` and
`end generated` comments (`<!-- ... -->` in Markdown, `# ...` in shell and YAML); everything else in those
files is written by hand. After changing a declaration (a field, its default, description or stack values):

    python -m kafka_ledger.config.reference           # rewrite the generated blocks
    python -m kafka_ledger.config.reference --check   # exit 1 if a file is out of date (a unit test does this)

scripts/env.sh is sourced before Python packages are installed: its block is committed, never made at run time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from kafka_ledger.config.pipeline import (
    ColumnSpec,
    DebeziumSettings,
    DoorbellSpec,
    IcebergSinkSpec,
    LakeMaintenanceSpec,
    PipelineConfig,
    ValueSpec,
)
from kafka_ledger.config.settings import PROJECT_ROOT, Settings, env_name
from kafka_ledger.formats.avro import AVRO_READS
from kafka_ledger.formats.protobuf import PROTOBUF_READS
from kafka_ledger.model.kinds import DECLARABLE, DecimalKind

BLOCK = re.compile(
    r"(?P<open>(?:<!--|#) generated: (?P<name>[^\n]+?)(?: -->)?\n)(?P<body>.*?)"
    r"(?P<close>[ \t]*(?:<!--|#) end generated(?: -->)?)",
    re.DOTALL,
)


def default_text(field: FieldInfo) -> str:
    """A field's default as the reference shows it: `required` when it has none, or what the field's
    `reference_default` (in its json_schema_extra) says when the model decides it."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if "reference_default" in extra:
        return str(extra["reference_default"])
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "none"
    if value == "":
        return "empty"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return f"`{value}`"
    if isinstance(value, BaseModel):  # one of a union of kinds (a sink) is named by its type, else its fields' defaults
        return f"`{value.type}`" if hasattr(value, "type") else "each field's default"
    return f"`{json.dumps(value)}`"


def cell(text: str | None) -> str:
    """Text for one cell of a Markdown table: a `|` would end the cell."""
    return " ".join((text or "").split()).replace("|", "\\|")


def fields_table(model: type[BaseModel], leave_out: tuple[str, ...] = ()) -> str:
    """One row per field of `model`, in declaration order: its name, default and description."""
    rows = ["| field | default | meaning |", "| --- | --- | --- |"]
    for name, field in model.model_fields.items():
        if name not in leave_out:
            rows.append(f"| `{field.alias or name}` | {default_text(field)} | {cell(field.description)} |")
    return "\n".join(rows) + "\n"


def stack_value(name: str, stack: str) -> str | None:
    """What a stack (`local_stack`: scripts/env.sh, `compose`: docker-compose.yaml) sets a setting to, if it does."""
    return (Settings.model_fields[name].json_schema_extra or {}).get(stack)  # type: ignore[union-attr, return-value]


def setting_default(field: FieldInfo) -> str:
    """What a deployment setting is when its variable is unset: its default, or where it comes from then."""
    connection = (field.json_schema_extra or {}).get("airflow_connection")  # type: ignore[union-attr]
    if connection and field.default is None:
        return f"the Airflow connection `{connection}`"
    if field.default is None:
        return "unset"
    if isinstance(field.default, Path):
        return f"`{field.default.relative_to(PROJECT_ROOT)}`"
    return default_text(field)


def column_types_table() -> str:
    """One row per kind a column may declare (model.kinds): its Postgres and Iceberg types, whether it can be an
    entity key, and what it holds."""
    rows = ["| type | Postgres | Iceberg | key | holds |", "| --- | --- | --- | --- | --- |"]
    for kind in DECLARABLE:
        name = "decimal(p,s)" if isinstance(kind, DecimalKind) else kind.declared
        postgres = "numeric(p,s)" if isinstance(kind, DecimalKind) else kind.postgres_type
        iceberg = "decimal(p, s)" if isinstance(kind, DecimalKind) else str(kind.iceberg_type())
        rows.append(f"| `{name}` | `{postgres}` | `{iceberg}` | {'yes' if kind.key_capable else 'no'} | "
                    f"{cell(kind.description)} |")
    return "\n".join(rows) + "\n"


# How a column reads an Avro type (formats.avro.AVRO_READS), in words.
_AVRO_HOW = {"same": "", "cast": " (widened)", "range": " (a value out of range is a dead letter)",
             "fit": " (a value that does not fit exactly is a dead letter, never rounded)", "json": " (its JSON text)",
             "text": " (its text read as the type)", "json text": " (its JSON text: any JSON value)",
             "epoch days": " (days since 1970-01-01)", "epoch millis": " (milliseconds since the epoch or midnight)",
             "epoch micros": " (microseconds since the epoch or midnight)",
             "variable scale": " (its scale and unscaled value)"}


def avro_types_table() -> str:
    """One row per kind: the Avro types (of the reader schema's field) a column of that kind reads."""
    rows = ["| type | reads the Avro types |", "| --- | --- |"]
    for kind in DECLARABLE:
        name = "decimal(p,s)" if isinstance(kind, DecimalKind) else kind.declared
        # Consecutive types read the same way share their words.
        groups = [(how, [avro for avro, _ in group])
                  for how, group in itertools.groupby(AVRO_READS[kind.word].items(), key=lambda item: item[1])]
        reads = ", ".join(", ".join(f"`{avro}`" for avro in names) + _AVRO_HOW[how] for how, names in groups)
        rows.append(f"| `{name}` | {reads} |")
    return "\n".join(rows) + "\n"


def protobuf_types_table() -> str:
    """One row per kind: the Protobuf field types (of the reader's message) a column of that kind reads."""
    rows = ["| type | reads the Protobuf field types |", "| --- | --- |"]
    for kind in DECLARABLE:
        name = "decimal(p,s)" if isinstance(kind, DecimalKind) else kind.declared
        rows.append(f"| `{name}` | {', '.join(f'`{field_type}`' for field_type in PROTOBUF_READS[kind.word])} |")
    return "\n".join(rows) + "\n"


def settings_table(names: list[str]) -> str:
    """One row per deployment setting: its variable, default, the stacks' values and its description."""
    rows = ["| variable | default | local stack | Docker Compose | used for |", "| --- | --- | --- | --- | --- |"]
    for name in names:
        field = Settings.model_fields[name]
        stacks = [f"`{cell(value)}`" if value else "unset" for value in
                  (stack_value(name, "local_stack"), stack_value(name, "compose"))]
        rows.append(f"| `{env_name(name)}` | {setting_default(field)} | {' | '.join(stacks)} | "
                    f"{cell(field.description)} |")
    return "\n".join(rows) + "\n"


def timeouts_table(names: list[str]) -> str:
    rows = ["| variable | default | bounds |", "| --- | --- | --- |"]
    for name in names:
        field = Settings.model_fields[name]
        rows.append(f"| `{env_name(name)}` | {default_text(field)} | {cell(field.description)} |")
    return "\n".join(rows) + "\n"


def env_sh_block() -> str:
    """scripts/env.sh's lines for the settings the local stack sets: each a default, a value already set wins."""
    names = [env_name(name) for name in Settings.model_fields if stack_value(name, "local_stack")]
    lines = [f"{env_name(name)}=${{{env_name(name)}:-{value}}}" for name in Settings.model_fields
             if (value := stack_value(name, "local_stack"))]
    return "\n".join([*lines, f"export {' '.join(names)}"]) + "\n"


def yaml_scalar(value: str) -> str:
    """`value` as a YAML scalar: plain when YAML reads it back unchanged, else double-quoted."""
    return value if yaml.safe_load(f"key: {value}") == {"key": value} else json.dumps(value)


def compose_block() -> str:
    """docker-compose.yaml's entries for the settings the containers set (x-airflow-common's environment)."""
    return "".join(f"    {env_name(name)}: {yaml_scalar(value)}\n" for name in Settings.model_fields
                   if (value := stack_value(name, "compose")))


# The ledger's timeouts have a section of their own.
TIMEOUTS = [name for name in Settings.model_fields if name.endswith("_timeout")]
# File (relative to the project) -> its generated blocks by name.
GENERATED: dict[str, dict[str, Callable[[], str]]] = {
    "docs/configuration.md": {
        # A pipeline's name is its entry's key in the file, not a field written in the entry.
        "pipeline fields": lambda: fields_table(PipelineConfig, leave_out=("name",)),
        "column fields": lambda: fields_table(ColumnSpec),
        "column types": column_types_table,
        "value fields": lambda: fields_table(ValueSpec),
        "debezium settings": lambda: fields_table(DebeziumSettings),
        "avro types": avro_types_table,
        "protobuf types": protobuf_types_table,
        "iceberg sink fields": lambda: fields_table(IcebergSinkSpec),
        "lake maintenance fields": lambda: fields_table(LakeMaintenanceSpec),
        "doorbell fields": lambda: fields_table(DoorbellSpec),
        "deployment settings": lambda: settings_table([name for name in Settings.model_fields
                                                       if name not in TIMEOUTS]),
        "ledger timeouts": lambda: timeouts_table(TIMEOUTS),
    },
    "scripts/env.sh": {"kafka-ledger settings": env_sh_block},
    "docker-compose.yaml": {"kafka-ledger settings": compose_block},
}


def render(text: str, blocks: dict[str, Callable[[], str]]) -> str:
    """The text with every generated block rewritten from the code; an unknown block name is an error."""
    def block(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in blocks:
            raise ValueError(f"unknown generated block {name!r} (known: {', '.join(blocks)})")
        return f"{match['open']}{blocks[name]()}{match['close']}"

    return BLOCK.sub(block, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kafka_ledger.config.reference", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file differs from the generation")
    parser.add_argument("--root", type=Path, default=PROJECT_ROOT, help="the project (default: this one)")
    args = parser.parse_args(argv)
    stale = []
    for relative, blocks in GENERATED.items():
        path = args.root / relative
        text = path.read_text()
        generated = render(text, blocks)
        if generated == text:
            continue
        stale.append(relative)
        if not args.check:
            path.write_text(generated)
            print(f"rewrote the generated blocks of {relative}")
    if stale and args.check:
        print(f"out of date: {', '.join(stale)}: run python -m kafka_ledger.config.reference", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
