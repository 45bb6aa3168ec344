"""What a recall's query becomes for the lexical channel: its words without stopwords."""

from __future__ import annotations

import threading
import unicodedata

import pytest

from mnemo.recall import query as recall_query
from mnemo.recall.query import INLINE_CHARS, Plan, keywords, offline_plan, query_parts, split
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


async def test_a_long_query_is_planned_and_split_off_the_loop(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the offline plan of a query at the size limit (32,000 characters) was
    made on the event loop, tens of milliseconds; it is made with the query's parts, in a
    worker thread past `INLINE_CHARS`, on the loop below, and a model's plan is kept."""
    threads: list[bool] = []

    def recorded(query: str) -> Plan:
        threads.append(threading.current_thread() is threading.main_thread())
        return offline_plan(query)

    monkeypatch.setattr(recall_query, "offline_plan", recorded)
    short = "how do I deploy the payment service"
    long = " ".join([short] * (INLINE_CHARS // len(short) + 1))
    for query in (short, long):
        plan, parts = await split(query, dense_without_names=True)
        assert (plan, parts) == (offline_plan(query),
                                 query_parts(query, dense_without_names=True))
    assert threads == [True, False]
    given = Plan("semantic", ())
    assert (await split(long, dense_without_names=True, plan=given))[0] is given
