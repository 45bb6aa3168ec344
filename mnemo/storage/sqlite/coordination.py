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
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec
from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.config import DEFAULT_IDLE_SESSION_TIMEOUT
from mnemo.session.machine import State
from mnemo.session.ports import HolderInfo, IdleSweep, SessionLease, StoredOp, StoredResult
from mnemo.storage.row import Row
from mnemo.storage.sqlite.database import Database

_LEASE_COLUMNS = "id, repo, state, version, holder, lease_until, model, ended"
# Seconds until an idle session comes due (its config's timeout after its last change; a
# config stored before the setting existed has its default), from the first parameter, now.
_IDLE_LEFT = (
    "(julianday(updated_at) - julianday(?)) * 86400.0"
    f" + coalesce(json_extract(config, '$.idle_session_timeout'), {DEFAULT_IDLE_SESSION_TIMEOUT})"
)


class SqliteCoordination:
    """`Coordination` over a SQLite file."""

    def __init__(self, database: Database) -> None:
        self._database = database

    def now(self) -> datetime:
        # The host's boot time clock, anchored in the file (`HostClock`): one clock for every
        # process on the host, which no step of a wall clock moves.
        return self._database.clock.now()

    async def sync_clock(self) -> None:
        return None

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
                f"SELECT {_LEASE_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
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
        rows = await self._database.run(
            lambda db: db.conn.execute(
                f"SELECT {_LEASE_COLUMNS} FROM sessions s WHERE ended = 0"
                " AND (state = 'extracting' OR (state IN ('collecting', 'idle')"
                " AND json_extract(config, '$.auto_commit')))"
                " AND (lease_until IS NULL OR lease_until < ? OR holder IS NULL"
                f" OR {_departed('s.holder', gone)})"
                " ORDER BY created_at, id",
                (_text(now), _text(unseen_since), *gone),
            ).fetchall()
        )
        return [_lease(row) for row in rows]

    async def claim_steps(
        self, session_id: str, step_ids: Sequence[str], holder_id: str, *,
        unseen_since: datetime, gone: Sequence[str] = (),
    ) -> set[str]:
        ids = list(step_ids)
        if not ids:
            return set()
        marks = ",".join("?" * len(ids))

        def write(db: SqliteUtilsDatabase) -> set[str]:
            conn = db.conn
            with db.atomic():
                conn.execute(
                    f"DELETE FROM step_claims WHERE step_id IN ({marks}) AND holder IS NOT ?"
                    f" AND {_departed('step_claims.holder', gone)}",
                    (*ids, holder_id, _text(unseen_since), *gone),
                )
                # Not for an ended session: its end dropped every claim, a live holder's too.
                conn.execute(
                    "INSERT OR IGNORE INTO step_claims(step_id, session_id, holder)"
                    " SELECT s.id, s.session_id, ? FROM steps s JOIN sessions ss"
                    f" ON ss.id = s.session_id WHERE s.id IN ({marks}) AND s.session_id = ?"
                    " AND s.committed_in IS NULL AND ss.ended = 0",
                    (holder_id, *ids, session_id),
                )
                rows = conn.execute(
                    f"SELECT step_id FROM step_claims WHERE step_id IN ({marks})"
                    " AND holder = ?",
                    (*ids, holder_id),
                ).fetchall()
            return {str(step_id) for step_id, in rows}

        return await self._database.run(write)

    async def release_steps(
        self, session_id: str, holder_id: str, step_ids: Sequence[str]
    ) -> None:
        ids = list(step_ids)
        if not ids:
            return
        marks = ",".join("?" * len(ids))

        def write(db: SqliteUtilsDatabase) -> None:
            with db.atomic():
                db.conn.execute(
                    "DELETE FROM step_claims WHERE session_id = ? AND holder = ?"
                    f" AND step_id IN ({marks})",
                    (session_id, holder_id, *ids),
                )

        await self._database.run(write)

    async def unannotated(
        self, unseen_since: datetime, gone: Sequence[str] = ()
    ) -> list[str]:
        rows = await self._database.run(
            lambda db: db.conn.execute(
                # Through the partial index of unannotated steps (m027).
                "SELECT DISTINCT st.session_id FROM steps st JOIN sessions s"
                " ON s.id = st.session_id AND s.episode_id = st.episode_id"
                " WHERE st.trajectory_id = '' AND s.ended = 0 AND s.state = 'collecting'"
                " AND NOT EXISTS (SELECT 1 FROM step_claims c WHERE c.step_id = st.id"
                f" AND NOT {_departed('c.holder', gone)})",
                (_text(unseen_since), *gone),
            ).fetchall()
        )
        return [str(session_id) for session_id, in rows]

    async def queue_op(self, op: StoredOp) -> None:
        row = (op.id, op.session_id, op.kind, json.dumps(op.args), op.accepted_by,
               _text(op.created_at))

        def write(db: SqliteUtilsDatabase) -> None:
            with db.atomic():
                db.conn.execute(
                    "INSERT INTO ops(id, session_id, kind, args, accepted_by, created_at)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    row,
                )

        await self._database.run(write)

    async def take_ops(self, session_id: str, holder_id: str) -> list[StoredOp]:
        def write(db: SqliteUtilsDatabase) -> list[Row]:
            with db.atomic():
                return db.conn.execute(
                    "UPDATE ops SET taken_by = ? WHERE session_id = ? AND taken_by IS NULL"
                    " RETURNING id, session_id, kind, args, accepted_by, created_at",
                    (holder_id, session_id),
                ).fetchall()

        rows = await self._database.run(write)
        ops = [StoredOp(str(i), str(s), str(k), list(json.loads(a)), str(by), _time(at))
               for i, s, k, a, by, at in rows]
        return sorted(ops, key=lambda op: (op.created_at, op.id))

    async def finish_op(self, op_id: str, result: StoredResult) -> None:
        def write(db: SqliteUtilsDatabase) -> None:
            with db.atomic():
                db.conn.execute("DELETE FROM ops WHERE id = ? AND accepted_by = ''", (op_id,))
                db.conn.execute("UPDATE ops SET result = ? WHERE id = ?",
                                (msgspec.json.encode(result).decode(), op_id))

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

    async def op_results(self, op_ids: Sequence[str]) -> dict[str, StoredResult]:
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
        return {str(i): StoredResult.decode(r) for i, r in rows}

    async def abandon_ops(
        self, op_ids: Sequence[str], unseen_since: datetime, gone: Sequence[str] = (), *,
        me: str | None = None,
    ) -> list[str]:
        ids = list(op_ids)
        if not ids:
            return []
        marks = ",".join("?" * len(ids))

        def write(db: SqliteUtilsDatabase) -> list[str]:
            with db.atomic():
                rows = db.conn.execute(
                    f"DELETE FROM ops WHERE id IN ({marks}) AND {_left(gone)} RETURNING id",
                    (*ids, me, _text(unseen_since), *gone),
                ).fetchall()
            return [str(op_id) for op_id, in rows]

        return await self._database.run(write)

    async def forget_orphans(
        self, unseen_since: datetime, gone: Sequence[str] = (), *, me: str | None = None
    ) -> int:
        where = f"FROM ops WHERE accepted_by = '' AND {_left(gone)}"
        params = (me, _text(unseen_since), *gone)

        def write(db: SqliteUtilsDatabase) -> int:
            # Looked for first: the takeover task asks twice a lease, and a write would wait for
            # another process's write lock every time, to find nothing.
            if db.conn.execute(f"SELECT 1 {where} LIMIT 1", params).fetchone() is None:
                return 0
            with db.atomic():
                return db.conn.execute(f"DELETE {where}", params).rowcount

        return await self._database.run(write)

    async def still_taken(self, op_id: str, holder_id: str) -> bool:
        rows = await self._database.run(
            lambda db: db.conn.execute(
                "SELECT 1 FROM ops WHERE id = ? AND taken_by = ?", (op_id, holder_id)
            ).fetchall()
        )
        return bool(rows)

    async def drop_ops(self, op_ids: Sequence[str]) -> None:
        ids = list(op_ids)
        if not ids:
            return
        marks = ",".join("?" * len(ids))

        def write(db: SqliteUtilsDatabase) -> None:
            with db.atomic():
                db.conn.execute(f"DELETE FROM ops WHERE id IN ({marks})", ids)

        await self._database.run(write)

    async def end_idle(self, limit: int) -> IdleSweep:
        now = _text(self.now())

        def sweep(db: SqliteUtilsDatabase) -> IdleSweep:
            # Looked for first: a write would wait for another process's write lock, to find
            # nothing most times.
            rows = db.conn.execute(
                f"SELECT id, {_IDLE_LEFT} AS due FROM sessions WHERE ended = 0"
                " AND state = 'idle' ORDER BY due LIMIT ?", (now, limit + 1),
            ).fetchall()
            due = [str(sid) for sid, left in rows[:limit] if left <= 0]
            next_due = max(float(rows[len(due)][1]), 0.0) if len(rows) > len(due) else None
            if not due:
                return IdleSweep([], next_due)
            with db.atomic():
                ended = db.conn.execute(
                    "UPDATE sessions SET ended = 1, version = version + 1, holder = NULL,"
                    " lease_until = NULL, updated_at = ? WHERE ended = 0 AND state = 'idle'"
                    f" AND id IN ({','.join('?' * len(due))}) AND {_IDLE_LEFT} <= 0"
                    " RETURNING id, repo",
                    (now, *due, now),
                ).fetchall()
                drop_ended_work(db, [str(sid) for sid, _ in ended])
            return IdleSweep([(str(sid), str(repo)) for sid, repo in ended], next_due)

        return await self._database.run(sweep)

    async def change_token(self) -> int:
        rows = await self._database.run(
            lambda db: db.conn.execute("PRAGMA data_version").fetchall()
        )
        return int(rows[0][0])


