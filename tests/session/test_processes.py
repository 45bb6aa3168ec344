"""Many processes on one store (the API contract, "Storage backends and many processes"), with real
worker processes (tests/session/worker_child.py) killed by SIGKILL: an extraction held by a
killed process is taken over within the lease, and under random kills nothing accepted is
lost and nothing is committed twice.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

import mnemo
from mnemo import State
from tests.fakes import (
    Callbacks,
    EventLog,
    FakeEmbedder,
    FakeLLM,
    extracted_observations,
    waiting_for_claims,
)
from tests.session.worker_child import INGESTED, chaos_embedder

ROOT = Path(__file__).resolve().parents[2]
REPO = "r"
# Short enough to keep the tests quick, long enough for a child to start and renew its lease
# on a busy 2-core machine.
LEASE = 2.0


class Child:
    """A worker_child process whose stdout lines are counted as they come."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self.ended = False  # its stdout closed: it exited or was killed
        self._changed = anyio.Event()

    async def read(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            if lines:
                self.lines.extend(line.decode() for line in lines)
                changed, self._changed = self._changed, anyio.Event()
                changed.set()
        self.ended = True
        self._changed.set()

    async def wait_lines(self, n: int) -> None:
        """Waits until the child printed `n` lines (or ended)."""
        while len(self.lines) < n and not self.ended:
            await self._changed.wait()

    async def kill(self) -> int | None:
        """SIGKILLs the child (no cleanup at all); returns its exit code if it had ended on
        its own first, else None."""
        try:
            self.process.kill()
        except ProcessLookupError:
            return await self.process.wait()
        code = await self.process.wait()
        return None if code == -9 else code


@asynccontextmanager
async def child(
    tg: anyio.abc.TaskGroup, log: Path, *args: str
) -> AsyncIterator[Child]:
    """Starts `python -m tests.session.worker_child ARGS`; its stderr goes to `log`."""
    with log.open("ab") as stderr:
        process = await anyio.open_process(
            [sys.executable, "-m", "tests.session.worker_child", *args],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
        )
    started = Child(process)
    tg.start_soon(started.read)
    try:
        yield started
    finally:
        if process.returncode is None:
            await started.kill()
        await process.aclose()


@asynccontextmanager
async def children() -> AsyncIterator[anyio.abc.TaskGroup]:
    """A task group for the children's readers, cancelled when the block ends; a single
    failure comes out as itself, not in an exception group (so xfail's `raises` sees it)."""
    try:
        async with anyio.create_task_group() as tg:
            yield tg
            tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from group
        raise


def config() -> mnemo.Config:
    return mnemo.Config(lease_timeout=LEASE)


@asynccontextmanager
async def holding(
    tg: anyio.abc.TaskGroup, tmp_path: Path, store: str, mode: str = "hold"
) -> AsyncIterator[tuple[Child, str]]:
    """A child holding the work of a session it closed (its LLM hangs: worker_child's `mode`),
    and the session's id, its first line."""
    log = tmp_path / f"{mode}.log"
    async with child(tg, log, store, mode, str(LEASE)) as holder:
        with anyio.fail_after(60):
            await holder.wait_lines(1)
        assert holder.lines, log.read_text()
        yield holder, holder.lines[0]


@pytest.mark.slow
async def test_an_ingest_waits_on_a_live_process_claim_and_takes_a_killed_ones(
    store: str, tmp_path: Path
) -> None:
    """A child ingesting a source (its LLM hangs) holds its claim: an identical ingest here
    asks no model while the child lives; once the child is SIGKILLed, it ingests the source
    itself, once."""
    llm = FakeLLM()
    async with children() as tg:
        async with child(tg, tmp_path / "ingesting.log", store, "ingesting", str(LEASE)) as holder:
            with anyio.fail_after(60):
                await holder.wait_lines(1)
            assert holder.lines == ["claimed"], (tmp_path / "ingesting.log").read_text()
            async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(),
                                    config=config()) as mem:
                await mem.open_repo(REPO, config=config())
                done: list[mnemo.IngestReceipt] = []
                ended = anyio.Event()

                async def ingest() -> None:
                    done.append(await mem.ingest(REPO, INGESTED, source_id="s1"))
                    ended.set()

                async with anyio.create_task_group() as mine:
                    mine.start_soon(ingest)
                    with anyio.move_on_after(LEASE / 2):
                        await ended.wait()
                    assert not done
                    assert llm.calls == [], "asked its model while a live process held the claim"
                    await holder.kill()
                    with anyio.fail_after(LEASE * 3):
                        await ended.wait()
                assert done[0].created
                assert len(await mem.history(REPO)) == 1


