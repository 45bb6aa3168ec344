"""The PostgreSQL backend: every store of one database, over one pool of connections, and its
clock (`ServerClock`)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path

from psycopg.types.json import Jsonb

from mnemo.config import DEFAULT_IDLE_SESSION_TIMEOUT
from mnemo.conversation.drafts import MessageDraft
from mnemo.errors import StorageError
from mnemo.graph.model import now_utc
from mnemo.storage import clock as host_clock
from mnemo.storage.coordination import SqlCoordination
from mnemo.storage.lexical.fresh import K1, B
from mnemo.storage.lexical.index import LexicalIndex
from mnemo.storage.postgres.connection import PgDialect, Postgres, as_array
from mnemo.storage.postgres.graph import PgGraph
from mnemo.storage.postgres.lexical import PgLexicalSource, default_folder
from mnemo.storage.postgres.sessions import PgSessions
from mnemo.storage.postgres.text_search import WORD_QUERY
from mnemo.storage.row import Row
from mnemo.storage.sql import Statements
from mnemo.storage.thread_rows import SearchQuery
from mnemo.storage.threads import SqlThreads

# Connections one Memory may hold: a commit holds one for its repo's advisory lock and uses
# another, a recall runs its channels on two or three at once.
MAX_CONNECTIONS = 10
SAMPLES = 3


class ServerClock:
    """The store's time on PostgreSQL, compared across hosts: the server's `clock_timestamp()`
    read at open and at each takeover look (best of `SAMPLES` round trips), plus this host's
    monotonic time since."""

    def __init__(self, pg: Postgres, host: Callable[[], datetime] = now_utc) -> None:
        self._pg = pg
        self.host = host  # before the first read only
        self._read: tuple[datetime, float] | None = None  # the server's time, and when

    def now(self) -> datetime:
        if self._read is None:
            return self.host()
        server, at = self._read
        return server + timedelta(seconds=host_clock.elapsed() - at)

    async def sync(self) -> None:
        """Reads the server's time again; on `StorageError` the last read stays."""
        samples: list[tuple[float, datetime, float]] = []  # (round trip, time, when)
        async with self._pg.connection() as conn:
            for _ in range(SAMPLES):
                before = host_clock.elapsed()
                cur = await conn.execute("SELECT clock_timestamp()")
                after = host_clock.elapsed()
                row = await cur.fetchone()
                server = None if row is None else row[0]
                if not isinstance(server, datetime):
                    raise StorageError("unavailable", f"the server's time read {server!r}")
                samples.append((after - before, server, before + (after - before) / 2))
        _, server, at = min(samples, key=lambda sample: sample[0])
        self._read = (server, at)


# `ts_rank` of a word found once (weight D, 0.1, times 6 / pi^2): the ratio is a saturating tf.
TS_RANK_ONE = 0.1 * 6 / math.pi**2


COUNT_CAP = 10_000


def _per_word(words: Sequence[str]) -> tuple[str, list[object]]:
    """SQL of `w`, one tsquery per word with `df`, `n` and `avglen`, and its parameters."""
    rows = ", ".join(f"({WORD_QUERY})" for _ in words)
    sql = (
        f"words (query) AS (VALUES {rows}),"
        " size (n, avglen) AS MATERIALIZED (SELECT greatest(1,"
        " (SELECT reltuples FROM pg_class WHERE oid = 'messages'::regclass),"
        " (SELECT count(*) FROM (SELECT 1 FROM messages LIMIT %s) c)),"
        " (SELECT greatest(avg(length(search)), 1)::float8 FROM"
        " (SELECT search FROM messages LIMIT %s) l)),"
        " w AS MATERIALIZED (SELECT words.query, size.n, size.avglen,"
        " (SELECT count(*) FROM (SELECT 1 FROM messages d"
        " WHERE d.search @@ words.query LIMIT %s) c) AS df FROM words, size)"
    )
    return sql, [*words, COUNT_CAP, COUNT_CAP, COUNT_CAP]


# One word's bm25 in message `m`, from `w` of `_per_word` and `tf.f` (`_TF`, once a row).
_TF = f"LATERAL (SELECT ts_rank(m.search, w.query, 0) / {TS_RANK_ONE} AS f) tf"
_BM25 = (
    "ln(1 + (w.n - w.df + 0.5) / (w.df + 0.5))"
    f" * tf.f * ({K1} + 1) / (tf.f + {K1} * (1 - {B} + {B} * length(m.search) / w.avglen))"
)


def scoring_query(query: SearchQuery, unseen: Sequence[str] = (),
                  hidden: Sequence[object] = ()) -> tuple[str, list[object]]:
    """The statement ranking the best `query.pool` candidates (rowid, bm25, recorded_at) for
    the query's words, and its parameters (`unseen`, `hidden`: `SqlThreads._unseen`'s)."""
    conditions = ["m.search @@ w.query", *unseen]
    filters: list[object] = [*hidden]
    if query.thread_id is not None:
        conditions.append("m.thread_id = %s")
        filters.append(query.thread_id)
    for key, values in (query.where or {}).items():
        conditions.append("m.metadata -> %s = ANY(%s::jsonb[])")
        filters += [key, list(values)]
    per_word, word_params = _per_word(query.words)
    return (
        f"WITH {per_word}"
        f" SELECT m.rowid, sum({_BM25}), m.recorded_at"
        f" FROM messages m JOIN w ON {' AND '.join(conditions)} CROSS JOIN {_TF}"
        " GROUP BY m.rowid, m.recorded_at ORDER BY 2 DESC, m.rowid DESC LIMIT %s",
        [*word_params, *filters, query.pool],
    )