def drop_ended_work(db: SqliteUtilsDatabase, session_ids: Sequence[str]) -> None:
    """What nobody will do for these sessions, which have just ended: the stored operations
    nobody took (their Memories answer them session_ended when they see the end; one taken,
    or with its result, stays for its Memory to read and drop), and their step claims."""
    marks = ",".join("?" * len(session_ids))
    db.conn.execute(
        f"DELETE FROM ops WHERE session_id IN ({marks}) AND taken_by IS NULL"
        " AND result IS NULL", session_ids,
    )
    db.conn.execute(f"DELETE FROM step_claims WHERE session_id IN ({marks})", session_ids)


def _text(moment: datetime) -> str:
    return moment.isoformat(timespec="microseconds")


def _time(text: Any) -> datetime:
    return datetime.fromisoformat(str(text))


def _lease(row: Row) -> SessionLease:
    session_id, repo, state, version, holder, until, model, ended = row
    return SessionLease(
        str(session_id), str(repo), State(state), int(version),
        None if holder is None else str(holder), None if until is None else _time(until),
        None if model is None else str(model), bool(ended),
    )


def _departed(column: str, gone: Sequence[str]) -> str:
    """The condition that the holder in `column` has left: it retired, was last seen before
    the first parameter, or is among `gone` (the parameters after)."""
    also = f" OR {column} IN ({','.join('?' * len(gone))})" if gone else ""
    return (
        f"(NOT EXISTS (SELECT 1 FROM holders h WHERE h.id = {column} AND h.seen_at >= ?)"
        f"{also})"
    )


def _left(gone: Sequence[str]) -> str:
    """The condition on an `ops` row that a holder other than the first parameter (`me`)
    took and left without a result (`_departed`, with the parameters after)."""
    return (
        "result IS NULL AND taken_by IS NOT NULL AND taken_by IS NOT ?"
        f" AND {_departed('ops.taken_by', gone)}"
    )
