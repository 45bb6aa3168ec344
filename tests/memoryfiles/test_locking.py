"""Writers of one memory-files directory take turns: `MemoryFiles` objects and processes.

The API contract: "Concurrent writes are serialised; writes are atomic." Two objects on one
directory, or two processes, honour its lock files: the writer lock from a write's scan
through its model calls to its last file written, the file lock across each read-merge-write
and use stamp.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from functools import partial
from pathlib import Path

import anyio
import anyio.lowlevel
import filelock
import pytest

import mnemo
from mnemo.calls.tasks import task_inputs
from mnemo.memoryfiles._folder import Folder
from mnemo.memoryfiles.files import LOCK_FILE, WRITER_LOCK_FILE, DirectoryLock
from tests.memoryfiles.fakes import SlowOffline, user


class OneTopic:
    """Files every statement under one topic, after a checkpoint (so writers interleave)."""

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        await anyio.lowlevel.checkpoint()
        statement = task_inputs(request)["statement"]
        return mnemo.LLMResponse(
            data={"topic": "ops", "description": "ops facts", "entry": statement}
        )


def entries(directory: Path) -> list[str]:
    (only,) = mnemo.MemoryFiles(directory).list()
    return sorted(only.content.splitlines())


async def test_two_objects_on_one_directory_lose_nothing(tmp_path: Path) -> None:
    """Two MemoryFiles objects persisting 40 statements each to one topic at once keep all 80."""
    a = mnemo.MemoryFiles(tmp_path, max_chars=100_000)
    b = mnemo.MemoryFiles(tmp_path, max_chars=100_000)
    statements = {a: [f"Fact A{n} holds." for n in range(40)],
                  b: [f"Fact B{n} holds." for n in range(40)]}
    llm = OneTopic()
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for files, said in statements.items():
                for statement in said:
                    tg.start_soon(partial(files.persist, statement, llm=llm))
    assert entries(tmp_path) == sorted(f"- {s}" for said in statements.values() for s in said)


@pytest.mark.parametrize("write", ["persist", "update", "recall"])
async def test_the_lock_file_is_held_from_read_to_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    """Whenever a file is written (a persist, an update, a recall's use stamp), another process
    cannot take the directory's lock file: it is held across the read-merge-write."""
    files = mnemo.MemoryFiles(tmp_path)
    await files.persist("Our wiki lives at wiki.acme.io.", llm=None)
    others_could_lock: list[bool] = []
    real_write = Folder.write

    def write_and_probe(folder: Folder, name: str, text: str) -> None:
        # Another process's view: its own descriptor of the lock file.
        probe = filelock.FileLock(str(tmp_path / LOCK_FILE))
        try:
            probe.acquire(blocking=False)
        except filelock.Timeout:
            others_could_lock.append(False)
        else:
            probe.release()
            others_could_lock.append(True)
        real_write(folder, name, text)

    monkeypatch.setattr(Folder, "write", write_and_probe)
    if write == "persist":
        await files.persist("The wiki is backed up nightly.", llm=None)
    elif write == "update":
        statement = "We decided the wiki keeps 3 replicas."
        assert (await files.update(user(statement), llm=None, iterations=10)).error is None
    else:
        assert await files.recall("wiki")
    assert others_could_lock
    assert not any(others_could_lock)


def could_lock(path: Path) -> bool:
    """Whether another process (its own descriptor of `path`) could take the lock now."""
    probe = filelock.FileLock(str(path))
    try:
        probe.acquire(blocking=False)
    except filelock.Timeout:
        return False
    probe.release()
    return True


class Probing(SlowOffline):
    """The offline LLM, recording whether another process could take the writer lock while
    it is asked."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.writer_lock = directory / WRITER_LOCK_FILE
        self.others_could_lock: list[bool] = []

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        self.others_could_lock.append(could_lock(self.writer_lock))
        return await super().generate(request)


@pytest.mark.parametrize("write", ["persist", "update"])
async def test_the_writer_lock_is_held_while_the_model_is_asked(tmp_path: Path, write: str) -> None:
    """While a write asks the model (which picks its topics from the directory as it scanned
    it), another process cannot take the directory's writer lock."""
    files = mnemo.MemoryFiles(tmp_path)
    llm = Probing(tmp_path)
    if write == "persist":
        await files.persist("Our wiki lives at wiki.acme.io.", llm=llm)
    else:
        statement = "We decided the wiki keeps 3 replicas."
        assert (await files.update(user(statement), llm=llm, iterations=10)).error is None
    assert llm.others_could_lock
    assert not any(llm.others_could_lock)
    assert could_lock(tmp_path / WRITER_LOCK_FILE)


async def test_recall_does_not_wait_for_a_writers_model(tmp_path: Path) -> None:
    """A recall (which stamps a use) ends while another object's write waits for its model."""
    reader = mnemo.MemoryFiles(tmp_path)
    await reader.persist("Our wiki lives at wiki.acme.io.", llm=None)
    writer = mnemo.MemoryFiles(tmp_path)
    asked = anyio.Event()
    answer = anyio.Event()

    class Held:
        async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
            asked.set()
            await answer.wait()
            return await OneTopic().generate(request)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(writer.persist, "The wiki is backed up nightly.", llm=Held()))
            await asked.wait()
            (found,) = await reader.recall("wiki")
            assert "wiki.acme.io" in found.content
            answer.set()
    assert len(reader.list()) == 2


