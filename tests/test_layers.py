"""Which part of mnemo may import which: no circle between mnemo's top-level packages and
modules, nor between the modules of one package; the command line and the MCP server are two
front ends over the facade, neither importing the other, and neither knowing a database driver
(the JSON shapes they share are `mnemo.jsonable`)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import mnemo
from tests.source import parsed

PACKAGE = Path(mnemo.__file__).parent


def imported(folder: Path) -> dict[str, set[str]]:
    """Each module of `folder` (by its path in the package) and the modules it imports,
    wherever in the module (a deferred import counts too)."""
    found: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
        found[str(path.relative_to(PACKAGE))] = names
    return found


def _offending(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{module} imports {name}"
        for module, names in imported(PACKAGE / folder).items()
        for name in sorted(names)
        if any(name == f or name.startswith(f"{f}.") for f in forbidden)
    ]


DRIVERS = ("sqlite3", "psycopg", "psycopg_pool", "mnemo.storage.sqlite", "mnemo.storage.postgres")


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("mcp", ("mnemo.cli", "mnemo.ui", *DRIVERS)),
        ("cli", ("mnemo.mcp._output", *DRIVERS)),
        ("ui", ("mnemo.cli", "mnemo.mcp", *DRIVERS)),
    ],
)
def test_a_front_end_imports_neither_the_other_nor_a_driver(
    folder: str, forbidden: tuple[str, ...]
) -> None:
    """No module of mnemo/mcp imports mnemo.cli, and no front end (mcp, cli, ui) imports
    sqlite3, psycopg or a backend's own folder under mnemo/storage: what they need of a store
    goes through the facade or mnemo/storage's backend-neutral modules."""
    assert _offending(folder, forbidden) == []


@pytest.mark.slow
def test_the_version_and_the_package_import_none_of_the_parts() -> None:
    """`mnemo --version` and `import mnemo` load no part of mnemo (each public name is
    imported when first used), nor typer or numpy: the version answers at once."""
    import subprocess
    import sys

    code = (
        "import sys; sys.argv = ['mnemo', '--version']; import mnemo; "
        "from mnemo.cli import main; main(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('typer', 'numpy', 'httpx', 'rich') or m.startswith('mnemo.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    version, loaded = done.stdout.splitlines()
    assert version.startswith("mnemo ")
    assert loaded == "['mnemo.cli', 'mnemo.version']"


# Packages whose modules still import each other in a circle, each with its circle; every other
# package is held to the rule. An entry goes as soon as its circle does.
CIRCLES_ALLOWED: dict[str, str] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(body: list[ast.stmt], *, everywhere: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of `body`: with `everywhere`, all of them (under
    `if TYPE_CHECKING:` and inside functions and classes too); otherwise only those that run
    when the module is imported (`if TYPE_CHECKING:` blocks and function bodies left out)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if everywhere or not _is_type_checking(node.test):
                yield from _statements(node.body, everywhere=everywhere)
            yield from _statements(node.orelse, everywhere=everywhere)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse,
                          node.finalbody):
                yield from _statements(block, everywhere=everywhere)
        elif isinstance(node, ast.With):
            yield from _statements(node.body, everywhere=everywhere)
        elif everywhere and isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.For | ast.While
        ):
            yield from _statements(node.body, everywhere=everywhere)


def module_imports(*, everywhere: bool) -> dict[str, set[str]]:
    """Each module of mnemo (`mnemo.graph.reads`) and the modules of mnemo it imports: for
    `from P import N`, `P.N` when that is a module, else `P` (a relative import resolved)."""
    found: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _statements(parsed(path).body, everywhere=everywhere):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = node.module or ""
            if node.level:
                kept = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*kept, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.add(full if full in MODULES else base)
        found[name] = {t for t in targets if t in MODULES and t != name}
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of `graph` with more than one node (Tarjan), each
    sorted: every import circle, one entry per tangle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _top(module: str) -> str:
    """The top-level package or module of mnemo a module belongs to (`mnemo.graph`)."""
    return ".".join(module.split(".")[:2])


def test_no_import_circle_between_top_level_packages() -> None:
    """No circle runs between mnemo's top-level packages and modules (`mnemo.graph`,
    `mnemo.ports`, ...), counting every import: those run at import time, those under
    `if TYPE_CHECKING:`, and those deferred into a function."""
    graph: dict[str, set[str]] = {}
    for module, targets in module_imports(everywhere=True).items():
        if module == "mnemo":
            continue  # the package's lazy re-exports of the public names
        graph.setdefault(_top(module), set()).update(
            _top(t) for t in targets if _top(t) != _top(module)
        )
    assert circles(graph) == []


def test_no_import_circle_between_modules() -> None:
    """No circle runs between mnemo's modules through the imports run when a module is
    imported (those under `if TYPE_CHECKING:` and those deferred into a function are left
    out), but inside the packages `CIRCLES_ALLOWED` names."""
    found = [
        circle
        for circle in circles(module_imports(everywhere=False))
        if not any(all(m.startswith(f"{p}.") for m in circle) for p in CIRCLES_ALLOWED)
    ]
    assert found == []


def test_the_circle_finder_finds_a_circle() -> None:
    """`circles` reports a circle of three and a pair, and nothing for a chain."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d", "f"}, "f": set()}
    assert circles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert circles({"a": {"b"}, "b": {"c"}}) == []
