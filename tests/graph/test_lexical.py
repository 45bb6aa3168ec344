"""Recall's lexical index (mnemo/storage/lexical.py), on each backend: it answers what the
store holds now, after commits, deletes, text changes, an index left behind by a closed or
killed process, a store made again at the same place, and with several processes at once."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import cast

import anyio
import anyio.from_thread
import anyio.to_thread
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from mnemo.graph import commit
from mnemo.graph.model import Changeset, NodeType, step_window
from mnemo.storage.lexical import index as lexical_index
from mnemo.storage.lexical.fresh import bm25, idf
from mnemo.storage.lexical.index import LOG_KEEP, LexicalIndex
from mnemo.storage.lexical.schema import analyzer
from mnemo.storage.lexical.source import OWN, WINDOW
from mnemo.storage.ports import Backend, open_backend
from mnemo.text import query_words
from tests.backends import backend_of, is_sqlite, open_stores, sql
from tests.graph._support import DIM, REPO, axis, draft, policy


def lexical(backend: Backend) -> LexicalIndex:
    index = backend_of(backend).graph._lexical  # type: ignore[attr-defined]
    assert isinstance(index, LexicalIndex)
    return index


async def add(backend: Backend, name: str, texts: dict[str, str], repo: str = REPO,
              kind: NodeType = NodeType.SEMANTIC) -> None:
    """Commits one changeset of nodes of one type (id -> text), SEMANTIC unless told."""
    nodes = [
        draft(node_id, kind, text, axis(n % DIM))
        for n, (node_id, text) in enumerate(texts.items())
    ]
    target = cast(commit.CommitTarget, backend.graph)
    await commit.apply(target, Changeset(name, repo, nodes), intents=policy())


async def add_steps(backend: Backend, name: str, steps: dict[str, str]) -> None:
    """Commits one changeset of EPISODIC nodes (id -> text)."""
    await add(backend, name, steps, kind=NodeType.EPISODIC)


def holding(texts: dict[str, str], steps: set[str], word: str) -> set[str]:
    """The nodes whose document holds `word`: their text, or a step's window's texts."""
    return {
        i for i, text in texts.items()
        if word in text.split() or (i in steps and any(
            n in steps and word in texts[n].split() for n in step_window(i, WINDOW)))
    }


async def found(backend: Backend, word: str, repo: str = REPO) -> set[str]:
    """The ids the index returns for one word; fails if the index did not answer."""
    result = await lexical(backend).search(repo, word, 100, None)
    assert result is not None, "the lexical index did not answer"
    return {node_id for node_id, _ in result}


async def settled(backend: Backend) -> None:
    """Waits for the index's background work (a rebuild) to end."""
    worker = lexical(backend)._worker
    if worker is not None:
        await anyio.to_thread.run_sync(worker.join)


async def test_a_commit_is_found_at_once_and_a_delete_is_gone_at_once(backend: Backend) -> None:
    """The index applies the store's log before each search: no stale hit, no missed node."""
    await add(backend, "c1", {"a": "the zebra grazes", "b": "a zebra sleeps", "c": "quiet owl"})
    assert await found(backend, "zebra") == {"a", "b"}
    assert await backend.graph.search_text(REPO, "zebra", 10) != []
    await backend.graph.delete_nodes(REPO, ["a"])
    assert await found(backend, "zebra") == {"b"}
    await sql(backend, "UPDATE nodes SET text = 'a heron sleeps' WHERE id = 'b'")
    assert await found(backend, "zebra") == set()
    assert await found(backend, "heron") == {"b"}


