"""Keyword search over every thread's messages, and drill-down around one message.

Search runs on FTS5 (`porter unicode61`: stems, case and diacritics folded). Any user text is
a safe query: it is split into words, each word is quoted (so nothing in it is FTS syntax)
and the words are OR-combined. AND, OR and NOT are words like any other (API.md): an agent
writing "keep NOT delete" means the words, and an operator would silently drop matches.

Ranking: FTS5's bm25 picks a pool of the best candidates (`POOL_FACTOR` times the limit, at
least `MIN_POOL`), then each score is weighted by recency, `0.5 + 0.5 * 2^(-age / 30 days)`:
a month-old message keeps 75% of its score and none drops below half, so relevance leads and
recency breaks near-ties. Snippets (about 300 characters) are made only for the hits returned.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.conversation.log import MESSAGE_COLUMNS, message_from_row, read_state
from mnemo.conversation.model import Message, MessageView, SearchHit, Snapshot
from mnemo.conversation.render import flat, reduced
from mnemo.conversation.viewport import SNAPSHOT_COLUMNS, snapshot_from_row
from mnemo.errors import NotFoundError
from mnemo.inputs import query_terms

POOL_FACTOR = 8
MIN_POOL = 40
HALF_LIFE_DAYS = 30.0
SNIPPET_TOKENS = 48
SNIPPET_CHARS = 300
VIEW_SNAPSHOTS = 3
_WORD = re.compile(r"\w+")


def match_expression(query: str) -> str:
    """The FTS5 MATCH expression for a user query ("" when it has no word).

    >>> match_expression('nginx "proxy" AND NOT port)')
    '"nginx" OR "proxy" OR "AND" OR "NOT" OR "port"'
    """
    # Distinct words, capped as graph recall caps its terms (the longest past the cap), so a
    # long query costs no more than `MAX_QUERY_TERMS` terms; AND, OR and NOT are words too.
    return " OR ".join(f'"{word}"' for word in query_terms(_WORD.findall(query)))


def recency_weight(age_seconds: float) -> float:
    """0.5 + 0.5 * 2^(-age / 30 days); 1.0 for a message from now (or the future)."""
    age_days = max(0.0, age_seconds) / 86_400.0
    return 0.5 + 0.5 * float(0.5 ** (age_days / HALF_LIFE_DAYS))


def search(
    db: SqliteUtilsDatabase,
    match: str,
    *,
    limit: int,
    now: datetime,
    thread_id: str | None = None,
    exclude_viewport_of: str | None = None,
) -> list[SearchHit]:
    """The best `limit` messages for a MATCH expression (see the module doc)."""
    conn = db.conn
    pool = max(MIN_POOL, limit * POOL_FACTOR)
    conditions: list[str] = []
    params: list[Any] = []
    if thread_id is not None:
        conditions.append("m.thread_id = ?")
        params.append(thread_id)
        # A thread's messages lie within the rowids of its first and last: FTS5 seeks to that
        # range instead of ranking every match of every thread (0.3 ms instead of 9 ms at p50
        # on 100k messages in threads of 100; threads written at the same time interleave,
        # which widens the range, never beyond the whole table).
        span = conn.execute(
            "SELECT min(rowid), max(rowid) FROM messages WHERE thread_id = ?", (thread_id,)
        ).fetchone()
        if span[0] is None:
            return []
        conditions.append("messages_fts.rowid BETWEEN ? AND ?")
        params += [span[0], span[1]]
    if exclude_viewport_of is not None:
        state = read_state(db, exclude_viewport_of)
        boundary = state.boundary_seq if state else 0
        # Only the messages from the boundary on: every viewport shows them when eviction
        # keeps up. Whether a pinned message is shown depends on the viewport's budget, which
        # search does not know, so pins stay findable (a repeat beats a hidden message).
        conditions.append("NOT (m.thread_id = ? AND m.seq >= ?)")
        params += [exclude_viewport_of, boundary]
    if conditions:
        rows = conn.execute(
            "SELECT m.rowid, bm25(messages_fts) AS score, m.recorded_at FROM messages_fts"
            " JOIN messages m ON m.rowid = messages_fts.rowid"
            f" WHERE messages_fts MATCH ? AND {' AND '.join(conditions)}"
            " ORDER BY score LIMIT ?",
            [match, *params, pool],
        ).fetchall()
    else:
        # Without a filter FTS5 orders by rank itself, keeping only the best `pool` rows.
        rows = conn.execute(
            "SELECT f.rowid, f.rank, m.recorded_at FROM"
            " (SELECT rowid, rank FROM messages_fts WHERE messages_fts MATCH ?"
            "  ORDER BY rank LIMIT ?) AS f JOIN messages m ON m.rowid = f.rowid",
            (match, pool),
        ).fetchall()
    scored = sorted(
        (
            (-score * recency_weight((now - datetime.fromisoformat(at)).total_seconds()), rowid)
            for rowid, score, at in rows
        ),
        reverse=True,
    )[:limit]
    hits: list[SearchHit] = []
    for rank, rowid in scored:
        row = conn.execute(
            "SELECT m.id, m.thread_id, m.seq, m.role,"
            f" snippet(messages_fts, 0, '', '', '...', {SNIPPET_TOKENS})"
            " FROM messages_fts JOIN messages m ON m.rowid = messages_fts.rowid"
            " WHERE messages_fts MATCH ? AND messages_fts.rowid = ?",
            (match, rowid),
        ).fetchone()
        if row is not None:
            mid, tid, seq, role, snippet = row
            hits.append(SearchHit(mid, tid, seq, _clip(snippet), rank, role))
    return hits


def _clip(snippet: str) -> str:
    one = " ".join(snippet.split())
    return one if len(one) <= SNIPPET_CHARS else one[: SNIPPET_CHARS - 3].rstrip() + "..."


def view(db: SqliteUtilsDatabase, message_id: str, radius: int) -> MessageView:
    """`radius` messages on each side of the message, tool outputs reduced to ok/error, and
    the 3 nearest level-1 snapshots on each side.

    Raises:
        NotFoundError: no such message.
    """
    conn = db.conn
    row = conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = ?", (message_id,)
    ).fetchone()
    if row is None:
        raise NotFoundError("message", message_id)
    target = message_from_row(row)
    before = _around(db, target, radius, "<", "DESC")
    after = _around(db, target, radius, ">", "ASC")
    window = [reduced(m) for m in [*reversed(before), target, *after]]
    snaps_before = _snapshots(db, target, "<=", "DESC")
    snaps_after = _snapshots(db, target, ">", "ASC")
    return MessageView(
        target=target,
        messages=window,
        snapshots_before=list(reversed(snaps_before)),
        snapshots_after=snaps_after,
    )


def _around(db: SqliteUtilsDatabase, target: Message, radius: int, op: str, order: str) -> (
    list[Message]
):
    if radius == 0:
        return []
    return [
        message_from_row(r)
        for r in db.conn.execute(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE thread_id = ? AND seq {op} ?"
            f" ORDER BY seq {order} LIMIT ?",
            (target.thread_id, target.seq, radius),
        )
    ]


def _snapshots(db: SqliteUtilsDatabase, target: Message, op: str, order: str) -> list[Snapshot]:
    return [
        snapshot_from_row(r)
        for r in db.conn.execute(
            f"SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE thread_id = ? AND level = 1"
            f" AND start_seq {op} ? ORDER BY start_seq {order} LIMIT ?",
            (target.thread_id, target.seq, VIEW_SNAPSHOTS),
        )
    ]


def render_hits(hits: Sequence[SearchHit]) -> str:
    """Hits as text for a model: one line each, with the id to pass to view_messages."""
    if not hits:
        return "No messages found."
    return "\n".join(
        f"{i}. [{h.message_id}] thread {h.thread_id}, message {h.seq} ({h.role}): "
        f"{flat(h.snippet, SNIPPET_CHARS + 20)}"
        for i, h in enumerate(hits, 1)
    )
