"""What a recall's query becomes: its words for BM25, the names it mentions (a candidate whose
speaker the query names scores `1 + Config.recall_speaker_boost` times more), its vectors (the
search tags' kept across recalls in `TagVectors`), the words its best hits share (lexical
pseudo-relevance feedback), and the offline heuristics' plan (`offline_plan`).
"""

from __future__ import annotations

import re
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass

import numpy as np

from mnemo import cpu, text as _text
from mnemo.extraction.entities import speaker_of
from mnemo.graph.model import Vector
from mnemo.graph.ports import NodeReads
from mnemo.ports import Embedder, Vectors, embed
from mnemo.recall.model import ReadContext
from mnemo.text import MAX_QUERY_TERMS, query_words

# A query up to this long is split on the event loop; a longer one in a worker thread.
INLINE_CHARS = 2_000


@dataclass(frozen=True, slots=True)
class QueryParts:
    """What recall makes of a query: `terms` for BM25, `words` for restatements, `dense` for
    the dense channel, and the `names` it mentions for the speaker match."""

    terms: str
    words: list[str]
    dense: str
    names: frozenset[str]


def query_parts(query: str, *, dense_without_names: bool) -> QueryParts:
    return QueryParts(keywords(query), words(query),
                      without_names(query) if dense_without_names else query,
                      query_names(query))


async def split(
    query: str, *, dense_without_names: bool, plan: Plan | None = None
) -> tuple[Plan, QueryParts]:
    """`plan` (else `offline_plan`) and `query_parts`, off the loop past `INLINE_CHARS`."""
    return await cpu.run(
        lambda: (plan or offline_plan(query),
                 query_parts(query, dense_without_names=dense_without_names)),
        len(query), on_loop_below=INLINE_CHARS + 1,
    )


@dataclass(slots=True)
class _Queries:
    dim: int
    embed: Callable[[Sequence[str]], Coroutine[object, object, Vectors]]


def query_side(embedder: Embedder) -> Embedder:
    """The embedder's `embed_queries` when it has one (e5's "query: " prefix), else `embed`."""
    queries = getattr(embedder, "embed_queries", None)
    return embedder if queries is None else _Queries(embedder.dim, queries)


def keywords(query: str) -> str:
    """The query without stopwords, for BM25, NFC-composed; all of it if nothing is left."""
    kept = _text.without_stopwords(query)
    return kept if query_words(kept) else query


# The longest query whose restatements are looked for, in words; the check reads at most this
# many words (and two more) of each candidate.
RESTATED_WORDS = 2 * MAX_QUERY_TERMS


def words(query: str) -> list[str]:
    """The query's lower-cased words, as `restatement` compares them: at most
    `RESTATED_WORDS` + 1 (a longer query restates nothing)."""
    return _text.first_tokens(query, RESTATED_WORDS + 1)


def restatement(query: Sequence[str], text: str) -> int | None:
    """How closely `text` restates the query whose lower-cased words are `query`: 0 for the
    same words in order, 1 for a near-exact restatement (five words or more, one word added,
    dropped or changed), else None (also for a query past `RESTATED_WORDS`). At most
    `len(query) + 2` words of `text` are read."""
    if not query or len(query) > RESTATED_WORDS:
        return None
    if len(text) <= _TURN_AWAY_CHARS and text.isascii() and _two_missing(query, text.lower()):
        return None
    other = _text.first_tokens(text, len(query) + 2)
    if other == list(query):
        return 0
    if min(len(query), len(other)) < 5 or abs(len(query) - len(other)) > 1:
        return None
    return 1 if _one_edit(list(query), other) else None


# An ASCII text up to this long is turned away unsplit when two of the query's words are not
# substrings of it (most candidates restate nothing); another is split as far as the query's
# length only.
_TURN_AWAY_CHARS = 1_000


def _two_missing(query: Sequence[str], lowered: str) -> bool:
    """Whether two distinct words of `query` are not substrings of `lowered`."""
    missing = 0
    for word in set(query):
        if word not in lowered:
            missing += 1
            if missing == 2:
                return True
    return False


def _one_edit(a: list[str], b: list[str]) -> bool:
    """At most one word inserted, deleted or substituted between `a` and `b`."""
    if len(a) > len(b):
        a, b = b, a
    i = 0
    while i < len(a) and a[i] == b[i]:
        i += 1
    return a[i + 1 :] == b[i + 1 :] if len(a) == len(b) else a[i:] == b[i + 1 :]


_POSSESSIVE = re.compile(r"['\u2019]s$", re.IGNORECASE)
_PUNCTUATION = "?!.,;:\"()"


def query_names(query: str) -> frozenset[str]:
    """The names a query mentions, lower-case: its capitalised words that are not stopwords
    (the first word too: "Melanie's pets?"), without a possessive "'s"."""
    names = {
        _POSSESSIVE.sub("", word).lower()
        for word in _text.words(_text.normalise(query))
        if word[:1].isupper()}
    return frozenset(n for n in names if n and not _text.is_stopword(n))


def without_names(query: str) -> str:
    """The query as the dense channel embeds it: without the names it mentions ("What did
    Melanie paint?" -> "What did paint?"), or as it is when it is nothing but names. The first
    word counts only with a possessive ("Melanie's pets?")."""
    head, _, rest = query.strip().partition(" ")
    names = query_names(rest)
    if _POSSESSIVE.search(head.strip(_PUNCTUATION)):
        names |= query_names(head)
    if not names:
        return query
    kept = [w for w in query.split()
            if _POSSESSIVE.sub("", w.strip(_PUNCTUATION)).lower() not in names]
    return " ".join(kept) if kept else query


