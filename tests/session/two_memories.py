"""What the stateful tests of two `Memory` objects on one store share: a worker (one open
Memory on the fakes, from a blocking portal), letting go of held extractions, waiting for a
session to rest wherever its extraction runs, and a fresh store per hypothesis example."""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import anyio
import anyio.from_thread

import mnemo
from mnemo import State
from tests.fakes import EventLog, FakeLLM, open_test_memory

REPO = "r"


class Worker:
    """One open Memory with repo "r" (configured by `config`), its fake LLM and its events,
    closed with its own stack."""

    def __init__(
        self, portal: anyio.from_thread.BlockingPortal, store: str, config: mnemo.Config
    ) -> None:
        self.llm = FakeLLM()
        self.events = EventLog()
        self.stack = ExitStack()
        self.mem: mnemo.Memory = self.stack.enter_context(portal.wrap_async_context_manager(
            open_test_memory(store, llm=self.llm, on_event=self.events, config=config)
        ))
        portal.call(lambda: self.mem.open_repo(REPO, config=config))


def let_go(llm: FakeLLM) -> None:
    """Releases every hold of `llm`; its calls no longer wait."""
    llm.release_all()
    llm.holds.clear()


async def at_rest(workers: list[Worker], sid: str, *states: State, within: float) -> State:
    """The session's state once it is in one of `states`, as the first of `workers` to see
    it reports (its extraction may run in any of them)."""
    landed: list[State] = []
    with anyio.fail_after(within):
        async with anyio.create_task_group() as tg:

            async def wait(worker: Worker) -> None:
                landed.append(await worker.events.wait_state(worker.mem, sid, *states,
                                                             within=within))
                tg.cancel_scope.cancel()

            for worker in workers:
                tg.start_soon(wait, worker)
    return landed[0]


def store_per_example(
    fresh_stores: Callable[[], str], tmp_path: Path, template: Path
) -> Callable[[], str]:
    """A new store for each hypothesis example: for SQLite a file (two Memories cannot share
    `:memory:`), a copy of `template` (the `sqlite_template` fixture's migrated store, as the
    `store` fixture's), a fresh database for PostgreSQL."""
    files: Iterator[Path] = (tmp_path / f"{n}.db" for n in itertools.count())

    def new_store() -> str:
        fresh = fresh_stores()
        if fresh != ":memory:":
            return fresh
        path = next(files)
        shutil.copyfile(template, path)
        return str(path)

    return new_store
