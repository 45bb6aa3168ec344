"""Every count a caller controls is bounded by a `Config` field (a default, a ceiling) and
checked before anything is stored: steps per ingest, messages per save, tool calls per
message, open goals, what a read asks for. Long ingests report their progress."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

import pytest

import mnemo
from mnemo.config import COUNT_CEILINGS
from tests.conftest import REPO, Enter
from tests.fakes import EventLog, FakeEmbedder, FakeLLM, js

DEFAULTS = {
    "max_steps_per_ingest": 100,
    "max_messages_per_save": 1_000,
    "max_tool_calls_per_message": 128,
    "max_open_goals": 100,
    "max_results": 1_000,
}


def steps(n: int) -> list[mnemo.Step]:
    return [mnemo.Step(f"walked to room {i}", f"opened door {i}") for i in range(n)]


def talk(n: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"message {i}"} for i in range(n)]


# ---- the Config fields --------------------------------------------------------------------


@pytest.mark.parametrize(("name", "default"), DEFAULTS.items())
def test_each_bound_has_its_default_and_ceiling(name: str, default: int) -> None:
    """Each per-call bound defaults as documented, takes any integer from 1 to its ceiling,
    survives a JSON round trip, and refuses 0, a bool, a float and one past its ceiling."""
    assert getattr(mnemo.Config(), name) == default
    ceiling = COUNT_CEILINGS[name]
    config = configured(name, ceiling)
    assert getattr(mnemo.Config.from_json(config.to_json()), name) == ceiling
    for bad in (0, ceiling + 1, True, 2.0):
        with pytest.raises(mnemo.InvalidInputError, match=f"Config.{name}"):
            configured(name, bad)


def configured(name: str, value: object) -> mnemo.Config:
    """A Config with one field set by name."""
    fields: dict[str, Any] = {name: value}
    return mnemo.Config(**fields)


def test_a_config_stored_before_the_bounds_reads_their_defaults() -> None:
    """A repo config written before the bounds existed opens with their defaults."""
    stored = mnemo.Config().to_json().replace('"max_steps_per_ingest": 100, ', "")
    assert "max_steps_per_ingest" not in stored
    assert mnemo.Config.from_json(stored).max_steps_per_ingest == 100


# ---- ingest -------------------------------------------------------------------------------


async def test_an_ingest_past_its_step_bound_is_refused_before_anything_is_stored(
    mem: mnemo.Memory, llm: FakeLLM
) -> None:
    """An ingest of 101 steps (the default bound is 100) is InvalidInputError naming the bound,
    before any model call and with nothing stored; 100 go in. A repo's own bound counts."""
    with pytest.raises(mnemo.InvalidInputError, match=r"101 steps.*Config.max_steps_per_ingest"):
        await mem.ingest(REPO, mnemo.Trajectory("explore", steps(101)), source_id="big")
    assert llm.calls == []
    assert await mem.history(REPO) == []
    assert await mem.get_nodes_by_type(REPO, list(mnemo.NodeType)) == []
    receipt = await mem.ingest(REPO, mnemo.Trajectory("explore", steps(100)), source_id="big")
    assert receipt.created
    await mem.open_repo("small", config=mnemo.Config(max_steps_per_ingest=3))
    with pytest.raises(mnemo.InvalidInputError, match="4 steps"):
        await mem.ingest("small", mnemo.Trajectory("explore", steps(4)), source_id="s")
    assert (await mem.ingest("small", mnemo.Trajectory("x", steps(3)), source_id="s")).created


async def test_an_ingest_reports_its_progress_in_order(
    mem: mnemo.Memory, events: EventLog
) -> None:
    """`progress` gets an IngestProgress before the first step, after each step, at
    extraction, at the commit and when done, and on_event gets the same as
    "ingest_progress" events; an ingest of a stored source reports only "done"."""
    seen: list[tuple[str, str, int, int]] = []

    def progress(update: mnemo.IngestProgress) -> None:
        seen.append((update.source_id, update.stage, update.done, update.total))

    trajectory = mnemo.Trajectory("explore", steps(3))
    await mem.ingest(REPO, trajectory, source_id="walk", progress=progress)
    assert seen == [
        ("walk", "annotating", 0, 3), ("walk", "annotating", 1, 3),
        ("walk", "annotating", 2, 3), ("walk", "annotating", 3, 3),
        ("walk", "extracting", 3, 3), ("walk", "committing", 3, 3), ("walk", "done", 3, 3),
    ]
    reported = [(e.repo, e.data["source_id"], e.data["stage"], e.data["done"], e.data["total"])
                for e in events.events if e.kind == "ingest_progress"]
    assert reported == [(REPO, *row) for row in seen]
    seen.clear()
    receipt = await mem.ingest(REPO, trajectory, source_id="walk", progress=progress)
    assert not receipt.created
    assert seen == [("walk", "done", 3, 3)]


