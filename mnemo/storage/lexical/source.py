"""What both backends' lexical sources read (`index.LexicalSource`): the same tables and the
same SQL, written once with `?` placeholders; a backend brings its connection (`_rows`), its
placeholder and its folder (`place`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mnemo.storage.lexical.index import Row

_CHANGES = (
    "SELECT l.node, n.id, n.type, n.text FROM"
    " (SELECT DISTINCT node FROM lexical_log WHERE repo = ? AND seq > ? AND seq <= ?) l"
    " LEFT JOIN nodes n ON n.rowid = l.node AND n.repo = ?"
)
_NODES = (
    "SELECT rowid, id, type, text FROM nodes WHERE repo = ? AND rowid > ? ORDER BY rowid LIMIT ?"
)


def changed_rows(rows: Iterable[tuple[Any, Any, Any, Any]]) -> tuple[list[Row], list[int]]:
    """Rows of (logged rowid, id, type, text), the last three NULL for a node that is gone, as
    (the nodes that exist, the rowids of those that do not)."""
    present: list[Row] = []
    gone: list[int] = []
    for rowid, node_id, kind, text in rows:
        if node_id is None:
            gone.append(int(rowid))
        else:
            present.append(Row(int(rowid), str(node_id), str(kind), str(text)))
    return present, gone


class LogSource:
    """`LexicalSource` but for the connection: subclasses give `_rows`, `place`, `close`."""

    placeholder = "?"

    def _rows(self, statement: str, params: tuple[object, ...] = ()) -> list[Any]:
        raise NotImplementedError

    def _read(self, statement: str, params: tuple[object, ...] = ()) -> list[Any]:
        return self._rows(statement.replace("?", self.placeholder), params)

    def epoch(self) -> str:
        return str(self._read("SELECT epoch FROM lexical_epoch")[0][0])

    def state(self, repo: str) -> tuple[int, int]:
        rows = self._read("SELECT seq, horizon FROM lexical_repos WHERE repo = ?", (repo,))
        return (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)

    def changes(self, repo: str, after: int, upto: int) -> tuple[list[Row], list[int]]:
        return changed_rows(self._read(_CHANGES, (repo, after, upto, repo)))

    def nodes(self, repo: str, after_rowid: int, limit: int) -> list[Row]:
        return changed_rows(self._read(_NODES, (repo, after_rowid, limit)))[0]
