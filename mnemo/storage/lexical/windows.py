"""What the lexical index holds for a node: its text and, for a step, the steps around it.

A step's words document is its own text and the text of the steps up to `WINDOW` before and
after it in its episode. In a conversation the answer to a question is often a turn whose own
words share nothing with the question: "What did you paint?" / "A lake at sunrise". In a
document that holds the turns around it, the question's words find the answer's turn too;
recall's neighbour lever does the same after fusion, only for the best hits, and on LoCoMo the
two together find more evidence than either.
Other node types (facts, procedures, tags) are their own text.

Erasure holds through the windows: a document records the keys of the nodes whose text it
holds (`Document.holds`, indexed), so when a node changes or goes, the index finds every
document that held its words and writes each again from the store as it is now.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mnemo.graph.model import NodeType, step_window
from mnemo.storage.lexical.schema import composed
from mnemo.storage.lexical.source import LexicalSource, Row

# Steps each side of a step in its document: LoCoMo dev R@10 0.753 with none, 0.748 with one
# each side, 0.771 with two, 0.766 with three (BENCHMARKS.md).
WINDOW = 2
_STEP = NodeType.EPISODIC.value


@dataclass(frozen=True, slots=True)
class Document:
    """A node's document: the row, the text indexed for it (`composed`), and the keys
    ("<repo>/<rowid>") of the other nodes whose text that holds."""

    row: Row
    text: str
    holds: tuple[str, ...]


def key(repo: str, rowid: int) -> str:
    return f"{repo}/{rowid}"


def rowid_of(key: str) -> int:
    """The rowid a document's key names."""
    return int(key.rpartition("/")[2])


def documents(source: LexicalSource, repo: str, rows: Iterable[Row]) -> list[Document]:
    """The documents of `rows` as the store holds them now: a step's neighbours are read
    from the store unless they are among `rows` (a batch of a rebuild mostly holds them)."""
    rows = list(rows)
    around = {row.id: step_window(row.id, WINDOW) for row in rows if row.type == _STEP}
    by_id = {row.id: row for row in rows}
    missing = [i for ids in around.values() for i in ids if i not in by_id]
    if missing:
        by_id.update((row.id, row) for row in source.rows(repo, missing))
    out: list[Document] = []
    for row in rows:
        near = [n for i in around.get(row.id, ()) if (n := by_id.get(i)) and n.type == _STEP]
        out.append(Document(row, composed(" ".join([row.text, *(n.text for n in near)])),
                            tuple(key(repo, n.rowid) for n in near)))
    return out


def to_rewrite(present: Iterable[Row]) -> list[str]:
    """The ids of the steps whose documents hold (or should now hold) one of these nodes'
    text: their windows' steps."""
    return [i for row in present if row.type == _STEP for i in step_window(row.id, WINDOW)]
