"""What `cronlog jobs`, `cronlog runs`, `apply` and `diff` print: aligned tables by
default, JSON with --json."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.table import Table

from connectors.api.service import Accepted

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
# Piped output (grep, awk, tests) is never cut to a terminal's width.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 400)


def print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in columns:
        table.add_column(column.upper(), no_wrap=True)
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in columns))
    console.print(table)


def print_accepted(accepted: Accepted, as_json: bool, what: str) -> None:
    """A write's answer: its body as JSON, or `what`, saying so when it is still applying,
    and every warning the answer gives (on stderr)."""
    if as_json:
        print_json(accepted.body)
    else:
        typer.echo(what + ("" if accepted.applied else " (accepted; applying)"))
        for warning in accepted.body.get("warnings") or ():
            typer.secho(f"warning: {warning}", fg=typer.colors.YELLOW, err=True)
