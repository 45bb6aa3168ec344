"""Recall's lexical channel folds accents and splits words as message search does, on each
backend: through the lexical index (its uncommitted documents, its committed ones, and a slot
opened again) and through the store's own full-text search; and an index written before it
folded them is rebuilt, not read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tantivy as tv

from mnemo.storage.lexical import index as lexical_index
from tests.backends import open_stores
from tests.graph._support import DIM, REPO
from tests.graph.test_lexical import add, found, lexical, settled

TEXTS = {"a": "We met at the café", "b": "Naïve résumé, crème brûlée",
         "c": "the cafe was closed", "d": "a quiet owl"}
# Each query, and the nodes it finds: accents written or not, in the query and the text alike.
EXPECTED = [("cafe", {"a", "c"}), ("café", {"a", "c"}), ("CAFÉ", {"a", "c"}),
            ("naive", {"b"}), ("NAÏVE", {"b"}), ("resume", {"b"}), ("brulee", {"b"})]

SHA1 = "da39a3ee5e6b4b0d3255bfef95601890afd80709"
SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
CJK = "我们明天下午三点在会议室讨论项目进度"  # 18 characters, 54 bytes: one word
# Words with combining marks (decomposed too) or format characters, long words, letters and
# digits with an accent; each query, and what it finds through the index and the store alike.
WORDS = {"h": "हिन्दी भाषा", "e": "e\u0301clair au chocolat", "p": "persian می\u200cخواهم",  # noqa: RUF001
         "z": "zero\u200bwidth soft\u00adhyphen", "n": "café2 naïve2",
         "l": f"commit {SHA1} digest {SHA256}", "k": f"{CJK} достопримечательности",
         "g": "Donaudampfschifffahrtsgesellschaftskapitän", "q": "a quiet owl"}
WORDS_FOUND = [("हिन्दी", {"h"}), ("भाषा", {"h"}), ("eclair", {"e"}), ("e\u0301clair", {"e"}),
               ("éclair", {"e"}), ("می\u200cخواهم", {"p"}), ("خواهم", {"p"}), ("width", {"z"}),  # noqa: RUF001
               ("hyphen", {"z"}), ("cafe2", {"n"}), ("naive2", {"n"}), (SHA1, {"l"}),
               (SHA256, {"l"}), (CJK, {"k"}), ("достопримечательности", {"k"}),
               ("Donaudampfschifffahrtsgesellschaftskapitan", {"g"})]


async def test_the_index_folds_accents(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lexical index finds a word with or without its accents: in what it applied and
    has not committed (scored by the index itself), once committed (tantivy's own analysis),
    and from the slot opened again by another process (which must register the analyzer)."""
    await _through_the_index(store, tmp_path, monkeypatch, TEXTS, EXPECTED)


