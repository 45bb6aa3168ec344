"""What the lexical index holds for a node: its text and, for a step, the text of the steps up
to `WINDOW` each side in its episode (an answer's turn often shares no word with the question).
A document records the keys whose text it holds (`holds`), so a change or erasure of a node
rewrites every document that held its words."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from mnemo.graph.model import NodeType, step_window
from mnemo.storage.lexical.source import LexicalSource, Row

# Steps each side of a step in its document (BENCHMARKS.md).
WINDOW = 2
_STEP = NodeType.EPISODIC.value


@dataclass(frozen=True, slots=True)
class Document:
    row: Row
    text: str
    holds: tuple[str, ...]


def key(repo: str, rowid: int) -> str:
    return f"{repo}/{rowid}"


def rowid_of(key: str) -> int:
    return int(key.rpartition("/")[2])


def documents(source: LexicalSource, repo: str, rows: Iterable[Row]) -> list[Document]:
    """The documents of `rows` as the store holds them now (neighbours read if not in `rows`)."""
    rows = list(rows)
    around = {row.id: step_window(row.id, WINDOW) for row in rows if row.type == _STEP}
    by_id = {row.id: row for row in rows}
    missing = [i for ids in around.values() for i in ids if i not in by_id]
    if missing:
        by_id.update((row.id, row) for row in source.by("id", repo, missing))
    out: list[Document] = []
    for row in rows:
        near = [n for i in around.get(row.id, ()) if (n := by_id.get(i)) and n.type == _STEP]
        # Composed as query words are, so both forms of an accent are one word.
        text = unicodedata.normalize("NFC", " ".join([row.text, *(n.text for n in near)]))
        out.append(Document(row, text, tuple(key(repo, n.rowid) for n in near)))
    return out


def to_rewrite(present: Iterable[Row]) -> list[str]:
    """The ids of the steps whose documents hold (or should hold) one of these nodes' text."""
    return [i for row in present if row.type == _STEP for i in step_window(row.id, WINDOW)]
