"""Pseudo-relevance feedback for the lexical channel: words the best hits share.

The best BM25 hits of a query are taken as relevant; a word that several of them use, and the
query does not, is likely about the same thing (a place, a name, the other half of an event)
and goes into a second lexical query. Pure: the caller searches.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from mnemo import text as _text

# How many of the best lexical hits feed back, and in how many of them a word must appear.
FEEDBACK_DOCS = 5
MIN_SHARED = 2


def feedback_terms(
    query: str, documents: Sequence[str], n: int, *, min_shared: int = MIN_SHARED
) -> list[str]:
    """At most `n` words of `documents` to add to `query`: content words (no stopwords, no
    digits, three characters or more, an underscored identifier whole; see `_content`)
    absent from the query, found in at least `min_shared` documents; the most shared first,
    then the most frequent, then the first seen. Words are split as a search splits them
    (`text.parts`), from the words that are no stopwords whole: "didn't" gives no "didn"."""
    asked = {_text.stem(w.lower()) for w in _text.text_words(query)}
    shared: dict[str, int] = {}
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for document in documents:
        seen: set[str] = set()
        for lower in _search_words(document):
            if not _content(lower) or _text.is_stopword(lower) or _text.stem(lower) in asked:
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


def _search_words(document: str) -> list[str]:
    """The lower-cased words a search reads in `document`, but those of a stopword."""
    return [part for word in _text.tokens(document) if not _text.is_stopword(word)
            for part in _text.parts(word)]


def _content(word: str) -> bool:
    """Three characters or more, a letter among them, and no digit: letters with the marks,
    joiners and underscores a word keeps ("हिन्दी", whose vowel signs `str.isalpha` refuses;
    "max_connections", searched as the phrase of its parts)."""
    return len(word) >= 3 and any(c.isalpha() for c in word) and all(
        unicodedata.category(c)[0] in "LM" or unicodedata.category(c) in ("Cf", "Pc")
        for c in word
    )
