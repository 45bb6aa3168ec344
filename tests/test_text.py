"""mnemo.text: one tokenizer with one mode (words, and their parts for a search) and one
stemmer (Snowball English, as the lexical index and PostgreSQL stem)."""

from __future__ import annotations

import gc
import random
import re
import string
import unicodedata
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import example, given, strategies as st

from mnemo import text as _text
from mnemo.storage.lexical.schema import analyzer

# Pieces that make the tokenizer's cases: joiners, other punctuation, spaces, an underscore,
# combining marks (an accent, Devanagari's vowel sign and virama), format characters (a
# zero-width space and non-joiner, a soft hyphen), typographic and modifier apostrophes.
PIECES = [*"ab1Z_ '.-,;:!/\"\n\t", "\u2019", "\u2018", "\u02bc", "\u0301", "\u093f", "\u094d",
          "\u200b", "\u200c", "\u00ad", "é", "हि", "न्", "दी", "—", "don't", "3.11", "the"]
TEXTS = st.lists(st.sampled_from(PIECES), max_size=24).map("".join) | st.text(max_size=40)
ASCII_TEXTS = st.text(st.sampled_from(string.printable), max_size=40)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("Don't edit /etc/nginx.conf!", ["Don't", "edit", "etc", "nginx.conf"]),
        ("Python 3.11, not 3.12.", ["Python", "3.11", "not", "3.12"]),
        ("an e-mail -- to max_connections", ["an", "e-mail", "to", "max_connections"]),
        ("e.g. a..b a.-b 'quoted' x-", ["e.g", "a", "b", "a", "b", "quoted", "x"]),
        ("Melanie\u2019s हिन्दी café", ["Melanie's", "हिन्दी", "café"]),
        ("zero\u200bwidth \u200bedge\u200b", ["zero\u200bwidth", "edge"]),
        ("cafe\u0301", ["café"]),
    ],
)
def test_words_keep_what_is_joined_and_marked_whole(text: str, words: list[str]) -> None:
    """A word is a run of word characters with its marks and inner format characters; one
    apostrophe, dot or hyphen between two runs joins them; the text is read composed."""
    assert _text.words(text) == words


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("Don't edit /etc/nginx.conf!", ["Don", "t", "edit", "etc", "nginx", "conf"]),
        ("Python 3.11 e-mail max_connections", ["Python", "3", "11", "e", "mail",
                                                 "max_connections"]),
        ("Melanie\u2019s हिन्दी", ["Melanie", "s", "हिन्दी"]),
    ],
)
def test_a_search_reads_the_parts_of_the_words(text: str, parts: list[str]) -> None:
    """A search splits at the joiners too, as FTS5, tantivy and PostgreSQL do."""
    assert _text.text_words(text) == parts


@given(TEXTS)
def test_the_search_mode_is_the_words_cut_at_their_joiners(text: str) -> None:
    """Every part a search reads holds a word character and no joiner, space or other ASCII
    punctuation but the underscore, and the parts of the words are the search's words."""
    searched = _text.text_words(text)
    assert searched == [p for word in _text.words(text) for p in _text.parts(word)]
    punctuation = set(string.punctuation + string.whitespace) - {"_"}
    for part in searched:
        assert re.search(r"\w", part)
        assert not punctuation & set(part)


@given(TEXTS)
def test_words_are_in_the_text_in_order(text: str) -> None:
    """Each word is a piece of the text (composed, apostrophes made ASCII), in order, never
    starting or ending with a joiner, never holding a space; tokens are them lower-cased."""
    composed = unicodedata.normalize("NFC", _text.normalise(text))
    at = 0
    found = _text.words(text)
    for word in found:
        at = composed.index(word, at) + len(word)
        assert word[0] not in _text.JOINERS
        assert word[-1] not in _text.JOINERS
        assert not any(c.isspace() for c in word)
    assert _text.tokens(text) == [w.lower() for w in found]


@given(ASCII_TEXTS)
def test_ascii_text_splits_as_any_other(text: str) -> None:
    """All-ASCII text takes a shortcut (one regular expression): the words are those of the
    general path, which a non-ASCII word after it takes."""
    assert _text.words(text + " é") == [*_text.words(text), "é"]
    assert _text.without_stopwords(text + " é") == _text.without_stopwords(text) + " é"


@given(TEXTS, st.integers(0, 12))
def test_the_first_tokens_are_those_of_the_whole_text(text: str, n: int) -> None:
    """`first_tokens` reads only a prefix of a long text, and finds the same words."""
    assert _text.first_tokens(text, n) == _text.tokens(text)[:n]
    long = text * 40
    assert _text.first_tokens(long, n) == _text.tokens(long)[:n]


