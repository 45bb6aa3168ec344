"""The repository's documents stand on their own: every Markdown link reaches a file of the
repository, and no file names a document outside it as a path."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A Markdown link's target: `[text](target)` or `[text](target "title")`.
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)")
# A URL (http:, mailto:, ...) or an anchor in the same page.
NOT_A_FILE = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|#)")
# The documents beside the repository that a file once named as paths.
OUTSIDE = re.compile(r"\b(?:API|STYLE|EMBEDDINGS)\.md\b|\.\.[/\\]shared\b")


def _files(*suffixes: str) -> Iterator[Path]:
    """The repository's files with these suffixes, outside hidden and generated folders."""
    for path in sorted(ROOT.rglob("*")):
        parts = path.relative_to(ROOT).parts
        if any(p.startswith(".") or p in {"node_modules", "build", "dist"} for p in parts[:-1]):
            continue
        if path.suffix in suffixes and path.is_file():
            yield path


def _bad_links(text: str, base: Path) -> list[str]:
    """The link targets in `text`, read from folder `base`, that leave the repository or name
    no file."""
    bad = []
    for target in LINK.findall(text):
        if NOT_A_FILE.match(target):
            continue
        resolved = (base / target.split("#", 1)[0]).resolve()
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            bad.append(target)
    return bad


def test_markdown_links_stay_inside_the_repository() -> None:
    """Every relative link of every Markdown file reaches an existing file of the repository."""
    found = {
        str(p.relative_to(ROOT)): _bad_links(p.read_text(encoding="utf-8"), p.parent)
        for p in _files(".md")
    }
    assert {name: links for name, links in found.items() if links} == {}
    assert "README.md" in found
    assert "docs/ARCHITECTURE.md" in found


def test_a_link_outside_or_to_nothing_is_caught() -> None:
    """The link check refuses a target outside the repository and one that does not exist, and
    takes a file of the repository, a URL and an anchor."""
    outside = "../.." + "/shared/" + "API" + ".md"
    text = f"[a]({outside}) [b](missing.md) [c](DECISIONS.md#top) [d](https://x.org) [e](#top)"
    assert _bad_links(text, ROOT / "docs") == [outside, "missing.md"]


def test_a_path_outside_is_caught() -> None:
    """The name check finds the outside documents as paths and leaves plain words alone."""
    assert OUTSIDE.search("(" + "STYLE" + ".md)")
    assert OUTSIDE.search(".." + "/shared/data")
    assert not OUTSIDE.search("the API contract, the house style, shared data")


@pytest.mark.parametrize("suffix", [".py", ".md"])
def test_no_file_names_a_document_outside_the_repository(suffix: str) -> None:
    """No Python or Markdown file names the documents kept beside the repository as paths."""
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _files(suffix)
        if path != Path(__file__).resolve()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert hits == []
