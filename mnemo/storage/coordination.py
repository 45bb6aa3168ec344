"""`SqlCoordination`: the `Coordination` port for the Memory objects sharing a store, once for
both backends. A compare-and-set is one `UPDATE ... WHERE version = ?` (the second of two racers
finds the version moved); `takeable` reads without locking, and only one `claim` wins."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta

import msgspec

from mnemo.config import DAY
from mnemo.session.machine import State
from mnemo.session.ports import HolderInfo, IdleSweep, SessionLease, StoredOp, StoredResult
from mnemo.storage.clock import Clock
from mnemo.storage.row import Row
from mnemo.storage.sql import Driver, SqlStore, Statements, marks, moment, number

_LEASE_COLUMNS = "id, repo, state, version, holder, lease_until, model, ended"


async def drop_ended_work(sql: Statements, session_ids: Sequence[str]) -> None:
    """Drops the just-ended sessions' stored operations not yet run (untaken, or queued by
    their holder) and their step claims."""
    if not session_ids:
        return
    await sql.run(
        f"DELETE FROM ops WHERE session_id IN ({marks(len(session_ids))})"
        f" AND (taken_by IS NULL OR {_QUEUED}) AND result IS NULL", session_ids,
    )
    await sql.run(f"DELETE FROM step_claims WHERE session_id IN ({marks(len(session_ids))})",
                  session_ids)


# An `ops` row a holder stored for its own queue (`queue_op(own=True)`).
_QUEUED = "taken_by = accepted_by"


def _departed(column: str, gone: Sequence[str]) -> str:
    """The condition that the holder in `column` has left: it retired, was last seen before
    the first parameter, or is among `gone` (the parameters after)."""
    also = f" OR {column} IN ({marks(len(gone))})" if gone else ""
    return (
        f"(NOT EXISTS (SELECT 1 FROM holders h WHERE h.id = {column} AND h.seen_at >= ?)"
        f"{also})"
    )


class SqlCoordination(SqlStore):
    # `a{DISTINCT}b`: a and b differ, NULL being a value.
    DISTINCT = " IS DISTINCT FROM "
    # A session's config asks for auto-commit.
    AUTO_COMMIT = ""
    # Seconds until an idle session comes due, from `_idle_params`.
    IDLE_LEFT = ""
    CHANGE_TOKEN = ""

    # Ends the idle sessions of `due` still due; returns their (id, repo).
    _end_due: Callable[[Statements, list[str], datetime], Awaitable[list[Row]]]

    def __init__(self, driver: Driver, clock: Clock) -> None:
        super().__init__(driver)
        self._clock = clock
        self.now = clock.now

    def _idle_params(self, now: datetime) -> tuple[object, ...]:
        return ()

    async def sync_clock(self) -> None:
        return None

    async def register(self, holder: HolderInfo) -> None:
        async def write(sql: Statements) -> None:
            await sql.run(
                "INSERT INTO holders(id, host, pid, started_at, seen_at) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET host = excluded.host, pid = excluded.pid,"
                " started_at = excluded.started_at, seen_at = excluded.seen_at",
                (holder.id, holder.host, holder.pid, self._stamp(holder.started_at),
                 self._stamp(holder.seen_at)))
            # A killed process's row (no retire): unseen past any lease, it has left either way.
            await sql.run("DELETE FROM holders WHERE seen_at < ?",
                          (self._stamp(holder.seen_at - timedelta(seconds=2 * DAY)),))

        await self._driver.write(write)

    async def beat(self, holder_id: str, now: datetime, lease_until: datetime) -> int:
        async def write(sql: Statements) -> int:
            await sql.run("UPDATE holders SET seen_at = ? WHERE id = ?",
                          (self._stamp(now), holder_id))
            return await sql.run(
                "UPDATE sessions SET lease_until = ? WHERE holder = ? AND ended = false",
                (self._stamp(lease_until), holder_id),
            )

        return await self._driver.write(write)

    async def retire(self, holder_id: str, now: datetime) -> None:
        async def write(sql: Statements) -> None:
            await sql.run("DELETE FROM holders WHERE id = ?", (holder_id,))
            await sql.run("UPDATE sessions SET lease_until = ? WHERE holder = ?",
                          (self._stamp(now), holder_id))

        await self._driver.write(write)

    async def holders(self) -> list[HolderInfo]:
        rows = await self._rows(
            "SELECT id, host, pid, started_at, seen_at FROM holders ORDER BY started_at, id")
        return [
            HolderInfo(str(i), str(host), int(pid), moment(started), moment(seen))
            for i, host, pid, started, seen in rows
        ]

    async def lease(self, session_id: str) -> SessionLease | None:
        rows = await self._rows(f"SELECT {_LEASE_COLUMNS} FROM sessions WHERE id = ?",
                                (session_id,))
        return self._lease(rows[0]) if rows else None

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
        moved = await self._driver.one(lambda sql: sql.run(
            "UPDATE sessions SET version = version + 1, holder = ?, lease_until = ?,"
            " state = coalesce(?, state), model = coalesce(?, model)"
            " WHERE id = ? AND version = ?",
            (holder_id, None if lease_until is None else self._stamp(lease_until),
             None if state is None else state.value, model, session_id, version),
        ))
        return version + 1 if moved else None

    async def takeable(
        self, now: datetime, unseen_since: datetime, gone: Sequence[str] = ()
    ) -> list[SessionLease]:
        rows = await self._rows(
            f"SELECT {_LEASE_COLUMNS} FROM sessions s WHERE ended = false"
            f" AND (state = 'extracting' OR (state IN ('collecting', 'idle')"
            f" AND {self.AUTO_COMMIT}))"
            " AND (lease_until IS NULL OR lease_until < ? OR holder IS NULL"
            f" OR {_departed('s.holder', gone)})"
            f" ORDER BY created_at, id{self.BYTE_ORDER}",
            (self._stamp(now), self._stamp(unseen_since), *gone))
        return [self._lease(row) for row in rows]

    async def claim_steps(
        self, session_id: str, step_ids: Sequence[str], holder_id: str, *,
        unseen_since: datetime, gone: Sequence[str] = (),
    ) -> set[str]:
        if not step_ids:
            return set()

        async def write(sql: Statements) -> set[str]:
            await self._lock_claims(sql, session_id)
            await sql.run(
                f"DELETE FROM step_claims WHERE step_id IN ({marks(len(step_ids))}) AND holder <> ?"
                f" AND {_departed('step_claims.holder', gone)}",
                (*step_ids, holder_id, self._stamp(unseen_since), *gone),
            )
            # Not for an ended session: its end dropped every claim, a live holder's too.
            await sql.run(
                "INSERT INTO step_claims(step_id, session_id, holder)"
                " SELECT s.id, s.session_id, ? FROM steps s JOIN sessions ss"
                f" ON ss.id = s.session_id WHERE s.id IN ({marks(len(step_ids))})"
                " AND s.session_id = ? AND s.committed_in IS NULL AND ss.ended = false"
                " ON CONFLICT DO NOTHING",
                (holder_id, *step_ids, session_id),
            )
            rows = await sql.rows(
                f"SELECT step_id FROM step_claims WHERE step_id IN ({marks(len(step_ids))})"
                " AND holder = ?",
                (*step_ids, holder_id),
            )
            return {str(step_id) for step_id, in rows}

        return await self._driver.write(write)

    async def release_steps(
        self, session_id: str, holder_id: str, step_ids: Sequence[str]
    ) -> None:
        if not step_ids:
            return

        async def write(sql: Statements) -> None:
            await self._lock_claims(sql, session_id)
            await sql.run(
                "DELETE FROM step_claims WHERE session_id = ? AND holder = ?"
                f" AND step_id IN ({marks(len(step_ids))})",
                (session_id, holder_id, *step_ids),
            )

        await self._driver.write(write)

    async def claim_source(
        self, repo: str, source_id: str, payload_hash: str, holder_id: str, *,
        unseen_since: datetime, gone: Sequence[str] = (),
    ) -> str | None:
        async def write(sql: Statements) -> str | None:
            await sql.run(
                "DELETE FROM source_claims WHERE repo = ? AND source_id = ? AND holder <> ?"
                f" AND {_departed('source_claims.holder', gone)}",
                (repo, source_id, holder_id, self._stamp(unseen_since), *gone))
            while True:
                # The holder's own claim takes the payload it ingests now.
                await sql.run(
                    "INSERT INTO source_claims(repo, source_id, payload_hash, holder)"
                    " VALUES (?, ?, ?, ?) ON CONFLICT (repo, source_id) DO UPDATE"
                    " SET payload_hash = excluded.payload_hash"
                    " WHERE source_claims.holder = excluded.holder",
                    (repo, source_id, payload_hash, holder_id))
                row = await sql.row("SELECT holder, payload_hash FROM source_claims"
                                    " WHERE repo = ? AND source_id = ?", (repo, source_id))
                if row is not None:  # else the conflicting claim went meanwhile: again
                    return None if row[0] == holder_id else str(row[1])

        return await self._driver.write(write)

    async def release_source(self, repo: str, source_id: str, holder_id: str) -> None:
        await self._driver.write(lambda sql: sql.run(
            "DELETE FROM source_claims WHERE repo = ? AND source_id = ? AND holder = ?",
            (repo, source_id, holder_id)))

    async def unannotated(
        self, unseen_since: datetime, gone: Sequence[str] = ()
    ) -> list[str]:
        rows = await self._rows(
            # Through the partial index of unannotated steps.
            "SELECT DISTINCT st.session_id FROM steps st JOIN sessions s"
            " ON s.id = st.session_id AND s.episode_id = st.episode_id"
            " WHERE st.trajectory_id = '' AND s.ended = false AND s.state = 'collecting'"
            " AND NOT EXISTS (SELECT 1 FROM step_claims c WHERE c.step_id = st.id"
            f" AND NOT {_departed('c.holder', gone)})",
            (self._stamp(unseen_since), *gone))
        return [str(session_id) for session_id, in rows]

    async def queue_op(self, op: StoredOp, *, own: bool = False) -> None:
        await self._driver.one(lambda sql: sql.run(
            "INSERT INTO ops(id, session_id, kind, args, accepted_by, created_at, taken_by)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (op.id, op.session_id, op.kind, self._json(op.args), op.accepted_by,
             self._stamp(op.created_at), op.accepted_by if own else None),
        ))

    async def take_ops(
        self, session_id: str, holder_id: str, unseen_since: datetime | None = None,
        gone: Sequence[str] = (),
    ) -> list[StoredOp]:
        left = ("" if unseen_since is None else f" OR ({_QUEUED} AND taken_by <> ?"
                f" AND result IS NULL AND {_departed('ops.taken_by', gone)})")
        also = () if unseen_since is None else (holder_id, self._stamp(unseen_since), *gone)
        rows = await self._driver.one(lambda sql: sql.rows(
            f"UPDATE ops SET taken_by = ? WHERE session_id = ? AND (taken_by IS NULL{left})"
            " RETURNING id, session_id, kind, args, accepted_by, created_at",
            (holder_id, session_id, *also),
        ))
        ops = [StoredOp(str(i), str(s), str(k), list(json.loads(a) if isinstance(a, str) else a),
                        str(by), moment(at))
               for i, s, k, a, by, at in rows]
        return sorted(ops, key=lambda op: (op.created_at, op.id))

    async def queued_ops(self, session_id: str) -> list[tuple[str, str, datetime]]:
        rows = await self._rows(
            "SELECT id, kind, created_at FROM ops WHERE session_id = ? AND result IS NULL"
            " AND accepted_by <> ''", (session_id,))
        return sorted(((str(i), str(k), moment(at)) for i, k, at in rows),
                      key=lambda op: (op[2], op[0]))

    async def finish_op(self, op_id: str, result: StoredResult) -> None:
        async def write(sql: Statements) -> None:
            await sql.run("DELETE FROM ops WHERE id = ? AND accepted_by = ''", (op_id,))
            await sql.run("UPDATE ops SET result = ? WHERE id = ?",
                          (self._json_text(msgspec.json.encode(result).decode()), op_id))

        await self._driver.write(write)

    async def orphan_ops(self, op_ids: Sequence[str]) -> None:
        if not op_ids:
            return

        async def write(sql: Statements) -> None:
            await sql.run(f"DELETE FROM ops WHERE id IN ({marks(len(op_ids))})"
                          " AND result IS NOT NULL", op_ids)
            await sql.run(f"UPDATE ops SET accepted_by = '' WHERE id IN ({marks(len(op_ids))})",
                          op_ids)

        await self._driver.write(write)

    async def op_results(self, op_ids: Sequence[str]) -> dict[str, StoredResult]:
        if not op_ids:
            return {}
        rows = await self._rows(
            f"SELECT id, result{self.TEXT} FROM ops WHERE id IN ({marks(len(op_ids))})"
            " AND result IS NOT NULL", op_ids)
        return {str(i): StoredResult.decode(str(r)) for i, r in rows}

    def _left(self, gone: Sequence[str]) -> str:
        """The condition that another holder took an `ops` row and left without a result."""
        return (
            f"result IS NULL AND taken_by IS NOT NULL AND taken_by{self.DISTINCT}?"
            f" AND NOT {_QUEUED} AND {_departed('ops.taken_by', gone)}"
        )

    async def abandon_ops(
        self, op_ids: Sequence[str], unseen_since: datetime, gone: Sequence[str] = (), *,
        me: str | None = None,
    ) -> list[str]:
        if not op_ids:
            return []
        rows = await self._driver.one(lambda sql: sql.rows(
            f"DELETE FROM ops WHERE id IN ({marks(len(op_ids))}) AND {self._left(gone)}"
            " RETURNING id",
            (*op_ids, me, self._stamp(unseen_since), *gone),
        ))
        return [str(op_id) for op_id, in rows]

    async def forget_orphans(
        self, unseen_since: datetime, gone: Sequence[str] = (), *, me: str | None = None
    ) -> int:
        # Nobody waits for it (its Memory closed or is gone), and it is answered or was left.
        where = (f"FROM ops WHERE (accepted_by = '' OR {_departed('ops.accepted_by', gone)})"
                 f" AND (result IS NOT NULL OR ({self._left(gone)}))")
        stamp = self._stamp(unseen_since)
        params = (stamp, *gone, me, stamp, *gone)
        # Looked for first, without a lock.
        if not await self._rows(f"SELECT 1 {where} LIMIT 1", params):
            return 0
        return await self._driver.one(lambda sql: sql.run(f"DELETE {where}", params))

    async def still_taken(self, op_id: str, holder_id: str) -> bool:
        return bool(await self._rows("SELECT 1 FROM ops WHERE id = ? AND taken_by = ?",
                                     (op_id, holder_id)))

    async def drop_queued(self, op_id: str, holder_id: str) -> bool:
        return bool(await self._driver.one(lambda sql: sql.run(
            f"DELETE FROM ops WHERE id = ? AND taken_by = ? AND {_QUEUED}", (op_id, holder_id))))

    async def left_queues(self, unseen_since: datetime, gone: Sequence[str] = ()) -> list[str]:
        rows = await self._rows(
            "SELECT DISTINCT o.session_id FROM ops o JOIN sessions s ON s.id = o.session_id"
            f" WHERE s.ended = false AND s.state <> 'extracting' AND o.{_QUEUED}"
            f" AND o.result IS NULL AND {_departed('o.taken_by', gone)}",
            (self._stamp(unseen_since), *gone))
        return [str(session_id) for session_id, in rows]

    async def drop_ops(self, op_ids: Sequence[str]) -> None:
        if op_ids:
            await self._driver.one(lambda sql: sql.run(
                f"DELETE FROM ops WHERE id IN ({marks(len(op_ids))})", op_ids))

    async def end_idle(self, limit: int) -> IdleSweep:
        now = self.now()
        # Looked for first, without a lock.
        rows = await self._rows(
            f"SELECT id, {self.IDLE_LEFT} AS due FROM sessions WHERE ended = false"
            " AND state = 'idle' ORDER BY due LIMIT ?", (*self._idle_params(now), limit + 1))
        due = [str(sid) for sid, left in rows[:limit] if float(left) <= 0]
        next_due = max(float(rows[len(due)][1]), 0.0) if len(rows) > len(due) else None
        if not due:
            return IdleSweep([], next_due)

        async def write(sql: Statements) -> list[tuple[str, str]]:
            ended = [(str(sid), str(repo)) for sid, repo in await self._end_due(sql, due, now)]
            # An idle session has no step claim: no claims lock is taken.
            await drop_ended_work(sql, [sid for sid, _ in ended])
            return ended

        return IdleSweep(await self._driver.write(write), next_due)

    async def change_token(self) -> int:
        return await self._driver.read(lambda sql: number(sql, self.CHANGE_TOKEN))

    def _lease(self, row: Row) -> SessionLease:
        session_id, repo, state, version, holder, until, model, ended = row
        return SessionLease(
            str(session_id), str(repo), State(state), int(version),
            None if holder is None else str(holder),
            None if until is None else moment(until),
            None if model is None else str(model), bool(ended),
        )
