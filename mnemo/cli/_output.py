"""How commands print: rich tables for people on stdout, progress and notes on stderr, and
with `--json` one JSON document on stdout (see `jsonable.py` for its shapes)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from mnemo.cli._ids import short_ids

if TYPE_CHECKING:
    from mnemo.recall.engine import RecallResult

TEXT_WIDTH = 100


def stdout_console() -> Console:
    """A console on the current stdout (made per call: tests swap stdout)."""
    return Console(file=sys.stdout)


def stderr_console() -> Console:
    """Progress and notes go to stderr, so that stdout stays one JSON document."""
    return Console(file=sys.stderr)


def json_text(value: object) -> str:
    """`value` as indented JSON text with sorted keys, ending in a newline."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def print_json(value: object) -> None:
    sys.stdout.write(json_text(value))


def shorten(text: str, width: int = TEXT_WIDTH) -> str:
    """The text on one line, cut at `width` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1].rstrip() + "…"


def recall_table(result: RecallResult, query: str) -> Table:
    """A recall's memories, best first: score, short id (`mnemo show` takes it), type, phase,
    hop and text."""
    table = Table(title=f"Recall: {escape(query)}", title_justify="left")
    table.add_column("score", justify="right")
    table.add_column("id", no_wrap=True)
    for column in ("type", "phase"):
        table.add_column(column)
    table.add_column("hop", justify="right")
    table.add_column("text", overflow="fold")
    ids = short_ids([m.node.id for m in result.memories], kind=False)
    for m in result.memories:
        table.add_row(
            f"{m.score:.3f}", ids[m.node.id], m.node.type.value, str(m.phase), str(m.hop),
            Text(shorten(m.node.text, 200)),
        )
    if not result.memories:
        table.add_row("", "", "", "", "", Text("(nothing recalled)", style="dim"))
    return table