@pytest.mark.slow
async def test_a_killed_holders_extraction_is_taken_over_within_the_lease(
    store: str, tmp_path: Path
) -> None:
    """A child holding an extraction (its LLM hangs) is left alone while it lives; once it is
    SIGKILLed, a Memory open in this process finishes the extraction within the lease
    without being asked, and commits it once."""
    llm, events = FakeLLM(), EventLog()
    async with children() as tg:
        async with holding(tg, tmp_path, store) as (holder, sid):
            async with mnemo.Memory(
                store, llm=llm, embedder=FakeEmbedder(), config=config(), on_event=events
            ) as mem:
                await mem.open_repo(REPO, config=config())
                assert await mem.session_state(sid) is State.EXTRACTING
                asked = llm.hold("semantic")
                # The holder is alive and renews its lease: half a lease without a takeover.
                with anyio.move_on_after(LEASE / 2):
                    await asked.started.wait()
                assert not asked.started.is_set(), "took over the work of a live holder"
                asked.release()
                await holder.kill()
                with anyio.fail_after(LEASE * 3):
                    landed = await events.wait_state(mem, sid, State.READY, State.FAILED)
                assert landed is State.READY
                receipt = await mem.commit(sid)
                assert receipt is not None
                facts = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])
                assert sorted(f.text for f in facts) == [
                    "fact: walk east", "fact: walk north", "fact: walk south"
                ]


@pytest.mark.slow
async def test_an_inspecting_memory_never_takes_a_killed_holders_extraction_over(
    store: str, tmp_path: Path
) -> None:
    """A child holding an extraction is SIGKILLed. What opens the store for inspection with
    the work's own model (a Memory with inspect=True, the web app's view, the MCP server's
    reads) reads the session and recalls for two leases, and the model is never asked to
    extract; a working Memory with that model then takes the work over within the lease.
    Before, the web app and the command line's reads took it over at once."""
    from mnemo.mcp.server import open_tools
    from mnemo.ui import open_view

    llm = FakeLLM()
    async with children() as tg, holding(tg, tmp_path, store) as (holder, sid):
        await holder.kill()
        asked = llm.hold("semantic")
        async with (
            mnemo.Memory(
                store, llm=llm, embedder=FakeEmbedder(), config=config(), inspect=True
            ) as mem,
            open_view(store, llm=llm, embedder=FakeEmbedder()) as view,
            open_tools(store, llm=llm, embedder=FakeEmbedder(), memory_dir=tmp_path) as tools,
        ):
            await mem.open_repo(REPO)
            assert await mem.session_state(sid) is State.EXTRACTING
            await mem.recall(REPO, "walk")
            assert [s.id for s in await view.memory.list_sessions()] == [sid]
            await view.recall(REPO, "walk", 5, None)
            await tools.recall(REPO, "walk")
            assert sid in await tools.list_sessions()
            with anyio.move_on_after(LEASE * 2):
                await asked.started.wait()
            assert not asked.started.is_set(), "an inspection took the extraction over"
            assert await mem.session_state(sid) is State.EXTRACTING
        asked.release()
        events = EventLog()
        async with mnemo.Memory(
            store, llm=llm, embedder=FakeEmbedder(), config=config(), on_event=events
        ) as mem:
            await mem.open_repo(REPO, config=config())
            with anyio.fail_after(LEASE * 3):
                assert await events.wait_state(mem, sid, State.READY) is State.READY


