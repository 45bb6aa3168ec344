"""`SqlThreads`: the conversation store (`ThreadStore`), once for both backends, and the reads
of its rows (`threads`, `messages` (never updated), `message_vectors`, `compactions`,
`snapshots`, `goals`, `pins`). Every write is one transaction; one that depends on a thread's
counters locks its row first (`LOCK`), so writers of a thread take turns; a read of several
statements is one snapshot."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from mnemo.conversation.drafts import MessageDraft
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
    compacted_floor,
    covered,
    replaced_compactions,
)
from mnemo.conversation.ports import (
    EvictionInputs,
    Shown,
    ThreadState,
    ViewportInputs,
    check_expected,
    differs,
    next_hash,
)
from mnemo.conversation.search import VIEW_SNAPSHOTS, hit_snippet, pool_size, rank_by_recency
from mnemo.errors import ConflictError, InvalidInputError, NotFoundError
from mnemo.graph.model import Vector
from mnemo.graph.scope import Metadata, Where
from mnemo.storage.row import Row
from mnemo.storage.sql import SqlStore, Statements, marks, moment, number, utc

MESSAGE_COLUMNS = "id, thread_id, seq, role, text, content, data, recorded_at, tokens, metadata"
SNAPSHOT_COLUMNS = "id, thread_id, level, start_seq, end_seq, text, created_at, covered_by"
UNCOVERED = "level = 1 AND covered_by IS NULL"


def message_from_row(row: Sequence[Any]) -> Message:
    """A `Message` from a row of `MESSAGE_COLUMNS` (data as JSON text, jsonb, or PostgreSQL's
    NUL-escaped string: `postgres.conversation.message_row`)."""
    message_id, thread_id, seq, role, text, content, data, recorded_at, tokens, metadata = row
    content = text if content is None else content
    if isinstance(data, str):
        data = json.loads(data)
        if isinstance(data, list):
            data, content, role = data
    return Message(
        id=message_id,
        thread_id=thread_id,
        seq=seq,
        role=role,
        content=content,
        data=data,
        recorded_at=moment(recorded_at),
        tokens=tokens,
        metadata=metadata_of(metadata),
    )


def metadata_of(stored: Any) -> Metadata:
    """A message's stored metadata (JSON text, jsonb or NULL) as a dict."""
    return json.loads(stored) if isinstance(stored, str) else dict(stored or {})


@dataclass(frozen=True, slots=True)
class SearchQuery:
    """What a search asks a backend's full-text index for: the best `pool` candidates."""

    words: Sequence[str]
    pool: int
    thread_id: str | None
    exclude_viewport_of: str | None
    shown: Shown | None
    where: Where | None


_LOCK_ATTEMPTS = 3


async def lock_row(
    sql: Statements, thread_id: str, stamp: object, lock: str
) -> tuple[ThreadState, bool]:
    """Locks the thread's row until the transaction ends, creating it at `stamp` first when
    absent (True then), so saves and purges of a thread take turns. Raises `ConflictError`
    when purges deleted the row under each of `_LOCK_ATTEMPTS` waits."""
    for _ in range(_LOCK_ATTEMPTS):
        state = await read_state(sql, thread_id, lock)
        if state is not None:
            return state, False
        created = await sql.row(
            "INSERT INTO threads(id, next_seq, history_len, boundary_seq, created_at,"
            " history_hash) VALUES (?, 0, 0, 0, ?, '') ON CONFLICT (id) DO NOTHING"
            " RETURNING id",
            (thread_id, stamp),
        )
        state = await read_state(sql, thread_id, lock)
        if state is not None:
            return state, created is not None
    raise ConflictError(f"thread {thread_id!r} was purged while waiting for it, each time")


async def read_state(sql: Statements, thread_id: str, lock: str = "") -> ThreadState | None:
    """The thread's counters; with `lock`, its row stays locked until the transaction ends."""
    row = await sql.row(
        "SELECT next_seq, history_len, boundary_seq, history_hash FROM threads WHERE id = ?"
        + lock,
        (thread_id,),
    )
    return None if row is None else ThreadState(*row)


async def read_messages(
    sql: Statements, thread_id: str, *, from_seq: int = 0, where: str = "", order: str = "ASC",
    params: Sequence[Any] = (), limit: int | None = None,
) -> list[Message]:
    """The thread's messages from `from_seq` on matching `where` (SQL after AND, with
    `params`), by seq in `order`, at most `limit`."""
    rows = await sql.rows(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE thread_id = ? AND seq >= ?{where}"
        f" ORDER BY seq {order}" + ("" if limit is None else " LIMIT ?"),
        (thread_id, from_seq, *params, *(() if limit is None else (limit,))),
    )
    return [message_from_row(row) for row in rows]


