"""`PgThreads`: the conversation store (`storage.threads.SqlThreads`) on mnemo's PostgreSQL
database: its driver, how it stores data and vectors, and its search.

A write that depends on a thread's counters locks the thread's row (`FOR UPDATE`), so writers
of one thread take turns; a read of several statements is one REPEATABLE READ transaction. Ids
are ordered byte by byte (`COLLATE "C"`), as on SQLite.

Search runs on the messages' generated `search` column (`SEARCH_VECTOR`, GIN-indexed):
Snowball's English stemmer, case and accents folded, no stop word dropped. Each word of the
query is `WORD_QUERY` (a parameter, so nothing in it is query syntax; its parts one phrase, as a
quoted FTS5 string), and a message matches when it holds any of them. Its relevance is FTS5's
bm25: per word, the idf `ln(1 + (N - df + 0.5) / (df + 0.5))` times the saturating term
frequency `tf (k1 + 1) / (tf + k1 (1 - b + b len / avglen))`, summed; `tf` read through
`ts_rank` (`TS_RANK_ONE`), `len` the message's distinct lexemes, `df`, `N` and `avglen` counted
up to `COUNT_CAP` messages (N at least the table's row estimate). The best candidates are
reordered by `rank_by_recency` (`mnemo.conversation.search`); `ts_headline`, which shows the
text as written, is asked only for the hits returned.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np
from psycopg.types.json import Jsonb

from mnemo.conversation.drafts import MessageDraft
from mnemo.graph.model import Vector
from mnemo.storage.postgres.text_search import TEXT_SEARCH_CONFIG, WORD_QUERY
from mnemo.storage.row import Row
from mnemo.storage.sql import Statements
from mnemo.storage.thread_rows import SearchQuery
from mnemo.storage.threads import SqlThreads

# bm25's parameters, FTS5's: term-frequency saturation and length normalisation.
K1 = 1.2
B = 0.75
# `ts_rank` (no normalisation) of a word found once (weight D, 0.1, times 6 / pi^2); n times
# ranks 1 + 1/4 + ... + 1/n^2 times that: the ratio is a saturating term frequency.
TS_RANK_ONE = 0.1 * 6 / math.pi**2

# About SQLite's 48-token snippet; `hit_snippet` then bounds it to SNIPPET_CHARS.
HEADLINE_OPTIONS = 'StartSel="", StopSel="", MaxWords=48, MinWords=24, ShortWord=0'


# Messages counted at most, for a word's document frequency and the table's size.
COUNT_CAP = 10_000


def tsquery(words: Sequence[str]) -> tuple[str, list[str]]:
    """The SQL of a tsquery ORing every word, and its parameters ("" when there are none).

    >>> tsquery(["nginx", "NOT"])[0].count("phraseto_tsquery")
    2
    """
    sql = " || ".join(WORD_QUERY for _ in words)
    return sql, list(words)


def _per_word(words: Sequence[str]) -> tuple[str, list[object]]:
    """A `w` table of one tsquery per word with its document frequency `df`, the
    collection's size `n` and mean length `avglen` (see the module doc), and its parameters;
    materialised, so that each word's `df` is counted once."""
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


# One word's bm25 in message `m` (see the module doc), from `w` of `_per_word` and the word's
# term frequency `tf.f` (`_TF`, computed once a row).
_TF = f"LATERAL (SELECT ts_rank(m.search, w.query, 0) / {TS_RANK_ONE} AS f) tf"
_BM25 = (
    "ln(1 + (w.n - w.df + 0.5) / (w.df + 0.5))"
    f" * tf.f * ({K1} + 1) / (tf.f + {K1} * (1 - {B} + {B} * length(m.search) / w.avglen))"
)


def scoring_query(query: SearchQuery) -> tuple[str, list[object]]:
    """The statement ranking the best `query.pool` candidates (rowid, bm25, recorded_at) for
    the query's words, and its parameters."""
    words, thread_id, where = query.words, query.thread_id, query.where
    exclude_viewport_of, shown = query.exclude_viewport_of, query.shown
    conditions = ["m.search @@ w.query"]
    filters: list[object] = []
    if thread_id is not None:
        conditions.append("m.thread_id = %s")
        filters.append(thread_id)
    for key, values in (where or {}).items():
        conditions.append("m.metadata -> %s = ANY(%s::jsonb[])")
        filters += [key, list(values)]
    if exclude_viewport_of is not None:
        boundary = "coalesce((SELECT boundary_seq FROM threads WHERE id = %s), 0)"
        if shown is not None:
            # What the viewport showed and still would: an eviction since moved some of it
            # behind the boundary, into a snapshot only (as SQLite's search).
            conditions.append(
                f"NOT (m.thread_id = %s AND m.id = ANY(%s) AND (m.seq >= {boundary}"
                " OR EXISTS (SELECT 1 FROM pins p WHERE p.message_id = m.id)))"
            )
            filters += [exclude_viewport_of, sorted(shown.ids), exclude_viewport_of]
        else:
            conditions.append(f"NOT (m.thread_id = %s AND m.seq >= {boundary})")
            filters += [exclude_viewport_of, exclude_viewport_of]
    per_word, word_params = _per_word(words)
    return (
        f"WITH {per_word}"
        f" SELECT m.rowid, sum({_BM25}), m.recorded_at"
        f" FROM messages m JOIN w ON {' AND '.join(conditions)} CROSS JOIN {_TF}"
        " GROUP BY m.rowid, m.recorded_at ORDER BY 2 DESC, m.rowid DESC LIMIT %s",
        [*word_params, *filters, query.pool],
    )