@pytest.mark.slow
async def test_a_killed_holders_background_commit_is_taken_over_within_the_lease(
    store: str, tmp_path: Path
) -> None:
    """An auto-commit session whose holder was committing a finished trajectory in the
    background (its LLM hangs) when it was SIGKILLed: a Memory open in this process takes the
    session over within the lease, without being asked, and commits that trajectory once,
    not at the next flush (two minutes away); the new trajectory's step waits for its own.
    Before, nothing took over an auto-commit session that was not extracting."""
    llm, events = FakeLLM(), EventLog()
    auto = mnemo.Config(lease_timeout=LEASE, auto_commit=True)
    async with children() as tg:
        async with holding(tg, tmp_path, store, "hold_auto") as (holder, sid):
            async with mnemo.Memory(
                store, llm=llm, embedder=FakeEmbedder(), config=auto, on_event=events
            ) as mem:
                await mem.open_repo(REPO, config=auto)
                await holder.kill()
                with anyio.fail_after(LEASE * 3):
                    committed = await events.wait_for(
                        lambda e: e.kind == "trajectory_committed" and e.session_id == sid
                    )
                assert committed.data["step_indices"] == [0, 1]
                assert await mem.session_state(sid) is State.COLLECTING
                facts = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])
                assert sorted(f.text for f in facts) == ["fact: walk east", "fact: walk north"]


