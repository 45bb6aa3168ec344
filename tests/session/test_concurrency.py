"""Many sessions at once: commits to one repo are serialised and deduplicated exactly."""

from __future__ import annotations

import anyio
import pytest

import mnemo
from tests.conftest import REPO
from tests.fakes import FakeEmbedder, FakeLLM

SESSIONS = 40
WORDS = ["walk", "open", "read", "take", "look"]


@pytest.mark.slow
async def test_dozens_of_sessions_commit_to_one_repo(mem: mnemo.Memory, llm: FakeLLM) -> None:
    """40 sessions appending and committing concurrently leave exact node counts: one TAG per
    concept, one INTENT in all (the fakes embed every "do ..." intent alike), every step, and
    one instruction per session (each says its own at every step)."""

    async def one(n: int) -> None:
        sid = await mem.start_session(f"session {n}", repo=REPO)
        for word in WORDS:
            await mem.append(sid, f"{word} thing {n}", f"act {n}")
        await mem.close_and_commit(sid)

    async with anyio.create_task_group() as tg:
        for n in range(SESSIONS):
            tg.start_soon(one, n)

    async def count(kind: mnemo.NodeType) -> int:
        return len(await mem.get_nodes_by_type(REPO, [kind]))

    steps = SESSIONS * len(WORDS)
    assert await count(mnemo.NodeType.EPISODIC) == steps
    assert await count(mnemo.NodeType.SEMANTIC) == steps
    # Each session's steps say one instruction ("act n"): stored once.
    assert await count(mnemo.NodeType.PROCEDURAL) == SESSIONS
    assert await count(mnemo.NodeType.SOURCE) == SESSIONS
    assert await count(mnemo.NodeType.SUBGOAL) == steps  # every word starts a trajectory
    assert sorted(n.text for n in await mem.get_nodes_by_type(REPO, [mnemo.NodeType.TAG])) == (
        sorted(WORDS)
    )
    assert await count(mnemo.NodeType.INTENT) == 1


async def test_appends_to_one_session_run_in_call_order(mem: mnemo.Memory) -> None:
    """Concurrent appends to one session get indices in the order they were called."""
    sid = await mem.start_session("explore", repo=REPO)
    infos: dict[int, mnemo.StepInfo] = {}

    async def one(n: int) -> None:
        infos[n] = await mem.append(sid, f"walk {n}", f"go {n}")

    async with anyio.create_task_group() as tg:
        for n in range(20):
            tg.start_soon(one, n)
    assert {n: info.index for n, info in infos.items()} == {n: n for n in range(20)}
    context = await mem.session_context(sid)
    assert context is not None
    assert context.recent_steps == [f"walk {n} -> go {n}" for n in range(15, 20)]


