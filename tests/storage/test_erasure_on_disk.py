"""Erasure reaches the disk: after `forget` of an ingested source, of a session or of an
episode, after `forget_where` and after a thread's `purge`, `clear`, `pop` or ttl, no file of the
store or beside it
holds a byte of a planted word (SQLite: the file, its WAL, the lexical index's and the HNSW
graphs' folders; PostgreSQL: the folders beside it, its tables' dead rows being the documented
VACUUM case).

The lexical index's term dictionaries do not keep a word's bytes in one piece (an FST), so a
byte scan cannot see it there: its segments are read instead, and a term any segment's
dictionary holds counts, a deleted document's too (tantivy keeps it until a merge)."""

from __future__ import annotations

import sqlite3
import uuid
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import mnemo
from mnemo.graph.scope import Metadata
from mnemo.storage.lexical import index as lexical_index
from mnemo.storage.lexical.index import LexicalIndex
from mnemo.storage.lexical.schema import analyzer, open_index, schema
from mnemo.storage.sqlite import database
from tests.backends import backend_of, is_sqlite
from tests.conversation._support import user
from tests.fakes import EventLog, FakeEmbedder
from tests.graph.test_history_erasure import holding as rows_holding

REPO = "r"


def planted() -> tuple[str, bytes]:
    """A word no other can share a prefix with, and the stretch of it a scan looks for (FTS5
    keeps a term after the prefix it shares with the term before it; "qz" survives
    stemming)."""
    word = f"zq{uuid.uuid4().hex}qz"
    return word, planted_part(word)


def planted_part(word: str) -> bytes:
    """The stretch of a `planted` word a scan looks for."""
    return word[4:].encode()


def holding(folder: Path, word: str, needle: bytes) -> list[str]:
    """The files under `folder` that hold `needle`, and the lexical index folders whose
    segments hold `word`'s term or whose files hold `needle` (a document's stored stems),
    each index folder once."""
    indexes = {meta.parent for meta in folder.rglob("meta.json")}
    found = {path.parent if path.parent in indexes else path for path in folder.rglob("*")
             if path.is_file() and needle in path.read_bytes()}
    [stem] = analyzer().analyze(word)
    for index in indexes:
        if open_index(index, schema()).searcher().terms_with_prefix("text", stem, limit=1):
            found.add(index)
    return sorted(str(path.relative_to(folder)) for path in found)


def indexed(folder: Path) -> int:
    """How many lexical index folders are under `folder`."""
    return len(list(folder.rglob("meta.json")))


async def searched(mem: mnemo.Memory, word: str) -> bool:
    """Whether a recall finds `word`, with the lexical index brought up and committed."""
    found = await mem.recall(REPO, word, reinforce=False)
    await mem._graph.settle(REPO)
    return any(word in m.node.text for m in found.memories)


async def test_forget_of_an_ingest_leaves_no_byte_on_disk(store: str, tmp_path: Path) -> None:
    """A word of an ingested source is on disk once searched (the file or the lexical
    index's segments); after forget it is in no file, and another source is still found."""
    word, needle = planted()
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        await mem.ingest(REPO, mnemo.Trajectory("water the garden", [mnemo.Step(
            "The tomatoes in the garden need water daily.", "Water them.")]), source_id="garden")
        await mem.ingest(REPO, mnemo.Trajectory(f"learn about {word}", [mnemo.Step(
            f"The {word} service listens on port 8080.", f"Restart {word} at night.")]),
            source_id="doc")
        assert await searched(mem, word)
        assert indexed(tmp_path) == 1
        assert holding(tmp_path, word, needle), "sanity: the word is on disk before the forget"

        assert await mem.forget(REPO, "doc") > 0

        assert holding(tmp_path, word, needle) == []
        assert not await searched(mem, word)
        assert await searched(mem, "tomatoes")
    assert holding(tmp_path, word, needle) == []


