"""What the lexical index reads of a store (`LexicalSource`: the SQL both backends share; a
backend brings `_rows` on its `_conn`, with `?` placeholders, and PostgreSQL its `place`), and
what it holds for a node (`documents`): its text and, for a step, the text of the steps up to
`WINDOW` each side in its episode (an answer's turn often shares no word with the question),
its own text counted `OWN` times, so a step outranks its neighbours on the words it says.
A document records the keys whose text it holds (`holds`), so a change or erasure of a node
rewrites every document that held its words."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mnemo.graph.model import NodeType, step_window
from mnemo.storage.row import Column
from mnemo.storage.sql import chunks, marks


@dataclass(frozen=True, slots=True)
class Row:
    """A node as the index sees it."""

    rowid: int
    id: str
    type: str
    text: str


# A repo's (seq, horizon), and the rowids its log's entries in (after, upto] touched, as `l`.
STATE = "SELECT seq, horizon FROM lexical_repos WHERE repo = ?"
# `STATE` with the store's epoch, in one read.
_STATE_AND_EPOCH = (
    "SELECT r.seq, r.horizon, e.epoch FROM lexical_epoch e"
    " LEFT JOIN lexical_repos r ON r.repo = ?"
)
LOGGED = "(SELECT DISTINCT node FROM lexical_log WHERE repo = ? AND seq > ? AND seq <= ?) l"
_CHANGES = (
    f"SELECT l.node, n.id, n.type, n.text FROM {LOGGED}"
    " LEFT JOIN nodes n ON n.rowid = l.node AND n.repo = ?"
)
_NODES = (
    "SELECT rowid, id, type, text FROM nodes WHERE repo = ? AND rowid > ? ORDER BY rowid LIMIT ?"
)
_BY = "SELECT rowid, id, type, text FROM nodes WHERE repo = ? AND {column} IN ({marks})"
_CHUNK = 500  # values per IN list (SQLite allows 32,766 parameters, PostgreSQL 65,535)


def state_of(rows: Sequence[Sequence[Column]]) -> tuple[int, int]:
    """The (seq, horizon) of `STATE`'s rows: (0, 0) for a repo never written."""
    return (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)


def changed_rows(rows: Sequence[tuple[Any, Any, Any, Any]]) -> tuple[list[Row], list[int]]:
    """Rows of (logged rowid, id, type, text) as (existing nodes, rowids of those gone)."""
    return ([Row(int(rowid), str(node_id), str(kind), str(text))
             for rowid, node_id, kind, text in rows if node_id is not None],
            [int(rowid) for rowid, node_id, _, _ in rows if node_id is None])


class LexicalSource:
    """The store's side, read from worker threads, one call at a time, on its own connection."""

    _rows: Callable[[str, tuple[object, ...]], list[Column]]
    _conn: Any  # the backend's own connection, None until opened

    def place(self) -> str:
        """The store's folder inside the index's base folder ("" for none: a SQLite file's own)."""
        return ""

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def epoch(self) -> str:
        """A random value of the store, renewed by each erasure (an index of another epoch
        wipes itself before answering)."""
        return str(self._rows("SELECT epoch FROM lexical_epoch", ())[0][0])

    def state(self, repo: str) -> tuple[int, int, str]:
        """(seq, horizon, epoch): the repo's last log sequence, the one below which the log is
        incomplete ((0, 0) if never written), and the store's epoch."""
        (seq, horizon, epoch), = self._rows(_STATE_AND_EPOCH, (repo,))
        return int(seq or 0), int(horizon or 0), str(epoch)

    def changes(self, repo: str, after: int, upto: int) -> tuple[list[Row], list[int]]:
        """The nodes touched by the log's entries in (after, upto]: those that exist, and the
        rowids of those gone."""
        return changed_rows(self._rows(_CHANGES, (repo, after, upto, repo)))

    def nodes(self, repo: str, after_rowid: int, limit: int) -> list[Row]:
        """The repo's nodes by rowid, after `after_rowid`, at most `limit`."""
        return changed_rows(self._rows(_NODES, (repo, after_rowid, limit)))[0]

    def by(self, column: str, repo: str, values: Sequence[object]) -> list[Row]:
        """Those of these nodes that exist, by `column` ("id" or "rowid")."""
        values = list(dict.fromkeys(values))
        found: list[Row] = []
        for chunk in chunks(values, _CHUNK):
            statement = _BY.format(column=column, marks=marks(len(chunk)))
            found += changed_rows(self._rows(statement, (repo, *chunk)))[0]
        return found


# Steps each side of a step in its document (BENCHMARKS.md).
WINDOW = 2
# How many times a node's own text counts in its document, a neighbour's once (BENCHMARKS.md).
OWN = 2
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
        text = unicodedata.normalize("NFC", " ".join([row.text] * OWN + [n.text for n in near]))
        out.append(Document(row, text, tuple(key(repo, n.rowid) for n in near)))
    return out


def to_rewrite(present: Iterable[Row]) -> list[str]:
    """The ids of the steps whose documents hold (or should hold) one of these nodes' text."""
    return [i for row in present if row.type == _STEP for i in step_window(row.id, WINDOW)]
