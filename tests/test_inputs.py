"""The input bounds: `Config.max_text_chars`, the text and JSON checks, and query terms."""

from __future__ import annotations

import pytest

import mnemo
from mnemo.graph import store
from mnemo.inputs import (
    DEFAULT_MAX_TEXT_CHARS,
    MAX_QUERY_TERMS,
    check_json,
    check_text,
    query_terms,
)
from tests.conftest import REPO


def test_config_default_bound() -> None:
    """Config.max_text_chars defaults to the documented bound and survives a JSON round trip."""
    config = mnemo.Config()
    assert config.max_text_chars == DEFAULT_MAX_TEXT_CHARS
    assert mnemo.Config.from_json(mnemo.Config(max_text_chars=500).to_json()).max_text_chars == 500


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "100"])
def test_config_rejects_bad_bound(bad: object) -> None:
    """A max_text_chars that is not an integer >= 1 is an InvalidInputError."""
    with pytest.raises(mnemo.InvalidInputError, match="max_text_chars"):
        mnemo.Config(max_text_chars=bad)  # type: ignore[arg-type]


def test_check_text_bound() -> None:
    """A text of exactly the bound passes; one character more is refused, naming the bound."""
    assert check_text("x" * 10, "goal", limit=10) == "x" * 10
    with pytest.raises(mnemo.InvalidInputError, match=r"goal is 11 characters.*10 allowed"):
        check_text("x" * 11, "goal", limit=10)


def test_check_text_type_and_blank() -> None:
    """Non-strings are refused; blank text only when it is not allowed."""
    with pytest.raises(mnemo.InvalidInputError, match="must be a string"):
        check_text(b"x", "observation", limit=10)
    with pytest.raises(mnemo.InvalidInputError, match="blank"):
        check_text("  ", "goal", limit=10)
    assert check_text("", "action", limit=10, blank_ok=True) == ""


def test_check_json_bound() -> None:
    """Metadata is bounded by the length of its JSON; unserialisable metadata is refused."""
    assert check_json({"a": 1}, "metadata", limit=8) == '{"a": 1}'
    with pytest.raises(mnemo.InvalidInputError, match="as JSON"):
        check_json({"a": "x" * 10}, "metadata", limit=8)
    with pytest.raises(mnemo.InvalidInputError, match="JSON-serialisable"):
        check_json({"a": object()}, "metadata", limit=100)


def test_query_terms_dedup_case_insensitive() -> None:
    """Repeated words count once, whatever their case; the first spelling is kept, in order."""
    assert query_terms(["Nginx", "port", "NGINX", "nginx", "Port", "proxy"]) == [
        "Nginx", "port", "proxy"
    ]


def test_query_terms_cap_keeps_longest_in_order() -> None:
    """Past the cap the longest words stay (earlier first on ties), in query order."""
    words = ["a", "bb", "ccc", "dd", "eeee", "f"]
    assert query_terms(words, cap=3) == ["bb", "ccc", "eeee"]


def test_query_terms_of_many_distinct_words() -> None:
    """5,000 distinct words become MAX_QUERY_TERMS terms."""
    words = [f"w{i}" for i in range(5000)]
    kept = query_terms(words)
    assert len(kept) == MAX_QUERY_TERMS
    assert kept == sorted(kept, key=words.index)


async def test_recall_of_5000_distinct_words_searches_capped_terms(
    mem: mnemo.Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recall query of 5,000 distinct words reaches FTS5 as at most MAX_QUERY_TERMS terms."""
    generated: list[str] = []
    original = store.fts_query

    def spy(text: str) -> str:
        generated.append(original(text))
        return generated[-1]

    monkeypatch.setattr(store, "fts_query", spy)
    query = " ".join(f"term{i}" for i in range(5000))
    await mem.recall(REPO, query)
    assert generated
    assert all(g.count(" OR ") + 1 <= MAX_QUERY_TERMS for g in generated)
