"""Which part of mnemo may import which: the command line and the MCP server are two front
ends over the facade, neither importing the other, and neither knowing a database driver
(the JSON shapes they share are `mnemo.jsonable`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import mnemo

PACKAGE = Path(mnemo.__file__).parent


def imported(folder: Path) -> dict[str, set[str]]:
    """Each module of `folder` (by its path in the package) and the modules it imports,
    wherever in the module (a deferred import counts too)."""
    found: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
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


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("mcp", ("mnemo.cli", "sqlite3", "psycopg", "psycopg_pool")),
        ("cli", ("mnemo.mcp._output", "sqlite3", "psycopg", "psycopg_pool")),
    ],
)
def test_a_front_end_imports_neither_the_other_nor_a_driver(
    folder: str, forbidden: tuple[str, ...]
) -> None:
    """No module of mnemo/mcp imports mnemo.cli, and no module of either imports sqlite3 or
    psycopg: what they need of a store goes through mnemo/storage or the facade."""
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