def _jsonb_keeps(value: object) -> bool:
    """Whether jsonb gives `value` back equal and of the same types: it refuses NUL in
    strings, stores numbers as `numeric` (1e16 comes back as the integer 10000000000000000,
    -0.0 as 0.0) and has no NaN or infinity."""
    if isinstance(value, str):
        return "\x00" not in value
    if isinstance(value, float):
        return math.isfinite(value) and "e+" not in repr(value) and math.copysign(1, value) > 0
    if isinstance(value, dict):
        return all(_jsonb_keeps(k) and _jsonb_keeps(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_jsonb_keeps(v) for v in value)
    return True


def message_row(
    message_id: str, thread_id: str, seq: int, role: str, text: str, content: str,
    data: dict[str, Any], recorded_at: datetime, tokens: int,
    metadata: Mapping[str, object] | None = None,
) -> tuple[Any, ...]:
    """The parameters of a row of `MESSAGE_COLUMNS` for a message (see `message_from_row`).

    A message's `data` is stored as a jsonb object, except when jsonb would not give it back
    exactly, or the role or content holds NUL (which no PostgreSQL text may): then the jsonb
    is a string, the JSON text of `data`, or of `[data, content, role]` (SQLite's text, which
    keeps everything). The search text has NUL as U+FFFD: it is only searched and quoted.
    """
    nul = "\x00" in content or "\x00" in role
    stored: object = data
    if nul or not _jsonb_keeps(data):
        stored = json.dumps([data, content, role] if nul else data, sort_keys=True,
                            ensure_ascii=False)
    kept = None if nul or content == text else content
    return (message_id, thread_id, seq, role.replace("\x00", "\ufffd"),
            text.replace("\x00", "\ufffd"), kept, Jsonb(stored), recorded_at, tokens,
            Jsonb(dict(metadata)) if metadata else None)


class PgThreads(SqlThreads):
    """`ThreadStore` over mnemo's PostgreSQL database."""

    LOCK = " FOR UPDATE"
    BYTE_ORDER = ' COLLATE "C"'
    VECTOR_UPSERT = (
        "INSERT INTO message_vectors(message_id, thread_id, vec)"
        " SELECT ?, ?, ? WHERE EXISTS (SELECT 1 FROM messages WHERE id = ?)"
        " ON CONFLICT (message_id) DO UPDATE"
        " SET thread_id = excluded.thread_id, vec = excluded.vec"
    )

    def _stamp(self, at: datetime) -> object:
        return at

    def _message_row(self, message_id: str, thread_id: str, seq: int, draft: MessageDraft,
                     at: datetime) -> Row:
        return message_row(message_id, thread_id, seq, draft.role, draft.text, draft.content,
                           draft.data, at, draft.tokens, draft.metadata)

    def _vector(self, vector: Vector) -> object:
        # `register_vector` sends exactly the numpy arrays as pgvector's `vector`.
        return np.asarray(vector, dtype=np.float32).reshape(-1)

    def _vector_of(self, value: Any) -> Vector:
        vector: Vector = value
        return vector

    def _prefix(self, prefix: str) -> tuple[str, tuple[object, ...]]:
        return "starts_with(id, ?)", (prefix,)

    async def _erased(self, sql: Statements, messages: int) -> None:
        """Nothing more: a message's search vector is a column of its row (dead row versions
        stay until VACUUM; see the README)."""

    async def _candidates(self, sql: Statements, query: SearchQuery) -> list[Row]:
        scoring, params = scoring_query(query)
        return await sql.rows(scoring, params)

    async def _snippets(
        self, sql: Statements, words: Sequence[str], rowids: list[int]
    ) -> dict[int, Row]:
        query, params = tsquery(words)
        rows = await sql.rows(
            f"WITH q AS (SELECT {query} AS query)"
            " SELECT m.rowid, m.id, m.thread_id, m.seq, m.role,"
            f" ts_headline('{TEXT_SEARCH_CONFIG}', m.text, q.query, %s), m.text"
            " FROM messages m, q WHERE m.rowid = ANY(%s)",
            [*params, HEADLINE_OPTIONS, rowids],
        )
        return {int(row[0]): row[1:] for row in rows}
