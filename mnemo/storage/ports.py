"""The backend port: `open_backend(path)` gives the backend a path names (a SQLite file,
`":memory:"` or a PostgreSQL URL), which opens a store and hands out its stores."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from mnemo.conversation.ports import ThreadStore
from mnemo.errors import POSTGRES_SCHEMES, StorageError
from mnemo.graph.ports import GraphStore
from mnemo.session.ports import Coordination, SessionStore


class Backend(Protocol):
    """The stores of one database, open between `open` and `close`."""

    @property
    def graph(self) -> GraphStore: ...

    @property
    def sessions(self) -> SessionStore: ...

    @property
    def threads(self) -> ThreadStore: ...

    @property
    def coordination(self) -> Coordination: ...

    async def open(self) -> None: ...

    async def close(self) -> None: ...


def is_postgres(path: str | Path) -> bool:
    """Whether `path` names a PostgreSQL store (a `postgresql://` or `postgres://` URL)."""
    return isinstance(path, str) and path.startswith(POSTGRES_SCHEMES)


def has_postgres_driver() -> bool:
    """Whether this installation has mnemo's `postgres` extra (psycopg and its pool)."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        return False
    return True


def open_backend(
    path: str | Path,
    *,
    dims: Callable[[str], int],
    busy_timeout: float,
    synchronous: str = "NORMAL",
    lexical_dir: str | Path | None = None,
    ann_dir: str | Path | None = None,
    inspect: bool = False,
) -> Backend:
    """The backend `path` names, to `open()` before use. `lexical_dir`, `ann_dir`: where the
    lexical index and HNSW graphs live (None: default; "": none); `inspect`: the store is only
    looked at (never upgraded; on SQLite, no checkpoint or clock anchor written). Raises
    `StorageError("unavailable")` for a PostgreSQL URL without the `postgres` extra."""
    if is_postgres(path):
        if not has_postgres_driver():
            raise StorageError(
                "unavailable",
                "a postgresql:// store needs the PostgreSQL driver: "
                "pip install 'pymnemo[postgres]'",
            )
        from mnemo.storage.postgres.store import PostgresBackend

        return PostgresBackend(
            str(path), dims=dims, busy_timeout=busy_timeout, lexical_dir=lexical_dir,
            ann_dir=ann_dir, inspect=inspect,
        )
    from mnemo.storage.sqlite import SqliteBackend

    return SqliteBackend(
        path, dims=dims, busy_timeout=busy_timeout, synchronous=synchronous,
        lexical_dir=lexical_dir, ann_dir=ann_dir, inspect=inspect,
    )
