"""The distribution's name: every install line says it, and a foreign `mnemo` package is
named by `mnemo doctor`."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from mnemo.version import DISTRIBUTION, foreign_distributions

ROOT = Path(__file__).resolve().parent.parent
NAME = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
# What `pip install` installs: its first argument that is not an option.
INSTALL = re.compile(r"pip install (?:-[-\w]+ )*\\?['\"]?([\w.-]+(?:\[[\w,-]+\])?)")


def install_lines() -> list[tuple[str, str]]:
    files = [ROOT / "README.md", *sorted((ROOT / "mnemo").rglob("*.py"))]
    found = []
    for path in files:
        for match in INSTALL.finditer(path.read_text()):
            found.append((str(path.relative_to(ROOT)), match.group(1)))
    return found


def test_the_distribution_is_named_once() -> None:
    """pyproject's name is the one mnemo reads its own version by."""
    assert NAME == DISTRIBUTION == "pymnemo"


def test_every_install_line_names_the_distribution() -> None:
    """Each `pip install` in README and in mnemo/ installs this project (by its name or from
    the clone), never a package of another name."""
    lines = install_lines()
    assert len(lines) >= 5
    for where, target in lines:
        assert re.fullmatch(rf"({NAME}|\.)(\[[a-z0-9,-]+\])?", target), (where, target)


def test_a_foreign_mnemo_package_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another installed distribution that ships a top-level `mnemo` is listed."""
    info = tmp_path / "mnemo_agent-0.5.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mnemo-agent\nVersion: 0.5.0\n")
    (info / "RECORD").write_text("mnemo/__init__.py,,\nmnemo_agent-0.5.0.dist-info/METADATA,,\n")
    assert "mnemo-agent" not in foreign_distributions()
    monkeypatch.syspath_prepend(str(tmp_path))
    assert foreign_distributions() == ["mnemo-agent"]
