"""A first `Memory` in a process does not hold the event loop while mnemo imports: the
libraries of its parts (SQLite's, the lexical index's, the models') are imported in a worker
thread when it is entered, off the loop. Only what naming `mnemo.Memory` needs (mnemo's own
modules, msgspec for `Config` and numpy for the graph's vectors) is imported where the caller
names it. Checked in a fresh process by an audit hook that records which thread imports what.
The recall's modules are among the parts': a first recall imports none on the loop."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

ROOT = Path(__file__).resolve().parents[1]

COLD_OPEN = """
import json, os, sys, tempfile, threading
import anyio

async def main() -> None:
    seen = []
    sys.addaudithook(lambda event, args: event == "import"
                     and seen.append((threading.current_thread().name, args[0])))
    import mnemo
    with tempfile.TemporaryDirectory() as folder:
        async with mnemo.Memory(os.path.join(folder, "m.db")):
            pass
    loop = threading.current_thread().name
    print(json.dumps({"loop": [m for t, m in seen if t == loop],
                      "off": [m for t, m in seen if t != loop]}))

anyio.run(main)
"""

# What naming `mnemo.Memory` imports besides mnemo and the standard library.
FACADE_NEEDS = {"msgspec", "numpy"}


def libraries(modules: list[str]) -> set[str]:
    """The top-level packages of `modules` that are neither mnemo nor the standard library
    (a name an import merely tried, as pickle's `org.python.core`, is among them)."""
    return {m.split(".")[0] for m in modules} - set(sys.stdlib_module_names) - {"mnemo", "org"}


@pytest.mark.slow
def test_a_cold_memory_imports_its_parts_libraries_off_the_event_loop() -> None:
    done = subprocess.run(
        [sys.executable, "-c", COLD_OPEN], cwd=ROOT, capture_output=True, check=True,
        text=True, timeout=120,
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert libraries(seen["loop"]) <= FACADE_NEEDS, seen["loop"]
    assert {"sqlite_utils", "transitions"} <= libraries(seen["off"]), seen["off"]


FIRST_RECALL = """
import json, sys, threading
import anyio, mnemo

async def main() -> None:
    threads = []
    sys.addaudithook(lambda event, args: event == "import"
                     and args[0].startswith("mnemo.recall.")
                     and threads.append(threading.current_thread().name))
    async with mnemo.Memory(sys.argv[1], embedder=mnemo.HashEmbedder()) as mem:
        await mem.open_repo("r")
        await mem.recall("r", "deploy failed on staging", k=5)
    print(json.dumps({"importers": threads, "loop": threading.current_thread().name}))

anyio.run(main)
"""


@pytest.mark.slow
async def test_a_first_recall_imports_its_modules_off_the_event_loop(store: str) -> None:
    """In a fresh process, the recall's modules are imported by a worker thread, with the
    parts' when the Memory opens, never by the event loop's (at open or at the first recall)."""
    done = await anyio.run_process(
        [sys.executable, "-c", FIRST_RECALL, store], cwd=ROOT, check=True)
    seen = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert seen["importers"], seen
    assert seen["loop"] not in seen["importers"], seen


WALKED = """
import gc, importlib, json, sys
import anyio, mnemo
if sys.argv[2]:  # the backend's module imported first, no faiss, a model of the caller's
    importlib.import_module("mnemo.storage.postgres.store" if sys.argv[1].startswith("postgres")
                            else "mnemo.storage.sqlite")
    sys.modules["faiss"] = None
embedder = mnemo.HashEmbedder() if sys.argv[2] else None

async def main() -> None:
    async with mnemo.Memory(sys.argv[1], embedder=embedder) as mem:
        await mem.open_repo("r")
        await mem.ingest("r", mnemo.Trajectory("deploy", [mnemo.Step("deploy failed", "retry")]),
                         source_id="s")
        await mem.recall("r", "deploy failed on staging", k=5)
        gc.collect()
        print(json.dumps({"tracked": len(gc.get_objects()), "frozen": gc.get_freeze_count()}))

anyio.run(main)
"""


@pytest.mark.slow
@pytest.mark.parametrize("first", ["", "backend first"])
async def test_a_full_collection_does_not_walk_what_the_imports_made(
        store: str, first: str) -> None:
    """The modules the parts, the default embedder's runtime and faiss import live as long as
    the process: the collector freezes them (also when a backend's module was imported
    first), so a full collection (which holds the GIL, and so the loop) walks only the
    objects made since (tens of thousands before)."""
    done = await anyio.run_process(
        [sys.executable, "-c", WALKED, store, first], cwd=ROOT, check=True)
    seen = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert seen["tracked"] < 10_000 < seen["frozen"], seen