async def test_forget_of_a_session_removes_what_it_committed_and_leaves_no_byte(
    store: str, tmp_path: Path
) -> None:
    """A session's committed episodes are forgotten by its id: its nodes go (forget counts
    them), its stored episodes too, no file holds its words; another session's stay."""
    word, needle = planted()
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        kept = await mem.start_session("water the garden", repo=REPO)
        await mem.append(kept, "The tomatoes in the garden need water daily.", "Water them.")
        await mem.close_and_commit(kept)
        sid = await mem.start_session(f"fix the {word} service", repo=REPO)
        await mem.append(sid, f"The {word} service listens on port 8080.", f"Restart {word}.")
        await mem.close_and_commit(sid)
        await mem.start_episode(sid, f"check {word} again")
        await mem.append(sid, f"The {word} service answers.", "Close the ticket.")
        await mem.close_and_commit(sid)
        before = {n.id for n in await mem.get_nodes_by_type(REPO, list(mnemo.NodeType))}
        assert await searched(mem, word)
        assert holding(tmp_path, word, needle)

        gone = await mem.forget(REPO, sid)

        after = {n.id for n in await mem.get_nodes_by_type(REPO, list(mnemo.NodeType))}
        assert gone == len(before - after) > 0
        assert all(word not in n.text for n in await mem.get_nodes_by_type(
            REPO, list(mnemo.NodeType)))
        assert await mem.episodes(sid) == []
        assert len(await mem.episodes(kept)) == 1
        assert holding(tmp_path, word, needle) == []
        assert await searched(mem, "tomatoes")
        assert await mem.forget(REPO, sid) == 0


async def test_forget_of_a_session_erases_it_whole_ended_or_live(
    store: str, tmp_path: Path
) -> None:
    """Forgetting an ended session, and a live one with uncommitted steps, leaves no row or
    file holding its goal, metadata or steps; the live one is ended (its id is then unknown);
    another session stays whole, and a forget in another repo touches neither."""
    word, needle = planted()
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        kept = await mem.start_session("water the garden", repo=REPO, metadata={"user": "bob"})
        await mem.append(kept, "The tomatoes in the garden need water daily.", "Water them.")
        await mem.close_and_commit(kept)
        await mem.end_session(kept)
        ended = await mem.start_session(f"fix the {word} service", repo=REPO,
                                        metadata={"user": word})
        await mem.append(ended, f"The {word} service listens on port 8080.", f"Restart {word}.")
        await mem.close_and_commit(ended)
        await mem.end_session(ended)
        live = await mem.start_session(f"check {word} again", repo=REPO, metadata={"user": word})
        await mem.append(live, f"The {word} service answers.", "Close the ticket.")
        assert await rows_holding(mem, word)
        await mem.open_repo("other")
        assert await mem.forget("other", ended) == await mem.forget("other", live) == 0
        assert len(await mem.episodes(ended)) == len(await mem.episodes(live)) == 1

        assert await mem.forget(REPO, ended) > 0
        assert await mem.forget(REPO, live) == 0

        assert await rows_holding(mem, word) == {}
        assert holding(tmp_path, word, needle) == []
        assert await mem.episodes(ended) == await mem.episodes(live) == []
        with pytest.raises(mnemo.NotFoundError):
            await mem.session_state(live)
        [episode] = await mem.episodes(kept)
        assert [s.observation for s in episode.steps] == [
            "The tomatoes in the garden need water daily."]
    assert holding(tmp_path, word, needle) == []


async def test_forget_where_erases_every_session_of_the_scope_only(
    store: str, tmp_path: Path
) -> None:
    """`forget_where` erases each session whose metadata is inside the scope (every key, any
    listed value), ended or live, committed or not, to the last byte; a session of another
    user or another team keeps its steps and metadata."""
    word, needle = planted()
    where = {"user_id": ["alice", "nobody"], "team": word}
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)

        async def session(goal: str, metadata: Metadata, *, commit: bool) -> str:
            sid = await mem.start_session(goal, repo=REPO, metadata=metadata)
            await mem.append(sid, f"{goal}: the tomatoes need water daily.", "Water them.")
            if commit:
                await mem.close_and_commit(sid)
                await mem.end_session(sid)
            return sid

        ended = await session(f"garden {word}", {"user_id": "alice", "team": word}, commit=True)
        live = await session(f"porch {word}", {"user_id": "alice", "team": word}, commit=False)
        blue = await session("balcony", {"user_id": "alice", "team": "blue"}, commit=True)
        bob = await session("orchard", {"user_id": "bob", "team": "blue"}, commit=False)
        assert await rows_holding(mem, word)

        assert await mem.forget_where(REPO, where) > 0

        assert await rows_holding(mem, word) == {}
        assert holding(tmp_path, word, needle) == []
        assert await mem.episodes(ended) == await mem.episodes(live) == []
        assert [s.id for s in await mem.list_sessions()] == [bob]
        for sid, user_id in ((blue, "alice"), (bob, "bob")):
            [episode] = await mem.episodes(sid)
            assert len(episode.steps) == 1
            assert await rows_holding(mem, user_id)
        assert await mem.nodes_where(REPO, {"user_id": "alice", "team": "blue"})
    assert holding(tmp_path, word, needle) == []


