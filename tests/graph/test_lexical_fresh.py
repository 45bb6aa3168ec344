"""The lexical index's uncommitted changes (mnemo/storage/lexical/fresh.py): their counts,
when the background thread commits them, and the search that skips their stale committed
copies; then the commit under writes that never stop, on each backend."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
import tantivy as tv
from hypothesis import given, strategies as st

from mnemo.storage.lexical import fresh as lexical_fresh, index as lexical_index
from mnemo.storage.lexical.fresh import (
    Fresh,
    FreshDoc,
    idf,
    needles,
    scores,
    stem_text,
    stored_doc,
    stored_score,
    unstale_hits,
)
from mnemo.storage.lexical.index import LexicalIndex
from mnemo.storage.ports import Backend
from tests.backends import open_stores
from tests.graph._support import DIM, REPO
from tests.graph.test_lexical import add, found, lexical, settled

# ---- counts and the commit's timing -------------------------------------------------------

_puts = st.tuples(st.sampled_from(["r", "s"]), st.sampled_from("abcdef"), st.booleans())


@given(st.lists(st.one_of(_puts, st.just("commit")), max_size=40))
def test_counts_follow_puts_deletions_and_commits(script: list[Any]) -> None:
    """`len` and `entries` agree with a recount of what was put since the last commit."""
    fresh = Fresh()
    model: dict[tuple[str, str], bool] = {}  # (repo, key) -> a document (not a deletion)
    for step in script:
        if step == "commit":
            fresh.committed(fresh.version)
            model.clear()
        else:
            repo, key, live = step
            doc = FreshDoc.of(key, "semantic", ["word", key]) if live else None
            fresh.put(repo, key, doc)
            model[(repo, key)] = live
        assert len(fresh) == len(model)
        for repo in ("r", "s"):
            assert {k: doc is not None for k, (_, doc) in fresh.entries(repo).items()} == {
                k: live for (r, k), live in model.items() if r == repo}


def test_commit_waits_for_quiet_but_never_past_the_oldest_change() -> None:
    now = [100.0]
    fresh = Fresh(clock=lambda: now[0])
    assert fresh.commit_wait(0.5, 1.0) == 0.5  # nothing to commit: the quiet wait
    fresh.put("r", "a", None)
    now[0] = 100.6
    fresh.put("r", "b", None)  # a change keeps coming: the oldest still counts
    assert fresh.commit_wait(0.5, 1.0) == pytest.approx(0.4)
    now[0] = 101.2
    assert fresh.commit_wait(0.5, 1.0) == 0.0  # due, however busy
    version = fresh.version
    fresh.put("r", "c", None)  # during the commit
    fresh.committed(version)
    assert fresh.commit_wait(0.5, 1.0) == 0.5  # what is left waits from the commit's end
    fresh.committed(fresh.version)
    assert fresh.since is None


def test_a_failed_commit_is_retried_as_if_its_changes_were_new() -> None:
    """Regression: a commit that failed left the oldest change's age past due, so
    every later write retried it at once (an fsync and a logged traceback each)."""
    now = [0.0]
    fresh = Fresh(clock=lambda: now[0])
    fresh.put("r", "a", None)
    now[0] = 5.0
    assert fresh.commit_wait(0.5, 1.0) == 0.0
    fresh.postpone()
    assert fresh.commit_wait(3600.0, 1.0) == 1.0


@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_idf_is_positive_and_falls_as_a_term_spreads(documents: int, frequency: int) -> None:
    """Regression: the frequency, which counts deleted copies until
    a merge, can exceed the count of documents; the weight went negative (idf(20, 34) was
    -0.50) and the uncommitted documents holding the term dropped out of the search."""
    assert idf(documents, frequency) > 0
    assert idf(documents, frequency + 1) <= idf(documents, frequency)


# ---- skipping stale copies ----------------------------------------------------------------


class _Address:
    def __init__(self, n: int) -> None:
        self.segment_ord, self.doc = 0, n


class _Searcher:
    """tantivy's searcher over a fixed ranking: counts the documents read."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        self.asked: list[int] = []
        self.read = 0

    def search(self, query: object, limit: int, count: bool) -> Any:
        self.asked.append(limit)
        hits = [(float(-n), _Address(n)) for n in range(min(limit, len(self.keys)))]
        return type("Result", (), {"hits": hits})()

    def doc(self, address: _Address) -> dict[str, list[Any]]:
        self.read += 1
        return {"key": [self.keys[address.doc]], "id": [b"n"], "stems": [b" s "]}


