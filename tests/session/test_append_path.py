"""How far a step walks: the files of mnemo one append runs through, and the imports among the
session modules.

What `test_an_append_runs_through_few_files` counts (`tests/paths.py`): the distinct source
files under mnemo/, `adapters/` left out, of the Python functions called (`sys.setprofile` and
`threading.setprofile` "call" events) on every thread from the call of `Memory.append` until it
returns, its step stored and annotated. The append is a second one (the first has the session's
record and the store warmed up), on the offline model and the hashing embedder, to a SQLite
file. The Memory's own periodic work, the holder's heartbeat and takeover looks
(`timers.holder`), does not run: it is not the append's, and would make the count depend on when
it comes.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import mnemo
from tests.paths import PACKAGE, files_run, quiet_holder

SESSION = PACKAGE / "session"

# The most files an append may run through (what counts: the module's docstring).
MOST_FILES = 12


async def files_of_one_append(store: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files of mnemo (relative to the package, `adapters/` left out) one append runs
    through, sorted."""
    quiet_holder(monkeypatch)
    async with mnemo.Memory(
        store, llm=mnemo.OfflineLLM(), embedder=mnemo.HashEmbedder()
    ) as mem:
        await mem.open_repo("r")
        sid = await mem.start_session("tidy the shed", repo="r")
        await mem.append(sid, "the shed is full of boxes", "open the first box")
        with files_run() as seen:
            info = await mem.append(sid, "the box holds old tools", "sort the tools")
        assert info.annotated
        assert len((await mem.episodes(sid))[0].steps) == 2
    return sorted(seen)


async def test_an_append_runs_through_few_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One append runs through at most `MOST_FILES` files of mnemo, its annotation included
    (what counts: the module's docstring)."""
    files = await files_of_one_append(str(tmp_path / "memory.db"), monkeypatch)
    assert "storage/sessions.py" in files
    assert "episode.py" in files
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
    assert {"machine", "transitions", "extracting", "operations", "timers"} <= set(graph)
    assert circle(graph) is None


def test_the_session_core_is_a_few_modules() -> None:
    """mnemo/session holds at most 8 modules (`__init__.py` counted), none past 500 lines."""
    modules = sorted(SESSION.glob("*.py"))
    assert len(modules) <= 8, [m.name for m in modules]
    sizes = {m.name: len(m.read_text(encoding="utf-8").splitlines()) for m in modules}
    assert max(sizes.values()) <= 500, sizes


async def test_the_session_store_says_the_version_an_append_checks(mem: mnemo.Memory) -> None:
    """`SessionStore.version`, the read an append makes when its turn comes, is the version
    the session's last write left (each append moves it on), and None once it ended."""
    sid = await mem.start_session("tidy the shed", repo="r")
    live = mem._live
    first = await live.store.version(sid)
    await mem.append(sid, "the shed is full of boxes", "open the first box")
    second = await live.store.version(sid)
    assert first is not None
    assert second == live.by_id[sid].version
    assert second > first
    await mem.end_session(sid)
    assert await live.store.version(sid) is None
    assert await live.store.version("session_unknown") is None