async def test_a_search_begun_runs_on_the_index_thread_before_it_is_awaited(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`start_search_text` queues the search on the index's thread at once (the query's
    words are read there, not on the event loop) and its answer is `search_text`'s; one
    begun and discarded is dropped."""
    await add(backend, "c1", {"a": "the zebra grazes", "b": "a zebra sleeps", "c": "quiet owl"})
    read_on: list[str] = []

    def recorded(text: str) -> list[str]:
        read_on.append(threading.current_thread().name)
        return query_words(text)

    monkeypatch.setattr(lexical_index, "query_words", recorded)
    begun = backend.graph.start_search_text(REPO, "zebra", 10)
    searcher = lexical(backend)._searcher
    assert searcher is not None
    await searcher.call(lambda: None)  # the thread's jobs run in turn: the search is done
    assert read_on == ["mnemo-lexical"]
    assert await begun.result() == await backend.graph.search_text(REPO, "zebra", 10)
    backend.graph.start_search_text(REPO, "owl", 10).discard()
    await searcher.call(lambda: None)
    assert read_on == ["mnemo-lexical"] * 3


async def test_a_search_begun_without_an_index_answers_from_the_store(store: str) -> None:
    """Without a lexical index, a begun search is the store's own full-text search."""
    async with open_stores(store, DIM, lexical_dir="") as backend:
        await add(backend, "c1", {"a": "the zebra grazes", "c": "quiet owl"})
        begun = backend.graph.start_search_text(REPO, "zebra", 10)
        assert [n for n, _ in await begun.result()] == ["a"]


async def test_searches_run_on_the_index_thread_which_ends_with_the_store(store: str) -> None:
    """A search runs on the index's own thread (one hop cheaper than anyio's pool), and
    closing the store ends that thread."""
    async with open_stores(store, DIM) as backend:
        await add(backend, "c1", {"a": "the zebra grazes"})
        assert await found(backend, "zebra") == {"a"}
        searcher = lexical(backend)._searcher
        assert searcher is not None
        thread = searcher._thread
        assert thread.name == "mnemo-lexical"
        assert thread.is_alive()
    await anyio.to_thread.run_sync(thread.join, 10.0)
    assert not thread.is_alive()


@pytest.mark.slow
async def test_a_step_is_found_by_the_words_of_the_steps_around_it(backend: Backend) -> None:
    """A step's document holds the steps up to WINDOW (2) before and after it in its episode
    ("What did you paint?" finds the answer "A lake at sunrise"); facts and other episodes'
    steps stay apart. Words of a step that changes or goes are gone from every window at
    once, and a step written later joins its neighbours' windows."""
    assert WINDOW == 2
    words = ["oak", "ash", "yew", "elm", "fir"]
    await add_steps(backend, "c1", {f"episodic_e:{i}": w for i, w in enumerate(words)})
    await add_steps(backend, "c2", {"episodic_other:0": "paint"})
    await add(backend, "c3", {"f": "yew fact"})
    steps = {f"episodic_e:{i}" for i in range(5)}
    assert await found(backend, "yew") == steps | {"f"}
    assert await found(backend, "oak") == {"episodic_e:0", "episodic_e:1", "episodic_e:2"}
    assert await found(backend, "paint") == {"episodic_other:0"}
    await add_steps(backend, "c4", {"episodic_e:5": "lake"})
    assert await found(backend, "lake") == {"episodic_e:3", "episodic_e:4", "episodic_e:5"}
    await backend.graph.delete_nodes(REPO, ["episodic_e:2"])
    assert await found(backend, "yew") == {"f"}
    await sql(backend, "UPDATE nodes SET text = 'pine' WHERE id = 'episodic_e:1'")
    assert await found(backend, "ash") == set()
    assert await found(backend, "pine") == {"episodic_e:0", "episodic_e:1", "episodic_e:3"}
    await lexical(backend).settle(REPO)  # committed: the same from tantivy's own segments
    assert await found(backend, "pine") == {"episodic_e:0", "episodic_e:1", "episodic_e:3"}
    await backend.graph.delete_nodes(REPO, ["episodic_e:3"])
    assert await found(backend, "pine") == {"episodic_e:0", "episodic_e:1"}
    assert await found(backend, "elm") == set()


async def test_types_and_repos_filter(backend: Backend) -> None:
    """A search sees its own repo only, and only the node types asked for."""
    await add(backend, "c1", {"f": "lantern fact"})
    steps = [draft("s", NodeType.EPISODIC, "lantern step", axis(1))]
    target = cast(commit.CommitTarget, backend.graph)
    await commit.apply(target, Changeset("c2", REPO, steps), intents=policy())
    await add(backend, "c3", {"o": "lantern elsewhere"}, repo="other")
    assert await found(backend, "lantern") == {"f", "s"}
    only = await lexical(backend).search(REPO, "lantern", 10, [NodeType.EPISODIC.value])
    assert [node_id for node_id, _ in only or []] == ["s"]
    assert await found(backend, "lantern", "other") == {"o"}


