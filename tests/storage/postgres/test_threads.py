"""The conversation store (`ThreadStore`) on both backends: `SqliteThreads` and `PgThreads` pass
the same assertions, and PostgreSQL keeps the counters' checks under concurrent writers."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from psycopg import sql
from sqlite_utils import Database as SqliteUtilsDatabase

import mnemo
from mnemo.conversation.drafts import MessageDraft, draft, history_hash
from mnemo.conversation.model import Message
from mnemo.conversation.ports import ThreadState, ThreadStore
from mnemo.conversation.search import SNIPPET_CHARS
from mnemo.storage.postgres.connection import Postgres
from mnemo.storage.postgres.store import PgThreads, scoring_query
from mnemo.storage.sqlite import SqliteThreads
from mnemo.storage.sqlite.database import Database
from mnemo.storage.thread_rows import SearchQuery
from mnemo.text import query_words
from tests.fakes import js
from tests.strategies import json_values, texts

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str | None:
    """None for SQLite, else the URL of a new PostgreSQL database (asked for only then, and
    outside the event loop: the server's fixtures run their own)."""
    if request.param == "sqlite":
        return None
    url: str = request.getfixturevalue("pg_url")
    return url


@dataclass(frozen=True, slots=True)
class Opened:
    """A store and a way to find what its database still holds of a text."""

    threads: ThreadStore
    holding: Callable[[str], Awaitable[dict[str, int]]]


@pytest.fixture
async def opened(backend: str | None, tmp_path: Path) -> AsyncIterator[Opened]:
    """The store on each backend, over a new database."""
    if backend is None:
        database = Database(tmp_path / "t.db")
        await database.open()
        try:
            yield Opened(SqliteThreads(database), lambda text: sqlite_holding(database, text))
        finally:
            await database.close()
    else:
        # Connections made ahead, so that racing writers do run at once (a pool that grows
        # on demand hands them out one after another).
        async with Postgres(backend, min_size=8, max_size=10) as pg:
            yield Opened(PgThreads(pg), lambda text: pg_holding(pg, text))


@pytest.fixture
def threads(opened: Opened) -> ThreadStore:
    return opened.threads


async def sqlite_holding(database: Database, text: str) -> dict[str, int]:
    """How many rows of each SQLite table hold `text` in any column (FTS5's index included,
    through MATCH: its shadow tables store words prefix-compressed)."""

    def count(db: SqliteUtilsDatabase) -> dict[str, int]:
        found: dict[str, int] = {}
        for table in db.table_names():
            if table.startswith("messages_fts"):
                continue
            columns = [c.name for c in db[table].columns]
            where = " OR ".join(f"instr(CAST([{c}] AS TEXT), ?) > 0" for c in columns)
            n = db.conn.execute(
                f"SELECT count(*) FROM [{table}] WHERE {where}", [text] * len(columns)
            ).fetchone()[0]
            if n:
                found[table] = n
        n = db.conn.execute(
            "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?", (f'"{text}"',)
        ).fetchone()[0]
        if n:
            found["messages_fts"] = n
        return found

    return await database.run(count)


async def pg_holding(pg: Postgres, text: str) -> dict[str, int]:
    """How many rows of each PostgreSQL table hold `text`, any case, in any column: a row as
    text shows every column, its search vector's lexemes included."""
    found: dict[str, int] = {}
    async with pg.connection() as conn:
        cur = await conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
        )
        for (table,) in await cur.fetchall():
            cur = await conn.execute(
                sql.SQL("SELECT count(*) FROM {} t WHERE t::text ILIKE %s").format(
                    sql.Identifier(str(table))),
                (f"%{text}%",),
            )
            row = await cur.fetchone()
            assert row is not None
            if row[0]:
                found[str(table)] = int(row[0])  # type: ignore[call-overload]
    return found


def drafts(*texts: str, role: str = "user") -> list[MessageDraft]:
    return [draft({"role": role, "content": text}, i) for i, text in enumerate(texts)]


def turn(text: str) -> list[MessageDraft]:
    """A user message and the assistant's reply."""
    return [draft({"role": "user", "content": text}, 0),
            draft({"role": "assistant", "content": f"reply to {text}"}, 1)]


