"""The `Coordination` port on both backends: holders and their heartbeat, compare-and-set
on a session's version, and the work nobody holds any more (the primitives of many Memories
on one store)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import anyio
import pytest

import mnemo
from mnemo.session.machine import State
from mnemo.session.ports import HolderInfo, StoredOp, StoredResult
from mnemo.storage.ports import Backend
from tests.backends import open_stores, sql
from tests.fakes import FakeEmbedder, FakeLLM

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
async def backend(store: str) -> AsyncIterator[Backend]:
    """A store with one repo "r" and its stores opened without a Memory."""
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder()) as mem:
        await mem.open_repo("r")
    async with open_stores(store, FakeEmbedder().dim) as opened:
        yield opened


async def a_session(backend: Backend, store: str) -> str:
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder()) as mem:
        return await mem.start_session("explore", repo="r")


def holder(name: str, seen: datetime = T0) -> HolderInfo:
    return HolderInfo(name, "host-1", 4242, T0, seen)


async def test_holders_register_beat_and_retire(backend: Backend) -> None:
    """A holder is listed once registered (again: replaced), its heartbeat moves `seen_at`,
    and it is gone once retired."""
    co = backend.coordination
    await co.register(holder("b"))
    await co.register(holder("a"))
    await co.register(holder("a", seen=T0 + timedelta(seconds=1)))
    assert [(h.id, h.seen_at) for h in await co.holders()] == [
        ("a", T0 + timedelta(seconds=1)), ("b", T0)]
    await co.beat("a", T0 + timedelta(seconds=5), T0 + timedelta(seconds=35))
    assert {h.id: h.seen_at for h in await co.holders()}["a"] == T0 + timedelta(seconds=5)
    await co.retire("a", T0 + timedelta(seconds=6))
    assert [h.id for h in await co.holders()] == ["b"]


async def test_a_holder_unseen_for_two_days_goes_when_another_registers(
    backend: Backend,
) -> None:
    """A killed process never retires: its row goes once another holder registers two days
    after it was last seen (past any lease); a row seen since stays."""
    co = backend.coordination
    await co.register(holder("killed"))
    await co.register(holder("quiet", seen=T0 + timedelta(days=1)))
    await co.register(holder("new", seen=T0 + timedelta(days=2, seconds=1)))
    assert [h.id for h in await co.holders()] == ["new", "quiet"]


async def test_claim_is_compare_and_set_on_the_version(backend: Backend, store: str) -> None:
    """A claim at the current version wins and moves the version on; a second claim at the
    same (now stale) version changes nothing; the lease and the state are written."""
    co = backend.coordination
    sid = await a_session(backend, store)
    before = await co.lease(sid)
    assert before is not None
    assert (before.state, before.holder, before.lease_until) == (State.COLLECTING, None, None)
    until = T0 + timedelta(seconds=30)
    won = await co.claim(sid, version=before.version, holder_id="a", lease_until=until,
                         state=State.EXTRACTING)
    assert won == before.version + 1
    assert await co.claim(sid, version=before.version, holder_id="b", lease_until=until) is None
    after = await co.lease(sid)
    assert after is not None
    assert (after.state, after.version, after.holder, after.lease_until) == (
        State.EXTRACTING, won, "a", until)
    assert await co.lease("session_unknown") is None


async def test_racing_claims_have_one_winner(backend: Backend, store: str) -> None:
    """Ten claims of one version at once: exactly one wins."""
    co = backend.coordination
    sid = await a_session(backend, store)
    lease = await co.lease(sid)
    assert lease is not None
    won: list[int | None] = []

    async def claim(name: str) -> None:
        won.append(await co.claim(sid, version=lease.version, holder_id=name,
                                  lease_until=T0 + timedelta(seconds=30)))

    async with anyio.create_task_group() as tg:
        for i in range(10):
            tg.start_soon(claim, f"h{i}")
    assert sorted(w is not None for w in won) == [False] * 9 + [True]


async def test_takeable_is_extracting_work_whose_holder_is_gone_or_late(
    backend: Backend, store: str
) -> None:
    """Extracting sessions are takeable once their lease ended, their holder stopped beating,
    or retired; a fresh lease with a living holder, and any other state, is not; a heartbeat
    renews the lease of every session its holder holds."""
    co = backend.coordination
    await co.register(holder("alive"))
    await co.register(holder("silent"))
    sessions = [await a_session(backend, store) for _ in range(4)]
    leases = {}
    for sid, (name, until) in zip(sessions, [
        ("alive", T0 + timedelta(seconds=30)),   # held
        ("alive", T0 - timedelta(seconds=1)),    # its lease ended
        ("silent", T0 + timedelta(seconds=30)),  # its holder stopped beating
        ("gone", T0 + timedelta(seconds=30)),    # no such holder
    ], strict=True):
        lease = await co.lease(sid)
        assert lease is not None
        leases[sid] = await co.claim(sid, version=lease.version, holder_id=name,
                                     lease_until=until, state=State.EXTRACTING)
    await co.beat("alive", T0, T0 + timedelta(seconds=30))  # renews both of alive's leases
    now, unseen_since = T0 + timedelta(seconds=1), T0 - timedelta(seconds=10)
    await sql(backend, "UPDATE holders SET seen_at = ? WHERE id = 'silent'",
              (T0 - timedelta(seconds=60)).isoformat(timespec="microseconds"))
    found = [lease.id for lease in await co.takeable(now, unseen_since)]
    assert found == sorted(found, key=sessions.index)
    assert set(found) == {sessions[2], sessions[3]}
    await co.retire("alive", now)
    assert set(lease.id for lease in await co.takeable(now + timedelta(microseconds=1),
                                                       unseen_since)) == set(sessions)


async def test_the_change_token_moves_when_another_connection_writes(
    backend: Backend, store: str
) -> None:
    """What a waiting Memory polls: another connection's commit moves the token."""
    co = backend.coordination
    first = await co.change_token()
    await a_session(backend, store)  # another Memory: another connection
    assert await co.change_token() != first


