"""The topic-file format: front matter round trip, slugs, topic identity, bounds and merges."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import example, given, strategies as st

from mnemo.memoryfiles import _format

TIMES = st.datetimes(
    min_value=datetime(1970, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=st.just(UTC),
)
LINES = st.lists(st.text(min_size=1, max_size=200), max_size=12)


@given(
    topic=st.text(min_size=1, max_size=100),
    description=st.text(max_size=300),
    updated=TIMES,
    used=st.none() | TIMES,
    content=LINES,
)
def test_front_matter_round_trip(
    topic: str, description: str, updated: datetime, used: datetime | None, content: list[str]
) -> None:
    """A rendered file parses back to the same (cleaned) fields and body."""
    topic = _format.one_line(topic, _format.MAX_TOPIC_CHARS) or "x"
    description = _format.one_line(description, _format.MAX_DESCRIPTION_CHARS)
    body = _format.body(_format.entries("\n".join(content)))
    text = _format.render(
        topic=topic, description=description, updated=updated, used=used, content=body
    )
    parsed = _format.parse(text)
    assert parsed == _format.Parsed(topic, description, updated, used, body)


@given(topic=st.text(min_size=1, max_size=100), description=st.text(max_size=200))
def test_front_matter_is_yaml(topic: str, description: str) -> None:
    """The front matter is valid YAML holding the same strings."""
    yaml = pytest.importorskip("yaml")
    topic = _format.one_line(topic, _format.MAX_TOPIC_CHARS) or "x"
    description = _format.one_line(description, _format.MAX_DESCRIPTION_CHARS)
    when = datetime(2025, 1, 1, tzinfo=UTC)
    text = _format.render(
        topic=topic, description=description, updated=when, used=None, content=""
    )
    loaded = yaml.safe_load(text.split("---\n")[1])
    assert loaded["topic"] == topic
    assert loaded["description"] == description


def test_parse_is_lenient() -> None:
    """Bare or single-quoted values, CRLF, unknown keys and bad times are read sensibly."""
    text = (
        "---\r\ntopic: Release process\r\ndescription: 'How we ship'\r\nowner: bob\r\n"
        "updated: yesterday\r\nused: 2025-01-02T03:04:05\r\n---\r\n- Tag on main.\r\n"
    )
    parsed = _format.parse(text)
    assert parsed.topic == "Release process"
    assert parsed.description == "How we ship"
    assert parsed.updated is None
    assert parsed.used == datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert parsed.body == "- Tag on main.\n"
    bare = _format.Parsed(None, "", None, None, "- just a line\n")
    assert _format.parse("- just a line\n") == bare


def test_times_are_stored_in_utc() -> None:
    """An aware time in another zone is written as UTC ISO-8601."""
    paris = timezone(timedelta(hours=2))
    text = _format.render(
        topic="t",
        description="",
        updated=datetime(2025, 6, 1, 12, 0, tzinfo=paris),
        used=None,
        content="",
    )
    assert "\nupdated: 2025-06-01T10:00:00+00:00\n" in text


@given(st.text(max_size=200))
def test_slug_is_safe(topic: str) -> None:
    """Any topic gives a short, non-empty file stem of lower-case letters, digits and dashes."""
    stem = _format.slug(topic)
    assert re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)*", stem)
    assert len(stem) <= 60
    assert stem not in {"con", "nul", "aux", "prn", "com1", "lpt1"}


@pytest.mark.parametrize(
    ("topic", "stem"),
    [
        ("Database Backups", "database-backups"),
        ("../../etc/passwd", "etc-passwd"),
        ("Café & Crème", "cafe-creme"),
        ("CON", "con-topic"),
    ],
)
def test_slug_examples(topic: str, stem: str) -> None:
    """Slugs drop path separators and accents and avoid reserved names."""
    assert _format.slug(topic) == stem


def test_slug_of_symbols_is_hashed() -> None:
    """A topic without ASCII letters or digits gets a stable hashed stem."""
    stem = _format.slug("日本語")
    assert stem.startswith("topic-")
    assert stem == _format.slug("日本語")
    assert stem != _format.slug("中文")


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Database backups", "database backup"),
        ("Backups of the database", "DATABASE  BACKUPS"),
        ("code style", "Code Styles"),
    ],
)
def test_topic_key_identifies_wording_variants(a: str, b: str) -> None:
    """Case, plurals, spacing, word order and function words do not change a topic."""
    assert _format.topic_key(a) == _format.topic_key(b)


def test_topic_key_separates_topics() -> None:
    """Different content words are different topics."""
    assert _format.topic_key("database") != _format.topic_key("deployment")


@pytest.mark.parametrize(("a", "b"), [("C++", "C#"), ("C++", "C"), ("F#", "F"), ("R&D", "RD")])
def test_topic_key_keeps_symbols(a: str, b: str) -> None:
    """Names that differ in symbols are different topics."""
    assert _format.topic_key(a) != _format.topic_key(b)


@pytest.mark.parametrize(("a", "b"), [
    ("Go", "Go!"), ("Notes: deploys", "notes deploys"), ("Deploys.", "deploys"),
    ("user's notes", "users notes"), ("**Deploys**", "deploys"), ("# Deploys", "deploys"),
    ("C++ / C#", "C# and C++")])
def test_topic_key_folds_sentence_punctuation(a: str, b: str) -> None:
    """Sentence punctuation, apostrophes, Markdown and the order of names do not make another
    topic."""
    assert _format.topic_key(a) == _format.topic_key(b)


def test_entries_are_bullets() -> None:
    """Blank lines go, bullets and numbers become "- ", headings stay."""
    body = "## Decisions\n\n* Use Go.\n1. Ship Fridays.\n  plain line  \n-\n"
    assert _format.entries(body) == ["## Decisions", "- Use Go.", "- Ship Fridays.", "- plain line"]


def test_dedupe_ignores_case_spacing_and_punctuation() -> None:
    """Entries equal up to case, spacing, bullets and a final period are one."""
    lines = ["- Use Go.", "- use  go", "- Use Rust."]
    assert _format.dedupe(lines) == ["- Use Go.", "- Use Rust."]


@example(lines=["#0000000000", "000000"], max_chars=20)  # the newest line was dropped
@given(lines=LINES, max_chars=st.integers(min_value=20, max_value=500))
def test_fit_bounds_the_body(lines: list[str], max_chars: int) -> None:
    """bound keeps the body within max_chars, keeps the newest line, and keeps order."""
    entries = _format.dedupe(_format.entries("\n".join(lines)))
    kept = _format.bound(entries, max_chars).lines
    assert len(_format.body(kept)) <= max_chars
    if entries:
        assert kept
        assert kept[-1] == entries[-1] or kept[-1].endswith("\u2026")
    untruncated = [line for line in kept if not line.endswith("\u2026")]
    positions = [entries.index(line) for line in untruncated]
    assert positions == sorted(positions)


def test_fit_drops_entries_before_headings() -> None:
    """The oldest entries go first; a heading goes only when no entry is left to drop."""
    lines = ["# Database", "- one one one", "- two two two", "- three three"]
    assert _format.bound(lines, 40).lines == ["# Database", "- two two two", "- three three"]


def test_fit_truncates_a_long_line() -> None:
    """A line longer than the bound is cut at a word boundary and marked."""
    (line,) = _format.bound(["- " + "word " * 30], 40).lines
    assert line == "- " + "word " * 6 + "word\u2026"
    assert len(line) <= 39


def test_merge_keeps_the_llm_order_when_nothing_changed() -> None:
    """With the file as the LLM saw it, its order wins; left-out lines stay in front."""
    base = ["- a", "- b", "- c"]
    assert _format.merge(base, ["- c", "- a", "- d"], base, allow_removal=False) == [
        "- b",
        "- c",
        "- a",
        "- d",
    ]
    assert _format.merge(base, ["- a", "- d"], base, allow_removal=True) == ["- a", "- d"]


def test_merge_after_a_concurrent_write_keeps_both() -> None:
    """When another writer changed the file meanwhile, both writers' additions stay."""
    base = ["- a", "- b"]
    current = ["- a", "- b", "- x"]
    assert _format.merge(current, ["- a", "- b", "- y"], base, allow_removal=False) == [
        "- a",
        "- b",
        "- x",
        "- y",
    ]
    # The other writer's correction removed "- b": it is not brought back.
    assert _format.merge(["- a", "- x"], ["- a", "- b", "- y"], base, allow_removal=False) == [
        "- a",
        "- x",
        "- y",
    ]
    # This writer's correction removes "- a" from the current file too.
    assert _format.merge(current, ["- b", "- y"], base, allow_removal=True) == [
        "- b",
        "- x",
        "- y",
    ]


def test_merge_without_base_appends() -> None:
    """When the LLM saw no content, its lines are appended unless already there."""
    assert _format.merge(["- a"], ["- A.", "- b"], None, allow_removal=True) == ["- a", "- b"]