async def save(
    store: ThreadStore, thread_id: str, batch: Sequence[MessageDraft], at: datetime = EPOCH,
    vectors: Sequence[Any] | None = None,
) -> list[Message]:
    """Appends after whatever the thread holds."""
    state = await store.state(thread_id)
    return await store.append(
        thread_id, batch, expected_len=state.history_len if state else 0, recorded_at=at,
        vectors=vectors,
    )


# ---- the log ------------------------------------------------------------------------------


async def test_append_numbers_and_reads_back(threads: ThreadStore) -> None:
    """Appended messages get consecutive seqs and read back equal, with content, data, times
    and tokens as written; the thread is listed with its counters."""
    first = await save(threads, "t", drafts("hello", "world"))
    call = draft({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}}]}, 0)
    second = await save(threads, "t", [call], EPOCH + timedelta(seconds=1))
    assert [m.seq for m in first + second] == [0, 1, 2]
    assert await threads.raw("t") == first + second
    assert js(second[0].to_dict())["tool_calls"][0]["id"] == "c1"
    assert second[0].recorded_at == EPOCH + timedelta(seconds=1)
    assert second[0].recorded_at.tzinfo is not None
    assert second[0].recorded_at.utcoffset() == timedelta(0)
    keys = [d.key for d in drafts("hello", "world")] + [call.key]
    assert await threads.state("t") == ThreadState(3, 3, 0, history_hash(keys))
    [info] = await threads.threads()
    assert (info.id, info.messages, info.next_seq, info.boundary_seq) == ("t", 3, 3, 0)
    assert info.created_at == EPOCH
    assert await threads.state("nobody") is None


async def test_append_with_a_stale_length_conflicts(threads: ThreadStore) -> None:
    """An append whose expected length is not the stored one raises ConflictError and writes
    nothing, not even a new thread's row."""
    await save(threads, "t", drafts("one"))
    with pytest.raises(mnemo.ConflictError, match="1 messages stored, expected 0"):
        await threads.append("t", drafts("two"), expected_len=0, recorded_at=EPOCH)
    with pytest.raises(mnemo.ConflictError):
        await threads.append("new", drafts("x"), expected_len=2, recorded_at=EPOCH)
    assert [m.content for m in await threads.raw("t")] == ["one"]
    assert await threads.state("new") is None


async def test_vectors_are_stored_replaced_and_skipped(threads: ThreadStore) -> None:
    """Vectors given with an append read back as float32; save_vectors replaces them and
    skips ids no longer stored."""
    a = np.array([1.0, 0.0, 0.5], dtype=np.float32)
    b = np.array([0.0, 1.0, 0.25], dtype=np.float32)
    saved = await save(threads, "t", drafts("x", "y"), vectors=[a, b])
    stored = await threads.vectors("t")
    assert set(stored) == {m.id for m in saved}
    assert stored[saved[0].id].dtype == np.float32
    np.testing.assert_array_equal(stored[saved[1].id], b)
    await threads.save_vectors("t", [(saved[0].id, b), ("msg_gone", a)])
    stored = await threads.vectors("t")
    assert set(stored) == {m.id for m in saved}
    np.testing.assert_array_equal(stored[saved[0].id], b)


async def test_expire_keeps_the_counter_and_drops_covered_records(threads: ThreadStore) -> None:
    """Expire erases messages before the cutoff (their vectors too) and the compactions and
    snapshots that only covered them; the next seq is not reused."""
    vec = np.ones(3, dtype=np.float32)
    await save(threads, "t", drafts("old0", "old1"), EPOCH, vectors=[vec, vec])
    await save(threads, "t", drafts("new2"), EPOCH + timedelta(days=2), vectors=[vec])
    await threads.add_compaction("t", 0, 1, "old summary", EPOCH)
    await threads.commit_eviction("t", boundary_before=0, boundary_after=2, zone=(0, 1),
                                  snapshot_text="old snapshot", pins=[], now=EPOCH)
    assert await threads.expire("t", EPOCH + timedelta(days=1)) == 2
    assert [m.seq for m in await threads.raw("t")] == [2]
    assert await threads.compactions("t") == []
    assert await threads.snapshots("t") == []
    assert len(await threads.vectors("t")) == 1
    assert await threads.expire("t", EPOCH + timedelta(days=1)) == 0
    assert await threads.expire("nobody", EPOCH) == 0
    [added] = await save(threads, "t", drafts("next"))
    assert added.seq == 3