async def test_an_async_or_failing_progress_callback_never_breaks_the_ingest(
    mem: mnemo.Memory, caplog: pytest.LogCaptureFixture
) -> None:
    """An async progress callback is awaited; one that raises is logged and the ingest goes
    on to store its nodes; one that is not callable is InvalidInputError."""
    stages: list[str] = []

    async def noted(update: mnemo.IngestProgress) -> None:
        stages.append(update.stage)

    await mem.ingest(REPO, mnemo.Trajectory("explore", steps(1)), source_id="a", progress=noted)
    assert stages[-1] == "done"

    def broken(update: mnemo.IngestProgress) -> None:
        raise RuntimeError("progress bar crashed")

    with caplog.at_level(logging.ERROR, logger="mnemo"):
        receipt = await mem.ingest(
            REPO, mnemo.Trajectory("explore", steps(2)), source_id="b", progress=broken
        )
    assert receipt.created
    assert receipt.node_ids
    assert "ingest progress callback failed" in caplog.text
    with pytest.raises(mnemo.InvalidInputError, match="progress"):
        await mem.ingest(REPO, mnemo.Trajectory("explore", steps(1)), source_id="c",
                         progress="bar")  # type: ignore[arg-type]


# ---- conversations ------------------------------------------------------------------------


async def test_a_save_past_its_message_bound_is_refused_before_anything_is_stored(
    mem: mnemo.Memory,
) -> None:
    """A first save of 1,001 messages (the bound counts new ones, default 1,000) is
    InvalidInputError naming the bound, storing nothing; the history saved in slices goes in,
    and a save adding one message to a long history is fine."""
    conversation = mem.conversation()
    history = talk(1_001)
    with pytest.raises(mnemo.InvalidInputError, match=r"1,001 new.*max_messages_per_save"):
        await conversation.save("t", history)
    assert await conversation.raw("t") == []
    assert len(await conversation.save("t", history[:1_000])) == 1_000
    assert len(await conversation.save("t", history)) == 1


