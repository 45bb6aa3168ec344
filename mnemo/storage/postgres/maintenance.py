"""`PgMaintenance`: graph maintenance on PostgreSQL (links by id, rows a merge or sweep
changes locked first)."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg.types.json import Jsonb

from mnemo.ports import JSONObject
from mnemo.storage.maintenance import SqlMaintenance
from mnemo.storage.postgres.text_search import SEARCH_VECTOR
from mnemo.storage.sql import Statements


class PgMaintenance(SqlMaintenance):
    """Graph maintenance on PostgreSQL."""

    KEY = "id"
    LINKS = "links(repo, src, dst, type)"
    LOCK = " FOR UPDATE"
    FALSE, TRUE = "false", "true"
    TEXT = "::text"
    ANY = " = ANY(?)"
    HAS_VECTOR = "v.node_id = n.id"
    DANGLING = (
        "repo = ? AND (NOT EXISTS (SELECT 1 FROM nodes n WHERE n.id = links.src)"
        " OR NOT EXISTS (SELECT 1 FROM nodes n WHERE n.id = links.dst))"
    )

    @staticmethod
    def _list(values: Sequence[str]) -> object:
        return list(values)

    @staticmethod
    def _json(data: JSONObject) -> object:
        return Jsonb(data)

    @staticmethod
    def _field(name: str, node: str = "") -> str:
        return f"{node}data -> '{name}'"

    @staticmethod
    def _repo(node: str) -> str:
        return f"{node}.repo, "

    async def _bad_vectors(self, sql: Statements, repo: str, dim: int) -> int:
        row = await sql.row(
            "SELECT count(*) FROM vectors WHERE repo = ? AND vector_dims(vec) <> ?", (repo, dim)
        )
        return int(row[0]) if row else 0

    async def _search_rebuilt(self, sql: Statements, repo: str) -> bool:
        # A generated column disagrees only after a configuration change; an UPDATE recomputes.
        return bool(await sql.run(
            "UPDATE nodes SET text = text WHERE repo = ?"
            f" AND search IS DISTINCT FROM {SEARCH_VECTOR}", (repo,),
        ))
