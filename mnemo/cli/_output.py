"""How commands print: rich tables for people on stdout, progress and notes on stderr, and
with `--json` one JSON document on stdout (see `jsonable.py` for its shapes)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from rich.console import Console, RenderableType
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from mnemo.cli._ids import short_ids
from mnemo.text import shorten

if TYPE_CHECKING:
    from mnemo.recall.engine import RecallResult


def stdout_console() -> Console:
    """A console on the current stdout (made per call: tests swap stdout)."""
    return Console(file=sys.stdout)


def stderr_console() -> Console:
    """Progress and notes go to stderr, so that stdout stays one JSON document."""
    return Console(file=sys.stderr)


def json_text(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def print_json(value: object) -> None:
    sys.stdout.write(json_text(value))


def emit(as_json: bool, value: object, text: RenderableType) -> None:
    """A command's answer: `value` as JSON with `--json`, else `text` for a person."""
    if as_json:
        print_json(value)
    else:
        stdout_console().print(text)


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[RenderableType]] = (), *,
          empty: tuple[int, str] | None = None, **options: object) -> Table:
    """A table titled `title` with `rows`; a column's name may end in `>` (right-justified), `~`
    (folded) or `!` (never wrapped), and `empty` fills the one row of an empty table."""
    shown = Table(title=title, **{"title_justify": "left", **options})  # type: ignore[arg-type]
    for column in columns:
        name = column.rstrip(">~!")
        marks = column[len(name):]
        shown.add_column(name, justify="right" if ">" in marks else "left",
                         overflow="fold" if "~" in marks else "ellipsis", no_wrap="!" in marks)
    for row in rows:
        shown.add_row(*row)
    if empty is not None and not shown.rows:
        cells: list[RenderableType] = [""] * len(columns)
        cells[empty[0]] = Text(empty[1], style="dim")
        shown.add_row(*cells)
    return shown


def progress(console: Console, *, disable: bool = False) -> Progress:
    return Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), console=console, disable=disable)


def recall_table(result: RecallResult, query: str) -> Table:
    """A recall's memories, best first: score, short id (`mnemo show` takes it), type, phase,
    hop and text."""
    ids = short_ids([m.node.id for m in result.memories])
    return table(
        f"Recall: {escape(query)}", ("score>", "id!", "type", "phase", "hop>", "text~"),
        [(f"{m.score:.3f}", ids[m.node.id], m.node.type.value, str(m.phase), str(m.hop),
          Text(shorten(m.node.text, 200))) for m in result.memories],
        empty=(5, "(nothing recalled)"))
