"""Closing a Memory: its background loops' looks at the store under way end before the loops are
cancelled, so no query is cut mid-way (on PostgreSQL a cut query costs its pooled connection and
the driver warns on stderr)."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import anyio
import pytest

import mnemo
from mnemo.storage.coordination import SqlCoordination

# A query that runs for a few tenths of a second on each backend.
SLOW = {
    "postgres": "SELECT pg_sleep(0.3)",
    "sqlite": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300000)"
              " SELECT count(*) FROM n",
}


async def test_a_close_lets_a_look_for_work_under_way_end(
    store: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """A Memory closed while its takeover task's first look runs a query waits for the look's
    end: it returns, and psycopg and its pool log no warning."""
    caplog.set_level(logging.WARNING, logger="psycopg")
    slow = SLOW["postgres" if store.startswith("postgresql") else "sqlite"]
    takeable = SqlCoordination.takeable
    started, ended = anyio.Event(), anyio.Event()

    async def slow_takeable(
        self: SqlCoordination, now: datetime, unseen_since: datetime, gone: Any = ()
    ) -> Any:
        started.set()
        await self._rows(slow)
        await anyio.sleep(0.1)  # a SQLite query, in its worker thread, is never cut
        ended.set()
        return await takeable(self, now, unseen_since, gone)

    monkeypatch.setattr(SqlCoordination, "takeable", slow_takeable)
    with anyio.fail_after(30):
        async with mnemo.Memory(store, embedder=mnemo.HashEmbedder()):
            await started.wait()
    assert ended.is_set()
    assert [(r.name, r.getMessage()) for r in caplog.records if r.name.startswith("psycopg")] == []


async def test_a_memory_opened_and_closed_on_postgresql_logs_no_driver_warning(
    pg_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """A Memory opened, used once and closed at once on PostgreSQL, three times, logs no
    warning from psycopg or its pool."""
    caplog.set_level(logging.WARNING, logger="psycopg")
    for _ in range(3):
        async with mnemo.Memory(pg_url, embedder=mnemo.HashEmbedder()) as mem:
            await mem.open_repo("shared")
            assert await mem.list_repos() == ["shared"]
    assert [(r.name, r.getMessage()) for r in caplog.records if r.name.startswith("psycopg")] == []