@pytest.mark.slow
async def test_a_repo_alone_is_searched_by_its_words_and_two_stay_apart(
    backend: Backend,
) -> None:
    """While the committed index holds one repo, a search is the words alone (tantivy then
    skips blocks that cannot enter the top k); once another repo's documents are committed,
    each search is filtered to its repo again."""
    index = lexical(backend)
    await add(backend, "c1", {"a": "tulip bulb"})
    assert await found(backend, "tulip") == {"a"}
    await index.settle(REPO)  # committed: the searcher holds this repo alone
    assert await found(backend, "tulip") == {"a"}
    assert index._repos == [REPO]
    await add(backend, "c2", {"b": "tulip field"}, repo="other")
    assert await found(backend, "tulip", "other") == {"b"}
    assert await found(backend, "tulip") == {"a"}
    await index.settle("other")
    assert await found(backend, "tulip") == {"a"}
    assert await found(backend, "tulip", "other") == {"b"}
    assert sorted(index._repos or []) == sorted([REPO, "other"])


async def test_a_write_never_waits_for_the_index_commit(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`changed` (called on the event loop as a repo's write lock is let go) does not wait
    for the background thread's commit, an fsync (regression: the thread held the lock
    `changed` takes across its idle commit)."""
    monkeypatch.setattr(lexical_index, "COMMIT_AFTER", 0.0)  # commits as soon as idle
    index = lexical(backend)
    await add(backend, "c0", {"z": "slate roof"})
    assert await found(backend, "slate") == {"z"}  # the slot is open (its first commit)
    await settled(backend)
    entered, release = threading.Event(), threading.Event()
    original = index._commit

    def stalled_commit() -> None:  # a disk that takes its time
        entered.set()
        release.wait(60)
        original()

    monkeypatch.setattr(index, "_commit", stalled_commit)
    try:
        # The write wakes the thread, which applies it and, idle, commits: stalled.
        await add(backend, "c1", {"a": "ochre tile"})
        assert await anyio.to_thread.run_sync(entered.wait, 60)
        caller = threading.Thread(target=index.changed, args=(REPO,))
        caller.start()
        await anyio.to_thread.run_sync(caller.join, 10.0)
        assert not caller.is_alive(), "changed() waited for the index's commit"
    finally:
        release.set()
    await settled(backend)
    assert await found(backend, "ochre") == {"a"}


async def test_an_index_left_behind_catches_up_from_the_log(store: str) -> None:
    """Changes made while no index ran (another process, one killed before it applied them)
    are in the store's log: the next search applies them."""
    async with open_stores(store, DIM) as backend:
        await add(backend, "c1", {"a": "amber kettle", "b": "amber lamp"})
        assert await found(backend, "amber") == {"a", "b"}
    async with open_stores(store, DIM, lexical_dir="") as backend:
        await add(backend, "c2", {"c": "amber door"})
        await backend.graph.delete_nodes(REPO, ["a"])
    async with open_stores(store, DIM) as backend:
        assert await found(backend, "amber") == {"b", "c"}


@pytest.mark.slow
async def test_a_repo_past_the_horizon_is_rebuilt_while_the_store_answers(store: str) -> None:
    """A repo whose log no longer reaches the index's point (a store from before the index)
    is rebuilt in the background; meanwhile the store's own search answers."""
    async with open_stores(store, DIM) as backend:
        await add(backend, "c1", {"a": "cobalt vase", "b": "cobalt bowl"})
        assert await found(backend, "cobalt") == {"a", "b"}
        await sql(backend, "UPDATE lexical_repos SET horizon = seq + 1, seq = seq + 1")
        assert await lexical(backend).search(REPO, "cobalt", 10, None) is None
        assert {n for n, _ in await backend.graph.search_text(REPO, "cobalt", 10)} == {"a", "b"}
        await settled(backend)
        assert await found(backend, "cobalt") == {"a", "b"}


@pytest.mark.slow
async def test_a_new_store_at_the_same_place_is_not_answered_from_the_old_index(
    store: str, tmp_path: Path
) -> None:
    """The index belongs to one store (its epoch): a store made again at the same path, with
    other nodes under the same rowids, starts from an empty index."""
    folder = str(tmp_path / "lexical")
    async with open_stores(store, DIM, lexical_dir=folder) as backend:
        await add(backend, "c1", {"a": "saffron cake"})
        assert await found(backend, "saffron") == {"a"}
        # Another store's identity (PostgreSQL: the folder is per database; SQLite: per path).
        await sql(backend, "UPDATE lexical_epoch SET epoch = 'another store'")
        await sql(backend, "DELETE FROM nodes")
        await sql(backend, "DELETE FROM lexical_log")
        await sql(backend, "UPDATE lexical_repos SET seq = 0, horizon = 0")
    async with open_stores(store, DIM, lexical_dir=folder) as backend:
        await add(backend, "c2", {"z": "plain bread"})
        assert await found(backend, "saffron") == set()
        assert await found(backend, "bread") == {"z"}


async def test_two_processes_take_two_slots_and_both_answer(store: str) -> None:
    """Each open index holds a slot (an OS lock that dies with its process); a second one
    takes the next, brings it up from the store, and both answer the same."""
    async with open_stores(store, DIM) as first, open_stores(store, DIM) as second:
        await add(first, "c1", {"a": "violet kite"})
        assert await found(first, "violet") == {"a"}
        await add(second, "c2", {"b": "violet string"})
        assert await found(second, "violet") == {"a", "b"}
        assert await found(first, "violet") == {"a", "b"}
        slots = {lexical(first).slot, lexical(second).slot}
        assert None not in slots
        assert len(slots) == 2


async def test_an_unreadable_slot_is_rebuilt_from_the_store(store: str, tmp_path: Path) -> None:
    """A slot whose files are damaged is started over; the store has everything."""
    folder = tmp_path / "lexical"
    async with open_stores(store, DIM, lexical_dir=str(folder)) as backend:
        await add(backend, "c1", {"a": "indigo scarf"})
        assert await found(backend, "indigo") == {"a"}
        slot = lexical(backend).slot
    assert slot is not None
    for name in os.listdir(slot):
        if name == "meta.json":
            (slot / name).write_text("{ not json")
    async with open_stores(store, DIM, lexical_dir=str(folder)) as backend:
        await add(backend, "c2", {"b": "indigo coat"})
        result = await lexical(backend).search(REPO, "indigo", 10, None)
        if result is None:  # the repo is being rebuilt from the store
            await settled(backend)
        assert await found(backend, "indigo") == {"a", "b"}


async def test_an_index_that_cannot_be_made_leaves_the_store_answering(
    store: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A folder that cannot be written (a file in its place) turns the index off, not recall:
    a warning (the answer is whole), never an error."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    async with open_stores(store, DIM, lexical_dir=str(blocker)) as backend:
        await add(backend, "c1", {"a": "copper pot"})
        assert await lexical(backend).search(REPO, "copper", 10, None) is None
        assert [n for n, _ in await backend.graph.search_text(REPO, "copper", 10)] == ["a"]
    said = [r for r in caplog.records if "cannot be used" in r.getMessage()]
    assert said
    assert {r.levelname for r in said} == {"WARNING"}


async def test_sqlite_index_lives_beside_the_file(tmp_path: Path) -> None:
    """SQLite: the index is a folder beside the file by default (`<file>.lexical`); removing
    it loses nothing, the next search rebuilds it from the file."""
    path = tmp_path / "m.db"
    async with open_stores(str(path), DIM) as backend:
        await add(backend, "c1", {"a": "walnut desk"})
        assert await found(backend, "walnut") == {"a"}
        assert is_sqlite(backend)
    assert (tmp_path / "m.db.lexical").is_dir()
    shutil.rmtree(tmp_path / "m.db.lexical")
    async with open_stores(str(path), DIM) as backend:
        await settled(backend)
        result = await lexical(backend).search(REPO, "walnut", 10, None)
        if result is None:
            await settled(backend)
        assert await found(backend, "walnut") == {"a"}


# ---- random writes, reopenings and searches against a model ---------------------------------

WORDS = ["alder", "birch", "cedar", "damson", "elder", "fennel"]


class IndexRules(RuleBasedStateMachine):
    """Nodes and an episode's steps added, deleted, renamed (with and without an index
    running, the latter like a process that wrote and was killed before applying), the index
    reopened: a search for a word returns exactly the nodes whose document holds it now (its
    text, or a step's window's texts), each scored by BM25 over the documents as they are now
    (never over the copies a change deleted, whether or not tantivy merged them away)."""

    def __init__(self, store: str) -> None:
        super().__init__()
        self.store = store
        self.texts: dict[str, str] = {}
        self.steps: set[str] = set()
        self.count = 0
        self.stack = ExitStack()
        self.portal = self.stack.enter_context(anyio.from_thread.start_blocking_portal())
        self.backend: Backend | None = None
        self.indexed = True
        self.reopen(indexed=True)

    def reopen(self, *, indexed: bool) -> None:
        if self.backend is not None:
            self.portal.call(self.backend.close)
        backend = open_backend(
            self.store, dims=lambda repo: DIM, busy_timeout=5.0,
            lexical_dir=None if indexed else "",
        )
        self.portal.call(backend.open)
        self.backend, self.indexed = backend, indexed

    @rule(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=3))
    def add(self, words: list[str]) -> None:
        self.count += 1
        node_id = f"n{self.count}"
        # The id among its words: two commits of one fact would be one node.
        self.texts[node_id] = " ".join([*words, node_id])
        assert self.backend is not None
        self.portal.call(add, self.backend, f"c{self.count}", {node_id: self.texts[node_id]})

    @rule(at=st.integers(0, 7), words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=2))
    def add_step(self, at: int, words: list[str]) -> None:
        node_id = f"episodic_e:{at}"
        if node_id in self.steps:
            return
        self.count += 1
        self.steps.add(node_id)
        self.texts[node_id] = " ".join(words)
        assert self.backend is not None
        self.portal.call(add_steps, self.backend, f"c{self.count}",
                         {node_id: self.texts[node_id]})

    @precondition(lambda self: self.texts)
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        node_id = data.draw(st.sampled_from(sorted(self.texts)))
        del self.texts[node_id]
        self.steps.discard(node_id)
        assert self.backend is not None
        self.portal.call(self.backend.graph.delete_nodes, REPO, [node_id])

    @precondition(lambda self: self.texts)
    @rule(data=st.data(), word=st.sampled_from(WORDS))
    def rename(self, data: st.DataObject, word: str) -> None:
        node_id = data.draw(st.sampled_from(sorted(self.texts)))
        self.texts[node_id] = f"{word} {node_id}"
        assert self.backend is not None
        self.portal.call(sql, self.backend, "UPDATE nodes SET text = ? WHERE id = ?",
                         self.texts[node_id], node_id)

    @rule(indexed=st.booleans())
    def reopen_store(self, indexed: bool) -> None:
        self.reopen(indexed=indexed)

    @precondition(lambda self: self.indexed)
    @rule(word=st.sampled_from(WORDS))
    def search(self, word: str) -> None:
        assert self.backend is not None
        backend = self.backend
        result = self.portal.call(lexical(backend).search, REPO, word, 100, None)
        if result is None:  # a rebuild under way: wait for it, then the index must answer
            self.portal.call(settled, backend)
            result = self.portal.call(lexical(backend).search, REPO, word, 100, None)
        assert result is not None
        assert dict(result) == self.scores(word)

    def scores(self, word: str) -> dict[str, float]:
        """BM25 of each node whose document holds `word`, recounted from the model."""
        analyze = analyzer().analyze
        docs = {i: analyze(" ".join([text] * OWN + [self.texts[n] for n in step_window(i, WINDOW)
                                                   if i in self.steps and n in self.steps]))
                for i, text in self.texts.items()}
        [stem] = analyze(word)
        if not docs:
            return {}
        frequency = sum(stem in stems for stems in docs.values())
        average = sum(map(len, docs.values())) / len(docs)
        weight = idf(len(docs), frequency)
        return {i: bm25([(weight, stems.count(stem))], len(stems), average)
                for i, stems in docs.items() if stem in stems}

    def teardown(self) -> None:
        with self.stack:
            if self.backend is not None:
                self.portal.call(self.backend.close)


