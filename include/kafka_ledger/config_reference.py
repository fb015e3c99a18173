"""The reference tables of docs/configuration.md, generated from the models that declare the settings.

The pipeline fields come from config.PipelineConfig and ColumnSpec, the deployment settings from
settings.Settings (with the value scripts/env.sh gives each for the local stack).

Each table sits between `<!-- generated: NAME -->` and `<!-- end generated -->` in the page; everything else
on the page is written by hand. After changing a declaration (a field, its default or its description):

    python -m kafka_ledger.config_reference           # rewrite docs/configuration.md
    python -m kafka_ledger.config_reference --check   # exit 1 if the page is out of date (a unit test does this)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from kafka_ledger.config import ColumnSpec, PipelineConfig
from kafka_ledger.settings import PROJECT_ROOT, Settings, env_name

CONFIGURATION_PAGE = PROJECT_ROOT / "docs" / "configuration.md"
ENV_SH = PROJECT_ROOT / "scripts" / "env.sh"
# scripts/env.sh gives a variable its local-stack value, unless already set, as NAME=${NAME:-value}.
ENV_SH_DEFAULT = re.compile(r"^(\w+)=\$\{\1:-(.*)\}[ \t]*(?:#.*)?$", re.MULTILINE)
BLOCK = re.compile(r"(<!-- generated: (?P<name>[^>]+?) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.DOTALL)


def default_text(field: FieldInfo) -> str:
    """A field's default as the reference shows it: `required` when it has none."""
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
    return f"`{json.dumps(value)}`"


def cell(text: str | None) -> str:
    """Text for one cell of a Markdown table: a `|` would end the cell."""
    return " ".join((text or "").split()).replace("|", "\\|")


def fields_table(model: type[BaseModel], leave_out: tuple[str, ...] = ()) -> str:
    """One row per field of `model`, in declaration order: its name, default and description."""
    rows = ["| field | default | meaning |", "| --- | --- | --- |"]
    for name, field in model.model_fields.items():
        if name not in leave_out:
            rows.append(f"| `{name}` | {default_text(field)} | {cell(field.description)} |")
    return "\n".join(rows) + "\n"


def local_stack_values() -> dict[str, str]:
    """Variable -> the value scripts/env.sh gives it for the local stack (unless it is set already)."""
    return {match[1]: match[2] for match in ENV_SH_DEFAULT.finditer(ENV_SH.read_text())}


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


def settings_table(names: list[str]) -> str:
    """One row per deployment setting: its variable, default, local-stack value and description."""
    local = local_stack_values()
    rows = ["| variable | default | local stack (`scripts/env.sh`) | used for |", "| --- | --- | --- | --- |"]
    for name in names:
        field, variable = Settings.model_fields[name], env_name(name)
        stack = f"`{cell(local[variable])}`" if variable in local else "unset"
        rows.append(f"| `{variable}` | {setting_default(field)} | {stack} | {cell(field.description)} |")
    return "\n".join(rows) + "\n"


def timeouts_table(names: list[str]) -> str:
    rows = ["| variable | default | bounds |", "| --- | --- | --- |"]
    for name in names:
        field = Settings.model_fields[name]
        rows.append(f"| `{env_name(name)}` | {default_text(field)} | {cell(field.description)} |")
    return "\n".join(rows) + "\n"


# The ledger's timeouts have a section of their own.
TIMEOUTS = [name for name in Settings.model_fields if name.endswith("_timeout")]
GENERATED: dict[str, Callable[[], str]] = {
    # A pipeline's name is its entry's key in the file, not a field written in the entry.
    "pipeline fields": lambda: fields_table(PipelineConfig, leave_out=("name",)),
    "column fields": lambda: fields_table(ColumnSpec),
    "deployment settings": lambda: settings_table([name for name in Settings.model_fields if name not in TIMEOUTS]),
    "ledger timeouts": lambda: timeouts_table(TIMEOUTS),
}


def render(text: str) -> str:
    """The page with every generated block rewritten from the code; an unknown block name is an error."""
    def block(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in GENERATED:
            raise ValueError(f"unknown generated block {name!r} (known: {', '.join(GENERATED)})")
        return f"{match[1]}{GENERATED[name]()}{match[4]}"

    return BLOCK.sub(block, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kafka_ledger.config_reference", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs from the generation")
    parser.add_argument("page", nargs="?", type=Path, default=CONFIGURATION_PAGE)
    args = parser.parse_args(argv)
    text = args.page.read_text()
    generated = render(text)
    if generated == text:
        return 0
    if args.check:
        print(f"{args.page} is out of date: run python -m kafka_ledger.config_reference", file=sys.stderr)
        return 1
    args.page.write_text(generated)
    print(f"rewrote the generated tables of {args.page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
