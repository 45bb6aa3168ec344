"""A `VectorCache` whose backend can begin a look at the node log (`start`): a `reading` block
begins it at its start and finishes it at its first use of the vectors; a look read at an
older sequence never takes the vectors back."""

from __future__ import annotations

import anyio
import numpy as np

from mnemo.graph.model import NodeType
from mnemo.graph.vectors import VectorIndex
from mnemo.storage.vector_log import Change, Reload, RepoVectors, VectorCache

REPO = "r"
DIM = 4


def vector(i: int) -> np.ndarray:
    out = np.zeros(DIM, dtype=np.float32)
    out[i % DIM] = 1.0
    return out


class Log:
    """A node log and its looks: each look begun is answered when the test says so."""

    def __init__(self) -> None:
        self.loads = 0
        self.begun: list[tuple[int, Gate]] = []  # (the sequence looked from, its answer)

    async def changes(self, repo: str, followed: RepoVectors) -> tuple[int, list[Change]] | None:
        raise AssertionError("a reading block with `start` does not look again")

    async def load(self, repo: str) -> RepoVectors:
        self.loads += 1
        return RepoVectors(VectorIndex(DIM), 0)

    def start(self, repo: str, since: int, generation: int) -> Gate:
        gate = Gate()
        self.begun.append((since, gate))
        return gate


class Gate:
    """A look under way; `answer` settles it."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.answer: tuple[int, list[Change]] | Exception | None = None
        self.discarded = False

    def settle(self, answer: tuple[int, list[Change]] | Exception | None) -> None:
        self.answer = answer
        self.done.set()

    async def result(self) -> tuple[int, list[Change]] | None:
        await self.done.wait()
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def discard(self) -> None:
        self.discarded = True


async def loaded(log: Log) -> VectorCache:
    follower = VectorCache(log.changes, log.load, log.start)
    await follower.index(REPO)  # the first use loads the repo
    return follower


async def test_a_block_begins_its_look_and_its_first_use_finishes_it() -> None:
    """The look begins when the block starts, without waiting for it; the first use waits
    for it and applies what it read; the other uses of the block find it done."""
    log = Log()
    follower = await loaded(log)
    async with follower.reading(REPO):
        assert [since for since, _ in log.begun] == [0]
        gate = log.begun[0][1]
        gate.settle((1, [(10, "x", NodeType.SEMANTIC.value, vector(1))]))
        index = await follower.index(REPO)
        assert "x" in index
        assert await follower.index(REPO) is index
    assert not gate.discarded


async def test_a_look_read_at_an_older_sequence_does_not_undo_a_newer_one() -> None:
    """Two blocks' looks that end in the other order: the later one (x deleted) applied
    first, the earlier one (x added) applied after it changes nothing."""
    log = Log()
    follower = await loaded(log)
    first_used = anyio.Event()
    seen: dict[str, bool] = {}

    async def earlier(task_status: anyio.abc.TaskStatus[None]) -> None:
        async with follower.reading(REPO):
            task_status.started()
            await first_used.wait()
            seen["earlier"] = "x" in await follower.index(REPO)

    async with anyio.create_task_group() as tg:
        await tg.start(earlier)
        async with follower.reading(REPO):
            (_, old), (_, new) = log.begun
            new.settle((2, [(10, None, None, None)]))
            old.settle((1, [(10, "x", NodeType.SEMANTIC.value, vector(1))]))
            seen["later"] = "x" in await follower.index(REPO)
        first_used.set()
    assert seen == {"later": False, "earlier": False}


async def test_a_block_that_never_uses_the_vectors_discards_its_look() -> None:
    """A look begun and never needed is discarded when its block ends."""
    log = Log()
    follower = await loaded(log)
    async with follower.reading(REPO):
        pass
    assert log.begun[0][1].discarded


async def test_a_look_past_the_logs_horizon_loads_the_repo_again() -> None:
    """A begun look that finds the log no longer reaches back (`Reload`) loads the repo."""
    log = Log()
    follower = await loaded(log)
    async with follower.reading(REPO):
        log.begun[0][1].settle(Reload())
        await follower.index(REPO)
    assert log.loads == 2


async def test_a_repo_not_loaded_yet_is_loaded_at_the_blocks_start() -> None:
    """Nothing to look from: the block loads the repo at its start, and begins no look."""
    log = Log()
    follower = VectorCache(log.changes, log.load, log.start)
    async with follower.reading(REPO):
        assert log.loads == 1
        assert log.begun == []
        await follower.index(REPO)
    assert log.loads == 1

