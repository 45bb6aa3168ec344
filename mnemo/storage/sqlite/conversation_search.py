"""Keyword search over every thread's messages, and drill-down around one message, on SQLite.

Search runs on FTS5 (`porter unicode61`: stems, case and diacritics folded). Each word of the
query is quoted (so nothing in it is FTS syntax) and the words are OR-combined
(`match_expression`). bm25 picks the pool of candidates that `rank_by_recency` reorders (see
`mnemo.conversation.search`); FTS5's `snippet()` is asked only for the hits returned.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.conversation.model import Message, MessageView, SearchHit, Snapshot
from mnemo.conversation.ports import Shown
from mnemo.conversation.search import VIEW_SNAPSHOTS, hit_snippet, pool_size, rank_by_recency
from mnemo.errors import NotFoundError
from mnemo.graph.scope import Where
from mnemo.storage.sqlite._thread_rows import (
    MESSAGE_COLUMNS,
    SNAPSHOT_COLUMNS,
    message_from_row,
    read_state,
    snapshot_from_row,
)

SNIPPET_TOKENS = 48


def match_expression(words: Sequence[str]) -> str:
    """The FTS5 MATCH expression for the words of a query ("" when there are none).

    >>> match_expression(["nginx", "proxy", "AND", "NOT", "port"])
    '"nginx" OR "proxy" OR "AND" OR "NOT" OR "port"'
    """
    # A word (`mnemo.text.query_words`) is word characters, marks and format characters: it
    # holds no double quote to escape. FTS5 splits it as it splits a text, into a phrase.
    return " OR ".join(f'"{word}"' for word in words)


def search(
    db: SqliteUtilsDatabase,
    words: Sequence[str],
    *,
    limit: int,
    now: datetime,
    thread_id: str | None = None,
    exclude_viewport_of: str | None = None,
    shown: Shown | None = None,
    where: Where | None = None,
) -> list[SearchHit]:
    """The best `limit` messages for the words of a query (see the module doc)."""
    match = match_expression(words)
    if not match:
        return []
    conn = db.conn
    pool = pool_size(limit)
    conditions: list[str] = []
    params: list[object] = []
    if thread_id is not None:
        conditions.append("m.thread_id = ?")
        params.append(thread_id)
        # A thread's messages lie within the rowids of its first and last: FTS5 seeks to that
        # range instead of ranking every match of every thread (a thirtieth of the time on
        # 100k messages in threads of 100; threads written at the same time interleave,
        # which widens the range, never beyond the whole table).
        span = conn.execute(
            "SELECT min(rowid), max(rowid) FROM messages WHERE thread_id = ?", (thread_id,)
        ).fetchone()
        if span[0] is None:
            return []
        conditions.append("messages_fts.rowid BETWEEN ? AND ?")
        params += [span[0], span[1]]
    for key, values in (where or {}).items():
        # Each of the scope's keys: the message's metadata value at that key, as JSON text.
        conditions.append(
            "EXISTS (SELECT 1 FROM json_each(m.metadata) j WHERE j.key = ? AND"
            " (CASE WHEN j.type IN ('true', 'false') THEN j.type ELSE json_quote(j.value) END)"
            f" IN ({', '.join('?' * len(values))}))")
        params += [key, *values]
    if exclude_viewport_of is not None:
        state = read_state(db, exclude_viewport_of)
        boundary = state.boundary_seq if state else 0
        if shown is not None:
            # What the viewport showed and still would: an eviction since moved some of it
            # behind the boundary, into a snapshot only; a pin still shows it.
            conditions.append(
                "NOT (m.thread_id = ? AND m.id IN (SELECT value FROM json_each(?))"
                " AND (m.seq >= ? OR EXISTS (SELECT 1 FROM pins p WHERE p.message_id = m.id)))"
            )
            params += [exclude_viewport_of, json.dumps(sorted(shown.ids)), boundary]
        else:
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
    # bm25 is lower for better matches: its negation is the relevance.
    scored = rank_by_recency(
        ((rowid, -score, datetime.fromisoformat(at)) for rowid, score, at in rows),
        now=now,
        limit=limit,
    )
    hits: list[SearchHit] = []
    for rank, rowid in scored:
        row = conn.execute(
            "SELECT m.id, m.thread_id, m.seq, m.role,"
            f" snippet(messages_fts, 0, '', '', '...', {SNIPPET_TOKENS}), m.text"
            " FROM messages_fts JOIN messages m ON m.rowid = messages_fts.rowid"
            " WHERE messages_fts MATCH ? AND messages_fts.rowid = ?",
            (match, rowid),
        ).fetchone()
        if row is not None:
            mid, tid, seq, role, snippet, text = row
            hits.append(SearchHit(mid, tid, seq, hit_snippet(snippet, text, words), rank, role))
    return hits


def message_ids(db: SqliteUtilsDatabase, prefix: str, limit: int) -> list[str]:
    """The ids starting with `prefix`: a range of the primary key (the strings that start
    with it sort, byte for byte, from it to it followed by the last code point)."""
    rows = db.conn.execute(
        "SELECT id FROM messages WHERE id >= ? AND id < ? ORDER BY id LIMIT ?",
        (prefix, prefix + "\U0010ffff", limit),
    )
    return [str(row[0]) for row in rows]


def view(db: SqliteUtilsDatabase, message_id: str, radius: int) -> MessageView:
    """`radius` messages on each side of the message, as stored, and the 3 nearest level-1
    snapshots on each side.

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
    snaps_before = _snapshots(db, target, "<=", "DESC")
    snaps_after = _snapshots(db, target, ">", "ASC")
    return MessageView(
        target=target,
        messages=[*reversed(before), target, *after],
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