def _jsonb_keeps(value: object) -> bool:
    """Whether jsonb gives `value` back equal and of the same types (no NUL, NaN, infinity,
    -0.0 or exponent floats)."""
    if isinstance(value, str):
        return "\x00" not in value
    if isinstance(value, float):
        return math.isfinite(value) and "e+" not in repr(value) and math.copysign(1, value) > 0
    if isinstance(value, dict):
        return all(_jsonb_keeps(k) and _jsonb_keeps(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_jsonb_keeps(v) for v in value)
    return True


def message_row(message_id: str, thread_id: str, seq: int, draft: MessageDraft,
                recorded_at: datetime) -> Row:
    """The parameters of a row of `MESSAGE_COLUMNS` for a message: `data` as jsonb, or, when
    jsonb would not keep it or role or content holds NUL, as a jsonb string of its JSON text
    (or of `[data, content, role]`). The searched text has NUL as U+FFFD."""
    role, text, content, data = draft.role, draft.text, draft.content, draft.data
    nul = "\x00" in content or "\x00" in role
    stored: object = data
    if nul or not _jsonb_keeps(data):
        stored = json.dumps([data, content, role] if nul else data, sort_keys=True,
                            ensure_ascii=False)
    kept = None if nul or content == text else content
    return (message_id, thread_id, seq, role.replace("\x00", "\ufffd"),
            text.replace("\x00", "\ufffd"), kept, Jsonb(stored), recorded_at, draft.tokens,
            Jsonb(dict(draft.metadata)) if draft.metadata else None)


class PgThreads(PgDialect, SqlThreads):
    """The conversation store on PostgreSQL: a message matches any query word (`WORD_QUERY`) in
    its generated `search` column, ranked by a BM25 per word (`scoring_query`: Lucene's idf,
    `df`, `N` and `avglen` counted up to `COUNT_CAP` messages, tf through `ts_rank`)."""

    _message_row = staticmethod(message_row)

    _vector_of = staticmethod(as_array)

    def _prefix(self, prefix: str) -> tuple[str, tuple[object, ...]]:
        return "starts_with(id, ?)", (prefix,)

    async def _candidates(self, sql: Statements, query: SearchQuery) -> list[Row]:
        return await sql.rows(*scoring_query(query, *self._unseen(query)))


class PgCoordination(PgDialect, SqlCoordination):
    """The `Coordination` port over PostgreSQL, for Memory objects on any hosts. The change
    token is the server's next transaction id: a wake-up may be spurious, never missed."""

    AUTO_COMMIT = "(config->>'auto_commit')::boolean"
    # By the server's clock.
    IDLE_LEFT = (
        "extract(epoch FROM updated_at - clock_timestamp()) + coalesce("
        f"(config->>'idle_session_timeout')::float8, {DEFAULT_IDLE_SESSION_TIMEOUT})"
    )
    CHANGE_TOKEN = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"

    _clock: ServerClock

    async def sync_clock(self) -> None:
        await self._clock.sync()

    async def _end_due(self, sql: Statements, due: list[str], now: datetime) -> list[Row]:
        # A row another writer holds is left for the next sweep: it may be moving on.
        return await sql.rows(
            "UPDATE sessions SET ended = true, version = version + 1, holder = NULL,"
            " lease_until = NULL, updated_at = clock_timestamp() WHERE id IN (SELECT id"
            " FROM sessions WHERE id = ANY(?) AND NOT ended AND state = 'idle'"
            f" AND {self.IDLE_LEFT} <= 0 FOR UPDATE SKIP LOCKED) RETURNING id, repo",
            (due,),
        )


class PostgresBackend:
    def __init__(
        self,
        url: str,
        *,
        dims: Callable[[str], int],
        busy_timeout: float,
        max_connections: int = MAX_CONNECTIONS,
        lexical_dir: str | Path | None = None,
        ann_dir: str | Path | None = None,
        inspect: bool = False,
    ) -> None:
        """`lexical_dir`, `ann_dir`: the lexical index's and the HNSW graphs' folder (None:
        `lexical.default_folder()`; "": none); `inspect`: the store is never upgraded."""
        self.inspect = inspect
        self.postgres = Postgres(url, busy_timeout=busy_timeout, max_size=max_connections)
        lexical, graphs = (None if folder == "" else Path(folder) if folder else default_folder()
                           for folder in (lexical_dir, ann_dir))
        self.graph = PgGraph(self.postgres, dims, ann_dir=graphs, lexical=None if lexical is None
                             else LexicalIndex(lexical, PgLexicalSource(url, busy_timeout)))
        self.clock = ServerClock(self.postgres)
        self.sessions = PgSessions(self.postgres, self.clock)
        self.threads = PgThreads(self.postgres)
        self.coordination = PgCoordination(self.postgres, self.clock)

    async def open(self) -> None:
        """Applies pending migrations, opens the pool and reads the server's time (closing the
        pool if that fails). Raises `StorageError` ("unavailable", "extension_missing", "busy")."""
        await self.postgres.open(migrate=True, upgrade=not self.inspect)
        try:
            await self.clock.sync()
        except BaseException:
            await self.postgres.close()
            raise

    async def close(self) -> None:
        await self.graph.aclose()
        await self.postgres.close()
