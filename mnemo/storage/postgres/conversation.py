"""`PgThreads`: the conversation store (`mnemo.conversation.ports.ThreadStore`) over mnemo's
PostgreSQL database.

Every write is one transaction. A write that depends on a thread's counters (append, expire,
compaction, eviction, clear, purge) first locks the thread's row (`SELECT ... FOR UPDATE`), so
writers of one thread take turns as they do behind SQLite's single writer: of two appends
racing with the same expected length, the second reads the first's count and raises
`ConflictError`. A read of several statements runs in one REPEATABLE READ transaction. The
tables are described in `_thread_rows`; search and drill-down are in `conversation_search`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Sequence
from datetime import UTC, datetime

import numpy as np

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
from mnemo.errors import ConflictError, InvalidInputError, NotFoundError
from mnemo.graph.model import Vector
from mnemo.graph.scope import Where
from mnemo.storage.postgres import conversation_search
from mnemo.storage.postgres._thread_rows import (
    MESSAGE_COLUMNS,
    delete_thread_rows,
    fetch,
    fetch_one,
    insert_snapshot,
    iter_messages,
    message_from_row,
    message_row,
    read_compactions,
    read_messages,
    read_open_goals,
    read_snapshots,
    read_state,
    read_uncovered_l1,
    reading,
    utc,
    write_pins,
)
from mnemo.storage.postgres.connection import Connection, Postgres


def _vector(vector: Vector) -> Vector:
    # `register_vector` sends exactly the numpy arrays as pgvector's `vector`.
    return np.asarray(vector, dtype=np.float32).reshape(-1)


# Times a write takes the thread's row again after a purge deleted it under the lock wait.
_LOCK_ATTEMPTS = 3


async def _lock_row(conn: Connection, thread_id: str, at: datetime) -> tuple[ThreadState, bool]:
    """Locks the thread's row until the transaction ends, creating it first when there is
    none (True then): the first save and a purge or clear of a new thread take turns on its
    key, as they do behind SQLite's single writer. Locking nothing when the row is not
    there yet, a save that commits between a purge's statements would leave messages
    without a thread, or a clear would keep them while resetting the count. A purge that
    deletes the row while this waits for its lock is met by creating the row again.

    Raises:
        ConflictError: purges deleted the row under each of `_LOCK_ATTEMPTS` waits.
    """
    for _ in range(_LOCK_ATTEMPTS):
        cur = await conn.execute(
            "INSERT INTO threads(id, next_seq, history_len, boundary_seq, created_at,"
            " history_hash) VALUES (%s, 0, 0, 0, %s, '') ON CONFLICT (id) DO NOTHING"
            " RETURNING id",
            (thread_id, at),
        )
        created = await cur.fetchone() is not None
        state = await read_state(conn, thread_id, lock=True)
        if state is not None:
            return state, created
    raise ConflictError(f"thread {thread_id!r} was purged while waiting for it, each time")


class PgThreads:
    """`ThreadStore` over mnemo's PostgreSQL database."""

    def __init__(self, pg: Postgres) -> None:
        self._pg = pg

    # ---- the log --------------------------------------------------------------------------

    async def state(self, thread_id: str) -> ThreadState | None:
        async with self._pg.connection() as conn:
            return await read_state(conn, thread_id)

    async def threads(self) -> list[ThreadInfo]:
        async with self._pg.connection() as conn:
            rows = await fetch(
                conn,
                "SELECT t.id, (SELECT count(*) FROM messages m WHERE m.thread_id = t.id),"
                " t.next_seq, t.boundary_seq, t.created_at FROM threads t"
                ' ORDER BY t.created_at, t.id COLLATE "C"',
            )
        return [
            ThreadInfo(tid, int(n), next_seq, boundary, utc(created))
            for tid, n, next_seq, boundary, created in rows
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
        arrays = None if vectors is None else [_vector(v) for v in vectors]
        async with self._pg.transaction() as conn:
            state, _ = await _lock_row(conn, thread_id, at)
            check_expected(thread_id, state, expected_len, expected_hash)
            rows = [
                message_row(ids[i], thread_id, state.next_seq + i, d.role, d.text, d.content,
                            d.data, at, d.tokens, d.metadata)
                for i, d in enumerate(drafts)
            ]
            async with conn.cursor() as cur:
                if rows:
                    await cur.executemany(
                        f"INSERT INTO messages({MESSAGE_COLUMNS})"
                        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        rows,
                    )
                if arrays:
                    await cur.executemany(
                        "INSERT INTO message_vectors(message_id, thread_id, vec)"
                        " VALUES (%s, %s, %s)",
                        [(ids[i], thread_id, vec) for i, vec in enumerate(arrays)],
                    )
            await conn.execute(
                "UPDATE threads SET next_seq = %s, history_len = %s, history_hash = %s"
                " WHERE id = %s",
                (state.next_seq + len(drafts), state.history_len + len(drafts),
                 next_hash(state, drafts, expected_hash), thread_id),
            )
        # As read back: the data through JSON, as SQLite's append gives it.
        return [
            Message(ids[i], thread_id, state.next_seq + i, d.role, d.content,
                    json.loads(json.dumps(d.data, sort_keys=True)), at, d.tokens)
            for i, d in enumerate(drafts)
        ]

    async def first_difference(
        self, thread_id: str, from_seq: int, keys: Sequence[bytes]
    ) -> int | None:
        async with reading(self._pg) as conn:
            async for message in iter_messages(conn, thread_id, from_seq=from_seq,
                                               newest_first=False):
                if message.seq - from_seq >= len(keys):
                    break
                if differs(message, from_seq, keys):
                    return message.seq
        return None

    async def expire(self, thread_id: str, cutoff: datetime) -> int:
        # Nothing due, no lock on the thread: a ttl manager's reads (each expires first)
        # would otherwise wait behind, and fail for, another writer of the thread.
        due = await self._pg.fetch_all(
            "SELECT 1 FROM messages WHERE thread_id = %s AND recorded_at < %s LIMIT 1",
            (thread_id, utc(cutoff)),
        )
        if not due:
            return 0
        async with self._pg.transaction() as conn:
            state = await read_state(conn, thread_id, lock=True)
            if state is None:
                return 0
            # Vectors and pins of the deleted messages go with them (ON DELETE CASCADE).
            cur = await conn.execute(
                "DELETE FROM messages WHERE thread_id = %s AND recorded_at < %s",
                (thread_id, utc(cutoff)),
            )
            gone = max(cur.rowcount, 0)
            if gone:
                row = await fetch_one(
                    conn, "SELECT min(seq) FROM messages WHERE thread_id = %s", (thread_id,)
                )
                first = state.next_seq if row is None or row[0] is None else int(row[0])
                for table in ("compactions", "snapshots"):
                    await conn.execute(
                        f"DELETE FROM {table} WHERE thread_id = %s AND end_seq < %s",
                        (thread_id, first),
                    )
        return gone

    async def pop(self, thread_id: str) -> Message | None:
        async with self._pg.transaction() as conn:
            if await read_state(conn, thread_id, lock=True) is None:
                return None
            # Vectors and pins go with the row (ON DELETE CASCADE), its search vector is a
            # column of it.
            row = await fetch_one(
                conn,
                "DELETE FROM messages WHERE id = (SELECT id FROM messages"
                " WHERE thread_id = %s ORDER BY seq DESC LIMIT 1)"
                f" RETURNING {MESSAGE_COLUMNS}",
                (thread_id,),
            )
            if row is None:
                return None
            await conn.execute(
                "DELETE FROM compactions WHERE thread_id = %s AND start_seq <= %s"
                " AND end_seq >= %s",
                (thread_id, row[2], row[2]),
            )
        return message_from_row(row)

    async def compactions(self, thread_id: str) -> list[Compaction]:
        async with self._pg.connection() as conn:
            return await read_compactions(conn, thread_id)

    async def raw(self, thread_id: str) -> list[Message]:
        async with self._pg.connection() as conn:
            return await read_messages(conn, thread_id)

    async def uncompacted(self, thread_id: str) -> tuple[list[Compaction], list[Message]]:
        async with reading(self._pg) as conn:
            compactions = await read_compactions(conn, thread_id)
            floor = compacted_floor(compactions)
            messages = await read_messages(conn, thread_id, from_seq=floor)
        return compactions, [m for m in messages if not covered(m.seq, compactions)]

    async def recent_turns(
        self, thread_id: str, k: int
    ) -> tuple[list[Compaction], list[Message]]:
        picked: list[Message] = []
        async with reading(self._pg) as conn:
            compactions = await read_compactions(conn, thread_id)
            floor = compacted_floor(compactions)
            turns = 0
            async for message in iter_messages(conn, thread_id, from_seq=floor):
                if covered(message.seq, compactions):
                    continue
                picked.append(message)
                if message.starts_turn:
                    turns += 1
                    if turns == k:
                        break
        picked.reverse()
        return compactions, picked

    async def add_compaction(
        self, thread_id: str, start_seq: int, end_seq: int, summary_text: str, now: datetime,
        *, replaces: Collection[int] | None = None,
    ) -> Compaction:
        at = utc(now)
        async with self._pg.transaction() as conn:
            state = await read_state(conn, thread_id, lock=True)
            if state is None:
                raise NotFoundError("thread", thread_id)
            if end_seq >= state.next_seq:
                raise InvalidInputError(
                    f"end_seq {end_seq} is past the last message of thread {thread_id!r}"
                    f" (seq {state.next_seq - 1})"
                )
            overlapping = await fetch(
                conn,
                "SELECT start_seq, end_seq FROM compactions WHERE thread_id = %s"
                " AND start_seq <= %s AND end_seq >= %s",
                (thread_id, end_seq, start_seq),
            )
            inside = replaced_compactions(
                thread_id, start_seq, end_seq, [(s, e) for s, e in overlapping], replaces)
            await conn.execute(
                "DELETE FROM compactions WHERE thread_id = %s AND start_seq = ANY(%s)",
                (thread_id, inside),
            )
            await conn.execute(
                "INSERT INTO compactions(thread_id, start_seq, end_seq, summary_text,"
                " created_at) VALUES (%s, %s, %s, %s, %s)",
                (thread_id, start_seq, end_seq, summary_text, at),
            )
        return Compaction(thread_id, start_seq, end_seq, summary_text, at)

    async def vectors(self, thread_id: str) -> dict[str, Vector]:
        async with self._pg.connection() as conn:
            rows = await fetch(
                conn,
                "SELECT message_id, vec FROM message_vectors WHERE thread_id = %s",
                (thread_id,),
            )
        return {mid: vec for mid, vec in rows}

    async def save_vectors(self, thread_id: str, rows: Sequence[tuple[str, Vector]]) -> None:
        params = [(mid, thread_id, _vector(vec), mid) for mid, vec in rows]
        if not params:
            return
        async with self._pg.transaction() as conn, conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO message_vectors(message_id, thread_id, vec)"
                " SELECT %s, %s, %s WHERE EXISTS (SELECT 1 FROM messages WHERE id = %s)"
                " ON CONFLICT (message_id) DO UPDATE"
                " SET thread_id = excluded.thread_id, vec = excluded.vec",
                params,
            )

    async def clear(self, thread_id: str) -> None:
        async with self._pg.transaction() as conn:
            _, created = await _lock_row(conn, thread_id, datetime.now(UTC))
            if created:  # no thread: nothing to clear, and no thread made by it
                await conn.execute("DELETE FROM threads WHERE id = %s", (thread_id,))
                return
            await delete_thread_rows(conn, thread_id)
            await conn.execute(
                "UPDATE threads SET history_len = 0, boundary_seq = next_seq,"
                " history_hash = '' WHERE id = %s",
                (thread_id,),
            )

    async def purge(self, thread_id: str) -> int:
        """Erases the thread without a trace; returns how many messages went.

        Every row of the thread is deleted in one transaction, its counter row too; a
        message's search vector is a column of its row, so no index entry names the thread's
        words once the deletion commits. The deleted row versions stay in the table's pages
        until VACUUM reclaims them (and in the WAL until it is recycled): what an operator
        does about those is in the README.
        """
        async with self._pg.transaction() as conn:
            await _lock_row(conn, thread_id, datetime.now(UTC))
            gone = await delete_thread_rows(conn, thread_id)
            await conn.execute("DELETE FROM threads WHERE id = %s", (thread_id,))
        return gone

    # ---- goals and pins -------------------------------------------------------------------

    async def add_goal(self, thread_id: str, description: str, now: datetime) -> str:
        goal_id = f"goal_{uuid.uuid4().hex}"
        async with self._pg.transaction() as conn:
            await conn.execute(
                "INSERT INTO goals(id, thread_id, description, status, created_at)"
                " VALUES (%s, %s, %s, %s, %s)",
                (goal_id, thread_id, description, GOAL_OPEN, utc(now)),
            )
        return goal_id

    async def complete_goal(self, goal_id: str, now: datetime) -> int:
        async with self._pg.transaction() as conn:
            cur = await conn.execute(
                "UPDATE goals SET status = %s, completed_at = %s WHERE id = %s AND status = %s",
                (GOAL_COMPLETED, utc(now), goal_id, GOAL_OPEN),
            )
            if cur.rowcount <= 0:
                cur = await conn.execute("SELECT 1 FROM goals WHERE id = %s", (goal_id,))
                if await cur.fetchone() is None:
                    raise NotFoundError("goal", goal_id)
            cur = await conn.execute("DELETE FROM pins WHERE goal_id = %s", (goal_id,))
            return max(cur.rowcount, 0)

    async def open_goals(self, thread_id: str) -> list[Goal]:
        async with self._pg.connection() as conn:
            return await read_open_goals(conn, thread_id)

    # ---- viewport, eviction and snapshots -------------------------------------------------

    async def viewport_inputs(self, thread_id: str, token_limit: int) -> ViewportInputs:
        async with reading(self._pg) as conn:
            state = await read_state(conn, thread_id)
            boundary = state.boundary_seq if state else 0
            pinned = [
                message_from_row(row)
                for row in await fetch(
                    conn,
                    f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE thread_id = %s AND seq < %s"
                    " AND id IN (SELECT message_id FROM pins WHERE thread_id = %s)"
                    " ORDER BY seq DESC",
                    (thread_id, boundary, thread_id),
                )
            ]
            level1 = await read_snapshots(
                conn, thread_id, "level = 1 AND covered_by IS NULL", "start_seq DESC"
            )
            level2 = await read_snapshots(conn, thread_id, "level = 2", "start_seq DESC")
            row = await fetch_one(
                conn,
                "SELECT coalesce(sum(tokens), 0) FROM messages WHERE thread_id = %s"
                " AND seq >= %s",
                (thread_id, boundary),
            )
            past = int(row[0]) if row else 0
            newest: list[Message] = []
            used = 0
            # Newest first, up to and including the first message past the limit: the rows
            # come a page at a time, so a long backlog past the boundary is never read whole.
            async for message in iter_messages(conn, thread_id, from_seq=boundary):
                newest.append(message)
                used += message.tokens
                if used > token_limit:
                    break
        return ViewportInputs(boundary, pinned, level1, level2, past, newest)

    async def eviction_inputs(self, thread_id: str) -> EvictionInputs:
        async with reading(self._pg) as conn:
            state = await read_state(conn, thread_id)
            if state is None:
                raise NotFoundError("thread", thread_id)
            past = await read_messages(conn, thread_id, from_seq=state.boundary_seq)
            last = await read_uncovered_l1(conn, thread_id)
            goals = await read_open_goals(conn, thread_id)
        return EvictionInputs(state.boundary_seq, past, goals, last[-1].text if last else "")

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
        snapshot = None
        if snapshot_text.strip():
            snapshot = Snapshot(
                f"snap_{uuid.uuid4().hex}", thread_id, 1, zone[0], zone[1], snapshot_text,
                utc(now),
            )
        async with self._pg.transaction() as conn:
            state = await read_state(conn, thread_id, lock=True)
            if state is None or state.boundary_seq != boundary_before:
                raise ConflictError(f"thread {thread_id!r} changed during eviction")
            await conn.execute(
                "UPDATE threads SET boundary_seq = %s WHERE id = %s", (boundary_after, thread_id)
            )
            await write_pins(conn, thread_id, pins, now)
            if snapshot is not None:
                await insert_snapshot(conn, snapshot)
        return snapshot

    async def uncovered_snapshots(self, thread_id: str) -> list[Snapshot]:
        async with self._pg.connection() as conn:
            return await read_uncovered_l1(conn, thread_id)

    async def commit_fold(
        self, thread_id: str, covered: Sequence[Snapshot], text: str, now: datetime
    ) -> Snapshot | None:
        level2 = Snapshot(
            f"snap_{uuid.uuid4().hex}", thread_id, 2, min(s.start_seq for s in covered),
            max(s.end_seq for s in covered), text, utc(now),
        )
        ids = [s.id for s in covered]
        async with self._pg.transaction() as conn:
            # Locking the rows makes a racing fold wait, then re-check `covered_by` on the
            # version this one committed, and find them covered.
            cur = await conn.execute(
                "SELECT id FROM snapshots WHERE id = ANY(%s) AND covered_by IS NULL FOR UPDATE",
                (ids,),
            )
            if len(await cur.fetchall()) != len(ids):
                return None
            await insert_snapshot(conn, level2)
            await conn.execute(
                "UPDATE snapshots SET covered_by = %s WHERE id = ANY(%s)", (level2.id, ids)
            )
        return level2

    async def snapshots(self, thread_id: str) -> list[Snapshot]:
        async with self._pg.connection() as conn:
            return await read_snapshots(conn, thread_id, "true", "level, start_seq")

    # ---- search and drill-down ------------------------------------------------------------

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
        async with reading(self._pg) as conn:
            return await conversation_search.search(
                conn, words, limit=limit, now=now, thread_id=thread_id,
                exclude_viewport_of=exclude_viewport_of, shown=shown, where=where,
            )

    async def message_ids(self, prefix: str, limit: int) -> list[str]:
        async with reading(self._pg) as conn:
            rows = await fetch(
                conn, "SELECT id FROM messages WHERE starts_with(id, %s) ORDER BY id LIMIT %s",
                (prefix, limit),
            )
        return [str(row[0]) for row in rows]

    async def view(self, message_id: str, radius: int) -> MessageView:
        async with reading(self._pg) as conn:
            return await conversation_search.view(conn, message_id, radius)