@pytest.mark.slow
def test_index_rules(
    fresh_stores: Callable[[], str], tmp_path: Path, sqlite_template: Path
) -> None:
    """The lexical index never disagrees with the store, on random histories."""
    files = iter(range(10**6))

    def fresh() -> str:
        store = fresh_stores()
        if store != ":memory:":
            return store
        # SQLite: a file (a `:memory:` database has no index, and is lost when reopened), a
        # copy of the migrated template as the `store` fixture's.
        path = tmp_path / f"{next(files)}.db"
        shutil.copyfile(sqlite_template, path)
        return str(path)

    class OnAFreshStore(IndexRules):
        def __init__(self) -> None:
            super().__init__(fresh())

    run_state_machine_as_test(
        OnAFreshStore, settings=settings(max_examples=25, stateful_step_count=25, deadline=None)
    )


# ---- killed processes -------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def spawn(store: str, seed: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.graph.lexical_child", store, str(seed)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )


@pytest.mark.slow
async def test_indexes_of_killed_processes_agree_with_the_store(store: str) -> None:
    """Processes that commit nodes and steps, delete and search (their index slots applying
    and committing all the while) are SIGKILLed at random moments, several at once; then
    every word's search returns exactly the nodes whose document holds it (a step's window
    included), from whichever slot the next process takes."""
    rng = random.Random(7)
    for round_ in range(3):
        children = [spawn(store, round_ * 10 + c) for c in range(2)]
        try:
            # Each is killed after a random number of rounds, wherever its next round is then:
            # mid-commit, mid-apply or between.
            for child in children:
                assert child.stdout is not None
                for _ in range(rng.randint(1, 6)):
                    line = await anyio.to_thread.run_sync(child.stdout.readline)
                    assert line == b"round\n", "the child died"
        finally:
            for child in children:
                child.kill()
                child.wait()
                assert child.stdout is not None
                child.stdout.close()
    async with open_stores(store, DIM) as backend:
        rows = await sql(backend, "SELECT id, text FROM nodes WHERE repo = ?", REPO)
        assert rows, "the children committed nothing"
        for word in WORDS:
            result = await lexical(backend).search(REPO, word, 10**6, None)
            if result is None:
                await settled(backend)
                result = await lexical(backend).search(REPO, word, 10**6, None)
            assert result is not None
            texts = dict(rows)
            steps = {i for i in texts if i.startswith("episodic_")}
            assert {i for i, _ in result} == holding(texts, steps, word)


