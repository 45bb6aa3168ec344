"""`ThreadLog`: the append-only message log of every thread, in mnemo's SQLite file.

Tables (migration `m003_conversation`): `threads` (the seq counter, the caller's history
length and the eviction boundary), `messages` (+ the `messages_fts` index kept by triggers),
`message_vectors`, `compactions`. Message rows are inserted and deleted, never updated.

Small keyed writes (an append of a few messages, a compaction record) run inline on the event
loop; reads that may scan a thread and deletes of many rows run in the worker thread (see
`mnemo.storage.sqlite.database`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.conversation.drafts import MessageDraft
from mnemo.conversation.model import Compaction, Message, ThreadInfo
from mnemo.errors import ConflictError, InvalidInputError, NotFoundError
from mnemo.storage.sqlite.database import Database

# Appends of up to this many messages run inline; a first save of a long history does not.
_INLINE_APPEND = 16

MESSAGE_COLUMNS = "id, thread_id, seq, role, text, content, data, recorded_at, tokens"


def timestamp(moment: datetime) -> str:
    """UTC ISO-8601 text with microseconds, so that text order is time order (a naive
    datetime is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def message_from_row(row: Sequence[Any]) -> Message:
    """A `Message` from a row of `MESSAGE_COLUMNS`."""
    message_id, thread_id, seq, role, text, content, data, recorded_at, tokens = row
    return Message(
        id=message_id,
        thread_id=thread_id,
        seq=seq,
        role=role,
        content=text if content is None else content,
        data=json.loads(data),
        recorded_at=datetime.fromisoformat(recorded_at),
        tokens=tokens,
    )


def compaction_from_row(thread_id: str, row: Sequence[Any]) -> Compaction:
    start, end, text, created_at = row
    return Compaction(thread_id, start, end, text, datetime.fromisoformat(created_at))


@dataclass(frozen=True, slots=True)
class ThreadState:
    """A thread's counters: the next seq to give, how many messages of the caller's history
    are stored, and where the viewport starts."""

    next_seq: int
    history_len: int
    boundary_seq: int


def read_state(db: SqliteUtilsDatabase, thread_id: str) -> ThreadState | None:
    row = db.conn.execute(
        "SELECT next_seq, history_len, boundary_seq FROM threads WHERE id = ?", (thread_id,)
    ).fetchone()
    return None if row is None else ThreadState(*row)


def read_compactions(db: SqliteUtilsDatabase, thread_id: str) -> list[Compaction]:
    return [
        compaction_from_row(thread_id, row)
        for row in db.conn.execute(
            "SELECT start_seq, end_seq, summary_text, created_at FROM compactions"
            " WHERE thread_id = ? ORDER BY start_seq",
            (thread_id,),
        )
    ]


def compacted_floor(compactions: Sequence[Compaction]) -> int:
    """The lowest seq that the compactions (sorted by start) do not cover from 0 upwards."""
    floor = 0
    for c in compactions:
        if c.start_seq > floor:
            break
        floor = max(floor, c.end_seq + 1)
    return floor


def covered(seq: int, compactions: Sequence[Compaction]) -> bool:
    return any(c.start_seq <= seq <= c.end_seq for c in compactions)


def iter_messages(
    db: SqliteUtilsDatabase, thread_id: str, *, from_seq: int = 0, newest_first: bool = False
) -> Iterator[Message]:
    order = "DESC" if newest_first else "ASC"
    for row in db.conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE thread_id = ? AND seq >= ?"
        f" ORDER BY seq {order}",
        (thread_id, from_seq),
    ):
        yield message_from_row(row)