async def test_a_cancelled_wait_for_the_lock_holds_nothing(tmp_path: Path) -> None:
    """A wait for a lock file another process holds ends when cancelled, taking nothing: once
    that process lets go, the lock is free to everyone."""
    other = filelock.FileLock(str(tmp_path / LOCK_FILE))
    other.acquire()
    lock = DirectoryLock(Folder(tmp_path))
    entered: list[bool] = []

    async def wait() -> None:
        async with lock.held():
            entered.append(True)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
    other.release()
    assert entered == []
    again = filelock.FileLock(str(tmp_path / LOCK_FILE))
    again.acquire(blocking=False)
    again.release()
    async with lock.held():
        entered.append(True)
    assert entered == [True]


CHILD = textwrap.dedent(
    """
    import json, sys, anyio, mnemo
    from pathlib import Path
    from mnemo.calls.tasks import task_inputs

    class One:
        async def generate(self, request):
            statement = task_inputs(request)["statement"]
            data = {"topic": "ops", "description": "ops facts", "entry": statement}
            return mnemo.LLMResponse(data=data)

    async def main():
        files = mnemo.MemoryFiles(Path(sys.argv[1]), max_chars=100_000)
        print("ready", flush=True)
        sys.stdin.readline()
        for n in range(int(sys.argv[2])):
            await files.persist(f"Fact C{n} holds.", llm=One())

    anyio.run(main)
    """
)


@pytest.mark.slow
async def test_two_processes_on_one_directory_lose_nothing(tmp_path: Path) -> None:
    """A child process and this one persisting to one topic at once keep every statement."""
    count = 60
    source = tmp_path / "child.py"
    source.write_text(CHILD, encoding="utf-8")
    directory = tmp_path / "memory"
    files = mnemo.MemoryFiles(directory, max_chars=100_000)
    llm = OneTopic()
    with anyio.fail_after(60):
        async with await anyio.open_process(
            [sys.executable, str(source), str(directory), str(count)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        ) as child:
            assert child.stdin is not None
            assert child.stdout is not None
            assert (await child.stdout.receive()).startswith(b"ready")
            await child.stdin.send(b"go\n")
            for n in range(count):
                await files.persist(f"Fact P{n} holds.", llm=llm)
            assert await child.wait() == 0
    expected = [f"- Fact {who}{n} holds." for who in "CP" for n in range(count)]
    assert entries(directory) == sorted(expected)
