"""A refusal costs less than the work it prevents: bad input is `InvalidInputError` before
the store is read (a Memory whose store is closed still answers it, not `StorageError`), and a
size past its bound is refused in time bounded by the bound, not by what the caller sent."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import mnemo
from mnemo.config import DURATION_CEILINGS
from mnemo.conversation.drafts import draft
from mnemo.errors import check_json
from mnemo.graph.scope import check_where
from tests.conftest import REPO
from tests.fakes import FakeLLM

BIG = 10_000_000  # items: walking them takes seconds, refusing them must not


async def closed_memory(store: str) -> tuple[mnemo.Memory, str]:
    """A Memory that knew repo "r", a session and a thread, then closed: every call that
    reaches its store raises StorageError("closed")."""
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(8)) as mem:
        await mem.open_repo(REPO)
        await mem.conversation().save("t", [{"role": "user", "content": "hello"}])
        session = await mem.start_session("greet", repo=REPO)
    return mem, session


def bad_calls(mem: mnemo.Memory, session: str) -> dict[str, Callable[[], Awaitable[Any]]]:
    """One bad call of each public call that takes input."""
    big: dict[str, object] = {"k": list(range(BIG))}
    conv = mem.conversation()
    trajectory = mnemo.Trajectory("g", [mnemo.Step("o", "a")])
    return {
        "open_repo": lambda: mem.open_repo(REPO, config="fast"),  # type: ignore[arg-type]
        "repo_config": lambda: mem.repo_config(""),
        "recall": lambda: mem.recall(REPO, "   "),
        "recall k": lambda: mem.recall(REPO, "hello", k=0),
        "recall types": lambda: mem.recall(REPO, "hello", types=["nope"]),  # type: ignore[list-item]
        "recall_in_context": lambda: mem.recall_in_context(REPO, session, ""),
        "recall_in_context k": lambda: mem.recall_in_context(REPO, session, "hello", k=0),
        "ingest": lambda: mem.ingest(REPO, "not one", source_id="s"),  # type: ignore[arg-type]
        "ingest metadata": lambda: mem.ingest(
            REPO, mnemo.Trajectory("g", [mnemo.Step("o", "a")], metadata=big), source_id="s"),
        "ingest source": lambda: mem.ingest(REPO, trajectory, source_id=" "),
        "forget": lambda: mem.forget(REPO, ""),
        "start_session": lambda: mem.start_session("   ", repo=REPO),
        "start_session long": lambda: mem.start_session("g" * 200_000, repo=REPO),
        "start_session config": lambda: mem.start_session(
            "g", repo=REPO, config="x"),  # type: ignore[arg-type]
        "append": lambda: mem.append(session, "o", 3),  # type: ignore[arg-type]
        "append metadata": lambda: mem.append(session, "o", "a", metadata=big),
        "close": lambda: mem.close(""),
        "commit": lambda: mem.commit(3),  # type: ignore[arg-type]
        "discard": lambda: mem.discard(""),
        "start_episode": lambda: mem.start_episode(session, " "),
        "close_and_commit": lambda: mem.close_and_commit(session, max_retries=-1),
        "commit_async": lambda: mem.commit_async(session, callback="call me"),  # type: ignore[arg-type]
        "append_async": lambda: mem.append_async(session, "o", None),  # type: ignore[arg-type]
        "session_state": lambda: mem.session_state(""),
        "session_context": lambda: mem.session_context(""),
        "end_session": lambda: mem.end_session(""),
        "episodes": lambda: mem.episodes(""),
        "get_node": lambda: mem.get_node(REPO, ""),
        "get_nodes_by_type": lambda: mem.get_nodes_by_type(REPO, ["nope"]),  # type: ignore[list-item]
        "node_ids": lambda: mem.node_ids(REPO, "x", limit=0),
        "get_linked_nodes": lambda: mem.get_linked_nodes(REPO, "node_abc"),
        "latest": lambda: mem.latest(REPO, top_k=0),
        "search_nodes": lambda: mem.search_nodes(REPO, " "),
        "delete_nodes": lambda: mem.delete_nodes(REPO, "node_abc"),
        "delete_nodes many": lambda: mem.delete_nodes(
            REPO, (f"n{i}" for i in range(BIG))),  # type: ignore[arg-type]
        "history": lambda: mem.history(REPO, limit=0),
        "commit_diff": lambda: mem.commit_diff(REPO, ""),
        "revert": lambda: mem.revert(REPO, ""),
        "decay": lambda: mem.decay(REPO, now="today"),  # type: ignore[arg-type]
        "reembed": lambda: mem.reembed(REPO, batch_size=0),
        "viewport": lambda: mem.viewport("t", token_budget=0),
        "evict": lambda: mem.evict("t", token_budget=100, eviction_fraction=2.0),
        "add_goal": lambda: mem.add_goal("t", " "),
        "complete_goal": lambda: mem.complete_goal(""),
        "search_messages": lambda: mem.search_messages(" "),
        "message_ids": lambda: mem.message_ids(""),
        "view_messages": lambda: mem.view_messages("", radius=1),
        "load": lambda: conv.load(""),
        "raw": lambda: conv.raw(""),
        "purge": lambda: conv.purge(""),
    }


async def test_bad_input_is_refused_before_the_store_is_read(store: str) -> None:
    """With the store closed under it, each bad call still answers InvalidInputError: it was
    refused before anything read the store (`ingest`, `forget` and `start_session` read it
    first, and a bad call while the store was down answered StorageError)."""
    mem, session = await closed_memory(store)
    wrong = {}
    for name, call in bad_calls(mem, session).items():
        try:
            await call()
        except mnemo.InvalidInputError:
            continue
        except Exception as exc:
            wrong[name] = repr(exc)[:120]
        else:
            wrong[name] = "accepted"
    assert wrong == {}, "\n".join(f"{k}: {v}" for k, v in wrong.items())


class Watched(list[int]):
    """A list that counts the items read from it."""

    read = 0

    def __iter__(self) -> Iterator[int]:
        for item in super().__iter__():
            Watched.read += 1
            yield item


def test_a_huge_value_is_refused_at_its_bound_without_reading_it() -> None:
    """Metadata holding a 10M-item list, or a message of 10M content parts, is refused
    before one item is read: its length alone passes the bound (each was walked, encoded
    and joined first: 48 s for the metadata, 27 s for 1M parts, on a loaded machine)."""
    huge = Watched(range(BIG))
    refusals: list[Callable[[], object]] = [
        lambda: check_json({"k": huge}, "metadata", limit=32_000),
        lambda: check_json({"k": [[huge]]}, "metadata", limit=32_000),
        lambda: draft({"role": "user", "content": huge}, 0),
    ]
    for refuse in refusals:
        with pytest.raises(mnemo.InvalidInputError, match="longer than"):
            refuse()
    assert Watched.read == 0


def test_what_a_check_reads_is_bounded_by_its_limit() -> None:
    """Many short lists are read no further than the limit allows (each item costs at
    least a character of JSON)."""
    Watched.read = 0
    many = [Watched(range(10)) for _ in range(30_000)]
    with pytest.raises(mnemo.InvalidInputError, match="longer than"):
        check_json({"k": many}, "metadata", limit=32_000)
    assert Watched.read <= 32_000


async def test_a_message_of_ten_million_parts_is_refused_at_its_bound(mem: mnemo.Memory) -> None:
    """A save reads the stored length to know which messages are new, then refuses the new
    one without reading its parts (they were walked and joined first: 27 s for 1M on a
    loaded machine), and stores nothing."""
    conv = mem.conversation()
    Watched.read = 0
    with pytest.raises(mnemo.InvalidInputError, match=r"messages\[0\]"):
        await conv.save("t", [{"role": "user", "content": Watched(range(BIG))}])
    assert Watched.read == 0
    assert await conv.raw("t") == []


async def test_a_ttl_past_a_hundred_years_is_refused_and_the_longest_loads(
    mem: mnemo.Memory,
) -> None:
    """`conversation(ttl=1e11)` was accepted and every later load raised OverflowError (the
    cut-off before year 1); now a ttl past its ceiling is refused, and one at it loads."""
    most = DURATION_CEILINGS["age"]
    for bad in (1e11, most * 1.01, timedelta(days=365 * 1_000)):
        with pytest.raises(mnemo.InvalidInputError, match="ttl"):
            mem.conversation(ttl=bad)
    conv = mem.conversation(ttl=most)
    await conv.save("t", [{"role": "user", "content": "hello"}])
    assert [m["content"] for m in await conv.load("t")] == ["hello"]


class History(list[dict[str, object]]):
    """A conversation that counts the messages read from it."""

    read = 0

    def __getitem__(self, index: Any) -> Any:
        History.read += 1
        return super().__getitem__(index)

    def __iter__(self) -> Iterator[dict[str, object]]:
        for message in super().__iter__():
            History.read += 1
            yield message


async def test_a_memory_file_update_reads_a_long_history_back_to_its_budget(
    tmp_path: Path,
) -> None:
    """`MemoryFiles.update` shows the model the newest messages that fit its budget; a
    history of 1M messages is read no further back than that (each was checked and joined
    first), and a message of 10M parts is refused unread."""
    files = mnemo.MemoryFiles(tmp_path / "memory", min_iterations=1)
    llm = FakeLLM()
    llm.fail_tasks.add("memory_update")  # what it is shown is the point, not its answer
    history = History({"role": "user", "content": f"we use port {i}"} for i in range(1_000_000))
    await files.update(history, llm=llm, iterations=10)
    assert [request.task for request in llm.calls] == ["memory_update"]
    assert History.read < 10_000
    parts = [{"role": "user", "content": Watched(range(BIG))}]
    Watched.read = 0
    update = await files.update(parts, llm=llm, iterations=10)
    assert update.error is not None
    assert "parts" in update.error
    assert Watched.read == 0


def test_a_where_of_ten_million_values_is_refused_unread() -> None:
    """A `where` listing 10M values for a key is refused on its length before one value is
    read (the values were copied into a list first: 0.12 s on the event loop per call)."""
    Watched.read = 0
    with pytest.raises(mnemo.InvalidInputError, match="10000000 values"):
        check_where({"k": Watched(range(BIG))})
    assert Watched.read == 0


async def test_a_bad_where_of_a_repo_this_memory_never_saw_is_refused_unread(store: str) -> None:
    """`where` is checked before the store is asked about the repo: with the store closed,
    a bad `where` on a repo this Memory does not know is InvalidInputError for every call
    taking one (search_nodes asked the store first: StorageError, or NotFoundError)."""
    mem, _ = await closed_memory(store)
    calls = {
        "recall": lambda: mem.recall("elsewhere", "q", where=5),  # type: ignore[arg-type]
        "search_nodes": lambda: mem.search_nodes("elsewhere", "q", where=5),  # type: ignore[arg-type]
        "nodes_where": lambda: mem.nodes_where("elsewhere", 5),  # type: ignore[arg-type]
        "forget_where": lambda: mem.forget_where("elsewhere", 5),  # type: ignore[arg-type]
    }
    for call in calls.values():
        with pytest.raises(mnemo.InvalidInputError, match="where must be a dict"):
            await call()