async def test_the_index_finds_marked_format_split_and_long_words(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lexical index finds a word with combining marks by its text (its query word was cut
    at each mark), a decomposed accent as a composed one (tantivy split the text at the mark),
    the parts of a word joined by a format character, and a word of 40 bytes or more (a
    commit's hash, a run of CJK characters: tantivy's `en_stem` dropped them), in uncommitted
    and committed documents alike."""
    await _through_the_index(store, tmp_path, monkeypatch, WORDS, WORDS_FOUND)


async def _through_the_index(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, texts: dict[str, str],
    expected: list[tuple[str, set[str]]],
) -> None:
    """Checks `expected` (query, ids) against the nodes `texts` through the index: scored
    by the index itself, committed, and from the slot opened again."""
    folder = str(tmp_path / "lexical")
    monkeypatch.setattr(lexical_index, "COMMIT_AFTER", 3600.0)  # nothing commits meanwhile
    monkeypatch.setattr(lexical_index, "COMMIT_WITHIN", 3600.0)
    async with open_stores(store, DIM, lexical_dir=folder) as backend:
        await add(backend, "c1", texts)
        for query, ids in expected:
            assert await found(backend, query) == ids, query
        assert len(lexical(backend)._fresh) == len(texts)  # the index scored them itself
        monkeypatch.setattr(lexical_index, "COMMIT_AFTER", 0.0)
        await backend.graph.settle(REPO)
        assert not len(lexical(backend)._fresh)
        for query, ids in expected:
            assert await found(backend, query) == ids, query
    async with open_stores(store, DIM, lexical_dir=folder) as backend:
        for query, ids in expected:
            assert await found(backend, query) == ids, query
            assert {n for n, _ in await backend.graph.search_text(REPO, query, 10)} == ids


async def test_the_store_search_folds_accents(store: str) -> None:
    """Without a lexical index, the store's own full-text search (FTS5, or PostgreSQL's
    `mnemo_english`, which found "café" by "café" alone) folds accents too."""
    async with open_stores(store, DIM, lexical_dir="") as backend:
        await add(backend, "c1", TEXTS)
        for query, ids in EXPECTED:
            assert {n for n, _ in await backend.graph.search_text(REPO, query, 10)} == ids, query


async def test_the_store_search_finds_marked_and_format_split_words(store: str) -> None:
    """Without a lexical index, the store's own full-text search finds the same words as the
    index: a word with combining marks by its text, a decomposed accent as a composed one (their
    query words were cut at each mark), the parts of a word joined by a format character
    (PostgreSQL kept it whole) and a word of letters and digits without its accent (PostgreSQL
    kept the accent); and the long words the index keeps."""
    async with open_stores(store, DIM, lexical_dir="") as backend:
        await add(backend, "c1", WORDS)
        for query, ids in WORDS_FOUND:
            assert {n for n, _ in await backend.graph.search_text(REPO, query, 10)} == ids, query


async def test_the_store_search_finds_a_word_of_parts_as_a_phrase(store: str) -> None:
    """The store's own full-text search finds a word of parts ("snake_case_name", two words
    joined by a zero-width space) as the phrase of its parts, as message search does
    (PostgreSQL's `plainto_tsquery` found the parts anywhere in a node)."""
    texts = {"s": "rename the snake_case_name variable", "r": "name the snake's case",
             "z": "zero\u200bwidth", "w": "width zero"}
    async with open_stores(store, DIM, lexical_dir="") as backend:
        await add(backend, "c1", texts)
        for query, ids in [("snake_case_name", {"s"}), ("snake", {"s", "r"}),
                           ("zero\u200bwidth", {"z"}), ("zero", {"z", "w"})]:
            assert {n for n, _ in await backend.graph.search_text(REPO, query, 10)} == ids, query


async def test_the_store_search_splits_at_punctuation(store: str) -> None:
    """Without a lexical index, the store's own full-text search finds the words of a path,
    an address or a version, as FTS5 and the index do (PostgreSQL's parser kept them
    whole)."""
    texts = {"p": "edit /etc/nginx/nginx.conf now", "m": "mail alice@example.com",
             "v": "version 1.2.3 on db01.internal:5432", "q": "a quiet owl"}
    async with open_stores(store, DIM, lexical_dir="") as backend:
        await add(backend, "c1", texts)
        for query, ids in [("nginx", {"p"}), ("conf", {"p"}), ("alice", {"m"}),
                           ("example", {"m"}), ("internal", {"v"}), ("5432", {"v"})]:
            assert {n for n, _ in await backend.graph.search_text(REPO, query, 10)} == ids, query


# ---- an index of the former format ----------------------------------------------------------

FORMER = "v3"  # the layout before accents were folded: tantivy's `en_stem`


def _former_schema() -> Any:
    builder = tv.SchemaBuilder()
    for name, stored in (("key", True), ("id", True), ("repo", False), ("type", False)):
        builder.add_text_field(name, tokenizer_name="raw", stored=stored, index_option="basic")
    builder.add_text_field("text", tokenizer_name="en_stem", index_option="freq")
    builder.add_text_field("holds", tokenizer_name="raw", index_option="basic")
    builder.add_integer_field("seq", stored=True)
    return builder.build()


def _former_analyzer() -> Any:
    return (tv.TextAnalyzerBuilder(tv.Tokenizer.simple()).filter(tv.Filter.remove_long(40))
            .filter(tv.Filter.lowercase()).filter(tv.Filter.stemmer("english")).build())


@pytest.mark.slow
async def test_an_index_of_the_former_format_is_rebuilt_and_deleted_once_free(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot written before accents were folded, up to date with the store, is not read: the
    current format's folder is built from the store (and finds "café" by "cafe"), and the
    former one, which no process holds, is deleted (it holds words a forget may since have
    erased from the store; one a process of the earlier version holds is left to it,
    tests/storage/test_lexical_slots.py)."""
    folder = str(tmp_path / "lexical")
    with monkeypatch.context() as former:
        former.setattr(lexical_index, "FORMAT", FORMER)
        former.setattr(lexical_index, "schema", _former_schema)
        former.setattr(lexical_index, "analyzer", _former_analyzer)
        async with open_stores(store, DIM, lexical_dir=folder) as backend:
            await add(backend, "c1", TEXTS)
            assert await found(backend, "café") == {"a"}
            assert await found(backend, "cafe") == {"c"}  # no folding
            await backend.graph.settle(REPO)  # committed: the slot is current
            old_slot = lexical(backend).slot
    assert old_slot is not None
    assert old_slot.exists()
    async with open_stores(store, DIM, lexical_dir=folder) as backend:
        if await lexical(backend).search(REPO, "cafe", 10, None) is None:
            await settled(backend)  # rebuilt in the background meanwhile
        assert await found(backend, "cafe") == {"a", "c"}
        slot = lexical(backend).slot
        assert slot is not None
        assert slot.parent.name == lexical_index.FORMAT != FORMER
    assert not old_slot.parent.exists()