@given(st.lists(st.booleans(), max_size=60), st.integers(1, 12), st.integers(0, 200))
def test_unstale_hits_are_the_ranking_without_the_stale(
    stale_marks: list[bool], limit: int, new: int
) -> None:
    """The best `limit` keys not stale, in order, whatever the stale keys' places; each
    document is read once; `new` stale keys that match nothing (never committed) cost no
    more hits."""
    keys = [f"k{n}" for n in range(len(stale_marks))]
    stale = {k for k, mark in zip(keys, stale_marks, strict=True) if mark}
    stale |= {f"new{n}" for n in range(new)}
    searcher = _Searcher(keys)
    got = [doc[0] for _, doc in unstale_hits(searcher, None, limit, stale, {})]
    assert got == [k for k in keys if k not in stale][:limit]
    assert searcher.read == len({*range(max(searcher.asked))} & {*range(len(keys))})
    assert max(searcher.asked) <= limit + 2 * len(stale & set(keys)) or len(searcher.asked) == 1


def test_fresh_new_documents_do_not_widen_the_search() -> None:
    """Regression: a search asked tantivy for `limit + len(stale)` hits, and read each, so
    2,000 new nodes not yet committed made every search read 2,000 documents."""
    searcher = _Searcher([f"k{n}" for n in range(5_000)])
    stale = {f"new{n}" for n in range(2_000)}
    assert len(unstale_hits(searcher, None, 10, stale, {})) == 10
    assert searcher.asked == [10]
    assert searcher.read == 10


def test_documents_read_are_read_once_until_the_next_commit() -> None:
    """The documents a search read are kept for the next searches (of the same commit: the
    index starts a new store of them at each): a second search reads none again, and the
    store never holds more than `READ_KEEP` of them."""
    searcher = _Searcher([f"k{n}" for n in range(50)])
    read: dict[tuple[int, int], Any] = {}
    first = unstale_hits(searcher, None, 10, set(), read)
    assert searcher.read == 10
    assert unstale_hits(searcher, None, 10, set(), read) == first
    assert searcher.read == 10
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lexical_fresh, "READ_KEEP", 5)
        unstale_hits(searcher, None, 20, set(), read)
    assert len(read) <= 5


def test_a_key_committed_twice_cannot_keep_the_search_asking() -> None:
    """Each key has one committed document (a write deletes by key first); should one have
    two, the search stops asking once the stale keys could all have been skipped (it asked
    for ever before), and still returns nothing stale."""
    searcher = _Searcher(["s", "s", "s", "s", "a"])
    got = unstale_hits(searcher, None, 2, {"s"}, {})
    assert all(doc[0] != "s" for _, doc in got)
    assert len(searcher.asked) <= 3


# ---- on each backend ----------------------------------------------------------------------


class _Commits:
    """Wraps an index's `_commit` and counts the commits; `committed()` waits, in a worker
    thread, for one more than were seen at its last call, leaving nothing uncommitted (30 s
    at most). The index commits only what it applied: a new commit is of a new change."""

    def __init__(self, index: LexicalIndex, monkeypatch: pytest.MonkeyPatch) -> None:
        self.index = index
        self.done = threading.Condition()
        self.count = self.seen = 0
        original = index._commit

        def commit() -> None:
            original()
            with self.done:
                self.count += 1
                self.done.notify_all()

        monkeypatch.setattr(index, "_commit", commit)

    def mark(self) -> None:
        with self.done:
            self.seen = self.count

    def _committed(self) -> bool:
        with self.done:
            return self.done.wait_for(
                lambda: self.count > self.seen and len(self.index._fresh) == 0, 30)

    async def committed(self) -> bool:
        return await anyio.to_thread.run_sync(self._committed)