async def speaker_boosts(
    graph: NodeReads, repo: str, names: frozenset[str], context: ReadContext, boost: float
) -> dict[str, float]:
    """The factor of each node recall read whose speaker (its own, else its one step's) the
    query does not name, when some candidate's speaker it names: 1 / (1 + boost); nodes not
    listed keep their score. At most one read, bounded by the candidates."""
    if not names or boost <= 0:
        return {}
    nodes = context.nodes
    speakers = {i: s for i, n in nodes.items() if (s := speaker_of(n.text)) is not None}
    step_of = {
        i: step for i, step in context.steps_of(list(nodes.values())).items()
        if step != i and i not in speakers}
    missing = sorted({s for s in step_of.values() if s not in nodes})
    texts = {i: n.text for i, n in nodes.items()}
    texts |= {n.id: n.text for n in await graph.get_nodes(repo, missing)}
    for node_id, step in step_of.items():
        speaker = speaker_of(texts.get(step, ""))
        if speaker is not None:
            speakers[node_id] = speaker
    said = {i for i, speaker in speakers.items() if set(speaker.lower().split()) & names}
    if not said:
        return {}
    # The others go down rather than these up: a score stays within [0, 1].
    return {i: 1.0 / (1.0 + boost) for i in nodes if i not in said}


class TagVectors:
    """`embed(query_side(embedder), [query, *tags])`, with the vectors of the last `size` tags
    remembered (across every repo's embedder)."""

    def __init__(self, size: int = 4096) -> None:
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        self._size = size
        # (id(embedder), tag) -> (the embedder, its vector): the embedder is held so that
        # its id is not reused while the entry lives.
        self._kept: OrderedDict[tuple[int, str], tuple[Embedder, Vector]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    async def embed(self, embedder: Embedder, query: str, tags: Sequence[str]) -> Vector:
        """The vectors of `query` then of each of `tags`, as rows of one matrix."""
        known: dict[str, Vector] = {}
        for tag in dict.fromkeys(tags):
            if (entry := self._kept.get((id(embedder), tag))) is not None:
                self._kept.move_to_end((id(embedder), tag))
                known[tag] = entry[1]
        missing = [tag for tag in dict.fromkeys(tags) if tag not in known]
        fresh = await embed(query_side(embedder), [query, *missing])
        for tag, vector in zip(missing, fresh[1:], strict=True):
            known[tag] = vector
            self._kept[(id(embedder), tag)] = (embedder, vector.copy())
            while len(self._kept) > self._size:
                self._kept.popitem(last=False)
        return np.vstack([fresh[0], *(known[tag] for tag in tags)]) if tags else fresh


# How many of the best lexical hits feed back, and in how many of them a word must appear.
FEEDBACK_DOCS = 5
MIN_SHARED = 2


def feedback_terms(query: str, documents: Sequence[str], n: int) -> list[str]:
    """At most `n` words of `documents` to add to `query`: content words (`_content`) absent
    from the query, found in at least `MIN_SHARED` documents; the most shared first, then the
    most frequent, then the first seen. Words are split as a search splits them."""
    asked = {_text.stem(w.lower()) for w in _text.text_words(query)}
    shared: dict[str, int] = {}
    counts: dict[str, int] = {}
    for document in documents:
        seen: set[str] = set()
        for lower in _search_words(document):
            if not _content(lower) or _text.is_stopword(lower) or _text.stem(lower) in asked:
                continue
            counts[lower] = counts.get(lower, 0) + 1
            if lower not in seen:
                seen.add(lower)
                shared[lower] = shared.get(lower, 0) + 1
    ranked = sorted(
        (w for w, docs in shared.items() if docs >= MIN_SHARED),
        key=lambda w: (-shared[w], -counts[w]),  # stable: `shared` is in first-seen order
    )
    return ranked[:n]


def _search_words(document: str) -> list[str]:
    """The lower-cased words a search reads in `document`, but those of a stopword."""
    return [part for word in _text.tokens(document) if not _text.is_stopword(word)
            for part in _text.parts(word)]


def _content(word: str) -> bool:
    """Three characters or more, a letter among them, and no digit (marks, joiners and
    underscores a word keeps allowed)."""
    return len(word) >= 3 and any(c.isalpha() for c in word) and all(
        unicodedata.category(c)[0] in "LM" or unicodedata.category(c) in ("Cf", "Pc")
        for c in word)


# Each mode's question forms, tried in this order by the offline heuristics.
_QUESTION_FORMS = {
    "procedural": re.compile(
        r"(?i)\bhow (?:do|to|can|should|would)\b|\bsteps?\b|\bprocedure\b|\binstructions?\b"
        r"|\bwhat should (?:i|we)\b|\bhow did (?:i|we|you) (?:fix|solve|set|install|configure)"
    ),
    "episodic": re.compile(
        r"(?i)\bwhen\b|\bwhat happened\b|\blast time\b|\byesterday\b|\bago\b"
        r"|\bdid (?:i|we|you|he|she|they)\b|\bhas \w+ ever\b"
    ),
    "semantic": re.compile(
        r"(?i)\bwhat (?:is|are|was|were|does|do|kind)\b|\bwho\b|\bwhich\b|\bwhere\b"
        r"|\bprefer|\bfavou?rite\b|\blikes?\b"
    ),
}


@dataclass(frozen=True, slots=True)
class Plan:
    """How to search: which kind of memory the query wants, and topic tags to route by."""

    mode: str
    tags: tuple[str, ...]


def offline_plan(query: str) -> Plan:
    """The offline heuristics' plan: the mode from the query's question form (the first of
    `_QUESTION_FORMS` that matches, else mixed), tags from its concept labels."""
    mode = next((mode for mode, form in _QUESTION_FORMS.items() if form.search(query)), "mixed")
    return Plan(mode, tuple(tag.lower() for tag in _text.concepts(query, limit=6)))