def stream_messages(
    sql: Statements, thread_id: str, *, from_seq: int, newest_first: bool
) -> AsyncGenerator[Row, None]:
    return sql.stream(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE thread_id = ? AND seq >= ?"
        f" ORDER BY seq {'DESC' if newest_first else 'ASC'}",
        (thread_id, from_seq),
    )


async def read_snapshots(
    sql: Statements, thread_id: str, where: str, order: str = "ASC", params: Sequence[Any] = (),
    limit: int | None = None,
) -> list[Snapshot]:
    """The thread's first `limit` snapshots matching `where` (SQL over the snapshot's columns,
    `params` its parameters) by level, start and the order written, each in `order`."""
    rows = await sql.rows(
        f"SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE thread_id = ? AND {where}"
        f" ORDER BY level {order}, start_seq {order}, rowid {order}"
        + (" LIMIT ?" if limit is not None else ""),
        (thread_id, *params, *([] if limit is None else [limit])),
    )
    return [Snapshot(i, t, level, s, e, text, moment(at), by)
            for i, t, level, s, e, text, at, by in rows]


async def read_open_goals(sql: Statements, thread_id: str, byte_order: str) -> list[Goal]:
    """The thread's open goals, oldest first (ids tie-break in `byte_order`)."""
    rows = await sql.rows(
        "SELECT id, description, status, created_at FROM goals"
        f" WHERE thread_id = ? AND status = ? ORDER BY created_at, id{byte_order}",
        (thread_id, GOAL_OPEN),
    )
    return [
        Goal(gid, thread_id, description, status, moment(created_at))
        for gid, description, status, created_at in rows
    ]


async def delete_thread_rows(sql: Statements, thread_id: str) -> int:
    """Deletes a thread's rows but its counter row (search entries too); messages deleted."""
    for table in ("pins", "goals", "snapshots", "compactions", "message_vectors"):
        await sql.run(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,))
    return await sql.run("DELETE FROM messages WHERE thread_id = ?", (thread_id,))


async def read_compactions(sql: Statements, thread_id: str) -> list[Compaction]:
    rows = await sql.rows(
        "SELECT start_seq, end_seq, summary_text, created_at FROM compactions"
        " WHERE thread_id = ? ORDER BY start_seq",
        (thread_id,),
    )
    return [Compaction(thread_id, start, end, text, moment(created))
            for start, end, text, created in rows]


