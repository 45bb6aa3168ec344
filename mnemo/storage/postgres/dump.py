"""The PostgreSQL side of `mnemo migrate`: a batch is one transaction, binary `COPY` into a
temporary table then `INSERT ... ON CONFLICT DO NOTHING`; rowids are copied as they are, so
`finish` moves identity sequences past them and builds each repo's HNSW index."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import numpy as np
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from mnemo.errors import StorageError
from mnemo.storage.postgres import schema
from mnemo.storage.postgres.connection import PgDialect, Postgres, placeholders
from mnemo.storage.transfer import TABLES, Kind, Row, SqlDump, Table

_STAGE = sql.Identifier("mnemo_transfer")


def _columns(names: Sequence[str]) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(name) for name in names)


class PostgresDump(SqlDump):
    BYTE_ORDER = PgDialect.BYTE_ORDER
    _driver: Postgres

    def __init__(self, pg: Postgres) -> None:
        super().__init__(pg)
        self._types: dict[str, list[int]] = {}

    def _load(self, table: Table, kind: Kind, value: object) -> object:
        if kind is Kind.VECTOR:
            return np.asarray(value, dtype=np.float32)
        return super()._load(table, kind, value)

    async def _rows(self, statement: str, params: Sequence[object] = ()) -> list[Row]:
        # Binary: a vector's text form costs more to parse than the rest of its row.
        async with self._driver.connection() as conn, conn.cursor(binary=True) as cur:
            await cur.execute(placeholders(statement), params)
            return await cur.fetchall()

    async def write(self, table: Table, rows: Sequence[Row]) -> int:
        if not rows:
            return 0
        target = sql.Identifier(table.name)
        columns = _columns(table.names)
        async with self._driver.transaction() as conn:
            await conn.execute(
                sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA")
                .format(_STAGE, columns, target)
            )
            types = self._types.get(table.name)
            if types is None:
                cur = await conn.execute(sql.SQL("SELECT {} FROM {}").format(columns, _STAGE))
                types = [column.type_code for column in cur.description or ()]
                self._types[table.name] = types
            async with conn.cursor() as cur:
                async with cur.copy(
                    sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(_STAGE, columns)
                ) as copy:
                    copy.set_types(types)
                    for row in rows:
                        await copy.write_row(row)
                await cur.execute(
                    sql.SQL(
                        "INSERT INTO {} ({}) SELECT {} FROM {} ORDER BY {} ON CONFLICT DO NOTHING"
                    ).format(target, columns, columns, _STAGE, _columns(self._source(table)[1]))
                )
                return max(cur.rowcount, 0)

    async def finish(self) -> None:
        async with self._driver.transaction() as conn:
            for table in TABLES:
                if table.has_rowid:
                    await conn.execute(
                        sql.SQL(
                            "SELECT setval(pg_get_serial_sequence({}, 'rowid'), max(rowid))"
                            " FROM {}"
                        ).format(sql.Literal(table.name), sql.Identifier(table.name))
                    )
            cur = await conn.execute("SELECT name, dim FROM repos ORDER BY name")
            repos = [(str(name), int(dim)) for name, dim in await cur.fetchall()]  # type: ignore[call-overload]
        async with self._driver.connection() as conn:
            for name, dim in repos:
                if dim > 0:
                    await schema.ensure_vector_index(conn, name, dim)


@asynccontextmanager
async def open_postgres_dump(url: str, *, must_exist: bool) -> AsyncIterator[PostgresDump]:
    """The dump of the database at `url`, opened and migrated for the block; raises
    `StorageError("unavailable")` when unreachable or, with `must_exist`, not mnemo's."""
    pg = Postgres(url)
    await pg.open(migrate=not must_exist)
    try:
        if must_exist:
            async with pg.connection() as conn:
                cur = await conn.execute("SELECT to_regclass('mnemo_migrations') IS NOT NULL")
                row = await cur.fetchone()
                if row is None or not row[0]:
                    name = conninfo_to_dict(url).get("dbname", "")
                    raise StorageError("unavailable", f"no mnemo store in the database {name!r}")
                await schema.apply(conn)
        yield PostgresDump(pg)
    finally:
        await pg.close()
