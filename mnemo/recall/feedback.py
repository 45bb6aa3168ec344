"""Pseudo-relevance feedback for the lexical channel: words the best hits share.

The best BM25 hits of a query are taken as relevant; a word that several of them use, and the
query does not, is likely about the same thing (a place, a name, the other half of an event)
and goes into a second lexical query. Pure: the caller searches.
"""

from __future__ import annotations

from collections.abc import Sequence

from mnemo.adapters import _text
from mnemo.inputs import is_letters, text_words

# How many of the best lexical hits feed back, and in how many of them a word must appear.
FEEDBACK_DOCS = 5
MIN_SHARED = 2


def feedback_terms(
    query: str, documents: Sequence[str], n: int, *, min_shared: int = MIN_SHARED
) -> list[str]:
    """At most `n` words of `documents` to add to `query`: content words (no stopwords, no
    numbers, three letters or more) absent from the query, found in at least `min_shared`
    documents; the most shared first, then the most frequent, then the first seen."""
    asked = {_text.stem(w.lower()) for w in text_words(query)}
    shared: dict[str, int] = {}
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for document in documents:
        seen: set[str] = set()
        # Split as the search will split them (whole words with their marks, composed).
        for word in text_words(document):
            lower = word.lower()
            if (len(lower) < 3 or not is_letters(lower) or _text.is_stopword(lower)
                    or _text.stem(lower) in asked):
                continue
            counts[lower] = counts.get(lower, 0) + 1
            first.setdefault(lower, len(first))
            if lower not in seen:
                seen.add(lower)
                shared[lower] = shared.get(lower, 0) + 1
    ranked = sorted(
        (w for w, docs in shared.items() if docs >= min_shared),
        key=lambda w: (-shared[w], -counts[w], first[w]),
    )
    return ranked[:n]