async def test_compactions_replace_what_they_contain(threads: ThreadStore) -> None:
    """A compaction containing older ones replaces them; a partial overlap, an end past the
    log and an unknown thread are refused and write nothing."""
    await save(threads, "t", drafts(*[f"m{i}" for i in range(6)]))
    await threads.add_compaction("t", 0, 1, "first", EPOCH)
    await threads.add_compaction("t", 2, 3, "second", EPOCH)
    with pytest.raises(mnemo.InvalidInputError, match="overlaps compaction 2-3"):
        await threads.add_compaction("t", 3, 4, "bad", EPOCH)
    with pytest.raises(mnemo.InvalidInputError, match="past the last message"):
        await threads.add_compaction("t", 4, 6, "bad", EPOCH)
    with pytest.raises(mnemo.NotFoundError):
        await threads.add_compaction("nobody", 0, 0, "bad", EPOCH)
    whole = await threads.add_compaction("t", 0, 3, "both", EPOCH + timedelta(hours=1))
    assert await threads.compactions("t") == [whole]
    assert whole.created_at == EPOCH + timedelta(hours=1)
    compactions, rest = await threads.uncompacted("t")
    assert compactions == [whole]
    assert [m.seq for m in rest] == [4, 5]


async def test_recent_turns_reads_back_k_turns(threads: ThreadStore) -> None:
    """recent_turns gives the uncompacted messages of the last k turns, oldest first."""
    for i in range(100):
        await save(threads, "t", turn(f"question {i}"))
    await threads.add_compaction("t", 0, 9, "early", EPOCH)
    compactions, recent = await threads.recent_turns("t", 3)
    assert [c.end_seq for c in compactions] == [9]
    assert [m.seq for m in recent] == list(range(194, 200))
    _, everything = await threads.recent_turns("t", 1000)
    assert [m.seq for m in everything] == list(range(10, 200))


async def test_clear_starts_a_new_history(threads: ThreadStore) -> None:
    """Clear deletes every record of the thread and moves the boundary to the counter; the
    next append starts from length 0 with the next seq."""
    await save(threads, "t", drafts("a", "b"), vectors=[np.ones(2, np.float32)] * 2)
    goal = await threads.add_goal("t", "keep", EPOCH)
    await threads.add_compaction("t", 0, 0, "s", EPOCH)
    await threads.clear("t")
    assert await threads.state("t") == ThreadState(2, 0, 2, "")
    assert (await threads.raw("t"), await threads.compactions("t")) == ([], [])
    assert (await threads.vectors("t"), await threads.open_goals("t")) == ({}, [])
    with pytest.raises(mnemo.NotFoundError):
        await threads.complete_goal(goal + "x", EPOCH)
    [again] = await threads.append("t", drafts("c"), expected_len=0, recorded_at=EPOCH)
    assert again.seq == 2


async def test_clear_of_a_thread_never_saved_deletes_its_goals(threads: ThreadStore) -> None:
    """A goal may be set on a thread before its first save; clearing the thread deletes it on
    both backends (PostgreSQL kept it: its clear stopped at the missing thread row), and
    makes no thread."""
    await threads.add_goal("t", "plan", EPOCH)
    await threads.clear("t")
    assert await threads.open_goals("t") == []
    assert await threads.state("t") is None


# ---- goals, viewport, eviction, snapshots -------------------------------------------------


