"""The reference tables of docs/configuration.md, generated from the models that declare the settings.

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

CONFIGURATION_PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
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


GENERATED: dict[str, Callable[[], str]] = {
    # A pipeline's name is its entry's key in the file, not a field written in the entry.
    "pipeline fields": lambda: fields_table(PipelineConfig, leave_out=("name",)),
    "column fields": lambda: fields_table(ColumnSpec),
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
