"""`PgThreads`: the conversation store on PostgreSQL. Search runs on the messages' generated
`search` column (English stems, accents folded, no stop words); a message matches any query
word (`WORD_QUERY`, a parameter: never query syntax) and is ranked by FTS5's bm25, `tf` read
through `ts_rank`, `df`, `N` and `avglen` counted up to `COUNT_CAP` messages."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import datetime

from psycopg.types.json import Jsonb

from mnemo.conversation.drafts import MessageDraft
from mnemo.storage.postgres.connection import PgDialect, as_array
from mnemo.storage.postgres.text_search import TEXT_SEARCH_CONFIG, WORD_QUERY
from mnemo.storage.row import Row
from mnemo.storage.sql import Statements
from mnemo.storage.thread_rows import SearchQuery
from mnemo.storage.threads import SqlThreads

# bm25's parameters, FTS5's: term-frequency saturation and length normalisation.
K1 = 1.2
B = 0.75
# `ts_rank` of a word found once (weight D, 0.1, times 6 / pi^2): the ratio is a saturating tf.
TS_RANK_ONE = 0.1 * 6 / math.pi**2

# About SQLite's 48-token snippet; `hit_snippet` then bounds it to SNIPPET_CHARS.
HEADLINE_OPTIONS = 'StartSel="", StopSel="", MaxWords=48, MinWords=24, ShortWord=0'


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
    _message_row = staticmethod(message_row)

    _vector_of = staticmethod(as_array)

    def _prefix(self, prefix: str) -> tuple[str, tuple[object, ...]]:
        return "starts_with(id, ?)", (prefix,)

    async def _candidates(self, sql: Statements, query: SearchQuery) -> list[Row]:
        return await sql.rows(*scoring_query(query, *self._unseen(query)))

    async def _snippets(
        self, sql: Statements, words: Sequence[str], rowids: list[int]
    ) -> dict[int, Row]:
        query = " || ".join(WORD_QUERY for _ in words)  # any word
        rows = await sql.rows(
            f"WITH q AS (SELECT {query} AS query)"
            " SELECT m.rowid, m.id, m.thread_id, m.seq, m.role,"
            f" ts_headline('{TEXT_SEARCH_CONFIG}', m.text, q.query, %s), m.text"
            " FROM messages m, q WHERE m.rowid = ANY(%s)",
            [*words, HEADLINE_OPTIONS, rowids],
        )
        return {int(row[0]): row[1:] for row in rows}