async def test_goals_pins_and_the_viewport(threads: ThreadStore) -> None:
    """An eviction moves the boundary, writes its snapshot and pins messages of the thread to
    its open goals; the viewport inputs show them; completing the goal releases the pins."""
    saved = await save(threads, "t", drafts(*[f"step {i} " + "w " * 10 for i in range(6)]))
    other = await save(threads, "u", drafts("elsewhere"))
    goal = await threads.add_goal("t", "finish", EPOCH)
    assert [g.id for g in await threads.open_goals("t")] == [goal]
    inputs = await threads.eviction_inputs("t")
    assert (inputs.boundary_seq, inputs.goals[0].id, inputs.previous_snapshot) == (0, goal, "")
    assert [m.seq for m in inputs.past_boundary] == list(range(6))
    snap = await threads.commit_eviction(
        "t", boundary_before=0, boundary_after=3, zone=(0, 2), snapshot_text="did 0-2",
        pins=[(saved[1].id, goal), (other[0].id, goal), (saved[2].id, "goal_nope")],
        now=EPOCH,
    )
    assert snap is not None
    assert snap.created_at == EPOCH
    with pytest.raises(mnemo.ConflictError):
        await threads.commit_eviction("t", boundary_before=0, boundary_after=4, zone=(3, 3),
                                      snapshot_text="x", pins=[], now=EPOCH)
    with pytest.raises(mnemo.ConflictError):
        await threads.commit_eviction("nobody", boundary_before=0, boundary_after=1,
                                      zone=(0, 0), snapshot_text="x", pins=[], now=EPOCH)
    assert await threads.commit_eviction("t", boundary_before=3, boundary_after=4, zone=(3, 3),
                                         snapshot_text="  ", pins=[], now=EPOCH) is None
    view = await threads.viewport_inputs("t", 10_000)
    assert (view.boundary_seq, [m.seq for m in view.pinned]) == (4, [1])
    assert view.level1 == [snap]
    assert [m.seq for m in view.newest] == [5, 4]
    assert view.tokens_past_boundary == saved[4].tokens + saved[5].tokens
    assert (await threads.eviction_inputs("t")).previous_snapshot == "did 0-2"
    assert await threads.complete_goal(goal, EPOCH) == 1
    assert await threads.complete_goal(goal, EPOCH) == 0
    with pytest.raises(mnemo.NotFoundError):
        await threads.complete_goal("goal_nope", EPOCH)
    assert (await threads.viewport_inputs("t", 10_000)).pinned == []
    assert await threads.open_goals("t") == []
    with pytest.raises(mnemo.NotFoundError):
        await threads.eviction_inputs("nobody")


async def test_viewport_inputs_stop_past_the_limit(threads: ThreadStore) -> None:
    """`newest` stops at the first message whose running token sum passes the limit; an
    unknown thread reads as empty inputs at boundary 0."""
    saved = await save(threads, "t", drafts(*[f"message {i} " + "word " * 20 for i in range(300)]))
    inputs = await threads.viewport_inputs("t", 100)
    assert inputs.tokens_past_boundary == sum(m.tokens for m in saved)
    running = [sum(m.tokens for m in inputs.newest[: i + 1]) for i in range(len(inputs.newest))]
    assert running[-1] > 100
    assert all(total <= 100 for total in running[:-1])
    assert inputs.newest == saved[::-1][: len(inputs.newest)]
    empty = await threads.viewport_inputs("nobody", 100)
    assert (empty.boundary_seq, empty.newest, empty.pinned, empty.tokens_past_boundary) == (
        0, [], [], 0)


async def test_fold_covers_once(threads: ThreadStore) -> None:
    """A fold writes a level-2 snapshot over uncovered level-1 ones; a second fold of the same
    snapshots writes nothing."""
    await save(threads, "t", drafts(*[f"m{i}" for i in range(6)]))
    for b in range(3):
        await threads.commit_eviction("t", boundary_before=b * 2, boundary_after=b * 2 + 2,
                                      zone=(b * 2, b * 2 + 1), snapshot_text=f"zone {b}",
                                      pins=[], now=EPOCH + timedelta(minutes=b))
    level1 = await threads.uncovered_snapshots("t")
    assert [s.text for s in level1] == ["zone 0", "zone 1", "zone 2"]
    level2 = await threads.commit_fold("t", level1, "all three", EPOCH)
    assert level2 is not None
    assert (level2.level, level2.start_seq, level2.end_seq) == (2, 0, 5)
    assert await threads.commit_fold("t", level1, "again", EPOCH) is None
    assert await threads.uncovered_snapshots("t") == []
    every = await threads.snapshots("t")
    assert [(s.level, s.covered_by) for s in every] == [(1, level2.id)] * 3 + [(2, None)]


