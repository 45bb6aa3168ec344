"""The index's changes that are applied but not yet committed, and the BM25 every search
scores with.

A tantivy commit is an fsync and a new segment: tens of milliseconds on a quiet disk, hundreds
on a busy one (BENCHMARKS.md). A search right after a commit must see its nodes, so rather than
commit before each search the index keeps what it applied since its last commit here, and a
search scores these documents beside the committed ones (whose stale copies it drops). The
background thread commits them within a second, or sooner when they are many.

Every hit, committed or not, is scored here with one BM25 (k1 1.2, b 0.75) over the repo's live
documents (`Statistics`, kept exact as changes are applied): tantivy's own statistics count the
copies a change deleted until a merge drops them, and every repo of a slot, so its scores moved
with when the background thread had committed and merged. A committed document's stems are
stored beside it (`stems`, as `stem_text` writes them), so a hit is scored from the document a
search reads anyway, and scores the same committed or not.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._repos: dict[str, dict[str, tuple[int, FreshDoc | None]]] = {}
        self._postings: dict[str, dict[str, set[str]]] = {}
        self._holders: dict[str, dict[str, set[str]]] = {}
        self._version = 0
        self._count = 0
        self._clock = clock
        # When the oldest entry was put (`clock()`), None while there is none.
        self.since: float | None = None

    def __len__(self) -> int:
        return self._count

    @property
    def version(self) -> int:
        return self._version

    def commit_wait(self, quiet: float, within: float) -> float:
        """Seconds the background thread may still wait for more changes before it commits:
        `quiet`, cut so that the oldest entry waits no longer than `within`; 0 when due."""
        since = self.since  # read once: the worker reads it without the index's lock
        if since is None:
            return quiet
        return max(0.0, min(quiet, since + within - self._clock()))

    def postpone(self) -> None:
        """After a commit that failed: the next try waits as if the entries were new."""
        if self._count:
            self.since = self._clock()

    def put(self, repo: str, key: str, doc: FreshDoc | None) -> None:
        self._version += 1
        if self.since is None:
            self.since = self._clock()
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
        # Entries put after `upto` (none in the index, where puts and commits hold one
        # lock) wait from now: their own times are not kept.
        self.since = self._clock() if self._count else None

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
    """The best `limit` hits of `query` (score, stored document) whose key is not in `stale`
    (committed copies of what changed since). Asks tantivy for `limit` more than the stale
    hits seen so far, round after round, rather than for `limit + len(stale)` at once: the
    stale entries are mostly documents never committed before (a new node), and each hit
    asked for is a document read. `read` keeps the documents read, by (segment, document),
    for the searches of the same commit (at most `READ_KEEP`)."""
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
        # Some hits were stale: as many again may be further down, never more than all (a
        # key's one committed copy each: should a key have two, the asking stops there).
        more = limit + min(2 * (len(hits) - len(kept)), len(stale))
        if len(kept) >= limit or len(hits) < want or more <= want:
            return kept[:limit]
        want = more


@dataclass(slots=True)
class Statistics:
    """A repo's live documents as BM25 counts them: how many, their tokens, and how many hold
    each stem, for the stems searches asked for (`frequencies_of`): a repo's vocabulary runs
    to millions of stems, and one tantivy call reading it whole holds the GIL for seconds."""

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
        """How many live documents of the repo hold each of `stems`: counted once in the
        slot's last commit (copies changed since left out) and the changes applied since,
        then kept as changes are applied (`add`), for `STEMS_KEPT` stems at most."""
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
        """The repo's documents and tokens: a sum over the `length` fast field of the slot's
        committed documents (live ones only) but those changed since (`fresh`), and the
        changes' documents."""
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
    """The committed documents of these keys, as their stored stems describe them (each key
    has at most one: a write deletes by key first)."""
    import tantivy as tv

    if not keys:
        return []
    query = tv.Query.term_set_query(fields, "key", keys)
    docs = (searcher.doc(a) for _, a in searcher.search(query, len(keys), count=False).hits)
    return [stored_doc(doc["id"][0].decode(), "", doc["stems"][0]) for doc in docs]


def stem_text(stems: list[str]) -> bytes:
    """A document's stems as its stored `stems` field holds them: each between two spaces of
    its own, so that a stem's count is the count of " stem " (two of one stem side by side
    share no space: `bytes.count` counts matches that do not overlap)."""
    return "".join(f" {stem} " for stem in stems).encode()


def stored_doc(node_id: str, kind: str, stored: bytes) -> FreshDoc:
    """The document a committed copy's stored stems (`stem_text`) describe."""
    return FreshDoc.of(node_id, kind, stored.decode().split())


def bm25(counts: Iterable[tuple[float, int]], length: int, average: float) -> float:
    """BM25 of a document `length` tokens long from (idf, term frequency) of each query stem,
    in the query's order: every hit is scored by this one sum, committed or not."""
    norm = K1 * (1 - B + B * length / average)
    score = 0.0
    for weight, tf in counts:
        if tf:
            score += weight * tf * (K1 + 1) / (tf + norm)
    return score


def stored_score(stored: bytes, needles: Sequence[tuple[str, bytes, float]],
                 average: float) -> float:
    """`bm25` of a committed document from its stored stems (`stem_text`), with `needles`,
    each query stem's (stem, " stem " as bytes, idf) (`needles`): each stem counted in it,
    or, when that would read more than `COUNTED_BYTES`, its stems counted once."""
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
    found = []
    for key, doc in docs.items():
        if kinds is not None and doc.type not in kinds:
            continue
        score = bm25([(w, doc.terms.get(stem, 0)) for stem, w in idf.items()], doc.length,
                     average)
        if score > 0:
            found.append((key, doc.id, score))
    return found


def idf(documents: int, frequency: int) -> float:
    """BM25's idf as tantivy and Lucene define it, never negative."""
    documents = max(documents, frequency)
    return math.log(1 + (documents - frequency + 0.5) / (frequency + 0.5))