@pytest.fixture
def by_age(monkeypatch: pytest.MonkeyPatch) -> None:
    """No quiet is ever long enough to commit after: only the oldest change's age commits."""
    monkeypatch.setattr(lexical_index, "COMMIT_AFTER", 3600.0)
    monkeypatch.setattr(lexical_index, "COMMIT_WITHIN", 0.0)


async def test_changes_are_committed_while_writes_keep_coming(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, by_age: None
) -> None:
    """Regression: the background thread committed only after `COMMIT_AFTER` seconds without
    a write, so under steady writes nothing was committed until a search met 2,000 changes
    and committed them itself."""
    commits = _Commits(lexical(backend), monkeypatch)
    await add(backend, "c0", {"a": "slate roof"})
    assert await found(backend, "slate") == {"a"}  # the slot opens; c0 is applied
    assert await commits.committed()
    commits.mark()
    await add(backend, "c1", {"b": "ochre tile"})
    assert await found(backend, "ochre") == {"b"}  # applied here or by the thread
    assert await commits.committed()


async def test_changes_are_committed_while_the_repo_stays_dirty(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, by_age: None
) -> None:
    """Regression: the age was looked at only when no repo waited to be brought
    up, so a repo that a write dirtied again during each apply put the commit off until
    2,000 changes. Here each step of bringing it up reports it still behind."""
    index = lexical(backend)
    commits = _Commits(index, monkeypatch)
    await add(backend, "c0", {"a": "slate roof"})
    assert await found(backend, "slate") == {"a"}
    assert await commits.committed()
    commits.mark()
    caught_up = threading.Event()
    original = index._rebuild_step

    def behind_again(repo: str) -> bool:  # a write landed meanwhile, until told otherwise
        original(repo)
        return caught_up.is_set()

    monkeypatch.setattr(index, "_rebuild_step", behind_again)
    try:
        await add(backend, "c1", {"b": "ochre tile"})  # the thread applies it
        assert await commits.committed()
        assert await found(backend, "ochre") == {"b"}
    finally:
        caught_up.set()