async def test_snapshots_of_one_start_keep_their_order(threads: ThreadStore) -> None:
    """Snapshots of one level and start come back in the order they were written on both
    backends, also after a fold rewrote the first one's row (long texts move it to another
    PostgreSQL page)."""
    await save(threads, "t", drafts("m0", "m1"))
    texts = [f"{i} " + "x" * 1500 for i in range(10)]
    for text in texts:
        await threads.commit_eviction("t", boundary_before=0, boundary_after=0, zone=(0, -1),
                                      snapshot_text=text, pins=[], now=EPOCH)
    first = (await threads.uncovered_snapshots("t"))[0]
    assert await threads.commit_fold("t", [first], "folded", EPOCH) is not None
    every = await threads.snapshots("t")
    assert [(s.level, s.text) for s in every] == [(1, text) for text in texts] + [(2, "folded")]


# ---- search and view ----------------------------------------------------------------------


async def test_search_stems_ors_and_snippets(threads: ThreadStore) -> None:
    """Each word is searched stemmed and the words are OR-combined ("deploying" finds
    "deployed"); operators and quotes are words; hits carry ids, roles and short snippets."""
    long_tail = " ".join(["filler"] * 200)
    saved = await save(threads, "t", [
        *drafts("we deployed the service yesterday", f"{long_tail} rollback plan {long_tail}"),
        *drafts("this is not a drill", role="assistant"),
    ])
    now = EPOCH + timedelta(days=1)
    hits = await threads.search(query_words("deploying"), limit=5, now=now)
    assert [(h.message_id, h.seq, h.role) for h in hits] == [(saved[0].id, 0, "user")]
    assert "deployed" in hits[0].snippet
    assert hits[0].rank > 0
    hits = await threads.search(query_words('rollback" OR NOT'), limit=5, now=now)
    assert {h.seq for h in hits} == {1, 2}
    assert all(len(h.snippet) <= SNIPPET_CHARS for h in hits)
    assert "rollback" in next(h for h in hits if h.seq == 1).snippet
    assert await threads.search(query_words("absent"), limit=5, now=now) == []
    assert await threads.search([], limit=5, now=now) == []
    assert await threads.search(["foo_bar", "___"], limit=5, now=now) == []


async def test_search_ranks_relevance_then_recency(threads: ThreadStore) -> None:
    """Of equal matches the newer ranks first; a message with more of the words ranks above
    an as long one with fewer, two months newer; limit bounds the hits."""
    now = EPOCH + timedelta(days=60)
    await save(threads, "old", drafts("the invoice total was wrong"), EPOCH)
    await save(threads, "new", drafts("the invoice total was wrong"), now)
    await save(threads, "few", drafts("an invoice arrived this morning"), now)
    hits = await threads.search(query_words("invoice total"), limit=5, now=now)
    assert [h.thread_id for h in hits][:2] == ["new", "old"]
    assert hits[0].rank > hits[1].rank
    assert len(await threads.search(query_words("invoice"), limit=2, now=now)) == 2


async def test_search_filters(threads: ThreadStore) -> None:
    """thread_id keeps one thread's hits; exclude_viewport_of leaves out that thread's messages
    from its boundary on, not what it evicted nor other threads."""
    await save(threads, "t", drafts(*[f"database migration step {i}" for i in range(6)]))
    await save(threads, "other", drafts("database migration elsewhere"))
    await threads.commit_eviction("t", boundary_before=0, boundary_after=4, zone=(0, 3),
                                  snapshot_text="s", pins=[], now=EPOCH)
    words = query_words("database migration")
    hits = await threads.search(words, limit=20, now=EPOCH, thread_id="other")
    assert [(h.thread_id, h.seq) for h in hits] == [("other", 0)]
    assert await threads.search(words, limit=20, now=EPOCH, thread_id="nobody") == []
    hits = await threads.search(words, limit=20, now=EPOCH, exclude_viewport_of="t")
    assert {(h.thread_id, h.seq) for h in hits} == {("other", 0)} | {("t", s) for s in range(4)}
    hits = await threads.search(words, limit=20, now=EPOCH, exclude_viewport_of="nobody")
    assert len(hits) == 7


