"""`RowReads`: the graph store's reads of plain rows (nodes, commit records), once for both
backends over `_rows`; a backend decodes them (`_node`, `WRITES._loads`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from mnemo.graph.history import CommitRecord
from mnemo.graph.model import CommitReceipt, Link, LinkType, Node, NodeType
from mnemo.storage.row import Row
from mnemo.storage.sql import SqlStore, marks, moment

if TYPE_CHECKING:
    from mnemo.storage.graph_writes import SqlGraphWrites

NODE_COLUMNS = (
    "id, type, text, data, created_at, valid_from, valid_to, recorded_at, retired_at, metadata"
)
NODE_WIDTH = len(NODE_COLUMNS.split(","))
# A commit record's columns as a commit writes them; read with maintenance's after them.
COMMIT_COLUMNS = ("id, repo, seq, committed_at, session_id, source_id, nodes, links, retired,"
                  " reworded, joined, reverted_by, reverts")
_READ = f"{COMMIT_COLUMNS}, maintenance, removed"


class RowReads(SqlStore):
    WRITES: SqlGraphWrites
    _node: Callable[[Row], Node]  # the node of a row that starts with `NODE_COLUMNS`

    def _receipt(self, value: Any) -> CommitReceipt:
        stored = self.WRITES._loads(value)  # a jsonb string on PostgreSQL if written as one
        return CommitReceipt.from_json(stored if isinstance(stored, str) else json.dumps(stored))

    def _commit(self, row: Row) -> CommitRecord:
        (commit_id, repo, seq, at, session_id, source_id, nodes, links, retired, reworded,
         joined, reverted_by, reverts, maintenance, removed) = row
        ids = self.WRITES._loads
        return CommitRecord(
            id=str(commit_id), repo=str(repo), seq=int(seq), committed_at=moment(at),
            session_id=session_id, source_id=source_id, node_ids=tuple(map(str, ids(nodes))),
            links=tuple(Link(str(s), str(d), LinkType(t)) for s, d, t in ids(links)),
            retired=tuple(map(str, ids(retired))), reworded=tuple(map(str, ids(reworded))),
            joined=tuple(map(str, ids(joined))), reverted_by=reverted_by, reverts=reverts,
            maintenance=maintenance, removed=tuple(map(str, ids(removed))))

    async def get_nodes(self, repo: str, node_ids: Sequence[str]) -> list[Node]:
        """The nodes with these ids, in the order asked (unknown ids are left out)."""
        ids = list(dict.fromkeys(node_ids))
        found: dict[str, Node] = {node.id: node for node in map(self._node, await self._among(
            f"SELECT {NODE_COLUMNS} FROM nodes WHERE repo = ? AND id IN ({{}})", ids, repo))}
        return [found[i] for i in ids if i in found]

    async def present(self, repo: str, node_ids: list[str]) -> set[str]:
        rows = await self._among("SELECT id FROM nodes WHERE id IN ({})", node_ids)
        return {str(i) for (i,) in rows}

    async def tag_owners(self, repo: str, keys: list[str]) -> dict[str, str]:
        rows = await self._among("SELECT key, id FROM nodes WHERE repo = ? AND type = 'tag'"
                                 " AND key IN ({})", list(dict.fromkeys(keys)), repo)
        return {str(k): str(i) for k, i in rows}

    async def access_stats(
        self, repo: str, node_ids: Sequence[str]
    ) -> dict[str, tuple[int, datetime | None]]:
        """How often and when last each node was recalled."""
        rows = await self._among(
            "SELECT id, access_count, last_access FROM nodes WHERE repo = ? AND id IN ({})",
            list(dict.fromkeys(node_ids)), repo)
        return {str(i): (int(count), None if last is None else moment(last))
                for i, count, last in rows}

    async def receipt(self, changeset_id: str) -> CommitReceipt | None:
        rows = await self._rows("SELECT receipt FROM applied_changesets WHERE id = ?",
                                [changeset_id])
        return self._receipt(rows[0][0]) if rows else None

    async def ingested(self, repo: str, source_id: str) -> tuple[str, CommitReceipt] | None:
        rows = await self._rows(
            "SELECT i.payload_hash, a.receipt FROM ingests i JOIN applied_changesets a"
            " ON a.id = i.changeset_id WHERE i.repo = ? AND i.source_id = ?", [repo, source_id])
        if not rows:
            return None
        made = self._receipt(rows[0][1])
        live = await self.present(repo, list(made.node_ids))
        return str(rows[0][0]), replace(made, node_ids=[i for i in made.node_ids if i in live])

    async def _of_types(self, repo: str, kinds: list[str], newest: int | None) -> list[Node]:
        order = " ORDER BY rowid" if newest is None else " ORDER BY rowid DESC LIMIT ?"
        return [self._node(row) for row in await self._rows(
            f"SELECT {NODE_COLUMNS} FROM nodes WHERE repo = ? AND type IN ({marks(len(kinds))})"
            f"{order}", [repo, *kinds, *([] if newest is None else [newest])])]

    async def commit_log(
        self, repo: str, *, limit: int | None = None, after_seq: int | None = None
    ) -> list[CommitRecord]:
        after, params = ("", []) if after_seq is None else (" AND seq > ?", [after_seq])
        cut = "" if after_seq is not None or limit is None else f" LIMIT {int(limit)}"
        return [self._commit(row) for row in await self._rows(
            f"SELECT {_READ} FROM commits WHERE repo = ?{after} ORDER BY seq DESC{cut}",
            [repo, *params])]

    async def commit_record(self, repo: str, commit_id: str) -> CommitRecord | None:
        rows = await self._rows(f"SELECT {_READ} FROM commits WHERE repo = ? AND id = ?",
                                [repo, commit_id])
        return self._commit(rows[0]) if rows else None

    async def node_ids(self, repo: str, like: str, unlike: str, limit: int) -> list[str]:
        rows = await self._rows(
            "SELECT id FROM nodes WHERE repo = ? AND id LIKE ? ESCAPE '\\'"
            " AND id NOT LIKE ? ESCAPE '\\' ORDER BY id LIMIT ?", [repo, like, unlike, limit])
        return [str(row[0]) for row in rows]

    async def get_nodes_by_type(self, repo: str, types: Iterable[NodeType]) -> list[Node]:
        """Every node of these types, oldest first."""
        kinds = [NodeType(t).value for t in types]
        return await self._of_types(repo, kinds, None) if kinds else []

    async def latest(self, repo: str, types: Iterable[NodeType], top_k: int) -> list[Node]:
        """The newest `top_k` nodes of these types, newest first."""
        kinds = [NodeType(t).value for t in types]
        return await self._of_types(repo, kinds, top_k) if kinds and top_k > 0 else []
