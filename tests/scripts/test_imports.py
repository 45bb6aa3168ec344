"""Every name a script in scripts/ imports from mnemo exists: a module moved or renamed
inside the package breaks no benchmark or evaluation unseen."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.py"))


def _imports(script: Path) -> list[tuple[int, str, str]]:
    return [(node.lineno, node.module, alias.name)
            for node in ast.walk(ast.parse(script.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module
            and node.module.split(".")[0] == "mnemo"
            for alias in node.names]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_name_a_script_imports_from_mnemo_exists(script: Path) -> None:
    missing = []
    for line, module, name in _imports(script):
        found = importlib.import_module(module)
        if not hasattr(found, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{script.name}:{line}: {module}.{name}")
    assert missing == []