@pytest.mark.slow
async def test_the_log_keeps_a_bounded_tail_and_a_slot_behind_it_rebuilds(store: str) -> None:
    """Each write drops the entry LOG_KEEP back (raising the horizon), so the log stays
    bounded; a slot left further behind than that rebuilds from the nodes."""
    async with open_stores(store, DIM) as backend:
        await add(backend, "c1", {"a": "teal mug"})
        assert await found(backend, "teal") == {"a"}
    bulk = LOG_KEEP + 10
    async with open_stores(store, DIM, lexical_dir="") as backend:
        await sql(
            backend,
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)"
            " INSERT INTO nodes (id, repo, type, text, data, created_at)"
            " SELECT 'bulk' || i, 'r', 'semantic', 'teal cup', '{}', '2026-01-01T00:00:00+00:00'"
            " FROM n",
            bulk,
        )
        (count,), = await sql(backend, "SELECT count(*) FROM lexical_log WHERE repo = ?", REPO)
        (seq, horizon), = await sql(
            backend, "SELECT seq, horizon FROM lexical_repos WHERE repo = ?", REPO
        )
        assert count == LOG_KEEP
        assert (seq, horizon) == (bulk + 1, bulk + 1 - LOG_KEEP)
    async with open_stores(store, DIM) as backend:
        assert await lexical(backend).search(REPO, "teal", 10, None) is None  # rebuilding
        await settled(backend)
        result = await lexical(backend).search(REPO, "teal", 10**6, None)
        assert result is not None
        assert len(result) == bulk + 1