async def test_the_memory_config_bounds_saves_tool_calls_and_goals(store: str) -> None:
    """Threads belong to no repo: the Memory's config bounds them. A message with more tool
    calls than max_tool_calls_per_message, a save of more new messages than
    max_messages_per_save, and a goal past max_open_goals are InvalidInputError, storing
    nothing; completing a goal makes room for another."""
    config = mnemo.Config(max_messages_per_save=3, max_tool_calls_per_message=2,
                          max_open_goals=2)
    async with mnemo.Memory(store, embedder=FakeEmbedder(), config=config) as mem:
        conversation = mem.conversation()
        with pytest.raises(mnemo.InvalidInputError, match="max_messages_per_save"):
            await conversation.save("t", talk(4))
        call = {"id": "c", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        many = {"role": "assistant", "content": None, "tool_calls": [call] * 3}
        with pytest.raises(mnemo.InvalidInputError, match=r"3 calls.*max_tool_calls_per_message"):
            await conversation.save("t", [many])
        assert await conversation.raw("t") == []
        await conversation.save("t", [{**many, "tool_calls": [call] * 2}])
        first = await mem.add_goal("t", "deploy the proxy")
        await mem.add_goal("t", "choose the port")
        with pytest.raises(mnemo.InvalidInputError, match="max_open_goals"):
            await mem.add_goal("t", "pick a cache")
        await mem.complete_goal(first)
        await mem.add_goal("t", "pick a cache")


async def test_a_message_with_more_tool_calls_than_the_default_is_refused(
    mem: mnemo.Memory,
) -> None:
    """129 tool calls in one message (the default bound is 128) are InvalidInputError; 128
    are stored."""
    call = {"id": "c", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    message = {"role": "assistant", "content": None, "tool_calls": [call] * 129}
    with pytest.raises(mnemo.InvalidInputError, match="129 calls"):
        await mem.conversation().save("t", [message])
    stored = await mem.conversation().save("t", [{**message, "tool_calls": [call] * 128}])
    assert len(js(stored[0].data)["tool_calls"]) == 128


# ---- reads --------------------------------------------------------------------------------


async def test_every_read_count_is_bounded_by_max_results(mem: mnemo.Memory) -> None:
    """recall's k, latest's top_k, history's and search_nodes' limit, and the ids one
    get_linked_nodes or delete_nodes takes are at most Config.max_results (1,000): one more
    is InvalidInputError naming it; the bound itself is fine."""
    ids = [f"n{i}" for i in range(1_001)]
    calls: list[Any] = [
        lambda n: mem.recall(REPO, "walk north", k=n),
        lambda n: mem.latest(REPO, top_k=n),
        lambda n: mem.history(REPO, limit=n),
        lambda n: mem.search_nodes(REPO, "walk", limit=n),
        lambda n: mem.get_linked_nodes(REPO, ids[:n]),
        lambda n: mem.delete_nodes(REPO, ids[:n]),
    ]
    for call in calls:
        with pytest.raises(mnemo.InvalidInputError, match=r"Config\.max_results"):
            await call(1_001)
        await call(1_000)


async def test_every_budget_and_policy_count_has_a_ceiling(
    mem: mnemo.Memory, tmp_path: Path
) -> None:
    """Token budgets stop at `MAX_TOKEN_BUDGET`, policy and memory-file counts at `MAX_COUNT`,
    a tool-output cut at `MAX_ITEM_CHARS`: one more is InvalidInputError, the bound is fine.
    They took any integer (a viewport of 10**30 tokens)."""
    from mnemo.conversation.model import MAX_ITEM_CHARS
    from mnemo.errors import MAX_COUNT, MAX_TOKEN_BUDGET

    await mem.conversation().save("t", talk(2))
    files = mnemo.MemoryFiles(tmp_path / "files")
    calls: list[tuple[int, Any]] = [
        (MAX_TOKEN_BUDGET, lambda n: mem.viewport("t", token_budget=n)),
        (MAX_TOKEN_BUDGET, lambda n: mem.evict("t", token_budget=n)),
        (MAX_TOKEN_BUDGET, lambda n: mem.conversation(auto_evict_budget=n)),
        (MAX_TOKEN_BUDGET, lambda n: mnemo.Summary(max_tokens=n)),
        (MAX_COUNT, lambda n: mnemo.Summary(keep=n)),
        (MAX_COUNT, lambda n: mnemo.Recent(k=n)),
        (MAX_COUNT, lambda n: mnemo.Semantic(k=n)),
        (MAX_ITEM_CHARS, lambda n: mnemo.ToolOutputPruner(max_chars=n)),
        (MAX_COUNT, lambda n: mnemo.MemoryFiles(tmp_path / "files", min_iterations=n)),
        (MAX_COUNT, lambda n: files.recall("deploys", limit=n)),
    ]

    async def run(call: Any, n: int) -> None:
        made = call(n)
        if inspect.isawaitable(made):
            await made

    for most, call in calls:
        with pytest.raises(mnemo.InvalidInputError, match=f"{most:,}"):
            await run(call, most + 1)
        await run(call, most)


async def test_memory_files_refuse_a_file_for_a_folder_and_report_bad_updates(
    tmp_path: Path
) -> None:
    """A file where the folder should be is InvalidInputError at once (list and persist raised
    bare OS errors); an update's iterations that are no count, and a history holding no
    message dict, come back as InvalidInputError in `error` (a TypeError, and silence)."""
    (tmp_path / "afile").write_text("x")
    with pytest.raises(mnemo.InvalidInputError, match="is a file"):
        mnemo.MemoryFiles(tmp_path / "afile")
    files = mnemo.MemoryFiles(tmp_path / "files", min_iterations=0)
    said = [{"role": "user", "content": "We decided the staging database is orders_stage."}]
    bad = await files.update(said, llm=None, iterations="30")  # type: ignore[arg-type]
    assert bad.error is not None
    assert bad.error.startswith("InvalidInputError: iterations")
    odd = await files.update([*said, 3], llm=None, iterations=30)  # type: ignore[list-item]
    assert odd.error == "InvalidInputError: history[1] must be a message dict, got int"
    assert files.list() == []


@pytest.mark.parametrize(
    "arguments",
    [{"max_retries": 101}, {"max_retries": -1}, {"max_retries": "2"}, {"max_polls": 0},
     {"max_polls": 2.5}, {"max_polls": 10**400}, {"max_polls": 1_728_001}, {"poll_interval": 0},
     {"poll_interval": float("inf")}, {"poll_interval": "fast"},
     {"max_polls": 10**400, "poll_interval": 1e-310}],
)
async def test_close_and_commit_takes_bounded_retries_and_waits(
    mem: mnemo.Memory, enter: Enter, arguments: dict[str, Any]
) -> None:
    """close_and_commit with more retries than MAX_RETRIES (each runs the extraction's model
    calls again), or a max_polls or poll_interval that is no count or time, or a wait
    (max_polls * poll_interval) past a day, is InvalidInputError, and the session is not
    closed."""
    sid = await enter(mnemo.State.COLLECTING)
    with pytest.raises(mnemo.InvalidInputError):
        await mem.close_and_commit(sid, **arguments)
    assert await mem.session_state(sid) is mnemo.State.COLLECTING
