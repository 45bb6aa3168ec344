"""How commands print: rich tables for people on stdout, progress and notes on stderr, and
with `--json` one JSON document on stdout (see `jsonable.py` for its shapes)."""

from __future__ import annotations

import json
import sys

from rich.console import Console

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