@pytest.mark.slow
async def test_changes_not_yet_committed_rank_as_they_will_once_committed(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search right after a write scores what the index has not committed yet itself
    (mnemo/storage/lexical/fresh.py): the same order and the same scores, to the bit, as once
    committed (and merged or not: deleted copies count for neither)."""
    await add(backend, "c0", {f"f{i}": f"filler words number {i}" for i in range(30)})
    await backend.graph.settle(REPO)
    monkeypatch.setattr(lexical_index, "COMMIT_AFTER", 3600.0)  # nothing commits meanwhile
    monkeypatch.setattr(lexical_index, "COMMIT_WITHIN", 3600.0)
    await add(backend, "c1", {
        "once": "a wren sang over the long quiet water at dawn",
        "twice": "wren and wren",
        "short": "wren",
        "other": "a heron",
    })
    index = lexical(backend)
    fresh = await index.search(REPO, "wren heron", 10, None)
    assert len(index._fresh) == 4  # the search scored them itself
    monkeypatch.setattr(lexical_index, "COMMIT_AFTER", 0.0)
    await backend.graph.settle(REPO)
    assert len(index._fresh) == 0
    committed = await index.search(REPO, "wren heron", 10, None)
    assert fresh is not None
    assert committed is not None
    assert fresh == committed


class _Watched(threading.Event):
    """An event that counts the threads waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = 0
        self.changed = threading.Condition()

    def wait(self, timeout: float | None = None) -> bool:
        with self.changed:
            self.inside += 1
            self.changed.notify_all()
        try:
            return super().wait(timeout)
        finally:
            with self.changed:
                self.inside -= 1


async def test_closing_commits_at_once_instead_of_waiting_for_more_writes(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing wakes the background thread that waits for more writes before it commits:
    what was applied is committed at once (closing waited out that delay, 0.5 s)."""
    monkeypatch.setattr(lexical_index, "COMMIT_AFTER", 3600.0)
    monkeypatch.setattr(lexical_index, "COMMIT_WITHIN", 3600.0)
    index = lexical(backend)
    index._wake = watched = _Watched()
    await add(backend, "c1", {"a": "a wren sang"})
    assert await found(backend, "wren") == {"a"}
    index.changed(REPO)  # the thread brings the repo up, then waits for more writes

    def brought_up_and_waiting() -> bool:
        with watched.changed:
            return watched.changed.wait_for(
                lambda: watched.inside > 0 and not index._dirty, timeout=10
            )

    assert await anyio.to_thread.run_sync(brought_up_and_waiting)
    assert len(index._fresh) == 1
    with anyio.fail_after(5):
        await index.aclose()
    assert len(index._fresh) == 0



async def test_a_search_returns_the_exact_bm25_top_whatever_tantivy_ranks_first(
    backend: Backend,
) -> None:
    """tantivy only finds the hits: its own scores count another repo's documents, so here
    it ranks the repo's 60 "beta" documents above its 3 "alpha" ones (rare in the repo, common
    in the other). The search still answers the repo's exact BM25 top, ties by rowid, so
    recall ranks alike whatever tantivy's segments, deletions and other repos."""
    ours = {
        **{f"a{i}": f"alpha note {i}" for i in range(3)},
        **{f"b{i:02d}": f"beta note {i}" for i in range(60)},
        **{f"g{i:03d}": f"gamma note {i}" for i in range(300)},
    }
    await add(backend, "c0", {f"o{i}": f"alpha other {i}" for i in range(400)}, repo="other")
    await add(backend, "c1", ours)
    index = lexical(backend)
    await index.settle("other")
    await index.settle(REPO)
    stems = {i: [s for w in text.split() for s in analyzer().analyze(w)]
             for i, text in ours.items()}
    average = sum(map(len, stems.values())) / len(stems)
    weights = {w: idf(len(stems), sum(w in s for s in stems.values())) for w in ("alpha", "beta")}
    exact = sorted(ours, key=lambda i: (-bm25(
        [(weights[w], stems[i].count(w)) for w in weights], len(stems[i]), average), i))
    result = await index.search(REPO, "alpha beta", 10, None)
    assert [node_id for node_id, _ in result or []] == exact[:10]