async def test_append_waiting_for_its_turn_when_the_session_ends(
    mem: mnemo.Memory, llm: FakeLLM
) -> None:
    """An append whose step is stored and still waits on the LLM when its session ends
    returns it unannotated (it was stored before the end, and stays in the log); nothing is
    committed."""
    sid = await mem.start_session("explore", repo=REPO)
    held = llm.hold("state")
    outcome: list[object] = []

    async def append() -> None:
        outcome.append(await mem.append(sid, "walk north", "go north"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(append)
        with anyio.fail_after(5):
            await held.started.wait()
        await mem.end_session(sid)
        held.release()
    assert outcome == [mnemo.StepInfo(0, None, None, annotated=False)]
    assert await mem.get_nodes_by_type(REPO, list(mnemo.NodeType)) == []


def limiter(mem: mnemo.Memory, llm: FakeLLM, width: int) -> anyio.CapacityLimiter | None:
    """The limiter of the calls to `llm` under configs of `llm_concurrency=width`, once a
    call made it."""
    entry = mem._repos.limits._limiters.get((id(llm), width))
    return None if entry is None else entry[1]


@pytest.mark.parametrize("where", ["memory", "repo", "session"])
async def test_llm_concurrency_caps_calls_in_flight_wherever_it_is_set(
    store: str, where: str
) -> None:
    """`llm_concurrency=2` in the Memory's, the repo's or a session's config: with five
    appends waiting on the provider, two calls hold its slots and the others wait for one (a
    repo's or session's setting was lost under the Memory's default of 16)."""
    llm = FakeLLM()
    held = llm.hold("state")
    config = mnemo.Config(llm_concurrency=2)
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(),
                            config=config if where == "memory" else None) as mem:
        await mem.open_repo(REPO, config=config if where == "repo" else None)
        sids = [await mem.start_session(f"goal {i}", repo=REPO,
                                        config=config if where == "session" else None)
                for i in range(5)]
        async with anyio.create_task_group() as tg:
            for sid in sids:
                tg.start_soon(mem.append, sid, "walk north", "go north")
            with anyio.fail_after(5):
                # Each append asks for several annotations at once: more than 2 calls queue.
                while (
                    (slots := limiter(mem, llm, 2)) is None
                    or slots.borrowed_tokens != 2 or slots.statistics().tasks_waiting < 3
                ):
                    await anyio.wait_all_tasks_blocked()
            held.release()
        assert [t for t in llm.tasks() if t == "state"] == ["state"] * 5


async def test_a_sessions_llm_concurrency_caps_its_own_calls_only(store: str) -> None:
    """A session with llm_concurrency=1 leaves the provider's other users at their own cap:
    one narrow setting used to cap every call of the provider for the Memory's life."""
    llm = FakeLLM()
    held = llm.hold("state")
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        narrow = await mem.start_session("narrow", repo=REPO,
                                         config=mnemo.Config(llm_concurrency=1))
        wide = [await mem.start_session(f"goal {i}", repo=REPO) for i in range(3)]
        async with anyio.create_task_group() as tg:
            tg.start_soon(mem.append, narrow, "walk north", "go north")
            for sid in wide:
                tg.start_soon(mem.append, sid, "walk north", "go north")
            with anyio.fail_after(5):
                # Calls reach the LLM (and its hold) only past their limiter: all four
                # appends' state calls get there at once.
                while llm.tasks().count("state") < 4:
                    await anyio.wait_all_tasks_blocked()
            one = limiter(mem, llm, 1)
            assert one is not None
            assert one.borrowed_tokens == 1
            held.release()


async def test_a_close_waiting_for_the_lock_is_refused_by_an_append_begun_meanwhile(
    mem: mnemo.Memory, llm: FakeLLM
) -> None:
    """A close passes its check, then waits for the session's lock; an append begins
    meanwhile (and waits for the lock to store its step): the close is refused with
    append_in_progress and the append lands (the close went through, and the append was
    refused)."""
    sid = await mem.start_session("explore", repo=REPO)
    record = mem._live.by_id[sid]
    held = llm.hold("subgoal")
    outcomes: dict[str, object] = {}

    async def close() -> None:
        try:
            await mem.close(sid)
            outcomes["close"] = "closed"
        except mnemo.SessionError as exc:
            outcomes["close"] = exc.reason

    async def append() -> None:
        outcomes["append"] = (await mem.append(sid, "walk north", "go north")).index

    async with anyio.create_task_group() as tg:
        async with record.lock:
            tg.start_soon(close)
            with anyio.fail_after(5):
                while not record.lock.statistics().tasks_waiting:  # the close waits for it
                    await anyio.wait_all_tasks_blocked()
            tg.start_soon(append)
            with anyio.fail_after(5):
                while record.lock.statistics().tasks_waiting < 2:  # the append waits too
                    await anyio.wait_all_tasks_blocked()
        with anyio.fail_after(5):
            await held.started.wait()
        held.release()
    assert outcomes == {"close": "append_in_progress", "append": 0}
    assert await mem.session_state(sid) is mnemo.State.COLLECTING
