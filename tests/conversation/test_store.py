"""The conversation store's port (`ThreadStore`) and its SQLite implementation: the consumers
know no backend, and the viewport's read is bounded by the budget, not the thread."""

from __future__ import annotations

import ast
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

import mnemo
from mnemo.conversation import ports
from mnemo.conversation.model import Message, Snapshot
from mnemo.conversation.ports import ThreadStore
from mnemo.conversation.viewport import layout
from mnemo.graph.model import now_utc
from mnemo.text import query_words
from tests.backends import backend_of
from tests.conversation._support import assistant, user
from tests.fakes import FakeEmbedder

CONVERSATION = Path(ports.__file__).parent
BACKENDS = ("mnemo.storage", "sqlite3", "sqlite_utils")
EPOCH = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.fixture
async def store(
    embedder: FakeEmbedder, store: str
) -> AsyncIterator[tuple[mnemo.Memory, ThreadStore]]:
    """A Memory on the test's store (each backend in turn), and its conversation store."""
    async with mnemo.Memory(store, embedder=embedder) as mem:
        threads: ThreadStore = backend_of(mem).threads
        yield mem, threads


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def test_conversation_imports_no_backend() -> None:
    """No module of mnemo.conversation imports a storage backend or an SQLite library."""
    offenders = [
        f"{path.name}: {name}"
        for path in sorted(CONVERSATION.glob("*.py"))
        for name in _imports(path)
        if name.startswith(BACKENDS)
    ]
    assert offenders == []


async def test_viewport_inputs_stop_past_the_limit(
    store: tuple[mnemo.Memory, ThreadStore],
) -> None:
    """`newest` holds the newest messages up to the first whose running token sum passes the
    limit, that one included; the token total still counts every message past the boundary."""
    mem, threads = store
    history = [user(f"message {i} " + "word " * 20) for i in range(200)]
    saved = await mem.conversation().save("t", history)
    inputs = await threads.viewport_inputs("t", 100)
    assert inputs.boundary_seq == 0
    assert inputs.tokens_past_boundary == sum(m.tokens for m in saved)
    assert [m.seq for m in inputs.newest] == list(range(199, 199 - len(inputs.newest), -1))
    running = [sum(m.tokens for m in inputs.newest[: i + 1]) for i in range(len(inputs.newest))]
    assert running[-1] > 100
    assert all(total <= 100 for total in running[:-1])
    assert len(inputs.newest) < len(saved)


async def test_viewport_inputs_of_a_short_thread_are_whole(
    store: tuple[mnemo.Memory, ThreadStore],
) -> None:
    """When every message past the boundary fits the limit, `newest` is all of them."""
    mem, threads = store
    saved = await mem.conversation().save("t", [user("hello"), assistant("hi")])
    inputs = await threads.viewport_inputs("t", 10_000)
    assert inputs.newest == saved[::-1]
    assert (inputs.pinned, inputs.level1, inputs.level2) == ([], [], [])


async def test_viewport_inputs_of_an_unknown_thread_are_empty(
    store: tuple[mnemo.Memory, ThreadStore],
) -> None:
    """A thread never saved reads as boundary 0 with nothing in it."""
    _, threads = store
    inputs = await threads.viewport_inputs("nobody", 100)
    assert inputs == ports.ViewportInputs(0, [], [], [], 0, [])


async def test_eviction_inputs_and_snapshots(
    store: tuple[mnemo.Memory, ThreadStore],
) -> None:
    """After an eviction the inputs start at the new boundary with the open goals and the
    snapshot's text, and `snapshots` lists the snapshot written."""
    mem, threads = store
    await mem.conversation().save("t", [user(f"step {i}") for i in range(6)])
    goal = await mem.add_goal("t", "finish the report")
    with pytest.raises(mnemo.NotFoundError):
        await threads.eviction_inputs("nobody")
    result = await mem.evict("t", token_budget=40, eviction_fraction=0.5)
    inputs = await threads.eviction_inputs("t")
    assert inputs.boundary_seq == result.boundary_after > 0
    assert [m.seq for m in inputs.past_boundary] == list(range(result.boundary_after, 6))
    assert [g.id for g in inputs.goals] == [goal]
    assert result.snapshot is not None
    assert inputs.previous_snapshot == result.snapshot.text
    assert await threads.snapshots("t") == [result.snapshot]


async def test_search_takes_words(store: tuple[mnemo.Memory, ThreadStore]) -> None:
    """The port searches for words: quotes and operators in a query are only words, and no
    words find nothing."""
    mem, threads = store
    await mem.conversation().save("t", [user('the "proxy" config'), assistant("NEAR(x y)")])
    hits = await threads.search(query_words('proxy" OR NEAR('), limit=5, now=now_utc())
    assert sorted(h.seq for h in hits) == [0, 1]
    assert await threads.search([], limit=5, now=now_utc()) == []


def _message(seq: int, tokens: int, role: str) -> Message:
    return Message(f"m{seq}", "t", seq, role, "x", {}, EPOCH, tokens)


def _snapshot(level: int, start: int, words: int) -> Snapshot:
    return Snapshot(f"s{level}-{start}", "t", level, start, start, "w " * words, EPOCH)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(1, 60), max_size=40),
    roles=st.lists(st.sampled_from(["user", "assistant", "tool"]), min_size=40, max_size=40),
    pins=st.lists(st.integers(1, 40), max_size=4),
    l1=st.lists(st.integers(1, 30), max_size=6),
    l2=st.lists(st.integers(1, 30), max_size=3),
    budget=st.integers(1, 400),
)
def test_bounded_newest_lays_out_as_the_whole_thread(
    tokens: list[int],
    roles: list[str],
    pins: list[int],
    l1: list[int],
    l2: list[int],
    budget: int,
) -> None:
    """The layout of the store's bounded read (newest messages up to the first past the
    budget) equals the layout of every message past the boundary."""
    past = [_message(100 + i, t, roles[i]) for i, t in enumerate(tokens)]
    newest_all = past[::-1]
    bounded: list[Message] = []
    for message in newest_all:
        bounded.append(message)
        if sum(m.tokens for m in bounded) > budget:
            break
    inputs = ports.ViewportInputs(
        boundary_seq=100,
        pinned=[_message(99 - i, t, "user") for i, t in enumerate(pins)],
        level1=[_snapshot(1, 90 - i, w) for i, w in enumerate(l1)],
        level2=[_snapshot(2, 50 - i, w) for i, w in enumerate(l2)],
        tokens_past_boundary=sum(tokens),
        newest=newest_all,
    )
    whole = layout("t", budget, inputs)
    assert layout("t", budget, replace(inputs, newest=bounded)) == whole
