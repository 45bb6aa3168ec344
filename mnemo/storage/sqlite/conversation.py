"""`SqliteThreads`: the conversation store on SQLite. Times are UTC ISO-8601 text (text order
is time order); search runs on FTS5 (`messages_fts`), query words quoted and OR-combined."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from mnemo.conversation.drafts import MessageDraft
from mnemo.graph.model import vector_from_blob, vector_to_blob
from mnemo.graph.scope import canonical
from mnemo.storage.row import Row
from mnemo.storage.sql import Statements, marks
from mnemo.storage.sqlite.database import Database, truncate_wal
from mnemo.storage.thread_rows import SearchQuery
from mnemo.storage.threads import SqlThreads


def match_expression(words: Sequence[str]) -> str:
    """The FTS5 MATCH expression of a query's words, each quoted: never FTS5 syntax ("" if none)."""
    # A query word holds no double quote to escape.
    return " OR ".join(f'"{word}"' for word in words)


class SqliteThreads(SqlThreads):
    _driver: Database

    def _message_row(self, message_id: str, thread_id: str, seq: int, draft: MessageDraft,
                     at: datetime) -> Row:
        return (message_id, thread_id, seq, draft.role, draft.text,
                None if draft.content == draft.text else draft.content,
                json.dumps(draft.data, sort_keys=True), self._stamp(at), draft.tokens,
                canonical(draft.metadata))

    _vector = staticmethod(vector_to_blob)
    _vector_of = staticmethod(vector_from_blob)

    def _prefix(self, prefix: str) -> tuple[str, tuple[object, ...]]:
        return "id >= ? AND id < ?", (prefix, prefix + "\U0010ffff")

    async def purge(self, thread_id: str) -> int:
        gone = await super().purge(thread_id)
        await self._driver.run(truncate_wal)
        return gone

    async def _erased(self, sql: Statements, messages: int) -> None:
        if messages:  # deleted words stay in old segments until a merge
            await sql.run("INSERT INTO messages_fts(messages_fts) VALUES ('optimize')")

    async def _candidates(self, sql: Statements, query: SearchQuery) -> list[Row]:
        match = match_expression(query.words)
        conditions: list[str] = []
        params: list[object] = []
        if query.thread_id is not None:
            conditions.append("m.thread_id = ?")
            params.append(query.thread_id)
            # FTS5 seeks to the thread's rowid range rather than rank every thread's matches.
            span = await sql.row(
                "SELECT min(rowid), max(rowid) FROM messages WHERE thread_id = ?",
                (query.thread_id,),
            )
            if span is None or span[0] is None:
                return []
            conditions.append("messages_fts.rowid BETWEEN ? AND ?")
            params += [span[0], span[1]]
        for key, values in (query.where or {}).items():
            # Each of the scope's keys: the message's metadata value at that key, as JSON.
            conditions.append(
                "EXISTS (SELECT 1 FROM json_each(m.metadata) j WHERE j.key = ? AND"
                " (CASE WHEN j.type IN ('true', 'false') THEN j.type"
                f" ELSE json_quote(j.value) END) IN ({marks(len(values))}))")
            params += [key, *values]
        unseen, hidden = self._unseen(query)
        conditions += unseen
        params += hidden
        if conditions:
            rows = await sql.rows(
                "SELECT m.rowid, bm25(messages_fts) AS score, m.recorded_at FROM messages_fts"
                " JOIN messages m ON m.rowid = messages_fts.rowid"
                f" WHERE messages_fts MATCH ? AND {' AND '.join(conditions)}"
                " ORDER BY score LIMIT ?",
                [match, *params, query.pool],
            )
        else:
            # Without a filter FTS5 orders by rank itself, keeping only the best `pool` rows.
            rows = await sql.rows(
                "SELECT f.rowid, f.rank, m.recorded_at FROM"
                " (SELECT rowid, rank FROM messages_fts WHERE messages_fts MATCH ?"
                "  ORDER BY rank LIMIT ?) AS f JOIN messages m ON m.rowid = f.rowid",
                (match, query.pool),
            )
        return [(rowid, -score, at) for rowid, score, at in rows]

    async def _snippets(
        self, sql: Statements, words: Sequence[str], rowids: list[int]
    ) -> dict[int, Row]:
        match = match_expression(words)
        found: dict[int, Row] = {}
        for rowid in rowids:
            row = await sql.row(
                "SELECT m.id, m.thread_id, m.seq, m.role,"
                " snippet(messages_fts, 0, '', '', '...', 48), m.text"
                " FROM messages_fts JOIN messages m ON m.rowid = messages_fts.rowid"
                " WHERE messages_fts MATCH ? AND messages_fts.rowid = ?",
                (match, rowid),
            )
            if row is not None:
                found[rowid] = row
        return found
