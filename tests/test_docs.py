"""The repository's documents stand on their own: every Markdown link reaches a file of the
repository, and no file names a document outside it as a path."""

from __future__ import annotations

import ast
import functools
import io
import os
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.source import parsed

ROOT = Path(__file__).resolve().parents[1]
# Where docstrings and comments must say what the code does, not its history.
CODE = ("mnemo", "scripts", "tests")
SKIPPED = {"node_modules", "build", "dist", "__pycache__"}

# A Markdown link's target: `[text](target)` or `[text](target "title")`.
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)")
# A URL (http:, mailto:, ...) or an anchor in the same page.
NOT_A_FILE = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|#)")
# The documents beside the repository that a file once named as paths.
OUTSIDE = re.compile(r"\b(?:API|STYLE|EMBEDDINGS)\.md\b|\.\.[/\\]shared\b")
# The story of a change: an issue, a work session (LoCoMo's "Conversation session 3" is data),
# a review, a probe that found something (a vector search's probe is a thing the code does), a
# work item ("p5b"; "p50" is a percentile), a document outside the repository.
HISTORY = re.compile(
    r"\b[Ii]ssues? \d"
    r"|(?<!onversation )(?<!-)\b[Ss]essions? \d"
    r"|\b[Rr]eview(?:s|ed|ers?)?\b"
    r"|\((?:a|the)(?: \w+)? probe\)"
    r"|\b(?:[Cc]ontract|[Cc]onversation|[Aa]dapters|[Dd]ifferential) probe\b"
    r"|\b[Aa] probe (?:found|showed|noted|reproduced)\b"
    r"|\b[Pp]\d+[a-z]\b"
    r"|\b(?:API|STYLE|EMBEDDINGS)\.md\b"
)
# In mnemo/ also the words of a change story: what the code "used to" do, "Before, it ...".
CHANGE_STORY = re.compile(r"\bused to\b|\bBefore, (?:it|the|a|each|every|this|that)\b")
# A timing figure ("took 12 ms", "3x faster"): measurements live in BENCHMARKS.md, where a run
# can replace them; a setting in seconds ("a 60 s timeout") is what the code does.
TIMING = re.compile(
    r"\d\s?(?:ms|µs|us|ns)\b|\b\d+(?:\.\d+)?x (?:faster|slower)\b|\btimes (?:faster|slower)\b"
)


def _files(*suffixes: str) -> Iterator[Path]:
    """The repository's files with these suffixes, outside hidden and generated folders."""
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED)
        for name in sorted(names):
            if name.endswith(suffixes):
                yield Path(folder) / name


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


def _prose(source: str, tree: ast.Module | None = None) -> Iterator[tuple[int, str]]:
    """Each comment and each docstring of a module's source (parsed as `tree`), with its
    first line."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(tree or ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    yield body[0].lineno, body[0].value.value


@functools.cache
def _file_prose(path: Path, *patterns: re.Pattern[str]) -> tuple[tuple[int, str], ...]:
    """`_prose` of the module at `path`; nothing when none of `patterns` occurs in its text at
    all (its comments and docstrings are text of the file), so only such files are tokenized."""
    text = path.read_text(encoding="utf-8")
    if not any(pattern.search(text) for pattern in patterns):
        return ()
    return tuple(_prose(text, parsed(path)))


def test_docstrings_and_comments_tell_no_history() -> None:
    """No docstring or comment in mnemo/, scripts/ or tests/ names an issue, a work session, a
    review or a document outside the repository: they say what the code does."""
    hits = [
        f"{path.relative_to(ROOT)}:{line}: {found.group(0)!r}"
        for path in _files(".py")
        if path.relative_to(ROOT).parts[0] in CODE and path != Path(__file__).resolve()
        for line, text in _file_prose(path, HISTORY, CHANGE_STORY)
        if (found := HISTORY.search(text))
        or (path.relative_to(ROOT).parts[0] == "mnemo" and (found := CHANGE_STORY.search(text)))
    ]
    assert hits == []


def test_history_in_prose_is_caught() -> None:
    """The history check finds a story in a comment or a docstring, not in code or data."""
    source = (
        '"""Recall (issue 12)."""\n'
        "x = 'Conversation session 3 on 8 May'  # found by a review\n"
        "def f() -> None:\n"
        '    """Fixed in session 19."""\n'
        "y = 'issue 4'\n"
    )
    found = [(line, HISTORY.search(text)) for line, text in _prose(source)]
    assert sorted(line for line, match in found if match) == [1, 2, 4]


@pytest.mark.parametrize(
    "prose",
    [
        "20 files, not 1 (review p5b)",
        "found by a review of the change",
        "a clear kept them (a probe)",
        "the conversation probe raised it",
        "A probe found that forget left words",
        "fixed in p5b",
    ],
)
def test_review_and_probe_words_are_caught(prose: str) -> None:
    """A review, a probe that found something, or a work item is history in prose."""
    assert HISTORY.search(prose)


@pytest.mark.parametrize(
    "prose",
    [
        "recall probes the tags with the query",
        "one walk of the graph for all probes",
        "p50 and p99 of an append",
        "What the probe measured of one LLM's server",
        "bench_auto_commit.py [--sessions 40]",
    ],
)
def test_what_the_code_does_with_probes_is_not_history(prose: str) -> None:
    """A vector search's probes, a server probe, percentiles and a command's option are what
    the code does."""
    assert not HISTORY.search(prose)


def test_no_timing_figures_in_the_code() -> None:
    """No docstring or comment in mnemo/ quotes a measured time: BENCHMARKS.md holds them."""
    hits = [
        f"{path.relative_to(ROOT)}:{line}: {found.group(0)!r}"
        for path in _files(".py")
        if path.relative_to(ROOT).parts[0] == "mnemo"
        for line, text in _file_prose(path, TIMING)
        if (found := TIMING.search(text))
    ]
    assert hits == []


def test_a_timing_figure_is_caught() -> None:
    """Measured times and speed-ups are found; a setting in seconds is not."""
    assert TIMING.search("a hop costs about 32 us")
    assert TIMING.search("took 1.5 ms in json.dumps")
    assert TIMING.search("about 5x slower")
    assert TIMING.search("three times faster than json")
    assert not TIMING.search("each attempt may take 60 s, the default timeout")


def test_a_change_story_is_caught() -> None:
    """The words of a change story are found; a word that only looks like one is not."""
    assert CHANGE_STORY.search("an error used to leave `running` set")
    assert CHANGE_STORY.search("Before, it was seen at the next write")
    assert not CHANGE_STORY.search("snapshots before, the messages, snapshots after")