@pytest.mark.slow
async def test_a_rebuild_committed_halfway_leaves_no_mark_of_the_repo(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebuild deletes the repo's documents and writes them again batch by batch; a commit
    between batches (one by age, for another repo's changes) must not leave the repo's old
    mark (the log's sequence it had applied) beside half its documents: a process killed
    then would reopen the slot as current up to that mark and apply only the log after it,
    never the documents the rebuild had not written back yet."""
    from mnemo.storage.lexical.slots import META

    index = lexical(backend)
    await add(backend, "c0", {"a": "teal mug", "b": "teal cup", "c": "teal pot"})
    assert await found(backend, "teal") == {"a", "b", "c"}
    await settled(backend)
    # Behind by more than the log's tail: the background thread rebuilds, a node a batch.
    monkeypatch.setattr(lexical_index, "LOG_KEEP", 0)
    monkeypatch.setattr(lexical_index, "BATCH", 1)
    marks: list[int] = []
    original = index._rebuild_step

    def step(repo: str) -> bool:
        current = original(repo)
        if repo in index._rebuilds and not marks:  # halfway: commit, look at the index
            index._commit()
            searcher = index._index.searcher()
            meta = tv.Query.term_query(index._schema, "key", META + repo)
            marks.append(len(searcher.search(meta, 1).hits))
        return current

    monkeypatch.setattr(index, "_rebuild_step", step)
    await add(backend, "c1", {"d": "teal jar"})
    await settled(backend)
    assert marks == [0]
    assert await found(backend, "teal") == {"a", "b", "c", "d"}


@pytest.mark.slow
async def test_a_rebuild_whose_commit_failed_is_not_taken_as_current(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a rebuild's documents are not scored as uncommitted, so until
    its commit succeeds the repo is not current. The failed commit used to leave the repo
    marked as applied up to the log: its searches answered from the old commit, without
    the nodes written since, until some other change brought a commit."""
    index = lexical(backend)
    await add(backend, "c0", {"a": "teal mug", "b": "teal cup"})
    assert await found(backend, "teal") == {"a", "b"}
    await settled(backend)
    monkeypatch.setattr(lexical_index, "LOG_KEEP", 0)  # the next change rebuilds the repo
    failures: list[str] = []
    original = index._commit

    def fails_once() -> None:
        if not failures:
            failures.append("disk full")
            raise OSError("disk full")
        original()

    monkeypatch.setattr(index, "_commit", fails_once)
    await add(backend, "c1", {"d": "teal jar"})
    await settled(backend)  # the background thread rebuilt the repo; the commit failed
    assert failures == ["disk full"]
    result = await index.search(REPO, "teal", 100, None)
    if result is None:  # rebuilt again, the store's search answering meanwhile
        await settled(backend)
        result = await index.search(REPO, "teal", 100, None)
    assert result is not None
    assert {node_id for node_id, _ in result} == {"a", "b", "d"}


@pytest.mark.slow
async def test_a_repo_with_documents_and_no_mark_is_rebuilt_not_applied_from_the_start(
    store: str, tmp_path: Path
) -> None:
    """Regression: a slot that holds some of a repo's
    documents without its mark (a rebuild committed halfway, then its process killed) must
    not apply the log from its start over them: the log of a store restored from a backup
    never names a document the rebuild wrote for a node the backup does not hold, and that
    document stayed searchable. Such a repo is rebuilt."""
    from mnemo.storage.lexical.slots import META
    from mnemo.storage.lexical.source import Document, Row

    folder = str(tmp_path / "lexical")
    async with open_stores(store, DIM, lexical_dir=folder) as backend:
        await add(backend, "c1", {"a": "saffron cake", "b": "saffron bun"})
        assert await found(backend, "saffron") == {"a", "b"}
        index = lexical(backend)
        # What the killed rebuild left: a document for a node this store never held, and
        # no mark. (Done here by hand, under the index's lock.)
        with index._lock:
            ghost = Row(rowid=10**6, id="ghost", type="semantic", text="saffron ghost")
            index._put(REPO, Document(ghost, ghost.text, ()))
            index._writer.delete_documents_by_term("key", META + REPO)
            index._applied.pop(REPO)
            index._commit()
    async with open_stores(store, DIM, lexical_dir=folder) as backend:
        result = await lexical(backend).search(REPO, "saffron", 100, None)
        if result is None:  # being rebuilt: the store's search answers meanwhile
            await settled(backend)
        assert await found(backend, "saffron") == {"a", "b"}


@given(st.lists(st.sampled_from(["job", "jobs", "a", "b", "ab"]), max_size=30),
       st.lists(st.sampled_from(["job", "a", "b", "c"]), min_size=1, max_size=3, unique=True))
def test_a_stored_document_scores_as_its_stems_do(stems: list[str], query: list[str]) -> None:
    """A committed document, scored from its stored stems (stem by stem, or all counted at
    once for a long one), scores to the bit what the same document scores before its commit:
    a stem repeated side by side counts twice (its stored form once counted such a pair as
    one)."""
    weights = {stem: 1.0 + n for n, stem in enumerate(query)}
    doc = FreshDoc.of("n", "semantic", stems)
    assert stored_doc("n", "semantic", stem_text(stems)).terms == doc.terms
    found = scores({"k": doc}, weights, None, 4.0)
    expected = found[0][2] if found else 0.0
    for counted in (0, 10**9):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(lexical_fresh, "COUNTED_BYTES", counted)
            assert stored_score(stem_text(stems), needles(weights), 4.0) == expected


async def test_a_search_counts_the_documents_of_its_own_stems_only(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a repo's first search read how many documents hold each stem of its
    whole vocabulary, in one tantivy call that held the GIL (3.3 s for 1.2M stems, the event
    loop stopped meanwhile). A search counts its own stems, and keeps `STEMS_KEPT` counted."""
    await add(backend, "c0", {f"n{i}": f"zebra word{i} other{i} more{i}" for i in range(40)})
    await backend.graph.settle(REPO)
    index = lexical(backend)
    assert await found(backend, "zebra") == {f"n{i}" for i in range(40)}
    assert set(index._stats[REPO].frequencies) == {"zebra"}
    monkeypatch.setattr(lexical_fresh, "STEMS_KEPT", 1)
    await add(backend, "c1", {"late": "zebra word3"})
    assert await found(backend, "word3") == {"n3", "late"}
    assert await found(backend, "zebra") == {*(f"n{i}" for i in range(40)), "late"}
    assert set(index._stats[REPO].frequencies) == {"zebra"}


# ---- tantivy's scores against the exact ones ---------------------------------------------

_docs = st.lists(st.tuples(st.sampled_from(["r", "s"]), st.lists(
    st.sampled_from(["ash", "elm", "oak", "yew", "fir", "box"]), min_size=1, max_size=60),
    st.booleans()), min_size=1, max_size=40)


@given(_docs, st.lists(st.sampled_from(["ash", "elm", "oak"]), min_size=1, max_size=3, unique=True))
def test_no_document_scores_higher_exactly_than_tantivy_scaled_says(
    docs: list[tuple[str, list[str], bool]], words: list[str]
) -> None:
    """`tantivy_scale` bounds every hit's exact BM25 (over repo "r"'s live documents) by its
    tantivy score, though tantivy counts "s"'s documents, deleted ones and rounded lengths:
    the search reads on until no unread document can enter the exact top."""
    from mnemo.storage.lexical.schema import TOKENIZER, analyzer, schema

    fields = schema()
    index = tv.Index(fields)
    index.register_tokenizer(TOKENIZER, analyzer())
    writer = index.writer()
    for n, (repo, stems, _) in enumerate(docs):
        writer.add_document(tv.Document(key=f"{repo}/{n}", repo=repo, text=" ".join(stems),
                                        stems=stem_text(stems), length=len(stems)))
    writer.commit()
    for n, (repo, _, dead) in enumerate(docs):
        if dead:
            writer.delete_documents_by_term("key", f"{repo}/{n}")
    writer.commit()
    index.reload()
    live = [stems for repo, stems, dead in docs if repo == "r" and not dead]
    if not live:
        return
    weights = {w: idf(len(live), sum(w in s for s in live)) for w in words}
    average = sum(map(len, live)) / len(live)
    searcher = index.searcher()
    query = tv.Query.boolean_query(
        [(tv.Occur.Must, tv.Query.boolean_query(
            [(tv.Occur.Should, tv.Query.term_query(fields, "text", w)) for w in words])),
         (tv.Occur.Must, tv.Query.const_score_query(tv.Query.term_query(fields, "repo", "r"),
                                                    0.0))])
    hits = searcher.search(query, 100).hits
    if not hits:
        return
    totals = lexical_fresh.tantivy_totals(searcher, fields, words)
    assert totals is not None
    scale = lexical_fresh.tantivy_scale(totals, weights, average,
                                        lambda s: searcher.doc_freq("text", s))
    for score, address in hits:
        stored = searcher.doc(address)["stems"][0]
        assert stored_score(stored, needles(weights), average) <= scale * score
