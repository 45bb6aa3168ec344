"""Concurrent writes give a result some serial order of them could give (the API contract:
"Concurrent writes are serialised").

A write picks its topic from the topics it finds: with the offline LLM, a statement joins an
existing topic sharing its words, else starts one named from its key phrase. One after another,
related statements therefore make one file; a write that picked its topic from a directory
another write changed meanwhile split one topic across many files (20 files).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from functools import partial
from pathlib import Path

import anyio
import pytest

import mnemo
from tests.memoryfiles.fakes import SlowOffline, user

STATEMENTS = [f"Deployment rule {n}: deploy service s{n} carefully." for n in range(20)]
DECISIONS = [f"We decided deployment rule {n} applies to service s{n}." for n in range(10)]


def one_topic(directory: Path, said: list[str]) -> None:
    """`directory` holds one file, named after one of `said`, with every statement of `said`."""
    (only,) = mnemo.MemoryFiles(directory).list()
    lines = only.content.splitlines()
    assert len(lines) == len(said)
    for statement in said:
        assert any(statement.rstrip(".") in line for line in lines), statement
    assert only.topic.startswith("deployment")


async def test_serial_persists_make_one_file(tmp_path: Path) -> None:
    """The baseline: related statements persisted one after another share one file."""
    files = mnemo.MemoryFiles(tmp_path)
    for statement in STATEMENTS:
        await files.persist(statement, llm=None)
    one_topic(tmp_path, STATEMENTS)


async def test_concurrent_persists_pick_topics_as_in_a_serial_order(tmp_path: Path) -> None:
    """Related statements persisted concurrently on one object also share one file."""
    files = mnemo.MemoryFiles(tmp_path)
    llm = SlowOffline()
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for statement in STATEMENTS:
                tg.start_soon(partial(files.persist, statement, llm=llm))
    one_topic(tmp_path, STATEMENTS)


async def test_concurrent_offline_persists_pick_topics_as_in_a_serial_order(
    tmp_path: Path,
) -> None:
    """`llm=None`, 20 concurrent persists, one file."""
    files = mnemo.MemoryFiles(tmp_path)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for statement in STATEMENTS:
                tg.start_soon(partial(files.persist, statement, llm=None))
    one_topic(tmp_path, STATEMENTS)


async def test_concurrent_updates_pick_topics_as_in_a_serial_order(tmp_path: Path) -> None:
    """Related decisions filed by concurrent updates on one object share one file."""
    files = mnemo.MemoryFiles(tmp_path)
    llm = SlowOffline()
    results: list[mnemo.MemoryUpdate] = []

    async def run(statement: str) -> None:
        results.append(await files.update(user(statement), llm=llm, iterations=10))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for statement in DECISIONS:
                tg.start_soon(run, statement)
    assert [r.error for r in results] == [None] * len(DECISIONS)
    one_topic(tmp_path, DECISIONS)


async def test_two_objects_pick_topics_as_in_a_serial_order(tmp_path: Path) -> None:
    """Two MemoryFiles objects on one directory, one persisting and one updating at once,
    file related statements in one file."""
    a = mnemo.MemoryFiles(tmp_path)
    b = mnemo.MemoryFiles(tmp_path)
    llm = SlowOffline()
    persisted, decided = STATEMENTS[:10], DECISIONS
    results: list[mnemo.MemoryUpdate] = []

    async def run(statement: str) -> None:
        results.append(await b.update(user(statement), llm=llm, iterations=10))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for statement, decision in zip(persisted, decided, strict=True):
                tg.start_soon(partial(a.persist, statement, llm=llm))
                tg.start_soon(run, decision)
    assert [r.error for r in results] == [None] * len(decided)
    one_topic(tmp_path, persisted + decided)


CHILD = textwrap.dedent(
    """
    import sys, anyio, mnemo
    from pathlib import Path
    from mnemo.adapters.offline import OfflineLLM

    class Slow:
        async def generate(self, request):
            await anyio.sleep(0.2)
            return await OfflineLLM().generate(request)

    async def main():
        files = mnemo.MemoryFiles(Path(sys.argv[1]))
        print("ready", flush=True)
        sys.stdin.readline()
        for n in range(int(sys.argv[2])):
            await files.persist(f"Deployment rule C{n}: deploy service c{n} carefully.", llm=Slow())

    anyio.run(main)
    """
)


@pytest.mark.slow
async def test_two_processes_pick_topics_as_in_a_serial_order(tmp_path: Path) -> None:
    """A child process and this one persisting related statements at once share one file."""
    count = 3
    source = tmp_path / "child.py"
    source.write_text(CHILD, encoding="utf-8")
    directory = tmp_path / "memory"
    files = mnemo.MemoryFiles(directory)
    llm = SlowOffline(0.2)
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
                await files.persist(f"Deployment rule P{n}: deploy service p{n} carefully.",
                                    llm=llm)
            assert await child.wait() == 0
    said = [f"Deployment rule {who}{n}: deploy service {who.lower()}{n} carefully."
            for who in "CP" for n in range(count)]
    one_topic(directory, said)
