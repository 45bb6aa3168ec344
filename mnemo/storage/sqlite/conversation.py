"""`SqliteThreads`: the conversation store (`mnemo.conversation.ports.ThreadStore`) over
mnemo's SQLite file.

Every statement runs in the database's own thread (see `mnemo.storage.sqlite.database`); a
write of more than one statement is one `db.atomic()` transaction. The tables are described in
`_thread_rows`; search and drill-down are in `conversation_search`.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Collection, Sequence
from datetime import datetime

from sqlite_utils import Database as SqliteUtilsDatabase

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
from mnemo.graph.model import Vector, vector_from_blob, vector_to_blob
from mnemo.graph.scope import Where, canonical
from mnemo.storage.sqlite import conversation_search
from mnemo.storage.sqlite._thread_rows import (
    MESSAGE_COLUMNS,
    SNAPSHOT_COLUMNS,
    compaction_from_row,
    delete_thread_rows,
    insert_snapshot,
    iter_messages,
    message_from_row,
    read_compactions,
    read_open_goals,
    read_state,
    read_uncovered_l1,
    snapshot_from_row,
    timestamp,
    write_pins,
)
from mnemo.storage.sqlite.database import Database, side_write


class SqliteThreads:
    """`ThreadStore` over mnemo's SQLite file."""

    def __init__(self, database: Database) -> None:
        self._database = database

    # ---- the log --------------------------------------------------------------------------

    async def state(self, thread_id: str) -> ThreadState | None:
        return await self._database.run(lambda db: read_state(db, thread_id))

    async def threads(self) -> list[ThreadInfo]:
        rows = await self._database.run(
            lambda db: db.conn.execute(
                "SELECT t.id, (SELECT count(*) FROM messages m WHERE m.thread_id = t.id),"
                " t.next_seq, t.boundary_seq, t.created_at FROM threads t"
                " ORDER BY t.created_at, t.id"
            ).fetchall()
        )
        return [
            ThreadInfo(thread_id, messages, next_seq, boundary, datetime.fromisoformat(created))
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
        stamp = timestamp(recorded_at)
        ids = [f"msg_{uuid.uuid4().hex}" for _ in drafts]
        blobs = None if vectors is None else [vector_to_blob(v) for v in vectors]

        def write(db: SqliteUtilsDatabase) -> list[Message]:
            conn = db.conn
            with db.atomic():
                state = read_state(db, thread_id)
                if state is None:
                    conn.execute(
                        "INSERT INTO threads(id, next_seq, history_len, boundary_seq, created_at,"
                        " history_hash) VALUES (?, 0, 0, 0, ?, '')",
                        (thread_id, stamp),
                    )
                    state = ThreadState(0, 0, 0)
                check_expected(thread_id, state, expected_len, expected_hash)
                rows = [
                    (
                        ids[i], thread_id, state.next_seq + i, d.role, d.text,
                        None if d.content == d.text else d.content,
                        json.dumps(d.data, sort_keys=True), stamp, d.tokens,
                        canonical(d.metadata),
                    )
                    for i, d in enumerate(drafts)
                ]
                conn.executemany(
                    f"INSERT INTO messages({MESSAGE_COLUMNS})"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
                conn.execute(
                    "UPDATE threads SET next_seq = ?, history_len = ?, history_hash = ?"
                    " WHERE id = ?",
                    (state.next_seq + len(drafts), state.history_len + len(drafts),
                     next_hash(state, drafts, expected_hash), thread_id),
                )
                if blobs is not None:
                    conn.executemany(
                        "INSERT INTO message_vectors(message_id, thread_id, vec) VALUES (?, ?, ?)",
                        [(ids[i], thread_id, blob) for i, blob in enumerate(blobs)],
                    )
            return [message_from_row(row) for row in rows]

        return await self._database.run(write)

    async def first_difference(
        self, thread_id: str, from_seq: int, keys: Sequence[bytes]
    ) -> int | None:
        def read(db: SqliteUtilsDatabase) -> int | None:
            for message in iter_messages(db, thread_id, from_seq=from_seq):
                if message.seq - from_seq >= len(keys):
                    break
                if differs(message, from_seq, keys):
                    return message.seq
            return None

        return await self._database.run(read)

    async def expire(self, thread_id: str, cutoff: datetime) -> int:
        stamp = timestamp(cutoff)

        def write(db: SqliteUtilsDatabase) -> int:
            conn = db.conn
            # Nothing due, no write lock: a ttl manager's reads (each expires first) would
            # otherwise take it every time, and fail "busy" while another writer held it.
            if not _any_before(conn, thread_id, stamp):
                return 0
            with db.atomic():
                gone: int = conn.execute(
                    "DELETE FROM messages WHERE thread_id = ? AND recorded_at < ?",
                    (thread_id, stamp),
                ).rowcount
                if gone:
                    first = conn.execute(
                        "SELECT min(seq) FROM messages WHERE thread_id = ?", (thread_id,)
                    ).fetchone()[0]
                    if first is None:
                        state = read_state(db, thread_id)
                        first = state.next_seq if state else 0
                    for table in ("compactions", "snapshots"):
                        conn.execute(
                            f"DELETE FROM {table} WHERE thread_id = ? AND end_seq < ?",
                            (thread_id, first),
                        )
            return gone

        return await self._database.run(write)

    async def pop(self, thread_id: str) -> Message | None:
        def write(db: SqliteUtilsDatabase) -> Message | None:
            conn = db.conn
            with db.atomic():
                # Vectors and pins go with the row (ON DELETE CASCADE), its search entry by
                # trigger.
                row = conn.execute(
                    "DELETE FROM messages WHERE rowid = (SELECT rowid FROM messages"
                    " WHERE thread_id = ? ORDER BY seq DESC LIMIT 1)"
                    f" RETURNING {MESSAGE_COLUMNS}",
                    (thread_id,),
                ).fetchone()
                if row is None:
                    return None
                conn.execute(
                    "DELETE FROM compactions WHERE thread_id = ? AND start_seq <= ?"
                    " AND end_seq >= ?",
                    (thread_id, row[2], row[2]),
                )
            return message_from_row(row)

        return await self._database.run(write)

    async def compactions(self, thread_id: str) -> list[Compaction]:
        return await self._database.run(lambda db: read_compactions(db, thread_id))

    async def raw(self, thread_id: str) -> list[Message]:
        return await self._database.run(lambda db: list(iter_messages(db, thread_id)))

    async def uncompacted(self, thread_id: str) -> tuple[list[Compaction], list[Message]]:
        def read(db: SqliteUtilsDatabase) -> tuple[list[Compaction], list[Message]]:
            compactions = read_compactions(db, thread_id)
            floor = compacted_floor(compactions)
            rest = [
                m for m in iter_messages(db, thread_id, from_seq=floor)
                if not covered(m.seq, compactions)
            ]
            return compactions, rest

        return await self._database.run(read)

    async def recent_turns(
        self, thread_id: str, k: int
    ) -> tuple[list[Compaction], list[Message]]:
        def read(db: SqliteUtilsDatabase) -> tuple[list[Compaction], list[Message]]:
            compactions = read_compactions(db, thread_id)
            floor = compacted_floor(compactions)
            picked: list[Message] = []
            turns = 0
            for message in iter_messages(db, thread_id, from_seq=floor, newest_first=True):
                if covered(message.seq, compactions):
                    continue
                picked.append(message)
                if message.starts_turn:
                    turns += 1
                    if turns == k:
                        break
            picked.reverse()
            return compactions, picked

        return await self._database.run(read)

    async def add_compaction(
        self, thread_id: str, start_seq: int, end_seq: int, summary_text: str, now: datetime,
        *, replaces: Collection[int] | None = None,
    ) -> Compaction:
        stamp = timestamp(now)

        def write(db: SqliteUtilsDatabase) -> Compaction:
            conn = db.conn
            with db.atomic():
                state = read_state(db, thread_id)
                if state is None:
                    raise NotFoundError("thread", thread_id)
                if end_seq >= state.next_seq:
                    raise InvalidInputError(
                        f"end_seq {end_seq} is past the last message of thread {thread_id!r}"
                        f" (seq {state.next_seq - 1})"
                    )
                overlapping = conn.execute(
                    "SELECT start_seq, end_seq FROM compactions WHERE thread_id = ?"
                    " AND start_seq <= ? AND end_seq >= ?",
                    (thread_id, end_seq, start_seq),
                ).fetchall()
                inside = replaced_compactions(
                    thread_id, start_seq, end_seq, overlapping, replaces)
                conn.executemany(
                    "DELETE FROM compactions WHERE thread_id = ? AND start_seq = ?",
                    [(thread_id, s) for s in inside],
                )
                conn.execute(
                    "INSERT INTO compactions(thread_id, start_seq, end_seq, summary_text,"
                    " created_at) VALUES (?, ?, ?, ?, ?)",
                    (thread_id, start_seq, end_seq, summary_text, stamp),
                )
            return compaction_from_row(thread_id, (start_seq, end_seq, summary_text, stamp))

        return await self._database.run(write)

    async def vectors(self, thread_id: str) -> dict[str, Vector]:
        rows = await self._database.run(
            lambda db: db.conn.execute(
                "SELECT message_id, vec FROM message_vectors WHERE thread_id = ?",
                (thread_id,),
            ).fetchall()
        )
        return {message_id: vector_from_blob(blob) for message_id, blob in rows}

    async def save_vectors(self, thread_id: str, rows: Sequence[tuple[str, Vector]]) -> None:
        params = [(mid, thread_id, vector_to_blob(vec), mid) for mid, vec in rows]

        def write(db: SqliteUtilsDatabase) -> None:
            with side_write(db):
                db.conn.executemany(
                    "INSERT OR REPLACE INTO message_vectors(message_id, thread_id, vec)"
                    " SELECT ?, ?, ? WHERE EXISTS (SELECT 1 FROM messages WHERE id = ?)",
                    params,
                )

        await self._database.run(write)

    async def clear(self, thread_id: str) -> None:
        def write(db: SqliteUtilsDatabase) -> None:
            with db.atomic():
                delete_thread_rows(db, thread_id)
                db.conn.execute(
                    "UPDATE threads SET history_len = 0, boundary_seq = next_seq,"
                    " history_hash = '' WHERE id = ?",
                    (thread_id,),
                )

        await self._database.run(write)

    async def purge(self, thread_id: str) -> int:
        """Erases the thread without a trace; returns how many messages went.

        Everything of the thread is deleted in one transaction with `PRAGMA secure_delete`
        on (freed pages are zeroed), then the search index is merged (`optimize`): FTS5 marks
        deleted entries in new segments but keeps the words in the old ones until a merge.
        Finally the WAL is checkpointed and truncated, so no old page image survives in it.
        The merge costs time proportional to the whole index (see the benchmark); it is
        skipped when the thread had no message.
        """

        def write(db: SqliteUtilsDatabase) -> int:
            conn = db.conn
            previous = int(conn.execute("PRAGMA secure_delete").fetchone()[0])
            conn.execute("PRAGMA secure_delete = 1")
            try:
                with db.atomic():
                    gone = delete_thread_rows(db, thread_id)
                    conn.execute("DELETE FROM threads WHERE id = ?", (thread_id,))
                    if gone:
                        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('optimize')")
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            finally:
                conn.execute(f"PRAGMA secure_delete = {previous}")
            return gone

        return await self._database.run(write)

    # ---- goals and pins -------------------------------------------------------------------

    async def add_goal(self, thread_id: str, description: str, now: datetime) -> str:
        goal_id = f"goal_{uuid.uuid4().hex}"

        def write(db: SqliteUtilsDatabase) -> None:
            with db.atomic():
                db.conn.execute(
                    "INSERT INTO goals(id, thread_id, description, status, created_at)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (goal_id, thread_id, description, GOAL_OPEN, timestamp(now)),
                )

        await self._database.run(write)
        return goal_id

    async def complete_goal(self, goal_id: str, now: datetime) -> int:
        def write(db: SqliteUtilsDatabase) -> int:
            with db.atomic():
                updated = db.conn.execute(
                    "UPDATE goals SET status = ?, completed_at = ? WHERE id = ? AND status = ?",
                    (GOAL_COMPLETED, timestamp(now), goal_id, GOAL_OPEN),
                ).rowcount
                if not updated:
                    known = db.conn.execute(
                        "SELECT 1 FROM goals WHERE id = ?", (goal_id,)
                    ).fetchone()
                    if known is None:
                        raise NotFoundError("goal", goal_id)
                released: int = db.conn.execute(
                    "DELETE FROM pins WHERE goal_id = ?", (goal_id,)
                ).rowcount
                return released

        return await self._database.run(write)

    async def open_goals(self, thread_id: str) -> list[Goal]:
        return await self._database.run(lambda db: read_open_goals(db, thread_id))

    # ---- viewport, eviction and snapshots -------------------------------------------------

    async def viewport_inputs(self, thread_id: str, token_limit: int) -> ViewportInputs:
        def read(db: SqliteUtilsDatabase) -> ViewportInputs:
            conn = db.conn
            state = read_state(db, thread_id)
            boundary = state.boundary_seq if state else 0
            pinned = [
                message_from_row(row)
                for row in conn.execute(
                    f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE thread_id = ? AND seq < ?"
                    " AND id IN (SELECT message_id FROM pins WHERE thread_id = ?)"
                    " ORDER BY seq DESC",
                    (thread_id, boundary, thread_id),
                )
            ]
            level1 = [
                snapshot_from_row(row)
                for row in conn.execute(
                    f"SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE thread_id = ? AND level = 1"
                    " AND covered_by IS NULL ORDER BY start_seq DESC",
                    (thread_id,),
                )
            ]
            level2 = [
                snapshot_from_row(row)
                for row in conn.execute(
                    f"SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE thread_id = ? AND level = 2"
                    " ORDER BY start_seq DESC",
                    (thread_id,),
                )
            ]
            past = int(
                conn.execute(
                    "SELECT coalesce(sum(tokens), 0) FROM messages WHERE thread_id = ?"
                    " AND seq >= ?",
                    (thread_id, boundary),
                ).fetchone()[0]
            )
            newest: list[Message] = []
            used = 0
            # Newest first, up to and including the first message past the limit: the rows
            # are read lazily, so a long backlog past the boundary is never read whole.
            for message in iter_messages(db, thread_id, from_seq=boundary, newest_first=True):
                newest.append(message)
                used += message.tokens
                if used > token_limit:
                    break
            return ViewportInputs(boundary, pinned, level1, level2, past, newest)

        return await self._database.run(read)

    async def eviction_inputs(self, thread_id: str) -> EvictionInputs:
        def read(db: SqliteUtilsDatabase) -> EvictionInputs:
            state = read_state(db, thread_id)
            if state is None:
                raise NotFoundError("thread", thread_id)
            past = list(iter_messages(db, thread_id, from_seq=state.boundary_seq))
            last = read_uncovered_l1(db, thread_id)
            return EvictionInputs(
                state.boundary_seq, past, read_open_goals(db, thread_id),
                last[-1].text if last else "",
            )

        return await self._database.run(read)

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
        stamp = timestamp(now)

        def write(db: SqliteUtilsDatabase) -> Snapshot | None:
            with db.atomic():
                state = read_state(db, thread_id)
                if state is None or state.boundary_seq != boundary_before:
                    raise ConflictError(f"thread {thread_id!r} changed during eviction")
                db.conn.execute(
                    "UPDATE threads SET boundary_seq = ? WHERE id = ?",
                    (boundary_after, thread_id),
                )
                write_pins(db, thread_id, pins, now)
                if not snapshot_text.strip():
                    return None
                snapshot = Snapshot(
                    f"snap_{uuid.uuid4().hex}", thread_id, 1, zone[0], zone[1], snapshot_text,
                    datetime.fromisoformat(stamp),
                )
                insert_snapshot(db, snapshot)
            return snapshot

        return await self._database.run(write)

    async def uncovered_snapshots(self, thread_id: str) -> list[Snapshot]:
        return await self._database.run(lambda db: read_uncovered_l1(db, thread_id))

    async def commit_fold(
        self, thread_id: str, covered: Sequence[Snapshot], text: str, now: datetime
    ) -> Snapshot | None:
        stamp = timestamp(now)
        level2 = Snapshot(
            f"snap_{uuid.uuid4().hex}", thread_id, 2, min(s.start_seq for s in covered),
            max(s.end_seq for s in covered), text, datetime.fromisoformat(stamp),
        )

        def write(db: SqliteUtilsDatabase) -> Snapshot | None:
            with db.atomic():
                marks = ",".join("?" * len(covered))
                still = db.conn.execute(
                    f"SELECT count(*) FROM snapshots WHERE id IN ({marks})"
                    " AND covered_by IS NULL",
                    [s.id for s in covered],
                ).fetchone()[0]
                if still != len(covered):
                    return None
                insert_snapshot(db, level2)
                db.conn.execute(
                    f"UPDATE snapshots SET covered_by = ? WHERE id IN ({marks})",
                    [level2.id, *[s.id for s in covered]],
                )
            return level2

        return await self._database.run(write)

    async def snapshots(self, thread_id: str) -> list[Snapshot]:
        rows = await self._database.run(
            lambda db: db.conn.execute(
                f"SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE thread_id = ?"
                " ORDER BY level, start_seq",
                (thread_id,),
            ).fetchall()
        )
        return [snapshot_from_row(row) for row in rows]

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
        return await self._database.run(
            lambda db: conversation_search.search(
                db, words, limit=limit, now=now, thread_id=thread_id,
                exclude_viewport_of=exclude_viewport_of, shown=shown, where=where,
            )
        )

    async def message_ids(self, prefix: str, limit: int) -> list[str]:
        return await self._database.run(
            lambda db: conversation_search.message_ids(db, prefix, limit)
        )

    async def view(self, message_id: str, radius: int) -> MessageView:
        return await self._database.run(
            lambda db: conversation_search.view(db, message_id, radius)
        )


def _any_before(conn: sqlite3.Connection, thread_id: str, stamp: str) -> bool:
    """Whether the thread has a message recorded before `stamp` (an index seek)."""
    return conn.execute(
        "SELECT 1 FROM messages WHERE thread_id = ? AND recorded_at < ? LIMIT 1",
        (thread_id, stamp),
    ).fetchone() is not None
