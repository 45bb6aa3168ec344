"""Every SQL statement of mnemo lives under `mnemo/storage/`: a module anywhere else
that holds one is a consumer that knows its backend."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import mnemo
from tests.source import parsed

PACKAGE = Path(mnemo.__file__).parent
STORAGE = PACKAGE / "storage"

# Statements as mnemo writes them (keywords in capitals); prose and names such as
# `MEMORY_UPDATE_SCHEMA` do not match.
STATEMENT = re.compile(
    r"\bSELECT\b[\s\S]*\bFROM\b"
    r"|\bINSERT\s+(?:OR\s+\w+\s+)?INTO\b"
    r"|\bUPDATE\s+\S+\s+SET\b"
    r"|\bDELETE\s+FROM\b"
    r"|\bPRAGMA\s+\w+"
    r"|\b(?:CREATE|DROP|ALTER)\s+(?:VIRTUAL\s+)?(?:TABLE|INDEX|TRIGGER)\b"
)


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes (they may name a statement when explaining one)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _strings(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Each string literal with its line; an f-string with `{}` for each placeholder."""
    skip = _docstrings(tree)
    inside_fstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = []
            for value in node.values:
                inside_fstrings.add(id(value))
                parts.append(value.value if isinstance(value, ast.Constant) else "{}")
            yield node.lineno, "".join(str(p) for p in parts)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skip | inside_fstrings
        ):
            yield node.lineno, node.value


def sql_statements(source: str | ast.Module) -> list[tuple[int, str]]:
    """The string literals of `source` (code, or its parsed tree) that hold an SQL statement,
    with their lines."""
    tree = ast.parse(source) if isinstance(source, str) else source
    return [(line, text) for line, text in _strings(tree) if STATEMENT.search(text)]


@pytest.mark.parametrize(
    "source",
    [
        'conn.execute("SELECT id FROM messages WHERE thread_id = ?", (t,))',
        'q = f"SELECT {COLUMNS} FROM snapshots WHERE level = 1"',
        'q = ("INSERT OR IGNORE INTO pins(a, b)"\n " VALUES (?, ?)")',
        'db.execute("UPDATE threads SET boundary_seq = ? WHERE id = ?")',
        'db.execute(f"DELETE FROM {table} WHERE thread_id = ?")',
        'conn.execute("PRAGMA secure_delete = 1")',
    ],
)
def test_detector_finds_statements(source: str) -> None:
    """The detector flags plain, implicitly joined and f-string statements."""
    assert sql_statements(source)


@pytest.mark.parametrize(
    "source",
    [
        'MEMORY_UPDATE_SCHEMA = {"type": "object"}',
        'text = "Select the facts from the observation; update the summary"',
        'def f():\n    """Runs `DELETE FROM pins` in the store."""\n',
    ],
)
def test_detector_ignores_prose(source: str) -> None:
    """Names, lower-case prose and docstrings are no statements."""
    assert sql_statements(source) == []


def test_sql_lives_only_in_storage() -> None:
    """No module of mnemo outside mnemo/storage/ holds an SQL statement."""
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {text.strip()[:60]}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if not path.is_relative_to(STORAGE)
        for line, text in sql_statements(parsed(path))
    ]
    assert offenders == []