@pytest.mark.parametrize("erasure", ["forget", "purge"])
async def test_an_old_image_in_a_pages_unused_space_goes_with_an_erasure(
    tmp_path: Path, erasure: str
) -> None:
    """SQLite leaves old images of moved rows in the unused space of a page it rebuilds
    (`secure_delete` zeroes freed cells only); after a forget or a thread's purge no file
    holds one. The image is written there as SQLite leaves it (SQLite only: PostgreSQL's
    dead rows are the documented VACUUM case)."""
    store = tmp_path / "memory.db"
    word, needle = planted()
    fact, message = ((word, "") if erasure == "forget" else ("", word))
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        for source, said in (("first", f"The tomatoes need water daily {fact}."),
                             ("second", "The roses need pruning in March.")):
            await mem.ingest(REPO, mnemo.Trajectory("tend the garden", [mnemo.Step(
                said, "Do it.")]), source_id=source)
        await mem.conversation().save("t", [user(f"remember the {message} release")])
    old_image_in_unused_space(store, f"the {word} release".encode())
    assert holding(tmp_path, word, needle)

    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        if erasure == "forget":
            await mem.forget(REPO, "first")
        else:
            await mem.conversation().purge("t")
        assert holding(tmp_path, word, needle) == []
        assert await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])


@pytest.mark.parametrize("then", ["again", "close"])
async def test_a_rewrite_that_failed_is_done_by_the_next_erasure_or_the_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    """A purge whose rewrite of the file fails (another process held the write lock) says the
    erasure is stored but not yet rewritten; a purge again, though it erases nothing more,
    or the close, rewrites it."""
    store = tmp_path / "memory.db"
    word, needle = planted()
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        await mem.conversation().save("t", [user(f"remember the {word} release")])
    old_image_in_unused_space(store, f"the {word} release".encode())
    rewrite, failures = database.scrub, [sqlite3.OperationalError("database is locked")]

    def busy_once(db: Any) -> None:
        if failures:
            raise failures.pop()
        rewrite(db)

    monkeypatch.setattr(database, "scrub", busy_once)
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        with pytest.raises(mnemo.StorageError, match="not rewritten") as refused:
            await mem.conversation().purge("t")
        assert refused.value.reason == "busy"
        assert holding(tmp_path, word, needle)
        if then == "again":
            await mem.conversation().purge("t")
            assert holding(tmp_path, word, needle) == []
    assert holding(tmp_path, word, needle) == []


@pytest.mark.parametrize("erasure", ["purge", "clear"])
async def test_a_thread_of_goals_only_leaves_no_byte_of_them(
    store: str, tmp_path: Path, erasure: str
) -> None:
    """A thread that holds a goal and no message: its purge or clear leaves no byte of the
    goal in any file, the WAL included, while the store is still open."""
    word, needle = planted()
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        await mem.add_goal("t", f"ship the {word} release")
        if is_sqlite(mem):
            assert holding(tmp_path, word, needle)
        await getattr(mem.conversation(), erasure)("t")
        assert holding(tmp_path, word, needle) == []


def old_image_in_unused_space(path: Path, image: bytes) -> None:
    """Writes `image` into the unused space (between the cell pointers and the cells) of the
    b-tree page of the closed SQLite file at `path` that has the most of it."""
    assert not Path(f"{path}-wal").exists() or not Path(f"{path}-wal").stat().st_size
    data = bytearray(path.read_bytes())
    size = int.from_bytes(data[16:18], "big")
    best = (0, 0)
    for start in range(0, len(data), size):
        header = start + (100 if start == 0 else 0)
        kind = data[header]
        if kind not in (2, 5, 10, 13):
            continue
        pointers = header + (8 if kind in (10, 13) else 12)
        cells = int.from_bytes(data[header + 3:header + 5], "big")
        free_from = pointers + 2 * cells
        content = int.from_bytes(data[header + 5:header + 7], "big") or 65536
        best = max(best, (start + content - free_from, free_from))
    room, at = best
    assert room > len(image) + 16
    data[at + 8:at + 8 + len(image)] = image
    path.write_bytes(bytes(data))