async def test_view_shows_neighbours_and_snapshots(threads: ThreadStore) -> None:
    """view gives `radius` messages each side and the nearest level-1 snapshots before and
    after; an unknown id is NotFoundError."""
    saved = await save(threads, "t", drafts(*[f"m{i}" for i in range(10)]))
    for b in range(4):
        await threads.commit_eviction("t", boundary_before=b * 2, boundary_after=b * 2 + 2,
                                      zone=(b * 2, b * 2 + 1), snapshot_text=f"zone {b}",
                                      pins=[], now=EPOCH)
    view = await threads.view(saved[3].id, 2)
    assert view.target == saved[3]
    assert [m.seq for m in view.messages] == [1, 2, 3, 4, 5]
    assert [s.text for s in view.snapshots_before] == ["zone 0", "zone 1"]
    assert [s.text for s in view.snapshots_after] == ["zone 2", "zone 3"]
    assert (await threads.view(saved[0].id, 0)).messages == [saved[0]]
    with pytest.raises(mnemo.NotFoundError):
        await threads.view("msg_nope", 1)


# ---- concurrency (PostgreSQL holds the checks under racing writers) -----------------------


async def race_appends(threads: ThreadStore, thread: str, stored: int, racers: int) -> list[str]:
    """Each racer's outcome ("ok" or "conflict") of appending after `stored` messages at once."""
    outcomes: list[str] = []

    async def attempt(i: int) -> None:
        try:
            await threads.append(thread, drafts(f"racer {i}"), expected_len=stored,
                                 recorded_at=EPOCH)
            outcomes.append("ok")
        except mnemo.ConflictError:
            outcomes.append("conflict")

    async with anyio.create_task_group() as tg:
        for i in range(racers):
            tg.start_soon(attempt, i)
    return outcomes


async def test_racing_appends_one_wins(threads: ThreadStore) -> None:
    """Of appends racing with the same expected length (to a new thread or a stored one),
    exactly one is written and the others raise ConflictError."""
    await save(threads, "old", drafts("first"))
    for thread, stored in (("new", 0), ("old", 1)):
        outcomes = await race_appends(threads, thread, stored, racers=8)
        assert sorted(outcomes) == ["conflict"] * 7 + ["ok"]
        assert len(await threads.raw(thread)) == stored + 1
        state = await threads.state(thread)
        assert state is not None
        assert (state.next_seq, state.history_len, state.boundary_seq) == (
            stored + 1, stored + 1, 0)


async def test_racing_evictions_one_wins(threads: ThreadStore) -> None:
    """Of evictions racing from the same boundary, exactly one moves it and writes its
    snapshot; the others raise ConflictError."""
    await save(threads, "t", drafts(*[f"m{i}" for i in range(8)]))
    outcomes: list[str] = []

    async def attempt(i: int) -> None:
        try:
            await threads.commit_eviction("t", boundary_before=0, boundary_after=i + 1,
                                          zone=(0, i), snapshot_text=f"by {i}", pins=[],
                                          now=EPOCH)
            outcomes.append("ok")
        except mnemo.ConflictError:
            outcomes.append("conflict")

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(attempt, i)
    assert sorted(outcomes) == ["conflict"] * 5 + ["ok"]
    [snap] = await threads.snapshots("t")
    state = await threads.state("t")
    assert state is not None
    assert state.boundary_seq == snap.end_seq + 1