class SqlThreads(SqlStore):
    # The parameters of a row of `MESSAGE_COLUMNS` for a draft.
    _message_row: Callable[[str, str, int, MessageDraft, datetime], Row]
    _vector_of: Callable[[Any], Vector]  # a stored vector as read back
    # The condition on `id` (and its parameters) of the ids starting with a prefix.
    _prefix: Callable[[str], tuple[str, tuple[object, ...]]]
    # The best `query.pool` (rowid, relevance, recorded_at) rows for the query's words.
    _candidates: Callable[[Statements, SearchQuery], Awaitable[list[Row]]]
    # By rowid, (id, thread_id, seq, role, snippet, text) of the messages of these words.
    _snippets: Callable[[Statements, Sequence[str], list[int]], Awaitable[dict[int, Row]]]

    async def _erased(self, sql: Statements, messages: int) -> None:
        """What a purge of this many messages does more, inside its transaction (PostgreSQL:
        nothing, the search vector is a column of the row)."""

    async def state(self, thread_id: str) -> ThreadState | None:
        return await self._driver.read(lambda sql: read_state(sql, thread_id))

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
    ) -> list[Message]:
        at = utc(recorded_at)
        ids = [f"msg_{uuid.uuid4().hex}" for _ in drafts]
        stored = None if vectors is None else [self._vector(v) for v in vectors]

        async def write(sql: Statements) -> ThreadState:
            state, _ = await lock_row(sql, thread_id, self._stamp(at), self.LOCK)
            check_expected(thread_id, state, expected_len, expected_hash)
            await sql.run_many(
                f"INSERT INTO messages({MESSAGE_COLUMNS}) VALUES ({marks(10)})",
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
        self, thread_id: str, from_seq: int, keys: Sequence[bytes]
    ) -> int | None:
        async def read(sql: Statements) -> int | None:
            rows = stream_messages(sql, thread_id, from_seq=from_seq, newest_first=False)
            async with aclosing(rows):
                async for row in rows:
                    message = message_from_row(row)
                    if message.seq - from_seq >= len(keys):
                        break
                    if differs(message, from_seq, keys):
                        return message.seq
            return None

        return await self._driver.together(read)

    async def expire(self, thread_id: str, cutoff: datetime) -> int:
        at = self._stamp(utc(cutoff))
        # Nothing due: no lock taken, so reads that expire first never wait for a writer.
        if not await self._rows("SELECT 1 FROM messages WHERE thread_id = ? AND recorded_at < ?"
                                " LIMIT 1", (thread_id, at)):
            return 0

        async def write(sql: Statements) -> int:
            state = await read_state(sql, thread_id, self.LOCK)
            if state is None:
                return 0
            # Vectors and pins of the deleted messages go with them (ON DELETE CASCADE).
            gone = await sql.run(
                "DELETE FROM messages WHERE thread_id = ? AND recorded_at < ?", (thread_id, at)
            )
            if gone:
                first = await number(sql, "SELECT coalesce(min(seq), ?) FROM messages"
                                     " WHERE thread_id = ?", state.next_seq, thread_id)
                for table in ("compactions", "snapshots"):
                    await sql.run(f"DELETE FROM {table} WHERE thread_id = ? AND end_seq < ?",
                                  (thread_id, first))
            return gone

        return await self._driver.write(write)

    async def pop(self, thread_id: str) -> Message | None:
        async def write(sql: Statements) -> Message | None:
            if await read_state(sql, thread_id, self.LOCK) is None:
                return None
            # Vectors and pins go with the row (ON DELETE CASCADE), its search entry too.
            row = await sql.row(
                "DELETE FROM messages WHERE rowid = (SELECT rowid FROM messages WHERE"
                f" thread_id = ? ORDER BY seq DESC LIMIT 1) RETURNING {MESSAGE_COLUMNS}",
                (thread_id,),
            )
            if row is None:
                return None
            await sql.run(
                "DELETE FROM compactions WHERE thread_id = ? AND start_seq <= ?"
                " AND end_seq >= ?",
                (thread_id, row[2], row[2]),
            )
            return message_from_row(row)

        return await self._driver.write(write)

    async def compactions(self, thread_id: str) -> list[Compaction]:
        return await self._driver.read(lambda sql: read_compactions(sql, thread_id))

    async def raw(self, thread_id: str) -> list[Message]:
        return await self._driver.read(lambda sql: read_messages(sql, thread_id))

    async def uncompacted(self, thread_id: str) -> tuple[list[Compaction], list[Message]]:
        async def read(sql: Statements) -> tuple[list[Compaction], list[Message]]:
            compactions = await read_compactions(sql, thread_id)
            messages = await read_messages(
                sql, thread_id, from_seq=compacted_floor(compactions))
            return compactions, [m for m in messages if not covered(m.seq, compactions)]

        return await self._driver.together(read)

    async def recent_turns(
        self, thread_id: str, k: int
    ) -> tuple[list[Compaction], list[Message]]:
        async def read(sql: Statements) -> tuple[list[Compaction], list[Message]]:
            compactions = await read_compactions(sql, thread_id)
            picked: list[Message] = []
            turns = 0
            rows = stream_messages(sql, thread_id, from_seq=compacted_floor(compactions),
                                         newest_first=True)
            async with aclosing(rows):
                async for row in rows:
                    message = message_from_row(row)
                    if covered(message.seq, compactions):
                        continue
                    picked.append(message)
                    if message.starts_turn:
                        turns += 1
                        if turns == k:
                            break
            picked.reverse()
            return compactions, picked

        return await self._driver.together(read)

    async def add_compaction(
        self, thread_id: str, start_seq: int, end_seq: int, summary_text: str, now: datetime,
        *, replaces: Collection[int] | None = None,
    ) -> Compaction:
        at = utc(now)

        async def write(sql: Statements) -> None:
            state = await read_state(sql, thread_id, self.LOCK)
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
        async def write(sql: Statements) -> None:
            _, created = await lock_row(
                sql, thread_id, self._stamp(datetime.now(UTC)), self.LOCK)
            await delete_thread_rows(sql, thread_id)  # goals of a thread never saved too
            if created:  # no thread was saved: none made by clearing it
                await sql.run("DELETE FROM threads WHERE id = ?", (thread_id,))
                return
            await sql.run(
                "UPDATE threads SET history_len = 0, boundary_seq = next_seq,"
                " history_hash = '' WHERE id = ?",
                (thread_id,),
            )

        await self._driver.write(write)

    async def purge(self, thread_id: str) -> int:
        async def write(sql: Statements) -> int:
            await lock_row(sql, thread_id, self._stamp(datetime.now(UTC)), self.LOCK)
            gone = await delete_thread_rows(sql, thread_id)
            await sql.run("DELETE FROM threads WHERE id = ?", (thread_id,))
            await self._erased(sql, gone)
            return gone

        return await self._driver.write(write)

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
            lambda sql: read_open_goals(sql, thread_id, self.BYTE_ORDER))

    async def viewport_inputs(self, thread_id: str, token_limit: int) -> ViewportInputs:
        async def read(sql: Statements) -> ViewportInputs:
            state = await read_state(sql, thread_id)
            boundary = state.boundary_seq if state else 0
            pinned = await read_messages(
                sql, thread_id, where=" AND seq < ? AND id IN (SELECT message_id FROM pins"
                " WHERE thread_id = ?)", order="DESC", params=(boundary, thread_id),
            )
            level1 = await read_snapshots(sql, thread_id, UNCOVERED, "DESC")
            level2 = await read_snapshots(sql, thread_id, "level = 2", "DESC")
            past = await number(sql, "SELECT sum(tokens) FROM messages WHERE thread_id = ?"
                                " AND seq >= ?", thread_id, boundary)
            newest: list[Message] = []
            used = 0
            rows = stream_messages(sql, thread_id, from_seq=boundary, newest_first=True)
            async with aclosing(rows):
                async for row in rows:
                    message = message_from_row(row)
                    newest.append(message)
                    used += message.tokens
                    if used > token_limit:
                        break
            return ViewportInputs(boundary, pinned, level1, level2, past, newest)

        return await self._driver.together(read)

    async def eviction_inputs(self, thread_id: str) -> EvictionInputs:
        async def read(sql: Statements) -> EvictionInputs:
            state = await read_state(sql, thread_id)
            if state is None:
                raise NotFoundError("thread", thread_id)
            past = await read_messages(sql, thread_id, from_seq=state.boundary_seq)
            last = await read_snapshots(sql, thread_id, UNCOVERED)
            goals = await read_open_goals(sql, thread_id, self.BYTE_ORDER)
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
            state = await read_state(sql, thread_id, self.LOCK)
            if state is None or state.boundary_seq != boundary_before:
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
            f"INSERT INTO snapshots({SNAPSHOT_COLUMNS}) VALUES ({marks(8)})",
            (s.id, s.thread_id, s.level, s.start_seq, s.end_seq, s.text,
             self._stamp(s.created_at), s.covered_by),
        )

    async def uncovered_snapshots(self, thread_id: str) -> list[Snapshot]:
        return await self._driver.read(
            lambda sql: read_snapshots(sql, thread_id, UNCOVERED))

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
            lambda sql: read_snapshots(sql, thread_id, "1 = 1"))

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
        query = SearchQuery(
            words, pool_size(limit), thread_id, exclude_viewport_of, shown, where)

        async def read(sql: Statements) -> list[SearchHit]:
            scored = rank_by_recency(
                ((int(rowid), float(score), moment(at))
                 for rowid, score, at in await self._candidates(sql, query)),
                now=now, limit=limit,
            )
            if not scored:
                return []
            found = await self._snippets(sql, words, [rowid for _, rowid in scored])
            return [SearchHit(mid, tid, seq, hit_snippet(snippet, text, words), rank, role)
                    for rank, rowid in scored if rowid in found
                    for mid, tid, seq, role, snippet, text in [found[rowid]]]

        return await self._driver.together(read)

    def _unseen(self, query: SearchQuery) -> tuple[list[str], list[object]]:
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
        return [metadata_of(stored) for stored, in rows]

    async def message_ids(self, prefix: str, limit: int) -> list[str]:
        condition, params = self._prefix(prefix)
        rows = await self._rows(
            f"SELECT id FROM messages WHERE {condition} ORDER BY id{self.BYTE_ORDER} LIMIT ?",
            (*params, limit))
        return [str(row[0]) for row in rows]

    async def view(self, message_id: str, radius: int) -> MessageView:
        async def read(sql: Statements) -> MessageView:
            row = await sql.row(f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = ?",
                                (message_id,))
            if row is None:
                raise NotFoundError("message", message_id)
            target = message_from_row(row)
            near = [
                await read_messages(sql, target.thread_id, where=f" AND seq {op} ?",
                                          order=order, params=(target.seq,), limit=radius)
                if radius else []
                for op, order in (("<", "DESC"), (">", "ASC"))
            ]
            snapshots = [
                await read_snapshots(sql, target.thread_id, f"level = 1 AND start_seq {op} ?",
                                           order, (target.seq,), VIEW_SNAPSHOTS)
                for op, order in (("<=", "DESC"), (">", "ASC"))
            ]
            return MessageView(
                target=target,
                messages=[*reversed(near[0]), target, *near[1]],
                snapshots_before=list(reversed(snapshots[0])),
                snapshots_after=snapshots[1],
            )

        return await self._driver.together(read)