async def test_forget_of_a_source_whose_words_a_shared_fact_took_leaves_no_byte(
    store: str, tmp_path: Path
) -> None:
    """A source that says a fact again with one word more joins it, and the fact takes its
    fuller wording; forgetting that source leaves the fact, in the first source's wording,
    and no file holds the word."""
    word, needle = planted()
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        for source, said in (("first", "The tomatoes need water daily."),
                             ("second", f"The tomatoes need water daily {word}.")):
            await mem.ingest(REPO, mnemo.Trajectory("water the garden", [mnemo.Step(
                said, "Water them.")]), source_id=source)
        [fact] = [n for n in await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])
                  if "tomatoes" in n.text]
        assert word in fact.text
        assert await searched(mem, word)
        assert holding(tmp_path, word, needle)

        await mem.forget(REPO, "second")

        [kept] = [n for n in await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])
                  if "tomatoes" in n.text]
        assert (kept.id, kept.text) == (fact.id, "The tomatoes need water daily.")
        assert holding(tmp_path, word, needle) == []
        assert await searched(mem, "tomatoes")


async def test_forget_of_a_corrected_facts_source_leaves_no_byte_of_its_data(
    store: str, tmp_path: Path
) -> None:
    """A fact remembered with data of the caller's and then corrected: the correction keeps
    none of that data, so forgetting the source leaves the correction (its own wording) and
    no file holds the data."""
    word, needle = planted()
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        # Keys a correction keeps of a LangGraph item or as numbers, here the caller's words.
        remembered = await mem.remember(REPO, "The vault code is 7781.", source_id="note", data={
            "origin": f"told by {word}", "confidence": 0.5, "return_score": f"by {word}",
            "key": word, "namespace": [word], "created_at": word})
        corrected = await mem.correct(REPO, remembered.node_ids[0], "The vault code changed.")
        node = await mem.get_node(REPO, corrected.node_ids[0])
        assert node is not None
        assert node.data == {"confidence": 0.5}
        assert await rows_holding(mem, word)
        assert holding(tmp_path, word, needle) or not is_sqlite(mem)

        await mem.forget(REPO, "note")

        assert await mem.get_node(REPO, corrected.node_ids[0]) == node
        assert await rows_holding(mem, word) == {}
        assert holding(tmp_path, word, needle) == []


async def second_episode(mem: mnemo.Memory, word: str) -> str:
    """A session of repo "r" with a committed episode about tomatoes and a second, open,
    holding `word`; its id."""
    await mem.open_repo(REPO)
    sid = await mem.start_session("water the garden", repo=REPO)
    await mem.append(sid, "The tomatoes in the garden need water daily.", "Water them.")
    await mem.close_and_commit(sid)
    await mem.start_episode(sid, f"fix the {word} service")
    await mem.append(sid, f"The {word} service listens on port 8080.", f"Restart {word}.")
    return sid


async def test_forget_of_an_episode_removes_that_episode_only(store: str, tmp_path: Path) -> None:
    """An episode's id forgets what that episode committed and its stored steps; the same
    session's other episode stays, words and all."""
    word, needle = planted()
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        sid = await second_episode(mem, word)
        await mem.close_and_commit(sid)
        first, second = await mem.episodes(sid)
        assert await searched(mem, word)

        assert await mem.forget(REPO, second.id) > 0

        assert [e.id for e in await mem.episodes(sid)] == [first.id]
        assert holding(tmp_path, word, needle) == []
        assert await searched(mem, "tomatoes")


@pytest.mark.parametrize("extracted", [False, True])
async def test_forget_of_an_open_episode_ends_its_session_and_erases_its_steps(
    store: str, tmp_path: Path, extracted: bool
) -> None:
    """An episode still open (its steps stored, not committed; collecting, or extracted and
    ready with its changeset) is forgotten as a live session is: its session is ended first,
    so nothing of it is committed later, and its stored steps and changeset go to the last
    byte; the session's committed episode stays."""
    word, needle = planted()
    events = EventLog()
    async with mnemo.Memory(store, embedder=FakeEmbedder(), on_event=events) as mem:
        sid = await second_episode(mem, word)
        if extracted:
            await mem.close(sid)
            assert await events.wait_state(mem, sid, mnemo.State.READY) is mnemo.State.READY
        first, second = await mem.episodes(sid)
        assert second.status == "open"

        assert await mem.forget(REPO, second.id) == 0

        with pytest.raises(mnemo.NotFoundError):
            await mem.close_and_commit(sid)
        assert [e.id for e in await mem.episodes(sid)] == [first.id]
        assert await rows_holding(mem, word) == {}
        assert holding(tmp_path, word, needle) == []
        assert not await searched(mem, word)
        assert await searched(mem, "tomatoes")