async def test_racing_folds_one_wins(threads: ThreadStore) -> None:
    """Of folds racing over the same snapshots, exactly one writes a level-2 snapshot."""
    await save(threads, "t", drafts(*[f"m{i}" for i in range(4)]))
    for b in range(2):
        await threads.commit_eviction("t", boundary_before=b * 2, boundary_after=b * 2 + 2,
                                      zone=(b * 2, b * 2 + 1), snapshot_text=f"zone {b}",
                                      pins=[], now=EPOCH)
    level1 = await threads.uncovered_snapshots("t")
    written: list[object] = []

    async def attempt(i: int) -> None:
        written.append(await threads.commit_fold("t", level1, f"fold {i}", EPOCH))

    async with anyio.create_task_group() as tg:
        for i in range(5):
            tg.start_soon(attempt, i)
    assert sum(w is not None for w in written) == 1
    assert len([s for s in await threads.snapshots("t") if s.level == 2]) == 1


# ---- round trip ---------------------------------------------------------------------------

_MESSAGES = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "tool"]),
            "content": st.one_of(st.none(), texts(max_size=20)),
        },
        optional={"name": texts(min_size=1, max_size=8), "extra": json_values,
                  "big": st.sampled_from([1e16, -0.0, 1.7976931348623157e308, 2**70])},
    ),
    min_size=1, max_size=4,
)


def _types(value: object) -> object:
    """The value with each scalar replaced by its type (1 == 1.0, but not as JSON)."""
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(messages=_MESSAGES)
def test_messages_round_trip(pg_url: str, tmp_path: Path, messages: list[dict[str, Any]]) -> None:
    """Any message a caller may save (floats jsonb would turn into integers included; NUL
    is refused by the input checks) reads back from either backend as it was saved, and as append
    returned it."""
    thread = f"t-{uuid.uuid4().hex}"

    async def run() -> None:
        database = Database(tmp_path / "trip.db")
        await database.open()
        try:
            async with Postgres(pg_url) as pg:
                for store in (SqliteThreads(database), PgThreads(pg)):
                    batch = [draft(m, i) for i, m in enumerate(messages)]
                    saved = await save(store, thread, batch)
                    raw = await store.raw(thread)
                    assert raw == saved
                    assert [m.to_dict() for m in raw] == messages
                    assert [_types(m.to_dict()) for m in raw] == [_types(m) for m in messages]
        finally:
            await database.close()

    anyio.run(run)


# ---- erasure ------------------------------------------------------------------------------


async def test_purge_leaves_nothing(opened: Opened) -> None:
    """After purge no row of any table holds the thread's id or a word of it (messages, tool
    calls, search index, vectors, compaction, snapshot, goal, pins); other threads stay."""
    threads = opened.threads
    marker = f"zq{uuid.uuid4().hex}qz"
    thread = f"thread-{marker}"
    call = draft({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "tag", "arguments": f'{{"tag": "{marker}"}}'}}]}, 0)
    batch = [*drafts(f"tag the build {marker}", f"step {marker} done"), call]
    saved = await save(threads, thread, batch, vectors=[np.ones(3, np.float32)] * 3)
    await save(threads, "keeper", drafts("unrelated gardening"))
    goal = await threads.add_goal(thread, f"ship {marker}", EPOCH)
    await threads.add_compaction(thread, 0, 0, f"summary of {marker}", EPOCH)
    await threads.commit_eviction(thread, boundary_before=0, boundary_after=2, zone=(0, 1),
                                  snapshot_text=f"snapshot {marker}",
                                  pins=[(saved[0].id, goal)], now=EPOCH)
    assert await threads.search([marker], limit=5, now=EPOCH)
    before = await opened.holding(marker)
    assert before.get("messages") == 3, before
    assert await threads.purge(thread) == 3
    assert await opened.holding(marker) == {}
    assert await threads.state(thread) is None
    assert await threads.search([marker], limit=5, now=EPOCH) == []
    assert [t.id for t in await threads.threads()] == ["keeper"]
    assert [m.content for m in await threads.raw("keeper")] == ["unrelated gardening"]
    assert await threads.purge(thread) == 0