@pytest.mark.slow
async def test_a_close_takes_over_the_steps_a_killed_memorys_commit_claimed(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child's boundary commit of the first trajectory hangs in its model call, its steps
    claimed in the store. A close in this process waits: while the child lives, the claimed
    steps are left to it. Once the child is SIGKILLed, the close takes them over (its process
    is gone from this host) and the session ends idle, each step asked once here and in the
    graph once. Before claims, the close asked about the child's steps at once, while the
    child was still at work on them."""
    llm, events = FakeLLM(), EventLog()
    # A long lease here: a late heartbeat of the child must not pass for its death (its
    # process gone from this host is seen at once).
    auto = mnemo.Config(lease_timeout=30.0, auto_commit=True)
    waiting = waiting_for_claims(monkeypatch)
    async with children() as tg:
        async with holding(tg, tmp_path, store, "hold_auto") as (holder, sid):
            async with mnemo.Memory(
                store, llm=llm, embedder=FakeEmbedder(), config=auto, on_event=events
            ) as mem:
                await mem.open_repo(REPO, config=auto)
                await mem.close(sid)
                with anyio.fail_after(30):
                    await waiting.wait()
                # Half a lease with the child alive: the close waits for its claims.
                with anyio.move_on_after(LEASE / 2):
                    await events.wait_state(mem, sid, State.IDLE, State.FAILED, within=LEASE)
                assert await mem.session_state(sid) is State.EXTRACTING
                assert extracted_observations(llm) == []
                await holder.kill()
                landed = await events.wait_state(mem, sid, State.IDLE, State.FAILED,
                                                 within=LEASE * 3)
                assert landed is State.IDLE
                assert extracted_observations(llm) == ["walk north", "walk east", "open door"]
                facts = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])
                assert sorted(f.text for f in facts) == [
                    "fact: open door", "fact: walk east", "fact: walk north"]


async def annotated_steps(mem: mnemo.Memory, sid: str) -> list[tuple[str, bool]]:
    [*_, episode] = await mem.episodes(sid)
    return [(s.line, s.annotated) for s in episode.steps]


@pytest.mark.slow
async def test_a_killed_memorys_stored_step_is_annotated_by_another_without_a_call(
    store: str, tmp_path: Path
) -> None:
    """A child stores a step and is SIGKILLed while the model annotates it: the step is in
    the store, left alone while the child lives (it holds its claim), then annotated by a
    Memory open here without being asked (its takeover task takes the claim over)."""
    llm = FakeLLM()
    async with children() as tg:
        async with holding(tg, tmp_path, store, "annotating") as (holder, sid):
            async with mnemo.Memory(
                store, llm=llm, embedder=FakeEmbedder(), config=config()
            ) as mem:
                await mem.open_repo(REPO, config=config())
                assert await annotated_steps(mem, sid) == [("walk north -> go north", False)]
                held = llm.hold("state")
                with anyio.move_on_after(LEASE):  # two looks of the takeover task, the child alive
                    await held.started.wait()
                assert not held.started.is_set()
                await holder.kill()
                with anyio.fail_after(LEASE * 5):
                    await held.started.wait()
                held.release()
                assert await mem.session_state(sid) is State.COLLECTING
                receipt = await mem.close_and_commit(sid)
                assert receipt.node_ids
                assert extracted_observations(llm) == ["walk north"]
                assert await annotated_steps(mem, sid) == [("walk north -> go north", True)]


@pytest.mark.slow
async def test_a_step_stored_before_a_kill_is_annotated_after_a_restart(
    store: str, tmp_path: Path
) -> None:
    """Killed between storing a step and its annotation: after a restart (a new Memory on
    the store, nothing else open) the step is there and gets annotated without a call."""
    async with children() as tg:
        async with holding(tg, tmp_path, store, "annotating") as (holder, sid):
            await holder.kill()
    llm = FakeLLM()
    held = llm.hold("state")
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), config=config()) as mem:
        await mem.open_repo(REPO, config=config())
        assert await annotated_steps(mem, sid) == [("walk north -> go north", False)]
        with anyio.fail_after(LEASE * 5):
            await held.started.wait()  # no call asked for it
        held.release()
        info = await mem.append(sid, "walk east", "go east")
        assert (info.index, info.annotated, info.boundary_detected) == (1, True, False)
        assert await annotated_steps(mem, sid) == [("walk north -> go north", True),
                                                   ("walk east -> go east", True)]


@pytest.mark.slow
async def test_operations_a_killed_memory_took_are_called_back_as_failed(
    store: str, tmp_path: Path
) -> None:
    """A commit, a start_episode and an append accepted here while a child holds the
    extraction are stored for the child, which takes and runs them when its extraction ends:
    the commit and the start call back here with their results; the child is SIGKILLed while
    the append's step, stored, waits on its LLM, and this Memory's takeover task answers the append
    operation_failed at its next look, once (its outcome unknown). Before, its callback never
    came. The session goes on here, with the child's step, annotated here. This Memory's
    lease is long: a child late with its heartbeat on a busy machine is not taken for gone
    while it lives (its pid is what says it died)."""
    llm = FakeLLM()
    here = mnemo.Config(lease_timeout=3 * LEASE)
    recorded = Callbacks()

    async with children() as tg:
        async with holding(tg, tmp_path, store, "run_ops") as (runner, sid):
            async with mnemo.Memory(
                store, llm=llm, embedder=FakeEmbedder(), config=here
            ) as mem:
                await mem.open_repo(REPO, config=config())

                async def took_nothing(*_: Any, **__: Any) -> list[Any]:
                    return []

                # This Memory's watcher leaves the taking to the child (it may look between
                # the child's end of extraction and its take, and run them itself).
                mem._backend.coordination.take_ops = took_nothing  # type: ignore[method-assign]
                await mem.commit_async(sid, recorded("commit"))
                await mem.start_episode_async(sid, "walk on", recorded("start"))
                await mem.append_async(sid, "walk west", "go west", recorded("append"))
                assert runner.process.stdin is not None
                await runner.process.stdin.send(b"go\n")
                with anyio.fail_after(60):
                    await runner.wait_lines(2)
                    await recorded.wait(2, within=60)
                assert runner.lines[1] == "held", (tmp_path / "run_ops.log").read_text()
                assert [(label, r.value) for label, r in recorded.results] == [
                    ("commit", "committed"), ("start", "started")]
                await runner.kill()
                # The takeover task looks every half lease.
                await recorded.wait(3, within=LEASE * 3)
                [(label, failed)] = recorded.results[2:]
                assert label == "append"
                assert failed.error is not None
                assert failed.error.reason == "operation_failed"
                assert "left before it recorded a result" in str(failed.error.__cause__)
                assert await mem.session_state(sid) is State.COLLECTING
                # The child stored the step before it asked the model (durable first): it is
                # kept, and annotated here, before the next one.
                info = await mem.append(sid, "walk north", "go north")
                assert (info.index, info.annotated) == (1, True)
                [*_, episode] = await mem.episodes(sid)
                assert [(s.line, s.annotated) for s in episode.steps] == [
                    ("walk west -> go west", True), ("walk north -> go north", True)]
                assert len(recorded.results) == 3


def journal(path: Path) -> list[dict[str, Any]]:
    """The accepted operations a chaos worker journaled; a last line cut short by a kill was
    never fsync'd as accepted, so it is left out."""
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


# Workers, operations per life of a worker, and kills: sized for < 30 s per backend on a
# 2-core machine.
WORKERS, OPS, KILLS = 3, 30, 4


@pytest.mark.slow
async def test_chaos_kills_lose_no_accepted_step_and_commit_nothing_twice(
    store: str, tmp_path: Path
) -> None:
    """Three worker processes append, close and commit random sessions of one store while
    random ones are SIGKILLed and restarted; then every journaled step is in its episode
    once, every episode's indexes are contiguous, no step's node is in the repo twice, and
    no fact or instruction is either, though the workers' sessions say some of them
    again and again, concurrently."""
    rng = random.Random(11)
    paths = [tmp_path / f"journal-{w}.jsonl" for w in range(WORKERS)]
    seeds = iter(range(1000))

    def args(w: int) -> list[str]:
        return [store, "chaos", str(LEASE), str(paths[w]), f"w{w}", str(next(seeds)), str(OPS)]

    # The store and repo exist before the workers race to open them.
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=chaos_embedder()) as first:
        await first.open_repo(REPO, config=config())
    async with children() as tg, AsyncExitStack() as stack:
        logs = [tmp_path / f"worker-{w}.log" for w in range(WORKERS)]
        running = [
            await stack.enter_async_context(child(tg, logs[w], *args(w)))
            for w in range(WORKERS)
        ]
        for _ in range(KILLS):
            w = rng.randrange(WORKERS)
            with anyio.fail_after(60):
                await running[w].wait_lines(rng.randint(1, OPS // 3))
            ended = await running[w].kill()
            assert ended in (None, 0), logs[w].read_text()
            running[w] = await stack.enter_async_context(child(tg, logs[w], *args(w)))
        with anyio.fail_after(120):
            for worker in running:
                await worker.process.wait()
        for w, worker in enumerate(running):
            assert worker.process.returncode == 0, logs[w].read_text()
    entries = [entry for path in paths for entry in journal(path)]
    assert any(entry["op"] == "commit" for entry in entries), "no commit: too small to test"
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=chaos_embedder()) as mem:
        await mem.open_repo(REPO, config=config())
        episodes = {
            sid: await mem.episodes(sid) for sid in {entry["sid"] for entry in entries}
        }
        for sid, logs_of in episodes.items():
            for episode in logs_of:
                assert [s.index for s in episode.steps] == list(range(len(episode.steps))), (
                    f"{sid}: step indexes of {episode.id} are not contiguous"
                )
        stored = {
            (sid, step.index, step.observation)
            for sid, logs_of in episodes.items()
            for episode in logs_of
            for step in episode.steps
        }
        accepted = {
            (entry["sid"], entry["index"], entry["observation"])
            for entry in entries
            if entry["op"] == "append"
        }
        assert accepted - stored == set(), "accepted steps lost"
        nodes = await mem.get_nodes_by_type(
            REPO, [mnemo.NodeType.SEMANTIC, mnemo.NodeType.PROCEDURAL, mnemo.NodeType.EPISODIC]
        )
        # A step said in several sessions is several steps; a fact or an instruction is one.
        twice = {text: n for text, n in Counter(
            node.text for node in nodes
            if node.type is not mnemo.NodeType.EPISODIC or "shared" not in node.text
        ).items() if n > 1}
        assert twice == {}, "nodes committed twice"
        shared = [n for n in nodes if n.type is mnemo.NodeType.SEMANTIC and "shared" in n.text]
        assert shared, "no shared fact committed: too small to test"
        facts = Counter(node.text for node in nodes if node.type is mnemo.NodeType.SEMANTIC)
        for logs_of in episodes.values():
            for episode in logs_of:
                if episode.status == "committed":
                    for step in episode.steps:
                        assert facts[f"fact: {step.observation}"] == 1, (
                            f"{episode.id}: committed, but its step {step.index} is not in "
                            "the repo once"
                        )


@pytest.mark.slow
async def test_operations_stored_before_a_takeover_run_first_and_bound_the_queue(
    store: str, tmp_path: Path
) -> None:
    """Regression: an operation this Memory accepted while a live child
    held the extraction is stored for it; once the child is killed and this Memory takes the
    work over, the operations it accepts next were validated without the stored one (a
    second commit was accepted) and ran before it. Now the stored one counts as queued first
    and runs first."""
    llm = FakeLLM()
    recorded = Callbacks()

    async with children() as tg:
        async with holding(tg, tmp_path, store) as (holder, sid):
            async with mnemo.Memory(
                store, llm=llm, embedder=FakeEmbedder(), config=config()
            ) as mem:
                await mem.open_repo(REPO, config=config())
                asked = llm.hold("semantic")
                await mem.commit_async(sid, recorded("commit"))  # stored: the child holds it
                await holder.kill()
                with anyio.fail_after(LEASE * 3):
                    await asked.started.wait()  # taken over: the extraction runs here
                with pytest.raises(mnemo.SessionError) as refused:
                    await mem.commit_async(sid, recorded("commit again"))
                assert refused.value.reason == "invalid_queued_operation"
                await mem.start_episode_async(sid, "walk west", recorded("start"))
                asked.release()
                await recorded.wait(2, within=30)
                assert [(label, r.ok) for label, r in recorded.results] == [
                    ("commit", True), ("start", True)]
                assert await mem.session_state(sid) is State.COLLECTING


@pytest.mark.slow
async def test_operations_a_killed_holder_accepted_behind_its_extraction_run_after_a_takeover(
    store: str, tmp_path: Path
) -> None:
    """A child holding an extraction accepts a commit, a new episode and an append of it,
    queued behind its own extraction, and is SIGKILLed: they were stored with the session, so
    the Memory that takes the extraction over runs them, in order, once."""
    events = EventLog()
    async with children() as tg:
        async with holding(tg, tmp_path, store, "hold_queued") as (holder, sid):
            with anyio.fail_after(30):
                await holder.wait_lines(2)
            assert holder.lines[1:] == ["queued"]
            await holder.kill()
            async with mnemo.Memory(
                store, llm=FakeLLM(), embedder=FakeEmbedder(), config=config(), on_event=events
            ) as mem:
                await mem.open_repo(REPO, config=config())
                with anyio.fail_after(LEASE * 10):
                    await events.wait_for(lambda e: e.kind == "step_appended"
                                          and e.session_id == sid)
                assert await mem.session_state(sid) is State.COLLECTING
                [*_, last] = await mem.episodes(sid)
                assert [s.observation for s in last.steps] == ["walk west"]
                assert len([c for c in await mem.history(REPO) if c.session_id == sid]) == 1