class ThreadLog:
    """The threads' messages, compactions and message vectors."""

    def __init__(self, database: Database) -> None:
        self._database = database

    async def state(self, thread_id: str) -> ThreadState | None:
        """The thread's counters, None for a thread never saved (or purged)."""
        return await self._database.run(lambda db: read_state(db, thread_id))

    async def threads(self) -> list[ThreadInfo]:
        """Every stored thread (not purged), oldest first, with its number of messages."""
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
        expected_len: int,
        recorded_at: datetime,
        vectors: Sequence[bytes] | None = None,
    ) -> list[Message]:
        """Appends `drafts` after the stored history of length `expected_len`, each with the
        next seq, in one transaction; `vectors` (one blob per draft) are stored beside them.

        Raises:
            ConflictError: the stored history length is no longer `expected_len` (another
                writer on the same file got there first); nothing was written.
        """
        stamp = timestamp(recorded_at)
        ids = [f"msg_{uuid.uuid4().hex}" for _ in drafts]

        def write(db: SqliteUtilsDatabase) -> list[Message]:
            conn = db.conn
            with db.atomic():
                state = read_state(db, thread_id)
                if state is None:
                    conn.execute(
                        "INSERT INTO threads(id, next_seq, history_len, boundary_seq, created_at)"
                        " VALUES (?, 0, 0, 0, ?)",
                        (thread_id, stamp),
                    )
                    state = ThreadState(0, 0, 0)
                if state.history_len != expected_len:
                    raise ConflictError(
                        f"thread {thread_id!r} changed while saving: {state.history_len} "
                        f"messages stored, expected {expected_len}"
                    )
                rows = [
                    (
                        ids[i], thread_id, state.next_seq + i, d.role, d.text,
                        None if d.content == d.text else d.content,
                        json.dumps(d.data, sort_keys=True), stamp, d.tokens,
                    )
                    for i, d in enumerate(drafts)
                ]
                conn.executemany(
                    f"INSERT INTO messages({MESSAGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
                conn.execute(
                    "UPDATE threads SET next_seq = ?, history_len = ? WHERE id = ?",
                    (state.next_seq + len(drafts), state.history_len + len(drafts), thread_id),
                )
                if vectors is not None:
                    conn.executemany(
                        "INSERT INTO message_vectors(message_id, thread_id, vec) VALUES (?, ?, ?)",
                        [(ids[i], thread_id, blob) for i, blob in enumerate(vectors)],
                    )
            return [message_from_row(row) for row in rows]

        if len(drafts) <= _INLINE_APPEND:
            return await self._database.run(write)
        return await self._database.run(write)

    async def expire(self, thread_id: str, cutoff: datetime) -> int:
        """Erases the thread's messages recorded before `cutoff` (their search entries,
        vectors and pins go with them), and the compactions and snapshots that only covered
        erased messages. The seq counter is untouched. Returns how many messages went."""
        stamp = timestamp(cutoff)

        def write(db: SqliteUtilsDatabase) -> int:
            conn = db.conn
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

    async def compactions(self, thread_id: str) -> list[Compaction]:
        """The thread's compaction records, by start."""
        return await self._database.run(lambda db: read_compactions(db, thread_id))

    async def raw(self, thread_id: str) -> list[Message]:
        """Every stored message of the thread, by seq."""
        return await self._database.run(lambda db: list(iter_messages(db, thread_id)))

    async def uncompacted(
        self, thread_id: str
    ) -> tuple[list[Compaction], list[Message]]:
        """The compactions and every message none of them covers, by seq, read together."""

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
        """The compactions and the uncompacted messages of the last `k` turns (a turn starts
        at a user message), by seq. Reads the log backwards and stops at the k-th turn."""

        def read(db: SqliteUtilsDatabase) -> tuple[list[Compaction], list[Message]]:
            compactions = read_compactions(db, thread_id)
            floor = compacted_floor(compactions)
            picked: list[Message] = []
            turns = 0
            for message in iter_messages(db, thread_id, from_seq=floor, newest_first=True):
                if covered(message.seq, compactions):
                    continue
                picked.append(message)
                if message.role == "user":
                    turns += 1
                    if turns == k:
                        break
            picked.reverse()
            return compactions, picked

        return await self._database.run(read)

    async def add_compaction(
        self, thread_id: str, start_seq: int, end_seq: int, summary_text: str, now: datetime
    ) -> Compaction:
        """Records that `summary_text` stands for messages `start_seq`..`end_seq`. Records the
        new range contains are replaced by it.

        Raises:
            NotFoundError: the thread was never saved.
            InvalidInputError: `end_seq` is past the last seq given, or the range partly
                overlaps (or lies inside) an existing compaction; nothing was written.
        """
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
                for s, e in overlapping:
                    if not (start_seq <= s and e <= end_seq):
                        raise InvalidInputError(
                            f"compaction {start_seq}-{end_seq} overlaps compaction {s}-{e} of"
                            f" thread {thread_id!r} without containing it"
                        )
                conn.executemany(
                    "DELETE FROM compactions WHERE thread_id = ? AND start_seq = ?",
                    [(thread_id, s) for s, _ in overlapping],
                )
                conn.execute(
                    "INSERT INTO compactions(thread_id, start_seq, end_seq, summary_text,"
                    " created_at) VALUES (?, ?, ?, ?, ?)",
                    (thread_id, start_seq, end_seq, summary_text, stamp),
                )
            return compaction_from_row(thread_id, (start_seq, end_seq, summary_text, stamp))

        return await self._database.run(write)

    async def vectors(self, thread_id: str) -> dict[str, bytes]:
        """The stored vector blob of each message of the thread that has one."""
        return await self._database.run(
            lambda db: dict(
                db.conn.execute(
                    "SELECT message_id, vec FROM message_vectors WHERE thread_id = ?",
                    (thread_id,),
                ).fetchall()
            )
        )

    async def save_vectors(self, thread_id: str, rows: Sequence[tuple[str, bytes]]) -> None:
        """Stores (or replaces) vectors of existing messages; ids no longer stored are skipped."""

        def write(db: SqliteUtilsDatabase) -> None:
            with db.atomic():
                db.conn.executemany(
                    "INSERT OR REPLACE INTO message_vectors(message_id, thread_id, vec)"
                    " SELECT ?, ?, ? WHERE EXISTS (SELECT 1 FROM messages WHERE id = ?)",
                    [(mid, thread_id, blob, mid) for mid, blob in rows],
                )

        await self._database.run(write)

    async def clear(self, thread_id: str) -> None:
        """Deletes the thread's messages, vectors, compactions, snapshots, goals and pins, and
        starts a new history; the seq counter goes on (no seq is reused)."""

        def write(db: SqliteUtilsDatabase) -> None:
            with db.atomic():
                _delete_thread_rows(db, thread_id)
                db.conn.execute(
                    "UPDATE threads SET history_len = 0, boundary_seq = next_seq WHERE id = ?",
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
                    gone = _delete_thread_rows(db, thread_id)
                    conn.execute("DELETE FROM threads WHERE id = ?", (thread_id,))
                    if gone:
                        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('optimize')")
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            finally:
                conn.execute(f"PRAGMA secure_delete = {previous}")
            return gone

        return await self._database.run(write)


def _delete_thread_rows(db: SqliteUtilsDatabase, thread_id: str) -> int:
    """Deletes everything a thread holds except its counter row; returns messages deleted."""
    conn = db.conn
    for table in ("pins", "goals", "snapshots", "compactions", "message_vectors"):
        conn.execute(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,))
    gone: int = conn.execute("DELETE FROM messages WHERE thread_id = ?", (thread_id,)).rowcount
    return gone
