"""`SqlThreads`: the conversation store (`ThreadStore`), once for both backends. Every write is
one transaction; one that depends on a thread's counters locks its row first (`LOCK`), so
writers of a thread take turns; a read of several statements is one snapshot."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from contextlib import aclosing
from datetime import UTC, datetime
from typing import Any

from mnemo import cpu
from mnemo.conversation.drafts import MessageDraft, message_key
from mnemo.conversation.model import (
    GOAL_COMPLETED,
    GOAL_OPEN,
    Compaction,
    Goal,
    Message,
    MessageView,
    SearchHit,
    Snapshot,
    ThreadInfo,
    replaced_compactions,
)
from mnemo.conversation.ports import (
    EvictionInputs,
    Shown,
    ThreadState,
    ViewportInputs,
    check_expected,
    next_hash,
)
from mnemo.conversation.search import hit_snippet, pool_size, rank_by_recency
from mnemo.errors import ConflictError, InvalidInputError, NotFoundError
from mnemo.graph.model import Vector
from mnemo.graph.scope import Metadata, Where
from mnemo.storage import thread_rows as reads
from mnemo.storage.row import Row
from mnemo.storage.sql import SqlStore, Statements, T, Work, marks, moment, number, utc


class SqlThreads(SqlStore):
    # The parameters of a row of `reads.MESSAGE_COLUMNS` for a draft.
    _message_row: Callable[[str, str, int, MessageDraft, datetime], Row]
    _vector_of: Callable[[Any], Vector]  # a stored vector as read back
    # The condition on `id` (and its parameters) of the ids starting with a prefix.
    _prefix: Callable[[str], tuple[str, tuple[object, ...]]]
    # The best `query.pool` (rowid, relevance, recorded_at) rows for the query's words.
    _candidates: Callable[[Statements, reads.SearchQuery], Awaitable[list[Row]]]

    async def _erase(self, write: Work[T], erased: Callable[[T], object] = bool) -> T:
        """`write`, a transaction that erases (`erased` of what it returns: whether it erased
        anything), with what the backend does more (SQLite: merges the full-text index and
        rewrites the file; PostgreSQL: nothing, the search vector is a column of the row)."""
        return await self._driver.write(write)

    async def state(self, thread_id: str) -> ThreadState | None:
        return await self._driver.read(lambda sql: reads.read_state(sql, thread_id))

    async def threads(self) -> list[ThreadInfo]:
        rows = await self._rows(
            "SELECT t.id, (SELECT count(*) FROM messages m WHERE m.thread_id = t.id),"
            f" t.next_seq, t.boundary_seq, t.created_at FROM threads t"
            f" ORDER BY t.created_at, t.id{self.BYTE_ORDER}")
        return [
            ThreadInfo(thread_id, int(messages), next_seq, boundary, moment(created))
            for thread_id, messages, next_seq, boundary, created in rows
        ]

    async def append(
        self,
        thread_id: str,
        drafts: Sequence[MessageDraft],
        *,
        recorded_at: datetime,
        vectors: Sequence[Vector] | None = None,
        expected_len: int | None = None,
        expected_hash: str | None = None,
        expected_seq: int | None = None,
    ) -> list[Message]:
        at = utc(recorded_at)
        ids = [f"msg_{uuid.uuid4().hex}" for _ in drafts]
        stored = None if vectors is None else [self._vector(v) for v in vectors]

        async def write(sql: Statements) -> ThreadState:
            state, _ = await reads.lock_row(sql, thread_id, self._stamp(at), self.LOCK)
            check_expected(thread_id, state, expected_len, expected_hash, expected_seq)
            await sql.run_many(
                f"INSERT INTO messages({reads.MESSAGE_COLUMNS}) VALUES ({marks(10)})",
                [self._message_row(ids[i], thread_id, state.next_seq + i, d, at)
                 for i, d in enumerate(drafts)],
            )
            if stored:
                await sql.run_many(
                    "INSERT INTO message_vectors(message_id, thread_id, vec) VALUES (?, ?, ?)",
                    [(ids[i], thread_id, vec) for i, vec in enumerate(stored)],
                )
            await sql.run(
                "UPDATE threads SET next_seq = ?, history_len = ?, history_hash = ?"
                " WHERE id = ?",
                (state.next_seq + len(drafts), state.history_len + len(drafts),
                 next_hash(state, drafts, expected_hash), thread_id),
            )
            return state

        state = await self._driver.write(write)
        # As read back: the data through JSON.
        return [
            Message(ids[i], thread_id, state.next_seq + i, d.role, d.content,
                    json.loads(json.dumps(d.data, sort_keys=True)), at, d.tokens,
                    dict(d.metadata))
            for i, d in enumerate(drafts)
        ]

    async def first_difference(
        self, thread_id: str, keys: Sequence[bytes]
    ) -> tuple[int, Message] | None:
        async def read(sql: Statements) -> tuple[int, Message] | None:
            index = await number(sql, "SELECT history_len - (SELECT count(*) FROM messages WHERE"
                                 " thread_id = ?) FROM threads WHERE id = ?", thread_id, thread_id)
            rows = reads.stream_messages(sql, thread_id, from_seq=0, newest_first=False)
            async with aclosing(rows):
                async for row in rows:
                    message = reads.message_from_row(row)
                    if index >= len(keys):
                        break
                    if message_key(message.to_dict(), index) != keys[index]:
                        return index, message
                    index += 1
            return None

        return await self._driver.together(read)

    async def expire(self, thread_id: str, cutoff: datetime) -> int:
        at = self._stamp(utc(cutoff))
        # Nothing due: no lock taken, so reads that expire first never wait for a writer.
        if not await self._rows("SELECT 1 FROM messages WHERE thread_id = ? AND recorded_at < ?"
                                " LIMIT 1", (thread_id, at)):
            return 0

        async def write(sql: Statements) -> int:
            state = await reads.read_state(sql, thread_id, self.LOCK)
            if state is None:
                return 0
            # Vectors and pins of the deleted messages go with them (ON DELETE CASCADE).
            gone = await sql.run(
                "DELETE FROM messages WHERE thread_id = ? AND recorded_at < ?", (thread_id, at)
            )
            if gone:
                first = await number(sql, "SELECT coalesce(min(seq), ?) FROM messages"
                                     " WHERE thread_id = ?", state.next_seq, thread_id)
                for pointer in await reads.untell(sql, thread_id, first):
                    await self._insert_snapshot(sql, pointer)
            return gone

        return await self._erase(write)

    async def pop(self, thread_id: str) -> Message | None:
        async def write(sql: Statements) -> Message | None:
            await reads.read_state(sql, thread_id, self.LOCK)  # no thread: no message either
            # Vectors and pins go with the row (ON DELETE CASCADE), its search entry too.
            row = await sql.row(
                "DELETE FROM messages WHERE rowid = (SELECT rowid FROM messages WHERE"
                f" thread_id = ? ORDER BY seq DESC LIMIT 1) RETURNING {reads.MESSAGE_COLUMNS}",
                (thread_id,),
            )
            if row is None:
                return None
            await sql.run("UPDATE threads SET history_len = history_len - 1, history_hash = NULL"
                          " WHERE id = ?", (thread_id,))
            await sql.run(
                "DELETE FROM compactions WHERE thread_id = ? AND start_seq <= ?"
                " AND end_seq >= ?",
                (thread_id, row[2], row[2]),
            )
            await reads.unsnapshot(sql, thread_id, row[2])
            return reads.message_from_row(row)

        return await self._erase(write)

    async def compactions(self, thread_id: str) -> list[Compaction]:
        return await self._driver.read(lambda sql: reads.read_compactions(sql, thread_id))

    async def raw(self, thread_id: str, from_seq: int = 0, limit: int | None = None,
                  newest: bool = False) -> list[Message]:
        messages = await self._driver.read(lambda sql: reads.read_messages(
            sql, thread_id, from_seq=from_seq, order="DESC" if newest else "ASC", limit=limit))
        return messages[::-1] if newest else messages

    async def count(self, thread_id: str) -> int:
        return await self._driver.read(
            lambda sql: number(sql, "SELECT count(*) FROM messages WHERE thread_id = ?", thread_id))

    async def uncompacted(self, thread_id: str) -> tuple[list[Compaction], list[Message]]:
        return await self._driver.together(lambda sql: reads.read_uncompacted(sql, thread_id))

    async def preamble(self, thread_id: str) -> list[Message]:
        return await self._driver.read(lambda sql: reads.read_preamble(sql, thread_id))

    async def recent_turns(
        self, thread_id: str, k: int
    ) -> tuple[list[Compaction], list[Message]]:
        return await self._driver.together(lambda sql: reads.read_recent_turns(sql, thread_id, k))

    async def add_compaction(
        self, thread_id: str, start_seq: int, end_seq: int, summary_text: str, now: datetime,
        *, replaces: Collection[int] | None = None,
    ) -> Compaction:
        at = utc(now)

        async def write(sql: Statements) -> None:
            state = await reads.read_state(sql, thread_id, self.LOCK)
            if state is None:
                raise NotFoundError("thread", thread_id)
            if end_seq >= state.next_seq:
                raise InvalidInputError(
                    f"end_seq {end_seq} is past the last message of thread {thread_id!r}"
                    f" (seq {state.next_seq - 1})"
                )
            overlapping = await sql.rows(
                "SELECT start_seq, end_seq FROM compactions WHERE thread_id = ?"
                " AND start_seq <= ? AND end_seq >= ?",
                (thread_id, end_seq, start_seq),
            )
            inside = replaced_compactions(
                thread_id, start_seq, end_seq, [(s, e) for s, e in overlapping], replaces)
            await sql.run_many(
                "DELETE FROM compactions WHERE thread_id = ? AND start_seq = ?",
                [(thread_id, s) for s in inside],
            )
            await sql.run(
                "INSERT INTO compactions(thread_id, start_seq, end_seq, summary_text,"
                " created_at) VALUES (?, ?, ?, ?, ?)",
                (thread_id, start_seq, end_seq, summary_text, self._stamp(at)),
            )

        await self._driver.write(write)
        return Compaction(thread_id, start_seq, end_seq, summary_text, at)

    async def vectors(self, thread_id: str) -> dict[str, Vector]:
        rows = await self._rows(
            "SELECT message_id, vec FROM message_vectors WHERE thread_id = ?", (thread_id,))
        return {message_id: self._vector_of(vec) for message_id, vec in rows}

    async def save_vectors(self, thread_id: str, rows: Sequence[tuple[str, Vector]]) -> None:
        params = [(mid, thread_id, self._vector(vec), mid) for mid, vec in rows]
        if params:
            await self._driver.side_write(lambda sql: sql.run_many(
                "INSERT INTO message_vectors(message_id, thread_id, vec) SELECT ?, ?, ?"
                " WHERE EXISTS (SELECT 1 FROM messages WHERE id = ?) ON CONFLICT (message_id)"
                " DO UPDATE SET thread_id = excluded.thread_id, vec = excluded.vec", params))

    async def clear(self, thread_id: str) -> None:
        async def write(sql: Statements) -> int:
            _, created = await reads.lock_row(
                sql, thread_id, self._stamp(datetime.now(UTC)), self.LOCK)
            # Goals of one never saved too.
            _, gone = await reads.delete_thread_rows(sql, thread_id)
            # No thread was saved: none is made by clearing it.
            await sql.run("DELETE FROM threads WHERE id = ?" if created else
                          "UPDATE threads SET history_len = 0, boundary_seq = next_seq,"
                          " history_hash = '' WHERE id = ?", (thread_id,))
            return gone

        await self._erase(write)

    async def purge(self, thread_id: str) -> int:
        async def write(sql: Statements) -> tuple[int, bool]:
            _, created = await reads.lock_row(
                sql, thread_id, self._stamp(datetime.now(UTC)), self.LOCK)
            messages, rows = await reads.delete_thread_rows(sql, thread_id)
            await sql.run("DELETE FROM threads WHERE id = ?", (thread_id,))
            return messages, bool(rows) or not created  # a thread's own row is erased too

        messages, _ = await self._erase(write, lambda done: done[1])
        return messages

    async def add_goal(self, thread_id: str, description: str, now: datetime) -> str:
        goal_id = f"goal_{uuid.uuid4().hex}"
        await self._driver.write(lambda sql: sql.run(
            "INSERT INTO goals(id, thread_id, description, status, created_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (goal_id, thread_id, description, GOAL_OPEN, self._stamp(utc(now))),
        ))
        return goal_id

    async def complete_goal(self, goal_id: str, now: datetime) -> int:
        async def write(sql: Statements) -> int:
            updated = await sql.run(
                "UPDATE goals SET status = ?, completed_at = ? WHERE id = ? AND status = ?",
                (GOAL_COMPLETED, self._stamp(utc(now)), goal_id, GOAL_OPEN),
            )
            if not updated and await sql.row("SELECT 1 FROM goals WHERE id = ?",
                                             (goal_id,)) is None:
                raise NotFoundError("goal", goal_id)
            return await sql.run("DELETE FROM pins WHERE goal_id = ?", (goal_id,))

        return await self._driver.write(write)

    async def open_goals(self, thread_id: str) -> list[Goal]:
        return await self._driver.read(
            lambda sql: reads.read_open_goals(sql, thread_id, self.BYTE_ORDER))

    async def viewport_inputs(self, thread_id: str, token_limit: int) -> ViewportInputs:
        async def read(sql: Statements) -> ViewportInputs:
            state = await reads.read_state(sql, thread_id)
            boundary = state.boundary_seq if state else 0
            pinned = await reads.read_messages(
                sql, thread_id, where=" AND seq < ? AND id IN (SELECT message_id FROM pins"
                " WHERE thread_id = ?)", order="DESC", params=(boundary, thread_id),
            )
            level1 = await reads.read_snapshots(sql, thread_id, reads.UNCOVERED, "DESC")
            level2 = await reads.read_snapshots(sql, thread_id, "level = 2", "DESC")
            past = await number(sql, "SELECT sum(tokens) FROM messages WHERE thread_id = ?"
                                " AND seq >= ?", thread_id, boundary)
            newest: list[Message] = []
            used = 0
            rows = reads.stream_messages(sql, thread_id, from_seq=boundary, newest_first=True)
            async with aclosing(rows):
                async for row in rows:
                    message = reads.message_from_row(row)
                    newest.append(message)
                    used += message.tokens
                    if used > token_limit:
                        break
            return ViewportInputs(boundary, pinned, level1, level2, past, newest)

        return await self._driver.together(read)

    async def eviction_inputs(self, thread_id: str) -> EvictionInputs:
        async def read(sql: Statements) -> EvictionInputs:
            state = await reads.read_state(sql, thread_id)
            if state is None:
                raise NotFoundError("thread", thread_id)
            past = await reads.read_messages(sql, thread_id, from_seq=state.boundary_seq)
            last = await reads.read_snapshots(sql, thread_id, reads.UNCOVERED)
            goals = await reads.read_open_goals(sql, thread_id, self.BYTE_ORDER)
            return EvictionInputs(state.boundary_seq, past, goals, last[-1].text if last else "")

        return await self._driver.together(read)

    async def commit_eviction(
        self,
        thread_id: str,
        *,
        boundary_before: int,
        boundary_after: int,
        zone: tuple[int, int],
        snapshot_text: str,
        pins: Sequence[tuple[str, str]],
        now: datetime,
    ) -> Snapshot | None:
        at = utc(now)
        snapshot = None
        if snapshot_text.strip():
            snapshot = Snapshot(
                f"snap_{uuid.uuid4().hex}", thread_id, 1, zone[0], zone[1], snapshot_text, at
            )

        async def write(sql: Statements) -> None:
            state = await reads.read_state(sql, thread_id, self.LOCK)
            # A ttl erases the oldest messages, `pop` the newest: either, in the zone, takes an end.
            lost = zone[0] <= zone[1] and await number(
                sql, "SELECT count(*) FROM messages WHERE thread_id = ? AND seq IN (?, ?)",
                thread_id, zone[0], zone[1]) != len(set(zone))
            if state is None or state.boundary_seq != boundary_before or lost:
                raise ConflictError(f"thread {thread_id!r} changed during eviction")
            await sql.run("UPDATE threads SET boundary_seq = ? WHERE id = ?",
                          (boundary_after, thread_id))
            await sql.run_many(
                "INSERT INTO pins(message_id, goal_id, thread_id, created_at)"
                " SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM messages WHERE id = ? AND"
                " thread_id = ?) AND EXISTS (SELECT 1 FROM goals WHERE id = ? AND thread_id = ?"
                " AND status = ?) ON CONFLICT DO NOTHING",
                [(message_id, goal_id, thread_id, self._stamp(at), message_id, thread_id,
                  goal_id, thread_id, GOAL_OPEN) for message_id, goal_id in pins],
            )
            if snapshot is not None:
                await self._insert_snapshot(sql, snapshot)

        await self._driver.write(write)
        return snapshot

    async def _insert_snapshot(self, sql: Statements, s: Snapshot) -> None:
        await sql.run(
            f"INSERT INTO snapshots({reads.SNAPSHOT_COLUMNS}) VALUES ({marks(8)})",
            (s.id, s.thread_id, s.level, s.start_seq, s.end_seq, s.text,
             self._stamp(s.created_at), s.covered_by),
        )

    async def uncovered_snapshots(self, thread_id: str) -> list[Snapshot]:
        return await self._driver.read(
            lambda sql: reads.read_snapshots(sql, thread_id, reads.UNCOVERED))

    async def commit_fold(
        self, thread_id: str, covered: Sequence[Snapshot], text: str, now: datetime
    ) -> Snapshot | None:
        level2 = Snapshot(
            f"snap_{uuid.uuid4().hex}", thread_id, 2, min(s.start_seq for s in covered),
            max(s.end_seq for s in covered), text, utc(now),
        )
        ids = [s.id for s in covered]

        async def write(sql: Statements) -> Snapshot | None:
            # Locked: a racing fold waits, then finds them covered.
            still = await sql.rows(
                f"SELECT id FROM snapshots WHERE id IN ({marks(len(ids))})"
                f" AND covered_by IS NULL{self.LOCK}",
                ids,
            )
            if len(still) != len(ids):
                return None
            await self._insert_snapshot(sql, level2)
            await sql.run(f"UPDATE snapshots SET covered_by = ? WHERE id IN ({marks(len(ids))})",
                          (level2.id, *ids))
            return level2

        return await self._driver.write(write)

    async def snapshots(self, thread_id: str) -> list[Snapshot]:
        return await self._driver.read(
            lambda sql: reads.read_snapshots(sql, thread_id, "1 = 1"))

    async def search(
        self,
        words: Sequence[str],
        *,
        limit: int,
        now: datetime,
        thread_id: str | None = None,
        exclude_viewport_of: str | None = None,
        shown: Shown | None = None,
        where: Where | None = None,
    ) -> list[SearchHit]:
        if not words:
            return []
        query = reads.SearchQuery(
            words, pool_size(limit), thread_id, exclude_viewport_of, shown, where)

        async def read(sql: Statements) -> list[tuple[float, Row]]:
            scored = rank_by_recency(
                ((int(rowid), float(score), moment(at))
                 for rowid, score, at in await self._candidates(sql, query)),
                now=now, limit=limit,
            )
            if not scored:
                return []
            found = {int(row[0]): row[1:] for row in await sql.rows(
                "SELECT rowid, id, thread_id, seq, role, text FROM messages"
                f" WHERE rowid IN ({marks(len(scored))})", [rowid for _, rowid in scored])}
            return [(rank, found[rowid]) for rank, rowid in scored if rowid in found]

        hits = await self._driver.together(read)
        return await cpu.run(lambda: [  # long texts' snippets are made off the loop
            SearchHit(mid, tid, seq, hit_snippet(text, words), rank, role)
            for rank, (mid, tid, seq, role, text) in hits], sum(len(h[1][4]) for h in hits))

    def _unseen(self, query: reads.SearchQuery) -> tuple[list[str], list[object]]:
        """The condition that a message `m` is not in the viewport of `exclude_viewport_of`
        (from its boundary on, or, given `shown`, what it showed and still would: a pin still
        shows it), and its parameters; none without such a thread."""
        if (excluded := query.exclude_viewport_of) is None:
            return [], []
        boundary = "coalesce((SELECT boundary_seq FROM threads WHERE id = ?), 0)"
        if query.shown is None:
            return [f"NOT (m.thread_id = ? AND m.seq >= {boundary})"], [excluded, excluded]
        return ([f"NOT (m.thread_id = ? AND m.id{self.ANY} AND (m.seq >= {boundary}"
                 " OR EXISTS (SELECT 1 FROM pins p WHERE p.message_id = m.id)))"],
                [excluded, self._list(sorted(query.shown.ids)), excluded])

    async def scopes(self, thread_id: str, limit: int) -> list[Metadata]:
        rows = await self._rows("SELECT DISTINCT metadata FROM messages WHERE thread_id = ?"
                                " LIMIT ?", (thread_id, limit))
        return [reads.metadata_of(stored) for stored, in rows]

    async def message_ids(self, prefix: str, limit: int) -> list[str]:
        condition, params = self._prefix(prefix)
        rows = await self._rows(
            f"SELECT id FROM messages WHERE {condition} ORDER BY id{self.BYTE_ORDER} LIMIT ?",
            (*params, limit))
        return [str(row[0]) for row in rows]

    async def view(self, message_id: str, radius: int) -> MessageView:
        return await self._driver.together(lambda sql: reads.read_view(sql, message_id, radius))
