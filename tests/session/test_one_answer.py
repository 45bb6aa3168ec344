"""One answer per call on both backends (the API contract): a call on a session another Memory is
extracting is refused as the state table says, whichever backend holds the store."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import anyio
import pytest

import mnemo
from mnemo.session import transitions
from tests.session.test_many_memories import Called, extracting, fill, open_worker, ready


async def test_an_append_on_a_session_another_memory_extracts_is_extraction_in_progress(
    store: str,
) -> None:
    """B closed A's session and extracts it; an append through A afterwards raises
    extraction_in_progress (the state table's answer for extracting), not not_collecting,
    and stores no step."""
    async with AsyncExitStack() as stack:
        a = await open_worker(stack, store)
        sid = await fill(a.mem)
        b = await open_worker(stack, store)
        held = await extracting(b, sid)
        try:
            with pytest.raises(mnemo.SessionError) as refused:
                await a.mem.append(sid, "walk west", "go west")
            assert refused.value.reason == "extraction_in_progress"
            assert refused.value.state is mnemo.State.EXTRACTING
        finally:
            held.release()
        [episode] = await b.mem.episodes(sid)
        assert len(episode.steps) == 3


async def test_a_commit_whose_session_another_memory_touched_meanwhile_commits(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ready session's commit through A, whose write finds the version moved by B without
    the state changing (B's claim of the row), reads it again and commits; the callback of a
    commit_async carries no reason the API contract does not list (it carried `conflict`)."""
    async with AsyncExitStack() as stack:
        a = await open_worker(stack, store)
        b = await open_worker(stack, store)
        coordination = b.mem._backend.coordination
        real = transitions.commit_steps
        bumps = 0

        async def touched_first(*args: Any, **kwargs: Any) -> Any:
            nonlocal bumps
            if bumps < 2:  # one bump for the sync commit, one for the async one
                bumps += 1
                row = await coordination.lease(sid)
                assert row is not None
                assert row.state is mnemo.State.READY
                moved = await coordination.claim(
                    sid, version=row.version, holder_id=row.holder, lease_until=row.lease_until
                )
                assert moved == row.version + 1
            return await real(*args, **kwargs)

        monkeypatch.setattr(transitions, "commit_steps", touched_first)
        sid = await fill(a.mem)
        await ready(a, sid)
        receipt = await a.mem.commit(sid)
        assert receipt is not None
        assert receipt.node_ids
        assert await b.mem.session_state(sid) is mnemo.State.IDLE

        await a.mem.start_episode(sid, "explore the garden")
        await a.mem.append(sid, "walk west", "go west")
        await ready(a, sid)
        called = Called()
        await a.mem.commit_async(sid, called)
        with anyio.fail_after(10):
            await called.done.wait()
        [result] = called.results
        assert result.ok, result.error
        assert result.value == "committed"
        assert bumps == 2
