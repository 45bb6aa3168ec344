"""What a recall's query becomes for the lexical channel: its words without stopwords."""

from __future__ import annotations

import unicodedata

import pytest

from mnemo.recall.query import keywords
from mnemo.text import query_words


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("What did Melanie paint?", ["Melanie", "paint"]),
        ("don't stop the music", ["stop", "music"]),
        # A word with combining marks reaches the search whole: rebuilt from `_text.words`,
        # "हिन्दी" was ह, न and द.
        ("what is हिन्दी भाषा?", ["हिन्दी", "भाषा"]),
        ("the שָלוֹם greeting", ["שָלוֹם", "greeting"]),
        # A stopword glued to more of a word is no word of its own.
        ("the_end of zero\u200bthe", ["the_end", "zero\u200bthe"]),
        # Composed first: "a" with a combining accent is "á", no stopword.
        (unicodedata.normalize("NFD", "á ánimo"), ["á", "ánimo"]),
        ("the and of", ["the", "and", "of"]),  # nothing left: all of it
    ],
)
def test_keywords_drop_stopwords_and_keep_words_whole(query: str, words: list[str]) -> None:
    """Stopwords go; every other word reaches the search as the query wrote it, whole."""
    assert query_words(keywords(query)) == words