async def takers(backend: Backend) -> datetime:
    """Registers "late" (last seen before the returned cut-off), "alive" and "dead_pid" (seen
    after it; the second is named gone by the tests); "retired" never registers."""
    cut = T0 + timedelta(seconds=30)
    await backend.coordination.register(holder("late", seen=T0))
    for name in ["alive", "dead_pid"]:
        await backend.coordination.register(holder(name, seen=cut + timedelta(seconds=1)))
    return cut


async def test_abandon_ops_forgets_only_what_a_departed_taker_left_without_a_result(
    backend: Backend, store: str
) -> None:
    """Of six stored operations, `abandon_ops` forgets and returns those taken by a holder
    that retired (never recorded), was last seen before the cut-off, or is named gone;
    one taken by a holder seen since, one whose result is recorded and one nobody took stay.
    Only the ids asked about are looked at, and never one `me` took; `still_taken` says
    whether a holder still has an operation."""
    co = backend.coordination
    sid = await a_session(backend, store)
    cut = await takers(backend)
    await co.queue_op(StoredOp("op_not_asked", sid, "commit", [], "a", T0))
    assert [op.id for op in await co.take_ops(sid, "retired")] == ["op_not_asked"]
    for n, taker in enumerate(["retired", "late", "dead_pid", "alive", "finished", None]):
        await co.queue_op(StoredOp(f"op{n}", sid, "commit", [], "a", T0))
        if taker is not None:
            assert [op.id for op in await co.take_ops(sid, taker)] == [f"op{n}"]
    await co.finish_op("op4", StoredResult(True, "committed"))
    asked = [f"op{n}" for n in range(6)]
    assert await co.abandon_ops(["op1"], cut, me="late") == []  # never what `me` took
    assert [await co.still_taken("op1", who) for who in ("late", "alive")] == [True, False]
    assert sorted(await co.abandon_ops(asked, cut, ["dead_pid"])) == ["op0", "op1", "op2"]
    assert not await co.still_taken("op1", "late")
    assert sorted(r[0] for r in await sql(backend, "SELECT id FROM ops")) == [
        "op3", "op4", "op5", "op_not_asked"]
    assert await co.abandon_ops(asked, cut, ["dead_pid"]) == []
    assert await co.abandon_ops([], cut) == []


