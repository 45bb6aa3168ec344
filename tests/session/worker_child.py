"""A worker process for tests/session/test_processes.py: one `Memory` on a shared store, on
the tests' fakes, doing what one worker of a multi-process app would.

    python -m tests.session.worker_child STORE hold LEASE
    python -m tests.session.worker_child STORE hold_auto LEASE
    python -m tests.session.worker_child STORE annotating LEASE
    python -m tests.session.worker_child STORE chaos LEASE JOURNAL WORKER SEED OPS

"hold": starts a session in repo "r", appends three steps and closes it while its "semantic"
task hangs; once the extraction is asked that task it prints the session id and waits
forever (the test kills it there).

"run_ops": the same as "hold", then, once a line comes on stdin (the test stored its
operations for the session meanwhile), lets the extraction end, runs the stored operations it
then takes, and holds the first append among them at its "state" task: once asked, it prints
"held" and waits forever.

"hold_auto": the same as "hold" in an auto-commit session, held at the boundary's background commit:
two "walk" steps, then an "open" step that starts a new trajectory, whose commit of the first
one hangs at "semantic".

"annotating": starts a session in repo "r" and appends one step whose annotation hangs (its
"state" task): once the task is asked (the step is stored first), it prints the session id and
waits forever.

"ingesting": ingests the trajectory `INGESTED` as source "s1" of repo "r" while its
"semantic" task hangs: once the task is asked (the source claimed) it prints "claimed" and
waits forever.

"chaos": does OPS random operations (start a session, append, close, commit, start an
episode, discard) on random live sessions of the store, from any process; some appends say
what other workers' do (`SHARED`). Each operation that
returned without error is written to JOURNAL as one JSON line and fsync'd before the worker
prints "ok" and moves on, so the journal never holds more than the store accepted. A refused
operation (a `MnemoError`) is not journaled. It exits 0 after OPS operations.
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import IO, Any

import anyio
import anyio.lowlevel
import anyio.to_thread

import mnemo
from mnemo import State
from tests.fakes import EventLog, FakeEmbedder, FakeLLM, Hold

REPO = "r"
SHARED = 3  # the observations every chaos worker may append
STEPS = [("walk north", "go north"), ("walk east", "go east"), ("walk south", "go south")]
INGESTED = mnemo.Trajectory("map the house", [mnemo.Step(o, a) for o, a in STEPS])


def config(lease: float) -> mnemo.Config:
    return mnemo.Config(lease_timeout=lease)


@asynccontextmanager
async def holding(
    store: str, lease: float
) -> AsyncIterator[tuple[FakeLLM, Hold, mnemo.Memory, str]]:
    """A Memory holding the extraction of a session it closed, its "semantic" task held (the
    session's id printed once the task is asked): its LLM, that hold, the Memory, the id."""
    llm = FakeLLM()
    async with mnemo.Memory(
        store, llm=llm, embedder=FakeEmbedder(), config=config(lease), on_event=EventLog()
    ) as mem:
        await mem.open_repo(REPO, config=config(lease))
        sid = await mem.start_session("explore the house", repo=REPO)
        for observation, action in STEPS:
            await mem.append(sid, observation, action)
        held = llm.hold("semantic")
        await mem.close(sid)
        with anyio.fail_after(30):
            await held.started.wait()
        print(sid, flush=True)
        yield llm, held, mem, sid


async def hold(store: str, lease: float) -> None:
    async with holding(store, lease):
        await anyio.sleep_forever()


async def hold_queued(store: str, lease: float) -> None:
    """`hold`, with a commit, a new episode and an append of it queued behind the extraction
    ("queued" printed once they are accepted)."""
    async with holding(store, lease) as (_, _, mem, sid):
        await mem.commit_async(sid)
        await mem.start_episode_async(sid, "walk back")
        await mem.append_async(sid, "walk west", "go west")
        print("queued", flush=True)
        await anyio.sleep_forever()


async def run_ops(store: str, lease: float) -> None:
    async with holding(store, lease) as (llm, extraction, _, _):
        await anyio.to_thread.run_sync(sys.stdin.readline)
        append = llm.hold("state")
        extraction.release()
        with anyio.fail_after(30):
            await append.started.wait()
        print("held", flush=True)
        await anyio.sleep_forever()


async def annotating(store: str, lease: float) -> None:
    llm = FakeLLM()
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), config=config(lease)) as mem:
        await mem.open_repo(REPO, config=config(lease))
        sid = await mem.start_session("explore the house", repo=REPO)
        held = llm.hold("state")
        async with anyio.create_task_group() as tg:
            tg.start_soon(mem.append, sid, "walk north", "go north")
            with anyio.fail_after(30):
                await held.started.wait()
            print(sid, flush=True)
            await anyio.sleep_forever()


