"""`SqliteCoordination`: the `Coordination` port (`mnemo.session.ports`) over mnemo's SQLite
file, for several `Memory` objects (processes on one host) sharing it.

A compare-and-set is one `UPDATE ... WHERE version = ?` inside a `BEGIN IMMEDIATE`
transaction, so two processes racing for a session are serialised by SQLite's write lock and
the second one finds the version moved. Times are stored as SQLite stores every time, UTC ISO
8601 text, written with microseconds so that text order is time order. The change token is
`PRAGMA data_version`: it moves when another connection commits, and reading it costs no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.session.machine import State
from mnemo.session.ports import VANISHED as _VANISHED
from mnemo.session.ports import HolderInfo, SessionLease, StoredOp
from mnemo.storage.sqlite.database import Database

_LEASE_COLUMNS = "id, repo, state, version, holder, lease_until, model, ended"
# Whether operations stored with the session have not all run (`SessionLease.queued`).
_QUEUED = "EXISTS (SELECT 1 FROM ops o WHERE o.session_id = s.id AND o.result IS NULL)"


class SqliteCoordination:
    """`Coordination` over a SQLite file."""

    def __init__(self, database: Database) -> None:
        self._database = database

    async def register(self, holder: HolderInfo) -> None:
        row = (holder.id, holder.host, holder.pid, _text(holder.started_at),
               _text(holder.seen_at))

        def write(db: SqliteUtilsDatabase) -> None:
            with db.atomic():
                db.conn.execute(
                    "INSERT OR REPLACE INTO holders(id, host, pid, started_at, seen_at)"
                    " VALUES (?, ?, ?, ?, ?)",
                    row,
                )

        await self._database.run(write)

    async def beat(self, holder_id: str, now: datetime, lease_until: datetime) -> int:
        def write(db: SqliteUtilsDatabase) -> int:
            with db.atomic():
                db.conn.execute(
                    "UPDATE holders SET seen_at = ? WHERE id = ?", (_text(now), holder_id)
                )
                return db.conn.execute(
                    "UPDATE sessions SET lease_until = ? WHERE holder = ? AND ended = 0",
                    (_text(lease_until), holder_id),
                ).rowcount

        return await self._database.run(write)

    async def retire(self, holder_id: str, now: datetime) -> None:
        def write(db: SqliteUtilsDatabase) -> None:
            with db.atomic():
                db.conn.execute("DELETE FROM holders WHERE id = ?", (holder_id,))
                db.conn.execute(
                    "UPDATE sessions SET lease_until = ? WHERE holder = ?",
                    (_text(now), holder_id),
                )

        await self._database.run(write)

    async def holders(self) -> list[HolderInfo]:
        rows = await self._database.run(
            lambda db: db.conn.execute(
                "SELECT id, host, pid, started_at, seen_at FROM holders"
                " ORDER BY started_at, id"
            ).fetchall()
        )
        return [
            HolderInfo(str(i), str(host), int(pid), _time(started), _time(seen))
            for i, host, pid, started, seen in rows
        ]

    async def lease(self, session_id: str) -> SessionLease | None:
        rows = await self._database.run(
            lambda db: db.conn.execute(
                f"SELECT {_LEASE_COLUMNS}, {_QUEUED} FROM sessions s WHERE id = ?",
                (session_id,),
            ).fetchall()
        )
        return _lease(rows[0]) if rows else None

    async def claim(
        self,
        session_id: str,
        *,
        version: int,
        holder_id: str | None,
        lease_until: datetime | None,
        state: State | None = None,
        model: str | None = None,
    ) -> int | None:
        until = None if lease_until is None else _text(lease_until)

        def write(db: SqliteUtilsDatabase) -> int | None:
            with db.atomic():
                moved = db.conn.execute(
                    "UPDATE sessions SET version = version + 1, holder = ?, lease_until = ?,"
                    " state = coalesce(?, state), model = coalesce(?, model)"
                    " WHERE id = ? AND version = ?",
                    (holder_id, until, None if state is None else state.value, model,
                     session_id, version),
                ).rowcount
            return version + 1 if moved else None

        return await self._database.run(write)

    async def takeable(
        self, now: datetime, unseen_since: datetime, gone: Sequence[str] = ()
    ) -> list[SessionLease]:
        marks = ",".join("?" * len(gone))
        also = f" OR holder IN ({marks})" if gone else ""
        rows = await self._database.run(
            lambda db: db.conn.execute(
                f"SELECT {_LEASE_COLUMNS} FROM sessions s WHERE ended = 0"
                " AND state = 'extracting' AND (lease_until IS NULL OR lease_until < ?"
                " OR holder IS NULL OR NOT EXISTS (SELECT 1 FROM holders h"
                f" WHERE h.id = s.holder AND h.seen_at >= ?){also})"
                " ORDER BY created_at, id",
                (_text(now), _text(unseen_since), *gone),
            ).fetchall()
        )
        return [_lease(row) for row in rows]

    async def queue_op(
        self, op: StoredOp, admit: Callable[[State, State | None, int], State | None]
    ) -> bool:
        def write(db: SqliteUtilsDatabase) -> bool:
            with db.atomic():  # BEGIN IMMEDIATE: the write lock holds the queue
                conn = db.conn
                found = conn.execute(
                    "SELECT state FROM sessions WHERE id = ? AND ended = 0", (op.session_id,)
                ).fetchone()
                if found is None:
                    return False  # ended meanwhile: the caller's own call finds it so
                last = conn.execute(
                    "SELECT tail FROM ops WHERE session_id = ? AND result IS NULL"
                    " ORDER BY seq DESC LIMIT 1", (op.session_id,)).fetchone()
                (waiting,) = conn.execute(
                    "SELECT count(*) FROM ops WHERE session_id = ? AND result IS NULL"
                    " AND taken_by IS NULL", (op.session_id,)).fetchone()
                tail = _projected(last)
                after = admit(State(found[0]), tail, int(waiting))
                if after is None:
                    return False
                (seq,) = conn.execute(
                    "SELECT coalesce(max(seq), 0) + 1 FROM ops WHERE session_id = ?",
                    (op.session_id,)).fetchone()
                conn.execute(
                    "INSERT INTO ops(id, session_id, kind, args, accepted_by, created_at,"
                    " seq, tail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (op.id, op.session_id, op.kind, json.dumps(op.args), op.accepted_by,
                     _text(op.created_at), int(seq), after.value),
                )
                return True

        return await self._database.run(write)

    async def queued(self, session_id: str) -> bool:
        rows = await self._database.run(
            lambda db: db.conn.execute(
                "SELECT 1 FROM ops WHERE session_id = ? AND result IS NULL LIMIT 1",
                (session_id,),
            ).fetchall()
        )
        return bool(rows)

    async def take_ops(
        self, session_id: str, holder_id: str, unseen_since: datetime
    ) -> list[StoredOp]:
        vanished = json.dumps(_VANISHED)

        def write(db: SqliteUtilsDatabase) -> list[tuple[Any, ...]]:
            with db.atomic():
                conn = db.conn
                running = "session_id = ? AND taken_by IS NOT NULL AND taken_by != ?" \
                    " AND result IS NULL"
                if conn.execute(
                    f"SELECT 1 FROM ops o WHERE {running} AND EXISTS (SELECT 1 FROM holders"
                    " h WHERE h.id = o.taken_by AND h.seen_at >= ?) LIMIT 1",
                    (session_id, holder_id, _text(unseen_since)),
                ).fetchone():
                    return []  # they run in another Memory, which takes what follows
                # Taken by a Memory that vanished before it reported: never run twice.
                conn.execute(f"DELETE FROM ops WHERE {running} AND (accepted_by = ''"
                             " OR accepted_by = taken_by)", (session_id, holder_id))
                conn.execute(f"UPDATE ops SET result = ? WHERE {running}",
                             (vanished, session_id, holder_id))
                return conn.execute(
                    "UPDATE ops SET taken_by = ? WHERE session_id = ? AND taken_by IS NULL"
                    " AND result IS NULL"
                    " RETURNING id, session_id, kind, args, accepted_by, created_at, seq",
                    (holder_id, session_id),
                ).fetchall()

        rows = await self._database.run(write)
        ops = [(int(seq), StoredOp(str(i), str(s), str(k), list(json.loads(a)), str(by),
                                   _time(at)))
               for i, s, k, a, by, at, seq in rows]
        return [op for _, op in sorted(ops, key=lambda pair: (pair[0], pair[1].id))]

    async def finish_op(self, op_id: str, result: dict[str, Any]) -> None:
        def write(db: SqliteUtilsDatabase) -> None:
            with db.atomic():
                db.conn.execute("DELETE FROM ops WHERE id = ? AND accepted_by = ''", (op_id,))
                db.conn.execute(
                    "UPDATE ops SET result = ? WHERE id = ?", (json.dumps(result), op_id)
                )

        await self._database.run(write)

    async def orphan_ops(self, op_ids: Sequence[str]) -> None:
        ids = list(op_ids)
        if not ids:
            return
        marks = ",".join("?" * len(ids))

        def write(db: SqliteUtilsDatabase) -> None:
            with db.atomic():
                db.conn.execute(
                    f"DELETE FROM ops WHERE id IN ({marks}) AND result IS NOT NULL", ids
                )
                db.conn.execute(f"UPDATE ops SET accepted_by = '' WHERE id IN ({marks})", ids)

        await self._database.run(write)

    async def op_results(self, op_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        ids = list(op_ids)
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        rows = await self._database.run(
            lambda db: db.conn.execute(
                f"SELECT id, result FROM ops WHERE id IN ({marks}) AND result IS NOT NULL",
                ids,
            ).fetchall()
        )
        return {str(i): dict(json.loads(r)) for i, r in rows}

    async def drop_ops(self, op_ids: Sequence[str]) -> None:
        ids = list(op_ids)
        if not ids:
            return
        marks = ",".join("?" * len(ids))

        def write(db: SqliteUtilsDatabase) -> None:
            with db.atomic():
                db.conn.execute(f"DELETE FROM ops WHERE id IN ({marks})", ids)

        await self._database.run(write)

    async def change_token(self) -> int:
        rows = await self._database.run(
            lambda db: db.conn.execute("PRAGMA data_version").fetchall()
        )
        return int(rows[0][0])


def _projected(row: tuple[Any, ...] | None) -> State | None:
    """The tail stored with the queue's last operation not yet run (None: none is left; an
    operation stored before tails were, taken for none)."""
    return None if row is None or row[0] is None else State(row[0])


def _text(moment: datetime) -> str:
    return moment.isoformat(timespec="microseconds")


def _time(text: Any) -> datetime:
    return datetime.fromisoformat(str(text))


def _lease(row: tuple[Any, ...]) -> SessionLease:
    session_id, repo, state, version, holder, until, model, ended, *queued = row
    return SessionLease(
        str(session_id), str(repo), State(state), int(version),
        None if holder is None else str(holder), None if until is None else _time(until),
        None if model is None else str(model), bool(ended), bool(queued and queued[0]),
    )
