"""The index's applied but uncommitted changes (a search scores them beside the committed
documents, dropping stale copies, instead of paying a commit; BENCHMARKS.md), and the one BM25
(k1 1.2, b 0.75) every hit is scored with over the repo's live documents (`Statistics`, exact,
unlike tantivy's), from the stems stored with each document."""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# bm25's term-frequency saturation and length normalisation, FTS5's (PostgreSQL's too).
K1, B = 1.2, 0.75


@dataclass(frozen=True, slots=True)
class FreshDoc:
    """A document as scored: stem counts, length in tokens, keys of other nodes' texts held."""

    id: str
    type: str
    terms: Mapping[str, int]
    length: int
    holds: tuple[str, ...] = ()

    @classmethod
    def of(cls, node_id: str, kind: str, stems: list[str],
           holds: tuple[str, ...] = ()) -> FreshDoc:
        return cls(node_id, kind, Counter(stems), len(stems), holds)


class Fresh:
    """Per repo, the documents (or deletions: None) applied since the last commit, by key,
    indexed by stem and by held node."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._repos: dict[str, dict[str, tuple[int, FreshDoc | None]]] = {}
        self._postings: dict[str, dict[str, set[str]]] = {}
        self._holders: dict[str, dict[str, set[str]]] = {}
        self.version = 0
        self._clock = clock
        self.since: float | None = None

    def __len__(self) -> int:
        return sum(map(len, self._repos.values()))

    def commit_wait(self, quiet: float, within: float) -> float:
        """Seconds left before a commit is due (`quiet`, capped by the oldest's `within`)."""
        since = self.since  # read once: the worker reads it without the index's lock
        if since is None:
            return quiet
        return max(0.0, min(quiet, since + within - self._clock()))

    def postpone(self) -> None:
        """After a commit that failed: the next try waits as if the entries were new."""
        if len(self):
            self.since = self._clock()

    def put(self, repo: str, key: str, doc: FreshDoc | None) -> None:
        self.version += 1
        if self.since is None:
            self.since = self._clock()
        entries = self._repos.setdefault(repo, {})
        postings = self._postings.setdefault(repo, {})
        holders = self._holders.setdefault(repo, {})
        old = entries.get(key)
        if old is not None and old[1] is not None:
            self._unlist(repo, key, old[1])
        entries[key] = (self.version, doc)
        if doc is not None:
            for stem in doc.terms:
                postings.setdefault(stem, set()).add(key)
            for held in doc.holds:
                holders.setdefault(held, set()).add(key)

    def _unlist(self, repo: str, key: str, doc: FreshDoc) -> None:
        for stem in doc.terms:
            self._postings[repo][stem].discard(key)
        for held in doc.holds:
            self._holders[repo][held].discard(key)

    def committed(self, upto: int) -> None:
        """Forgets what a commit that saw `version == upto` wrote."""
        for repo in list(self._repos):
            entries = self._repos[repo]
            gone = [k for k, (version, _) in entries.items() if version <= upto]
            for key in gone:
                doc = entries.pop(key)[1]
                if doc is not None:
                    self._unlist(repo, key, doc)
            if not entries:
                del self._repos[repo]
                del self._postings[repo]
                del self._holders[repo]
        self.since = self._clock() if len(self) else None

    def of(self, repo: str, stems: Iterable[str]) -> tuple[set[str], dict[str, FreshDoc]]:
        """The repo's entry keys (committed copies stale) and live documents holding `stems`."""
        entries = self._repos.get(repo, {})
        postings = self._postings.get(repo, {})
        holding = set().union(*(postings.get(stem, ()) for stem in stems))
        live = {key: doc for key in holding if (doc := entries[key][1]) is not None}
        return set(entries), live

    def holding(self, repo: str, keys: Iterable[str]) -> tuple[set[str], set[str]]:
        """The repo's entry keys, and those of live documents holding one of `keys`' texts."""
        holders = self._holders.get(repo, {})
        return set(self._repos.get(repo, {})), set().union(*(holders.get(k, ()) for k in keys))

    def holders(self, repo: str, stem: str) -> int:
        """How many live documents of the repo applied since the last commit hold `stem`."""
        return len(self._postings.get(repo, {}).get(stem, ()))

    def entries(self, repo: str) -> Mapping[str, tuple[int, FreshDoc | None]]:
        """The repo's entries by key: (version, the document or None for a deletion)."""
        return self._repos.get(repo, {})


# A committed document as a search reads it: its key, its node's id and its stored stems.
Stored = tuple[str, str, bytes]
# The most committed documents a slot keeps read between two commits (`unstale_hits`).
READ_KEEP = 20_000


def unstale_hits(
    searcher: Any, query: Any, limit: int, stale: Collection[str],
    read: dict[tuple[int, int], Stored],
) -> list[tuple[float, Stored]]:
    """The best `limit` hits of `query` whose key is not in `stale`, asking tantivy for more as
    stale ones turn up (each hit is a document read); `read` caches them for one commit."""
    want = limit
    while True:
        hits = searcher.search(query, want, count=False).hits
        kept = []
        for score, address in hits:
            at = (address.segment_ord, address.doc)
            doc = read.get(at)
            if doc is None:
                if len(read) >= READ_KEEP:
                    read.clear()
                got = searcher.doc(address)
                doc = read[at] = (got["key"][0], got["id"][0].decode(), got["stems"][0])
            if doc[0] not in stale:
                kept.append((score, doc))
        # As many again may be further down, never more than all.
        more = limit + min(2 * (len(hits) - len(kept)), len(stale))
        if len(kept) >= limit or len(hits) < want or more <= want:
            return kept[:limit]
        want = more


@dataclass(slots=True)
class Statistics:
    """A repo's live documents as BM25 counts them: how many, their tokens, and how many hold
    each stem searches asked for (reading the whole vocabulary holds the GIL for seconds)."""

    documents: int = 0
    tokens: int = 0
    frequencies: dict[str, int] = field(default_factory=dict)

    def add(self, doc: FreshDoc, sign: int = 1) -> None:
        """Counts `doc` in (`sign` 1) or out (-1), in the stems already counted."""
        self.documents += sign
        self.tokens += sign * doc.length
        known = self.frequencies
        for stem in doc.terms.keys() & known.keys():
            known[stem] += sign

    @property
    def average(self) -> float:
        return self.tokens / self.documents if self.documents else 1.0

    def frequencies_of(self, stems: Iterable[str], searcher: Any, fields: Any, repo: str,
                       fresh: Fresh) -> dict[str, int]:
        """How many live documents hold each of `stems`: counted once, then kept by `add`."""
        import tantivy as tv

        known = self.frequencies
        if len(known) > STEMS_KEPT:
            known.clear()
        missing = [stem for stem in stems if stem not in known]
        filters = unchanged(fields, repo, fresh) if missing else []
        for stem in missing:
            committed = 0
            if searcher.doc_freq("text", stem):  # in some document, maybe deleted
                committed = searcher.search(tv.Query.boolean_query(
                    [(tv.Occur.Must, tv.Query.term_query(fields, "text", stem)), *filters]),
                    1, count=True).count
            known[stem] = committed + fresh.holders(repo, stem)
        return {s: known[s] for s in stems}

    @classmethod
    def read(cls, searcher: Any, fields: Any, repo: str, fresh: Fresh) -> Statistics:
        """The repo's live documents and tokens, committed and fresh."""
        import tantivy as tv

        counted = searcher.aggregate(tv.Query.boolean_query(unchanged(fields, repo, fresh)), {
            "documents": {"value_count": {"field": "length"}},
            "tokens": {"sum": {"field": "length"}},
        })
        stats = cls(int(counted["documents"]["value"] or 0),
                    int(counted["tokens"]["value"] or 0))
        for _, doc in fresh.entries(repo).values():
            if doc is not None:
                stats.add(doc)
        return stats


def unchanged(fields: Any, repo: str, fresh: Fresh) -> list[tuple[Any, Any]]:
    """A query's clauses for the repo's committed documents not changed since (`fresh`)."""
    import tantivy as tv

    clauses = [(tv.Occur.Must, tv.Query.term_query(fields, "repo", repo))]
    if stale := list(fresh.entries(repo)):
        clauses.append((tv.Occur.MustNot, tv.Query.term_set_query(fields, "key", stale)))
    return clauses


# The most stems a repo's `Statistics` keeps counted; past them, it counts afresh.
STEMS_KEPT = 200_000


def committed_docs(searcher: Any, fields: Any, keys: list[str]) -> list[FreshDoc]:
    """The committed documents of these keys (one per key at most)."""
    import tantivy as tv

    if not keys:
        return []
    query = tv.Query.term_set_query(fields, "key", keys)
    docs = (searcher.doc(a) for _, a in searcher.search(query, len(keys), count=False).hits)
    return [stored_doc(doc["id"][0].decode(), "", doc["stems"][0]) for doc in docs]


def stem_text(stems: list[str]) -> bytes:
    """A document's stored `stems`: each between two spaces of its own, so a stem's count is
    `bytes.count(b" stem ")`."""
    return "".join(f" {stem} " for stem in stems).encode()


def stored_doc(node_id: str, kind: str, stored: bytes) -> FreshDoc:
    """The document a committed copy's stored stems (`stem_text`) describe."""
    return FreshDoc.of(node_id, kind, stored.decode().split())


def bm25(counts: Iterable[tuple[float, int]], length: int, average: float) -> float:
    """BM25 of a document from (idf, term frequency) of each query stem, in query order."""
    norm = K1 * (1 - B + B * length / average)
    score = 0.0  # added left to right: `sum` of floats rounds otherwise from Python 3.12 on
    for weight, tf in counts:
        if tf:
            score += weight * tf * (K1 + 1) / (tf + norm)
    return score


def stored_score(stored: bytes, needles: Sequence[tuple[str, bytes, float]],
                 average: float) -> float:
    """`bm25` of a committed document from its stored stems and the query's `needles`."""
    length = stored.count(b" ") // 2
    if len(stored) * len(needles) <= COUNTED_BYTES:
        return bm25([(w, stored.count(needle)) for _, needle, w in needles], length, average)
    terms = Counter(stored.decode().split())
    return bm25([(w, terms[stem]) for stem, _, w in needles], length, average)


def needles(weights: Mapping[str, float]) -> list[tuple[str, bytes, float]]:
    """Each stem of `weights` (idf by stem) as `stored_score` looks for it."""
    return [(stem, f" {stem} ".encode(), w) for stem, w in weights.items()]


# Above this many bytes read to count a document's stems one by one, they are counted once.
COUNTED_BYTES = 32_000


def scores(
    docs: Mapping[str, FreshDoc],
    idf: Mapping[str, float],
    kinds: Collection[str] | None,
    average: float,
) -> list[tuple[str, str, float]]:
    """(key, id, BM25) of each document holding a stem of `idf`, of the wanted kinds."""
    scored = ((key, doc.id, bm25([(w, doc.terms.get(stem, 0)) for stem, w in idf.items()],
                                 doc.length, average))
              for key, doc in docs.items() if kinds is None or doc.type in kinds)
    return [hit for hit in scored if hit[2] > 0]


# What tantivy's BM25 counts: all its documents (deleted ones and other repos' too) and
# their average length.
Totals = tuple[int, float]


def tantivy_totals(searcher: Any, fields: Any, stems: Iterable[str]) -> Totals | None:
    """`Totals` as tantivy's explanation of a hit of one of `stems` gives them (None: no
    committed document holds one)."""
    import tantivy as tv

    for stem in stems:
        query = tv.Query.term_query(fields, "text", stem)
        hits = searcher.search(query, 1, count=False).hits
        if hits:
            found: dict[str, float] = {}
            todo = [json.loads(query.explain(searcher, hits[0][1]).to_json())]
            while todo:
                node = todo.pop()
                found.setdefault(node.get("description", ""), node.get("value", 0.0))
                todo.extend(node.get("details", []))
            return (int(found["N, total number of docs"]),
                    found["avgdl, average length of field"])
    return None


def tantivy_scale(totals: Totals, weights: Mapping[str, float], average: float,
                  frequency: Callable[[str], int]) -> float:
    """At least the most any committed document's exact BM25 (idf `weights` by stem, mean length
    `average`) exceeds tantivy's score of it, from tantivy's `totals` and `frequency` of a stem:
    tantivy also counts deleted and other repos' documents, and rounds lengths down."""
    documents, length = totals
    ratio = max(w / idf(documents, frequency(s)) for s, w in weights.items())
    return ratio * max(1.0, average / max(length, 1e-9)) * (1 + 1e-4)  # and float32 rounding


def idf(documents: int, frequency: int) -> float:
    """BM25's idf as tantivy and Lucene define it, never negative."""
    documents = max(documents, frequency)
    return math.log(1 + (documents - frequency + 0.5) / (frequency + 0.5))