@given(TEXTS)
@example("a,\u0301\u200ba")
@example("a\u200b\u0301,a")
def test_without_stopwords_drops_exactly_the_stopwords(text: str) -> None:
    """Only the words that are stopwords go, whole ("don't" with any apostrophe, "the" inside
    "the_end" never); the rest stays as written, composed (but a format character or a
    combining mark at the edge of a word, which stays in it only between two words, may go
    with the stopword: "a,\u0301\u200ba" keeps ",\u0301\u200ba", whose word is then "a",
    and "a\u200b\u0301,a" keeps "a\u200b\u0301,", whose word is "a")."""
    kept = _text.without_stopwords(text)
    assert _unformatted(_text.words(kept)) == _unformatted(
        [w for w in _text.words(text) if not _text.is_stopword(w)]
    )
    assert len(kept) == len(unicodedata.normalize("NFC", text))


def _unformatted(words: list[str]) -> list[str]:
    """Each word without its format characters, and without the marks they leave at its edges."""
    bare = ("".join(c for c in w if unicodedata.category(c) != "Cf") for w in words)
    return [w.strip("".join(c for c in w if unicodedata.category(c).startswith("M")))
            for w in bare]


def test_contractions_are_stopwords_with_any_apostrophe() -> None:
    """A contraction is a stopword with an ASCII, typographic or modifier-letter apostrophe."""
    for spelling in ("didn't", "didn\u2019t", "didn\u02bct", "Didn't"):
        assert _text.without_stopwords(f"{spelling} restart nginx").split() == ["restart",
                                                                                "nginx"]


@pytest.mark.parametrize(
    ("word", "bare"),
    [("Melanie's", "Melanie"), ("life's", "life"), ("they're", "they"), ("it'll", "it"),
     ("we've", "we"), ("I'd", "I"), ("I'm", "I"), ("don't", "don't"), ("o'clock", "o'clock"),
     ("nginx.conf", "nginx.conf"), ("James", "James")],
)
def test_a_clitic_comes_off_a_word(word: str, bare: str) -> None:
    """A possessive or a short verb at a word's end comes off; any other apostrophe stays."""
    assert _text.without_clitic(word) == bare


def test_concept_labels_are_words_without_their_clitics() -> None:
    """A label names the word, not its possessive ("melanie" for "Melanie's"), and a word that
    is informative only with its clitic ("lot's") is no label; an identifier keeps its case
    ("McGee")."""
    labels = _text.concepts("Then Melanie's painting's colors won a lot's praise at McGee's",
                            limit=8)
    assert labels == ["melanie", "McGee", "painting", "colors", "praise"]


@pytest.mark.parametrize(
    ("forms", "stem"),
    [
        (["configure", "configured", "configures", "configuring"], "configur"),
        (["proxy", "proxies"], "proxi"),
        (["stop", "stopped", "stopping", "stops"], "stop"),
        (["die", "dying", "dies"], "die"),
        (["sky", "skies"], "sky"),
        (["melanie", "melanie's"], "melani"),
    ],
)
def test_inflections_share_a_stem(forms: list[str], stem: str) -> None:
    """Snowball English conflates a word's inflections, possessive included."""
    assert {_text.stem(form) for form in forms} == {stem}


@pytest.mark.parametrize("word", ["3.11", "nginx.conf", "max_connections", "e-mail", "x86",
                                  "हिन्दी", ""])
def test_a_word_of_other_characters_than_letters_is_its_own_stem(word: str) -> None:
    """Digits, joiners, underscores and marks are left as they are."""
    assert _text.stem(word) == word


@given(st.text(st.sampled_from(string.ascii_lowercase), min_size=1, max_size=20))
def test_stems_agree_with_the_lexical_index(word: str) -> None:
    """A word of letters stems as the lexical index's analyzer (tantivy's Snowball English)
    stems it, so a word recall weighs and the word the index finds are one."""
    assert analyzer().analyze(word) == [_text.stem(word)]


def test_stems_kept_for_reuse_leave_nothing_for_the_garbage_collector_to_walk() -> None:
    """The stems of 60,000 distinct words, kept for the next texts, are in no object the
    garbage collector walks: a full collection (on whatever thread allocates, holding the
    GIL, while the event loop waits) does not grow with them."""
    draw = random.Random(11)
    words = ["".join(draw.choices(string.ascii_lowercase, k=9)) for _ in range(60_000)]
    for word in words:
        _text.stem(word)
    walked = [o for o in gc.get_objects()
              if o is not words and len(gc.get_referents(o)) >= len(words)]
    assert walked == []


def test_stems_on_many_threads_are_the_stems_on_one() -> None:
    """Each thread has its own stemmer (a Snowball stemmer keeps state while it stems)."""
    words = [f"{root}{suffix}" for root in ("configur", "deploy", "connect", "restart", "run")
             for suffix in ("", "e", "ed", "es", "ing", "ation", "s", "ments")]
    expected = [_text._stem(w) for w in words]
    with ThreadPoolExecutor(8) as pool:
        for _ in range(20):
            _text._STEMS.clear()
            assert list(pool.map(_text.stem, words)) == expected
