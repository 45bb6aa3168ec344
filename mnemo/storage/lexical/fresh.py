"""The index's changes that are applied but not yet committed, and their BM25 scores.

A tantivy commit is an fsync and a new segment: tens of milliseconds on a quiet disk, hundreds
on a busy one (BENCHMARKS.md). A search right after a commit must see its nodes, so rather than
commit before each search the index keeps what it applied since its last commit here, and a
search scores these documents itself, with tantivy's BM25 (k1 1.2, b 0.75) and the index's
document frequencies, beside the committed ones (whose stale copies it drops). The background
thread commits them within a second, or sooner when they are many.

The one approximation: BM25's average document length, which tantivy does not expose, is
estimated from a sample of the store's nodes and the documents applied since, so their scores
may differ from what tantivy gives them once committed by a fraction (tantivy's length norms
are coarser too; tests/graph/test_lexical.py bounds it); they are only ever compared with
committed documents' scores, and recall fuses ranks, not scores.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

K1, B = 1.2, 0.75


@dataclass(frozen=True, slots=True)
class FreshDoc:
    """A document as a search scores it: its stems' counts and its length in tokens; and the
    keys of the other nodes whose text it holds (a step's window, `windows.py`)."""

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
    with the keys of the documents holding each stem (a search reads only those) and of
    those holding each other node's text."""

    def __init__(self) -> None:
        self._repos: dict[str, dict[str, tuple[int, FreshDoc | None]]] = {}
        self._postings: dict[str, dict[str, set[str]]] = {}
        self._holders: dict[str, dict[str, set[str]]] = {}
        self._version = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def version(self) -> int:
        return self._version

    def put(self, repo: str, key: str, doc: FreshDoc | None) -> None:
        self._version += 1
        entries = self._repos.setdefault(repo, {})
        postings = self._postings.setdefault(repo, {})
        holders = self._holders.setdefault(repo, {})
        old = entries.get(key)
        if old is None:
            self._count += 1
        elif old[1] is not None:
            self._unlist(repo, key, old[1])
        entries[key] = (self._version, doc)
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
            self._count -= len(gone)
            if not entries:
                del self._repos[repo]
                del self._postings[repo]
                del self._holders[repo]

    def of(self, repo: str, stems: Iterable[str]) -> tuple[set[str], dict[str, FreshDoc]]:
        """The keys of every entry of the repo (their committed copies are stale), and the
        live documents holding one of `stems` (taken under the index's lock)."""
        entries = self._repos.get(repo, {})
        postings = self._postings.get(repo, {})
        holding = set().union(*(postings.get(stem, ()) for stem in stems))
        live = {key: doc for key in holding if (doc := entries[key][1]) is not None}
        return set(entries), live

    def holding(self, repo: str, keys: Iterable[str]) -> tuple[set[str], set[str]]:
        """The keys of every entry of the repo (their committed copies are stale), and of
        the live documents holding the text of one of the nodes `keys`."""
        holders = self._holders.get(repo, {})
        return set(self._repos.get(repo, {})), set().union(*(holders.get(k, ()) for k in keys))

    def live_count(self, repo: str) -> int:
        return sum(1 for _, doc in self._repos.get(repo, {}).values() if doc is not None)


def document_frequencies(docs: Iterable[FreshDoc], stems: Collection[str]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for doc in docs:
        counts.update(stem for stem in stems if stem in doc.terms)
    return counts


class AverageLength:
    """A running mean of documents' lengths in tokens (BM25's average document length)."""

    def __init__(self) -> None:
        self.tokens = 0
        self.documents = 0

    def add(self, length: int) -> None:
        self.tokens += length
        self.documents += 1

    @property
    def value(self) -> float:
        return self.tokens / self.documents if self.documents else 12.0


def scores(
    docs: Mapping[str, FreshDoc],
    idf: Mapping[str, float],
    kinds: Collection[str] | None,
    average: float,
) -> list[tuple[str, str, float]]:
    """(key, id, BM25) of each document holding a stem of `idf`, of the wanted kinds."""
    found = []
    for key, doc in docs.items():
        if kinds is not None and doc.type not in kinds:
            continue
        norm = K1 * (1 - B + B * doc.length / average)
        score = sum(
            weight * tf * (K1 + 1) / (tf + norm)
            for stem, weight in idf.items()
            if (tf := doc.terms.get(stem, 0))
        )
        if score > 0:
            found.append((key, doc.id, score))
    return found


def idf(documents: int, frequency: int) -> float:
    """tantivy's (and Lucene's) BM25 idf."""
    return math.log(1 + (documents - frequency + 0.5) / (frequency + 0.5))
