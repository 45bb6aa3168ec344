"""`PgCoordination`: the `Coordination` port (`mnemo.session.ports`) over PostgreSQL, for
`Memory` objects on any number of hosts sharing one database.

A compare-and-set is one `UPDATE ... WHERE version = %s`: the row lock it takes serialises
racers, and under READ COMMITTED the second one re-reads the committed row, finds the version
moved and changes nothing. `takeable` reads without locking: taking the work is a `claim`,
which only one `Memory` wins. The change token is the next transaction id of the server
(`pg_snapshot_xmax(pg_current_snapshot())`): it moves whenever any transaction that wrote
commits (on this server, so a wake-up may be spurious, never missed), and costs one cheap
statement.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime

import msgspec
from psycopg.types.json import Jsonb

from mnemo.config import DEFAULT_IDLE_SESSION_TIMEOUT
from mnemo.session.machine import State
from mnemo.session.ports import HolderInfo, IdleSweep, SessionLease, StoredOp, StoredResult
from mnemo.storage.postgres.clock import ServerClock
from mnemo.storage.postgres.connection import Connection, Postgres
from mnemo.storage.row import Row

_LEASE_COLUMNS = "id, repo, state, version, holder, lease_until, model, ended"
# Seconds until an idle session comes due (its config's timeout after its last change; a
# config stored before the setting existed has its default), by the server's clock.
_IDLE_LEFT = (
    "extract(epoch FROM updated_at - clock_timestamp()) + coalesce("
    f"(config->>'idle_session_timeout')::float8, {DEFAULT_IDLE_SESSION_TIMEOUT})"
)


def claims_lock_key(session_id: str) -> int:
    """The advisory-lock key of a session's step claims: 64 bits of a digest of its id."""
    digest = hashlib.sha256(b"mnemo.step_claims:" + session_id.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def lock_claims(conn: Connection, session_id: str) -> None:
    """Serialises, until the end of `conn`'s transaction, every write of the session's step
    claims (a claim, a release, a commit's or an end's drop): without it, two writers that
    lock claim rows in different orders across their statements deadlock, and a claim could
    take a step a commit in flight was marking committed."""
    await conn.execute("SELECT pg_advisory_xact_lock(%s)", (claims_lock_key(session_id),))


async def drop_ended_work(conn: Connection, session_ids: list[str]) -> None:
    """What nobody will do for these sessions, which have just ended: the stored operations
    nobody took (their Memories answer them session_ended when they see the end; one taken,
    or with its result, stays for its Memory to read and drop), and their step claims."""
    await conn.execute(
        "DELETE FROM ops WHERE session_id = ANY(%s) AND taken_by IS NULL AND result IS NULL",
        (session_ids,),
    )
    await conn.execute("DELETE FROM step_claims WHERE session_id = ANY(%s)", (session_ids,))


def _departed(column: str) -> str:
    """The condition that the holder in `column` has left: it retired, was last seen before
    the first parameter, or is in the second (`gone`)."""
    return (
        f"(NOT EXISTS (SELECT 1 FROM holders h WHERE h.id = {column} AND h.seen_at >= %s)"
        f" OR {column} = ANY(%s))"
    )


# The condition on an `ops` row that a holder other than the first parameter (`me`) took
# and left without a result (`_departed`, with the parameters after).
_LEFT = (
    "result IS NULL AND taken_by IS NOT NULL AND taken_by IS DISTINCT FROM %s"
    f" AND {_departed('ops.taken_by')}"
)


class PgCoordination:
    """`Coordination` over a PostgreSQL database."""

    def __init__(self, pg: Postgres, clock: ServerClock) -> None:
        self._pg = pg
        self._clock = clock

    def now(self) -> datetime:
        return self._clock.now()

    async def sync_clock(self) -> None:
        await self._clock.sync()

    async def register(self, holder: HolderInfo) -> None:
        async with self._pg.connection() as conn:
            await conn.execute(
                "INSERT INTO holders(id, host, pid, started_at, seen_at)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET"
                " host = excluded.host, pid = excluded.pid, started_at = excluded.started_at,"
                " seen_at = excluded.seen_at",
                (holder.id, holder.host, holder.pid, holder.started_at, holder.seen_at),
            )

    async def beat(self, holder_id: str, now: datetime, lease_until: datetime) -> int:
        async with self._pg.transaction() as conn:
            await conn.execute("UPDATE holders SET seen_at = %s WHERE id = %s", (now, holder_id))
            cur = await conn.execute(
                "UPDATE sessions SET lease_until = %s WHERE holder = %s AND NOT ended",
                (lease_until, holder_id),
            )
            return cur.rowcount

    async def retire(self, holder_id: str, now: datetime) -> None:
        async with self._pg.transaction() as conn:
            await conn.execute("DELETE FROM holders WHERE id = %s", (holder_id,))
            await conn.execute(
                "UPDATE sessions SET lease_until = %s WHERE holder = %s", (now, holder_id)
            )

    async def holders(self) -> list[HolderInfo]:
        rows = await self._pg.fetch_all(
            "SELECT id, host, pid, started_at, seen_at FROM holders ORDER BY started_at, id"
        )
        return [
            HolderInfo(str(i), str(host), int(pid), started, seen)
            for i, host, pid, started, seen in rows
        ]

    async def lease(self, session_id: str) -> SessionLease | None:
        rows = await self._pg.fetch_all(
            f"SELECT {_LEASE_COLUMNS} FROM sessions WHERE id = %s", (session_id,)
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
        async with self._pg.connection() as conn:
            cur = await conn.execute(
                "UPDATE sessions SET version = version + 1, holder = %s, lease_until = %s,"
                " state = coalesce(%s, state), model = coalesce(%s, model)"
                " WHERE id = %s AND version = %s",
                (holder_id, lease_until, None if state is None else state.value, model,
                 session_id, version),
            )
            return version + 1 if cur.rowcount else None

    async def takeable(
        self, now: datetime, unseen_since: datetime, gone: Sequence[str] = ()
    ) -> list[SessionLease]:
        rows = await self._pg.fetch_all(
            f"SELECT {_LEASE_COLUMNS} FROM sessions s WHERE NOT ended"
            " AND (state = 'extracting' OR (state IN ('collecting', 'idle')"
            " AND (config->>'auto_commit')::boolean))"
            " AND (lease_until IS NULL OR lease_until < %s OR holder IS NULL"
            f" OR {_departed('s.holder')})"
            ' ORDER BY created_at, id COLLATE "C"',
            (now, unseen_since, list(gone)),
        )
        return [_lease(row) for row in rows]

    async def claim_steps(
        self, session_id: str, step_ids: Sequence[str], holder_id: str, *,
        unseen_since: datetime, gone: Sequence[str] = (),
    ) -> set[str]:
        ids = list(step_ids)
        if not ids:
            return set()
        async with self._pg.transaction() as conn:
            # Each statement after the lock reads what the session's last claim-row writer
            # committed: a commit of a step in flight is waited for, then seen.
            await lock_claims(conn, session_id)
            await conn.execute(
                "DELETE FROM step_claims WHERE step_id = ANY(%s) AND holder <> %s"
                f" AND {_departed('step_claims.holder')}",
                (ids, holder_id, unseen_since, list(gone)),
            )
            # Not for an ended session: its end dropped every claim, a live holder's too.
            await conn.execute(
                "INSERT INTO step_claims(step_id, session_id, holder)"
                " SELECT s.id, s.session_id, %s FROM steps s JOIN sessions ss"
                " ON ss.id = s.session_id WHERE s.id = ANY(%s) AND s.session_id = %s"
                " AND s.committed_in IS NULL AND NOT ss.ended ON CONFLICT DO NOTHING",
                (holder_id, ids, session_id),
            )
            cur = await conn.execute(
                "SELECT step_id FROM step_claims WHERE step_id = ANY(%s) AND holder = %s",
                (ids, holder_id),
            )
            rows: list[Row] = await cur.fetchall()
        return {str(step_id) for step_id, in rows}

    async def release_steps(
        self, session_id: str, holder_id: str, step_ids: Sequence[str]
    ) -> None:
        ids = list(step_ids)
        if not ids:
            return
        async with self._pg.transaction() as conn:
            await lock_claims(conn, session_id)
            await conn.execute(
                "DELETE FROM step_claims WHERE holder = %s AND step_id = ANY(%s)",
                (holder_id, ids),
            )

    async def unannotated(
        self, unseen_since: datetime, gone: Sequence[str] = ()
    ) -> list[str]:
        rows = await self._pg.fetch_all(
            # Through the partial index of unannotated steps (m019).
            "SELECT DISTINCT st.session_id FROM steps st JOIN sessions s"
            " ON s.id = st.session_id AND s.episode_id = st.episode_id"
            " WHERE st.trajectory_id = '' AND NOT s.ended AND s.state = 'collecting'"
            " AND NOT EXISTS (SELECT 1 FROM step_claims c WHERE c.step_id = st.id"
            f" AND NOT {_departed('c.holder')})",
            (unseen_since, list(gone)),
        )
        return [str(session_id) for session_id, in rows]

    async def queue_op(self, op: StoredOp) -> None:
        async with self._pg.connection() as conn:
            await conn.execute(
                "INSERT INTO ops(id, session_id, kind, args, accepted_by, created_at)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                (op.id, op.session_id, op.kind, Jsonb(op.args), op.accepted_by, op.created_at),
            )

    async def take_ops(self, session_id: str, holder_id: str) -> list[StoredOp]:
        async with self._pg.connection() as conn:
            cur = await conn.execute(
                "UPDATE ops SET taken_by = %s WHERE session_id = %s AND taken_by IS NULL"
                " RETURNING id, session_id, kind, args, accepted_by, created_at",
                (holder_id, session_id),
            )
            rows: list[Row] = await cur.fetchall()
        ops = [StoredOp(str(i), str(s), str(k), list(a), str(by), at)
               for i, s, k, a, by, at in rows]
        return sorted(ops, key=lambda op: (op.created_at, op.id))

    async def finish_op(self, op_id: str, result: StoredResult) -> None:
        async with self._pg.transaction() as conn:
            await conn.execute("DELETE FROM ops WHERE id = %s AND accepted_by = ''", (op_id,))
            await conn.execute("UPDATE ops SET result = %s::jsonb WHERE id = %s",
                               (msgspec.json.encode(result).decode(), op_id))

    async def orphan_ops(self, op_ids: Sequence[str]) -> None:
        if not op_ids:
            return
        async with self._pg.transaction() as conn:
            await conn.execute("DELETE FROM ops WHERE id = ANY(%s) AND result IS NOT NULL",
                               (list(op_ids),))
            await conn.execute("UPDATE ops SET accepted_by = '' WHERE id = ANY(%s)",
                               (list(op_ids),))

    async def op_results(self, op_ids: Sequence[str]) -> dict[str, StoredResult]:
        if not op_ids:
            return {}
        rows = await self._pg.fetch_all(
            "SELECT id, result::text FROM ops WHERE id = ANY(%s) AND result IS NOT NULL",
            (list(op_ids),),
        )
        return {str(i): StoredResult.decode(str(r)) for i, r in rows}

    async def abandon_ops(
        self, op_ids: Sequence[str], unseen_since: datetime, gone: Sequence[str] = (), *,
        me: str | None = None,
    ) -> list[str]:
        if not op_ids:
            return []
        async with self._pg.connection() as conn:
            cur = await conn.execute(
                f"DELETE FROM ops WHERE id = ANY(%s) AND {_LEFT} RETURNING id",
                (list(op_ids), me, unseen_since, list(gone)),
            )
            rows: list[Row] = await cur.fetchall()
        return [str(op_id) for op_id, in rows]

    async def forget_orphans(
        self, unseen_since: datetime, gone: Sequence[str] = (), *, me: str | None = None
    ) -> int:
        async with self._pg.connection() as conn:
            cur = await conn.execute(
                f"DELETE FROM ops WHERE accepted_by = '' AND {_LEFT}",
                (me, unseen_since, list(gone)),
            )
            return int(cur.rowcount)

    async def still_taken(self, op_id: str, holder_id: str) -> bool:
        rows = await self._pg.fetch_all(
            "SELECT 1 FROM ops WHERE id = %s AND taken_by = %s", (op_id, holder_id)
        )
        return bool(rows)

    async def drop_ops(self, op_ids: Sequence[str]) -> None:
        if not op_ids:
            return
        async with self._pg.connection() as conn:
            await conn.execute("DELETE FROM ops WHERE id = ANY(%s)", (list(op_ids),))

    async def end_idle(self, limit: int) -> IdleSweep:
        # Looked for first, without a lock: most times none is due.
        rows = await self._pg.fetch_all(
            f"SELECT id, {_IDLE_LEFT} AS due FROM sessions WHERE NOT ended AND state = 'idle'"
            " ORDER BY due LIMIT %s", (limit + 1,),
        )
        due = [str(sid) for sid, left in rows[:limit] if float(left) <= 0]
        next_due = max(float(rows[len(due)][1]), 0.0) if len(rows) > len(due) else None
        if not due:
            return IdleSweep([], next_due)
        async with self._pg.transaction() as conn:
            # A row another writer holds is left for the next sweep: it may be moving on.
            cur = await conn.execute(
                "UPDATE sessions SET ended = true, version = version + 1, holder = NULL,"
                " lease_until = NULL, updated_at = clock_timestamp() WHERE id IN (SELECT id"
                " FROM sessions WHERE id = ANY(%s) AND NOT ended AND state = 'idle'"
                f" AND {_IDLE_LEFT} <= 0 FOR UPDATE SKIP LOCKED) RETURNING id, repo",
                (due,),
            )
            ended = [(str(sid), str(repo)) for sid, repo in await cur.fetchall()]
            # An idle session has no step claim: no claims lock is taken.
            await drop_ended_work(conn, [sid for sid, _ in ended])
        return IdleSweep(ended, next_due)

    async def change_token(self) -> int:
        rows = await self._pg.fetch_all(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
        )
        return int(rows[0][0])


def _lease(row: Row) -> SessionLease:
    session_id, repo, state, version, holder, until, model, ended = row
    return SessionLease(
        str(session_id), str(repo), State(state), int(version),
        None if holder is None else str(holder), until,
        None if model is None else str(model), bool(ended),
    )
