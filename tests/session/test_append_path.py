"""How far a step walks: the files of mnemo an append passes through on its way to the store,
and the imports among the session modules.

What `test_an_append_reaches_the_store_through_few_files` counts, precisely: the distinct
source files under mnemo/ of the Python functions called (`sys.setprofile` "call" events) on
the event loop's thread while one `Memory.append` runs (a frame counts when `Memory.append`'s
frame is on its stack: other tasks of the Memory running meanwhile are left out), from the
call until the session store's `add_step` returns, that is once the SQLite transaction that
holds the step has committed (the step is stored before it is annotated, so its annotation
comes after). Left out: the call into `mnemo.episode.annotation.annotate_step` and everything
under it, should it run on the way, and the statements SQLite runs in its worker thread
(functions defined in the storage files counted on the loop's side). The
append is a second one (the first has the session's record and the store warmed up), on an
offline model and a hashing embedder, to a SQLite file.
"""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path
from typing import Any

import mnemo
from mnemo.storage.sqlite.sessions import SqliteSessions

PACKAGE = Path(mnemo.__file__).parent
SESSION = PACKAGE / "session"

# The most files an append may pass through (see the module's docstring for what counts): the
# facade's `memory/sessions.py`, the service, the registry, the record, the input checks, the
# step's own module, and SQLite's session store and its connection (which hands the statement
# to its thread itself).
MOST_FILES = 8


def _frames(frame: types.FrameType | None) -> list[types.CodeType]:
    codes = []
    while frame is not None:
        codes.append(frame.f_code)
        frame = frame.f_back
    return codes


async def files_of_one_append(store: str) -> list[str]:
    """The files of mnemo (relative to the package) one append passes through, in the order
    first entered."""
    from mnemo.episode.annotation import annotate_step

    append, annotation = mnemo.Memory.append.__code__, annotate_step.__code__
    add_step = SqliteSessions.add_step.__code__
    seen: list[str] = []
    stored = False

    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        nonlocal stored
        if stored or (event != "call" and not (event == "return" and frame.f_code is add_step)):
            return
        if event == "return":
            stored = True  # the transaction that holds the step has committed
            return
        path = frame.f_code.co_filename
        if not path.startswith(str(PACKAGE)):
            return
        stack = _frames(frame)
        if append not in stack or annotation in stack:
            return
        name = str(Path(path).relative_to(PACKAGE))
        if name not in seen:
            seen.append(name)

    async with mnemo.Memory(
        store, llm=mnemo.OfflineLLM(), embedder=mnemo.HashEmbedder()
    ) as mem:
        await mem.open_repo("r")
        sid = await mem.start_session("tidy the shed", repo="r")
        await mem.append(sid, "the shed is full of boxes", "open the first box")
        sys.setprofile(profile)
        try:
            await mem.append(sid, "the box holds old tools", "sort the tools")
        finally:
            sys.setprofile(None)
        assert len((await mem.episodes(sid))[0].steps) == 2
    assert stored, "the append never reached the session store's add_step"
    return seen


async def test_an_append_reaches_the_store_through_few_files(tmp_path: Path) -> None:
    """One append passes through at most 8 files of mnemo from `Memory.append` to the SQLite
    commit of its step (what counts: the module's docstring)."""
    files = await files_of_one_append(str(tmp_path / "memory.db"))
    assert "storage/sqlite/sessions.py" in files
    assert len(files) <= MOST_FILES, files


def session_imports() -> dict[str, set[str]]:
    """Each module of mnemo/session and the modules of mnemo/session it imports (anywhere in
    the module: a deferred import counts too)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(SESSION.glob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "mnemo.session":
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.module.startswith("mnemo.session."):
                    names.add(node.module.split(".")[2])
            elif isinstance(node, ast.Import):
                names.update(alias.name.split(".")[2] for alias in node.names
                             if alias.name.startswith("mnemo.session."))
        graph[path.stem] = names - {path.stem}
    return graph


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (its modules in import order, the first repeated at the
    end), or None."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module):], module]
        if module in done:
            return None
        for imported in sorted(graph.get(module, ())):
            found = visit(imported, [*path, module])
            if found is not None:
                return found
        done.add(module)
        return None

    for module in sorted(graph):
        found = visit(module, [])
        if found is not None:
            return found
    return None


def test_the_circle_finder_finds_a_circle() -> None:
    """`circle` names the modules of an import circle, and None for a graph without one."""
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_session_module_imports_one_that_imports_it() -> None:
    """The modules of mnemo/session import each other without a circle (the machine's moves
    do not import what runs their effects)."""
    graph = session_imports()
    assert {"transitions", "extracting", "operations", "effects"} <= set(graph)
    assert circle(graph) is None


async def test_the_session_store_says_the_version_an_append_checks(mem: mnemo.Memory) -> None:
    """`SessionStore.version`, the read an append makes when its turn comes, is the version
    the session's last write left (each append moves it on), and None once it ended."""
    sid = await mem.start_session("tidy the shed", repo="r")
    live = mem._service._live
    first = await live.store.version(sid)
    await mem.append(sid, "the shed is full of boxes", "open the first box")
    second = await live.store.version(sid)
    assert first is not None
    assert second == live.by_id[sid].version
    assert second > first
    await mem.end_session(sid)
    assert await live.store.version(sid) is None
    assert await live.store.version("session_unknown") is None