async def test_purge_of_a_thread_leaves_no_byte_on_disk(store: str, tmp_path: Path) -> None:
    """A thread's words are in no file once it is purged (SQLite: the file and its WAL; on
    PostgreSQL nothing beside the database holds messages)."""
    word, needle = planted()
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        conv = mem.conversation(retrieval=mnemo.Semantic(k=3))
        await conv.save("t", [user(f"remember the {word} release"), user("and the garden")])
        await conv.load("t", query=word)
        assert await mem.search_messages(word)
        if is_sqlite(mem):
            assert holding(tmp_path, word, needle)
        await conv.purge("t")
        assert holding(tmp_path, word, needle) == []
        assert await mem.search_messages(word) == []


@pytest.mark.parametrize("erasure", ["pop", "clear", "ttl"])
async def test_every_erasure_of_messages_leaves_no_byte_on_disk(
    store: str, tmp_path: Path, erasure: str
) -> None:
    """A message that `pop`, `clear` or a thread's ttl erased is in no file while the store is
    open, and none once it is closed (SQLite: its words stayed in the full-text index's old
    segments and in the WAL)."""
    word, needle = planted()
    now = datetime(2026, 1, 1, tzinfo=UTC)
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        conv = mem.conversation(ttl=60, clock=lambda: now)
        await conv.save("t", [user("the garden"), user(f"remember the {word} release")])
        if is_sqlite(mem):
            assert holding(tmp_path, word, needle)
        if erasure == "ttl":
            now += timedelta(seconds=61)  # `raw` erases what the ttl ended
        elif erasure == "pop":
            assert (await conv.pop("t")) is not None
        elif erasure == "clear":
            await conv.clear("t")
        assert [m.content for m in await conv.raw("t")] == (
            ["the garden"] if erasure == "pop" else [])
        assert holding(tmp_path, word, needle) == []
        assert await mem.search_messages(word) == []
    assert holding(tmp_path, word, needle) == []


async def test_a_ttl_that_ends_part_of_a_snapshot_leaves_no_byte_of_it(
    store: str, tmp_path: Path
) -> None:
    """Messages a ttl erased that a snapshot told with messages it kept: no file holds their
    words once the snapshot is written again as a pointer (SQLite: the file and its WAL)."""
    planted_words = [planted() for _ in range(24)]
    now = datetime(2026, 1, 1, tzinfo=UTC)
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        conv = mem.conversation(auto_evict_budget=120, ttl=3600, clock=lambda: now)
        for i, (word, _) in enumerate(planted_words):
            said = f"Note {i}: {word}."
            await conv.append("t", [{"role": "assistant" if i % 2 else "user", "content": said}])
            now += timedelta(seconds=60)
        told = next(s for s in await mem._conversations.store.snapshots("t")
                    if s.level == 1 and s.end_seq > s.start_seq)
        now += timedelta(seconds=3600 - 60 * (len(planted_words) - told.start_seq - 1))
        kept = {m.seq for m in await conv.raw("t")}
        assert told.start_seq not in kept
        assert told.end_seq in kept
        for word, needle in planted_words[:told.start_seq + 1]:
            assert holding(tmp_path, word, needle) == []
        word, needle = planted_words[told.end_seq]
        assert holding(tmp_path, word, needle) if is_sqlite(mem) else True


async def test_a_forget_wipes_the_slots_of_other_memories(store: str, tmp_path: Path) -> None:
    """Each Memory keeps its own slot of the lexical index. A forget through A wipes A's
    slot and every slot no Memory holds (B's, once B closed) at once; a slot another open
    Memory holds (C's) is wiped by C before it answers its next search."""
    word, needle = planted()
    trajectory = mnemo.Trajectory(f"learn about {word}", [mnemo.Step(
        f"The {word} service listens on port 8080.", f"Restart {word} at night.")])
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(mnemo.Memory(store, embedder=FakeEmbedder()))
        await a.open_repo(REPO)
        await a.ingest(REPO, trajectory, source_id="doc")
        assert await searched(a, word)  # slot-0
        async with mnemo.Memory(store, embedder=FakeEmbedder()) as b:
            assert await searched(b, word)  # slot-1
            c = await stack.enter_async_context(mnemo.Memory(store, embedder=FakeEmbedder()))
            assert await searched(c, word)  # slot-2
        slots = [h.rsplit("/", 1)[-1] for h in holding(tmp_path, word, needle) if "slot" in h]
        assert slots == ["slot-0", "slot-1", "slot-2"]

        assert await a.forget(REPO, "doc") > 0

        [held] = holding(tmp_path, word, needle)
        assert held.endswith("slot-2")
        assert not await searched(c, word)
        assert holding(tmp_path, word, needle) == []


