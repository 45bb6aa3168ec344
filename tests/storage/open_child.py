"""A child process for the open-race test: for each path given, it prints "ready", waits for a
line on stdin, then opens a Memory on that path and a repo in it.

    python -m tests.storage.open_child PATH...
"""

from __future__ import annotations

import sys

import anyio

import mnemo
from tests.fakes import FakeEmbedder, FakeLLM


async def open_store(path: str) -> None:
    async with mnemo.Memory(path, llm=FakeLLM(), embedder=FakeEmbedder()) as mem:
        await mem.open_repo("shared")


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print("ready", flush=True)
        sys.stdin.readline()  # the parent says go once every child is ready
        anyio.run(open_store, path)
