"""`close_and_commit` waits as long as `extraction_timeout` allows;
reads never start work, and an interrupted extraction is resumed only by a Memory whose model
is the one it started with."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

import mnemo
from mnemo import State
from mnemo.session import timers
from tests.conftest import REPO
from tests.fakes import EventLog, FakeEmbedder, FakeLLM, leave_extracting


class OtherModel(FakeLLM):
    """Another provider's model: same answers, another name."""

    name = "other:model"


@pytest.mark.slow
async def test_close_and_commit_waits_as_long_as_the_extraction_may_take(
    llm: FakeLLM, embedder: FakeEmbedder, store: str
) -> None:
    """With the default max_polls, an extraction slower than max_polls' old fixed wait
    (200 x poll_interval) is waited for, since extraction_timeout allows it."""
    async with mnemo.Memory(store, llm=llm, embedder=embedder) as mem:
        await mem.open_repo(REPO)
        sid = await mem.start_session("explore", repo=REPO)
        await mem.append(sid, "The kitchen is north.", "go north")
        held = llm.hold("semantic")

        async def slow_model() -> None:
            await held.started.wait()
            await anyio.sleep(0.5)  # the model takes its time: 2.5x the old 0.2 s wait
            held.release()

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_model)
            receipt = await mem.close_and_commit(sid, poll_interval=0.001)
        assert receipt.node_ids
        assert await mem.session_state(sid) is State.IDLE


async def test_reads_through_another_model_never_resume_an_extraction(tmp_path: Path) -> None:
    """A Memory with another model reads the session (state, context, list, recall), opens
    the repo, and never extracts; a Memory with the session's own model then finishes it."""
    path = tmp_path / "m.db"
    sid = await leave_extracting(path, FakeLLM(), repo=REPO)

    other = OtherModel()
    async with mnemo.Memory(path, llm=other, embedder=FakeEmbedder()) as mem:
        assert await mem.session_state(sid) is State.EXTRACTING
        await mem.session_context(sid)
        assert [s.id for s in await mem.list_sessions()] == [sid]
        await mem.recall(REPO, "kitchen")
        await mem.open_repo(REPO)
        # One look of the takeover task run to its end here (the one the open asked for may still
        # be on its thread when the tasks look blocked).
        await timers.take_over(mem._live)
        await anyio.wait_all_tasks_blocked()
        assert await mem.session_state(sid) is State.EXTRACTING
    assert other.calls == []

    events = EventLog()
    own = FakeLLM()
    async with mnemo.Memory(path, llm=own, embedder=FakeEmbedder(), on_event=events) as mem:
        assert await events.wait_state(mem, sid, State.READY) is State.READY
        receipt = await mem.commit(sid)
        assert receipt is not None
        assert receipt.node_ids
    assert "semantic" in own.tasks()