async def ingesting(store: str, lease: float) -> None:
    llm = FakeLLM()
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), config=config(lease)) as mem:
        await mem.open_repo(REPO, config=config(lease))
        held = llm.hold("semantic")
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: mem.ingest(REPO, INGESTED, source_id="s1"))
            with anyio.fail_after(30):
                await held.started.wait()
            print("claimed", flush=True)
            await anyio.sleep_forever()


async def hold_auto(store: str, lease: float) -> None:
    llm = FakeLLM()
    auto = mnemo.Config(lease_timeout=lease, auto_commit=True)
    async with mnemo.Memory(
        store, llm=llm, embedder=FakeEmbedder(), config=auto, on_event=EventLog()
    ) as mem:
        await mem.open_repo(REPO, config=auto)
        sid = await mem.start_session("explore the house", repo=REPO)
        held = llm.hold("semantic")
        for observation, action in [*STEPS[:2], ("open door", "push door")]:
            await mem.append(sid, observation, action)
        with anyio.fail_after(30):
            await held.started.wait()
        print(sid, flush=True)
        await anyio.sleep_forever()


def chaos_embedder() -> mnemo.HashEmbedder:
    """The chaos workers' embedder: unlike `FakeEmbedder` (a vector per first word), it tells
    one step's fact from another's, as a commit's dedup needs."""
    return mnemo.HashEmbedder(64)


class Journal:
    """Accepted operations, one fsync'd JSON line each."""

    def __init__(self, file: IO[str]) -> None:
        self.file = file

    def write(self, **entry: Any) -> None:
        self.file.write(json.dumps(entry, sort_keys=True) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())
        print("ok", flush=True)


async def chaos(
    store: str, lease: float, journal: Journal, worker: str, seed: int, ops: int
) -> None:
    rng = random.Random(seed)
    # Unique per life of a worker, so every step's observation and action is unique on the
    # store and a node text seen twice is a step committed twice.
    life = f"{worker}x{seed}"
    async with mnemo.Memory(
        store, llm=FakeLLM(), embedder=chaos_embedder(), config=config(lease)
    ) as mem:
        await mem.open_repo(REPO, config=config(lease))
        for n in range(ops):
            try:
                await step(mem, rng, journal, f"{life}n{n}")
            except mnemo.MnemoError as exc:
                print(f"refused: {exc!r}", file=sys.stderr, flush=True)


async def step(mem: mnemo.Memory, rng: random.Random, journal: Journal, tag: str) -> None:
    """One random operation; journaled only when it returned."""
    live = [s for s in await mem.list_sessions() if s.repo == REPO]
    if not live or (len(live) < 6 and rng.random() < 0.15):
        sid = await mem.start_session(f"goal {tag}", repo=REPO)
        journal.write(op="start", sid=sid)
        return
    session = rng.choice(live)
    sid = session.id
    if session.state is State.COLLECTING:
        if rng.random() < 0.75:
            # Every observation starts with "walk": one trajectory per episode. A few are
            # every worker's (each of their facts and instructions is one node of the
            # store's); the others are this one's alone.
            said = f"shared{rng.randrange(SHARED)}" if rng.random() < 0.3 else tag
            observation, action = f"walk {said}", f"go {said}"
            info = await mem.append(sid, observation, action)
            journal.write(op="append", sid=sid, index=info.index, observation=observation)
        else:
            await mem.close(sid)
            journal.write(op="close", sid=sid)
    elif session.state is State.READY:
        receipt = await mem.commit(sid)
        journal.write(op="commit", sid=sid, nodes=receipt.node_ids if receipt else None)
    elif session.state is State.IDLE:
        await mem.start_episode(sid, f"goal {tag}")
        journal.write(op="start_episode", sid=sid)
    elif session.state is State.FAILED:
        await mem.discard(sid)
        journal.write(op="discard", sid=sid)
    else:
        # Extracting: the worker that holds it finishes it (or a takeover does).
        await anyio.lowlevel.checkpoint()


def main(argv: list[str]) -> None:
    store, mode, lease = argv[0], argv[1], float(argv[2])
    if mode == "hold":
        anyio.run(hold, store, lease)
    elif mode == "run_ops":
        anyio.run(run_ops, store, lease)
    elif mode == "hold_queued":
        anyio.run(hold_queued, store, lease)
    elif mode == "hold_auto":
        anyio.run(hold_auto, store, lease)
    elif mode == "ingesting":
        anyio.run(ingesting, store, lease)
    elif mode == "annotating":
        anyio.run(annotating, store, lease)
    elif mode == "chaos":
        path, worker, seed, ops = argv[3], argv[4], int(argv[5]), int(argv[6])
        # The journal's writes block on purpose: an operation is journaled (fsync'd) before
        # the worker moves on to the next one.
        with open(path, "a", encoding="utf-8") as file:
            anyio.run(chaos, store, lease, Journal(file), worker, seed, ops)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