def index_of(mem: mnemo.Memory) -> LexicalIndex:
    index = backend_of(mem).graph._lexical  # type: ignore[attr-defined]
    assert isinstance(index, LexicalIndex)
    return index


def killed(mem: mnemo.Memory) -> None:
    """Lets go of the Memory's lexical slot as a killed process does: its lock goes, nothing
    of its closing runs."""
    index = index_of(mem)
    with index._lock:
        index._writer = index._index = None


async def test_a_memory_holding_words_a_forget_erased_never_commits_them(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B's slot holds a word in changes it applied and has not committed when A forgets it:
    B's next commit wipes its slot instead of writing them, its close leaves nothing, and its
    search does not find the word."""
    monkeypatch.setattr(lexical_index, "COMMIT_AFTER", 3600.0)  # B's commit is the test's
    monkeypatch.setattr(lexical_index, "COMMIT_WITHIN", 3600.0)
    word, needle = planted()
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as a:
        await a.open_repo(REPO)
        await a.ingest(REPO, mnemo.Trajectory(f"learn about {word}", [mnemo.Step(
            f"The {word} service listens on port 8080.", "Restart it.")]), source_id="doc")
        async with mnemo.Memory(store, embedder=FakeEmbedder()) as b:
            await b.recall(REPO, word, reinforce=False)
            index = index_of(b)
            assert len(index._fresh), "sanity: B's slot holds the word uncommitted"

            assert await a.forget(REPO, "doc") > 0

            with index._lock:
                index._commit()
            assert holding(tmp_path, word, needle) == []
            found = await b.recall(REPO, word, reinforce=False)
            assert not any(word in m.node.text for m in found.memories)
        assert holding(tmp_path, word, needle) == []



async def held_through_a_forget(a: mnemo.Memory, b: mnemo.Memory, tmp_path: Path) -> str:
    """A ingests a planted word; A (slot-0) and B (slot-1) find it; A forgets it. The word,
    which B's slot alone still holds."""
    word, needle = planted()
    await a.open_repo(REPO)
    await a.ingest(REPO, mnemo.Trajectory(f"learn about {word}", [mnemo.Step(
        f"The {word} service listens on port 8080.", "Restart it.")]), source_id="doc")
    assert await searched(a, word)
    assert await searched(b, word)
    assert await a.forget(REPO, "doc") > 0
    assert [h.rsplit("/", 1)[-1] for h in holding(tmp_path, word, needle)] == ["slot-1"]
    return word


async def test_a_memory_that_held_its_slot_through_a_forget_wipes_it_when_it_closes(
    store: str, tmp_path: Path
) -> None:
    """B holds slot-1, words and all, through A's forget and closes without a search: B wipes
    its slot as it lets it go (A, still open, has no part in it)."""
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as a:
        async with mnemo.Memory(store, embedder=FakeEmbedder()) as b:
            word = await held_through_a_forget(a, b, tmp_path)
        assert holding(tmp_path, word, planted_part(word)) == []


async def test_a_slot_a_killed_memory_held_through_a_forget_is_wiped_by_the_eraser(
    store: str, tmp_path: Path
) -> None:
    """B holds slot-1, words and all, through A's forget and is killed: A wipes that slot
    when A closes."""
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as b:
        async with mnemo.Memory(store, embedder=FakeEmbedder()) as a:
            word = await held_through_a_forget(a, b, tmp_path)
            killed(b)
        assert holding(tmp_path, word, planted_part(word)) == []


async def test_a_slot_a_killed_memory_left_holding_erased_words_is_wiped_at_the_next_open(
    store: str, tmp_path: Path
) -> None:
    """B holds slot-1, words and all, through A's forget, and is killed after A closed: the
    next Memory to open the index (C, which takes slot-0) wipes slot-1."""
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as b:
        async with mnemo.Memory(store, embedder=FakeEmbedder()) as a:
            word = await held_through_a_forget(a, b, tmp_path)
        killed(b)
    needle = planted_part(word)
    assert [h.rsplit("/", 1)[-1] for h in holding(tmp_path, word, needle)] == ["slot-1"]
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as c:
        assert not await searched(c, word)
        slot = index_of(c).slot
        assert slot is not None
        assert slot.name == "slot-0"
        assert holding(tmp_path, word, needle) == []