async def test_forget_orphans_forgets_only_what_nobody_waits_for_and_is_answered_or_left(
    backend: Backend, store: str
) -> None:
    """`forget_orphans` forgets the stored operations whose accepting Memory closed or left
    (retired, last seen before the cut-off, or named gone) that are answered, or that a holder
    took and left without a result (likewise judged); never one `me` took. One a live Memory
    waits for (that is `abandon_ops`' to answer, or its own to read), one nobody took (it
    still runs) and one a live holder took stay."""
    co = backend.coordination
    sid = await a_session(backend, store)
    cut = await takers(backend)
    for op_id, accepted_by, taker in [
        ("retired", "", "retired"), ("late", "", "late"), ("gone", "", "dead_pid"),
        ("alive", "", "alive"), ("waited_for", "alive", "late"),
        ("answered_for_the_gone", "dead_pid", "alive"), ("answered", "alive", "alive"),
        ("answered_for_the_late", "late", "alive"),
        ("untaken", "", None), ("untaken_for_the_gone", "dead_pid", None),
    ]:
        await co.queue_op(StoredOp(op_id, sid, "commit", [], accepted_by, T0))
        if taker is not None:
            assert [op.id for op in await co.take_ops(sid, taker)] == [op_id]
    for op_id in ["answered_for_the_gone", "answered", "answered_for_the_late"]:
        await co.finish_op(op_id, StoredResult(True, "committed"))
    assert await co.forget_orphans(cut, me="late") == 2  # the retired one's; the late's answer
    assert await co.forget_orphans(cut, ["dead_pid"]) == 3
    assert sorted(r[0] for r in await sql(backend, "SELECT id FROM ops")) == [
        "alive", "answered", "untaken", "untaken_for_the_gone", "waited_for"]
    assert await co.forget_orphans(cut, ["dead_pid"]) == 0


async def test_claim_steps_leaves_a_live_holders_claims_to_it(
    backend: Backend, store: str
) -> None:
    """A claim takes the uncommitted steps nobody else holds, and those of a claimer that
    left (last seen before the cut-off, named gone, or retired); a live claimer keeps its own
    until it gives them up or retires; a committed step is claimed by nobody, and the
    session's end drops every claim."""
    co = backend.coordination
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder()) as mem:
        sid = await mem.start_session("explore", repo="r")
        for i in range(6):
            await mem.append(sid, f"look {i}", f"act {i}")
    steps = [str(r[0]) for r in await sql(
        backend, "SELECT id FROM steps WHERE session_id = ? ORDER BY idx", sid)]
    cut = await takers(backend)
    await co.register(holder("me", seen=cut + timedelta(seconds=1)))

    async def claim(name: str, *indices: int, gone: tuple[str, ...] = ()) -> list[int]:
        granted = await co.claim_steps(sid, [steps[i] for i in indices], name,
                                       unseen_since=cut, gone=gone)
        return sorted(steps.index(step) for step in granted)

    assert await claim("alive", 0, 1) == [0, 1]
    assert await claim("late", 2) == [2]
    assert await claim("dead_pid", 3) == [3]
    assert await claim("retired", 4) == [4]
    await sql(backend, "UPDATE steps SET committed_in = 'changeset_x' WHERE id = ?", steps[5])
    assert await claim("me", 0, 1, 2, 3, 4, 5, gone=("dead_pid",)) == [2, 3, 4]
    assert await claim("alive", 0, 1, 2) == [0, 1]  # its own still, not me's
    assert await claim("me", 2) == [2]  # held already
    await co.release_steps(sid, "alive", [steps[1]])
    assert await claim("me", 0, 1) == [1]
    await co.retire("alive", cut + timedelta(seconds=2))
    assert await claim("me", 0) == [0]
    assert await claim("alive", 0, 1, 2, 3, 4, 5) == []
    await backend.sessions.end(sid)
    assert await sql(backend, "SELECT * FROM step_claims") == []


async def test_the_stores_clock_is_this_hosts_when_they_share_one(backend: Backend) -> None:
    """`now` is the store's time: on one host (SQLite; a local PostgreSQL server) the host's
    own, before and after `sync_clock`, and it only moves forward."""
    co = backend.coordination
    await co.sync_clock()
    first = co.now()
    assert abs(first - datetime.now(UTC)) < timedelta(seconds=1)
    await co.sync_clock()
    assert abs(co.now() - datetime.now(UTC)) < timedelta(seconds=1)
    assert co.now() >= first
