"""Keyword search over every thread's messages, and drill-down around one message, on
PostgreSQL.

Search runs on the messages' generated `search` column (`SEARCH_VECTOR`, GIN-indexed):
Snowball's English stemmer, case folded, no stop word dropped. Each word of the query becomes
`WORD_QUERY`, `phraseto_tsquery('mnemo_english', word)` of the word split as a text is (a
parameter, so nothing in it is query syntax; a word split into parts, such as `foo_bar`, stays
one phrase, as a quoted FTS5 string does) and a message matches when it holds any of them. Its
relevance is bm25, as FTS5's: per word, its idf `ln(1 + (N - df + 0.5) / (df + 0.5))` times the
saturating term frequency `tf (k1 + 1) / (tf + k1 (1 - b + b len / avglen))`, summed. `tf` is
read through `ts_rank` without normalisation (`TS_RANK_ONE`: 1 for one occurrence, saturating
below 1.64; counting positions by unnesting each vector cost five times the search), `len` is
the message's distinct lexemes (`length(tsvector)`) and `avglen` their mean over up to
`COUNT_CAP` messages. Without the idf a word in every message repeated three times outranked a
rare one; with `ts_rank`'s division by the length's log instead of bm25's
saturation, a one-word message holding one query word outranked a sentence holding all of them.
`df` is counted through the GIN index up to `COUNT_CAP` messages, N is the
table's row estimate or its count up to the cap, whichever is larger (a capped count keeps a
large table's search bounded; its idf is near its floor there anyway). The best candidates are
reordered by `rank_by_recency` (see `mnemo.conversation.search`); `ts_headline` is asked only
for the hits returned (docs/DECISIONS.md).

Accents are folded as well (`unaccent` ahead of the stemmer, migration m012), in the query and
the text alike, as FTS5's `unicode61` folds them; `ts_headline` shows the text as written.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

from mnemo.conversation.model import Message, MessageView, SearchHit, Snapshot
from mnemo.conversation.ports import Shown
from mnemo.conversation.search import VIEW_SNAPSHOTS, hit_snippet, pool_size, rank_by_recency
from mnemo.errors import NotFoundError
from mnemo.graph.scope import Where
from mnemo.storage.postgres._thread_rows import (
    MESSAGE_COLUMNS,
    SNAPSHOT_COLUMNS,
    fetch,
    message_from_row,
    snapshot_from_row,
    utc,
)
from mnemo.storage.postgres.connection import Connection
from mnemo.storage.postgres.migrations import TEXT_SEARCH_CONFIG, WORD_QUERY

# bm25's parameters, FTS5's: term-frequency saturation and length normalisation.
K1 = 1.2
B = 0.75
# `ts_rank` (no normalisation) of a word found once (its weight D, 0.1, times 6 / pi^2). A
# word found n times ranks 1 + 1/4 + ... + 1/n^2 times that, so the ratio is a term frequency
# that saturates by itself (1, 1.25, 1.36, ... below pi^2 / 6 = 1.64), read in C from the
# vector without unnesting it.
TS_RANK_ONE = 0.1 * 6 / math.pi**2

# About SQLite's 48-token snippet; `clip` then bounds it to SNIPPET_CHARS.
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
    collection's size `n` and mean length `avglen` (see the module doc), and its parameters.
    Materialised: inlined, each word's `df` was counted again for every message it matched
    (a search's time grew with the matches times the cap)."""
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


def scoring_query(
    words: Sequence[str],
    *,
    limit: int,
    thread_id: str | None = None,
    exclude_viewport_of: str | None = None,
    shown: Shown | None = None,
    where: Where | None = None,
) -> tuple[str, list[object]]:
    """The statement ranking the best `limit` candidates (rowid, bm25, recorded_at) for the
    words, and its parameters (see `search`)."""
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
        [*word_params, *filters, limit],
    )


async def search(
    conn: Connection,
    words: Sequence[str],
    *,
    limit: int,
    now: datetime,
    thread_id: str | None = None,
    exclude_viewport_of: str | None = None,
    shown: Shown | None = None,
    where: Where | None = None,
) -> list[SearchHit]:
    """The best `limit` messages for the words (see the module doc); call inside one read
    transaction, so the hits' snippets come from the rows that were ranked."""
    query, params = tsquery(words)
    if not query:
        return []
    scoring, scoring_params = scoring_query(
        words, limit=pool_size(limit), thread_id=thread_id,
        exclude_viewport_of=exclude_viewport_of, shown=shown, where=where,
    )
    rows = await fetch(conn, scoring, scoring_params)
    scored = rank_by_recency(
        ((int(rowid), float(score), utc(at)) for rowid, score, at in rows),
        now=now,
        limit=limit,
    )
    if not scored:
        return []
    rows = await fetch(
        conn,
        f"WITH q AS (SELECT {query} AS query)"
        " SELECT m.rowid, m.id, m.thread_id, m.seq, m.role,"
        f" ts_headline('{TEXT_SEARCH_CONFIG}', m.text, q.query, %s), m.text"
        " FROM messages m, q WHERE m.rowid = ANY(%s)",
        [*params, HEADLINE_OPTIONS, [rowid for _, rowid in scored]],
    )
    found = {int(row[0]): row[1:] for row in rows}
    hits: list[SearchHit] = []
    for rank, rowid in scored:
        if rowid in found:
            mid, tid, seq, role, snippet, text = found[rowid]
            hits.append(SearchHit(mid, tid, seq, hit_snippet(snippet, text, words), rank, role))
    return hits


async def view(conn: Connection, message_id: str, radius: int) -> MessageView:
    """`radius` messages on each side of the message, as stored, and the 3 nearest level-1
    snapshots on each side.

    Raises:
        NotFoundError: no such message.
    """
    cur = await conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = %s", (message_id,)
    )
    row = await cur.fetchone()
    if row is None:
        raise NotFoundError("message", message_id)
    target = message_from_row(row)
    before = await _around(conn, target, radius, "<", "DESC")
    after = await _around(conn, target, radius, ">", "ASC")
    snaps_before = await _snapshots(conn, target, "<=", "DESC")
    snaps_after = await _snapshots(conn, target, ">", "ASC")
    return MessageView(
        target=target,
        messages=[*reversed(before), target, *after],
        snapshots_before=list(reversed(snaps_before)),
        snapshots_after=snaps_after,
    )


async def _around(conn: Connection, target: Message, radius: int, op: str, order: str) -> (
    list[Message]
):
    if radius == 0:
        return []
    cur = await conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE thread_id = %s AND seq {op} %s"
        f" ORDER BY seq {order} LIMIT %s",
        (target.thread_id, target.seq, radius),
    )
    return [message_from_row(r) for r in await cur.fetchall()]


async def _snapshots(conn: Connection, target: Message, op: str, order: str) -> list[Snapshot]:
    cur = await conn.execute(
        f"SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE thread_id = %s AND level = 1"
        f" AND start_seq {op} %s ORDER BY start_seq {order} LIMIT %s",
        (target.thread_id, target.seq, VIEW_SNAPSHOTS),
    )
    return [snapshot_from_row(r) for r in await cur.fetchall()]