# ---- both backends agree ------------------------------------------------------------------

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 4), st.integers(0, 3)),
        st.tuples(st.just("compact"), st.integers(0, 12), st.integers(0, 4)),
        st.tuples(st.just("expire"), st.integers(0, 4), st.just(0)),
        st.tuples(st.just("clear"), st.just(0), st.just(0)),
        st.tuples(st.just("evict"), st.integers(0, 3), st.integers(-1, 1)),
    ),
    max_size=12,
)


async def _apply(threads: ThreadStore, thread: str, op: tuple[str, int, int], step: int) -> str:
    """One operation; what it raised, by name ("" when nothing)."""
    kind, a, b = op
    at = EPOCH + timedelta(days=b)
    try:
        if kind == "append":
            await save(threads, thread, drafts(*[f"step {step} word{i}" for i in range(a)]), at)
        elif kind == "compact":
            await threads.add_compaction(thread, a, a + b, f"summary {step}", EPOCH)
        elif kind == "evict":
            state = await threads.state(thread)
            start = state.boundary_seq if state else 0
            # b = -1: a stale boundary, which must conflict on both.
            await threads.commit_eviction(
                thread, boundary_before=start + min(b, 0), boundary_after=start + a,
                zone=(start, start + a - 1), snapshot_text=f"snapshot {step}" * (b >= 0),
                pins=[], now=EPOCH)
        elif kind == "expire":
            await threads.expire(thread, EPOCH + timedelta(days=a))
        else:
            await threads.clear(thread)
    except mnemo.MnemoError as exc:
        return type(exc).__name__
    return ""


async def _seen(threads: ThreadStore, thread: str) -> tuple[object, ...]:
    """What a thread reads as, message ids aside (each backend makes its own)."""
    raw = [(m.seq, m.role, m.content, m.data, m.recorded_at, m.tokens)
           for m in await threads.raw(thread)]
    snapshots = [(s.level, s.start_seq, s.end_seq, s.text, s.created_at)
                 for s in await threads.snapshots(thread)]
    return raw, await threads.compactions(thread), await threads.state(thread), snapshots


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=_OPS)
def test_backends_agree(pg_url: str, tmp_path: Path, ops: list[tuple[str, int, int]]) -> None:
    """Random appends, compactions, evictions, expiries and clears leave SQLite and PostgreSQL
    with equal logs, compactions, counters and snapshots, and refuse the same operations."""
    thread = f"t-{uuid.uuid4().hex}"  # examples share the databases

    async def run() -> None:
        database = Database(tmp_path / "agree.db")
        await database.open()
        try:
            async with Postgres(pg_url) as pg:
                lite, post = SqliteThreads(database), PgThreads(pg)
                for step, op in enumerate(ops):
                    assert await _apply(lite, thread, op, step) == await _apply(
                        post, thread, op, step), op
                    assert await _seen(lite, thread) == await _seen(post, thread), op
        finally:
            await database.close()

    anyio.run(run)


def _subplan_loops(plan: dict[str, Any]) -> list[int]:
    """The loops of every subplan node under `plan` (EXPLAIN ANALYZE, JSON)."""
    found = []
    if plan.get("Subplan Name", "").startswith("SubPlan"):
        found.append(int(plan["Actual Loops"]))
    for child in plan.get("Plans", []):
        found += _subplan_loops(child)
    return found


async def test_message_search_counts_each_words_df_once(pg_url: str) -> None:
    """The scoring statement counts a word's document frequency once per search, not once per
    message it matches: the planner inlined the per-word CTE, and 500 messages took 131 ms a
    search, 5,000 about 5 s. The plan's subplans run at most once a word."""
    async with mnemo.Memory(pg_url, embedder=mnemo.HashEmbedder(8)) as mem:
        await mem.conversation().save(
            "t", [{"role": "user", "content": f"nginx cache python note {i}"} for i in range(60)]
        )
    words = ["nginx", "cache", "python"]
    statement, params = scoring_query(SearchQuery(words, 50, None, None, None, None))
    async with Postgres(pg_url) as pg, pg.connection() as conn:
        cur = await conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", params)
        row = await cur.fetchone()
    assert row is not None
    plans: Any = row[0]
    loops = _subplan_loops(plans[0]["Plan"])
    assert loops
    assert max(loops) <= len(words), loops
