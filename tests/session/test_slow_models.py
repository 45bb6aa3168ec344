"""A session's work with a slow model: the time its calls wait for their turn is not held
against it, a timeout raised on reopening applies to the retry, and a failure says what
failed, counting only this call's extractions; on each backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

import mnemo
from mnemo.adapters._http import DEFAULT_TIMEOUT, Transport
from mnemo.calls.retry import fail_after, remaining
from mnemo.errors import LLMError
from tests.adapters.provider_server import ProviderServer
from tests.conftest import REPO
from tests.fakes import FakeEmbedder, FakeLLM


class Timed(FakeLLM):
    """A FakeLLM whose calls take `seconds` (a slow server) and record the time the work
    they serve has left (`remaining()`)."""

    def __init__(self, seconds: float = 0.0) -> None:
        super().__init__()
        self.seconds = seconds
        self.left: list[float | None] = []

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        self.left.append(remaining())
        await anyio.sleep(self.seconds)
        return await super().generate(request)


async def _failed_session(store: str) -> str:
    """A session whose extraction failed (its semantic task), in a Memory now closed."""
    llm = FakeLLM()
    llm.fail_tasks.add("semantic")
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO, config=mnemo.Config(extraction_timeout=60.0))
        sid = await mem.start_session("explore", repo=REPO)
        await mem.append(sid, "walk north", "go north")
        with pytest.raises(mnemo.PipelineError):
            await mem.close_and_commit(sid, max_retries=0)
    return sid


async def test_a_timeout_raised_on_reopening_applies_to_the_retry(store: str) -> None:
    """A session recorded with extraction_timeout 60 s, failed, retried in a Memory that
    opens its repo with 900 s: the retry's calls run with 900 s left to them (they ran with
    60, which cut a slow server's replies)."""
    sid = await _failed_session(store)
    llm = Timed()
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO, config=mnemo.Config(extraction_timeout=900.0))
        await mem.close_and_commit(sid)
    left = [s for s in llm.left if s is not None]
    assert left
    assert min(left) > 60.0


async def test_a_memorys_longer_timeout_holds_for_a_repo_recorded_with_less(store: str) -> None:
    """`Memory(config=Config(extraction_timeout=900))` on a repo recorded with 60 s: its work
    there has 900 s (the CLI's --extraction-timeout), and the repo's record keeps 60."""
    sid = await _failed_session(store)
    llm = Timed()
    config = mnemo.Config(extraction_timeout=900.0)
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), config=config) as mem:
        await mem.open_repo(REPO)
        await mem.close_and_commit(sid)
    assert min(s for s in llm.left if s is not None) > 60.0
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        assert (await mem.repo_config(REPO)).extraction_timeout == 60.0


async def test_a_failure_counts_this_calls_extractions_and_names_the_task(store: str) -> None:
    """A session that failed before, retried once here and failing again: the error counts
    the extractions this call ran (2: it said 3, counting the one before) and names the
    task that failed."""
    sid = await _failed_session(store)
    llm = FakeLLM()
    llm.fail_tasks.add("semantic")
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        with pytest.raises(mnemo.PipelineError, match="failed 2 times in this call") as caught:
            await mem.close_and_commit(sid, max_retries=2)
    assert "'semantic'" in str(caught.value)
    assert isinstance(caught.value.__cause__, LLMError)


def test_an_attempt_may_take_what_the_work_has_left() -> None:
    """An adapter given no timeout lets one attempt take 60 s, or what the work it serves has
    left when longer; a timeout given is a hard cap."""

    async def main() -> None:
        free = Transport("http://x", name="x", error=LLMError)
        capped = Transport("http://x", name="x", error=LLMError, timeout=5.0)
        assert free.attempt_timeout() == DEFAULT_TIMEOUT
        with fail_after(900.0):
            assert free.attempt_timeout() == pytest.approx(900.0, abs=5)
            assert capped.attempt_timeout() == 5.0
        with fail_after(10.0):
            assert free.attempt_timeout() == DEFAULT_TIMEOUT
        await free.aclose()
        await capped.aclose()

    anyio.run(main)


@pytest.mark.slow
async def test_close_and_commit_waits_while_the_queued_calls_are_answered(store: str) -> None:
    """Three trajectories' six calls through one slot of a model taking 0.7 s each: 4.2 s of
    wall time, twice the 2.1 s close_and_commit waits for an extraction_timeout of 1 s; it
    keeps waiting while calls are answered, and every trajectory's own deadline counts only
    its calls' work, not their wait for the slot."""
    llm = Timed(0.7)
    config = mnemo.Config(extraction_timeout=1.0, llm_concurrency=1)
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO, config=config)
        sid = await mem.start_session("explore the house", repo=REPO)
        llm.seconds = 0.0
        for observation, action in [("walk north", "go north"), ("open door", "push door"),
                                    ("climb stairs", "go up")]:
            await mem.append(sid, observation, action)
        llm.seconds = 0.7
        receipt = await mem.close_and_commit(sid, max_retries=0)
        facts = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])
    assert receipt.node_ids
    assert len(facts) == 3


@asynccontextmanager
async def served_session(
    store: str, server: ProviderServer, config: mnemo.Config
) -> AsyncIterator[tuple[mnemo.OpenAICompatible, mnemo.Memory, str]]:
    """A Memory on `store` whose model is `server`'s, and a session of its repo."""
    llm = mnemo.OpenAICompatible("m", base_url=server.openai_url)
    async with llm, mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO, config=config)
        yield llm, mem, await mem.start_session("explore the house", repo=REPO)


@pytest.mark.slow
async def test_a_server_that_slows_mid_session_loses_no_step(store: str) -> None:
    """A local server (one slot) answering fast, then slowing to a few tokens a second (for
    replies of tens of tokens) mid-session, past what append_timeout allows a step: every
    append returns, the slow ones with their step stored but not annotated yet; no step is
    lost, and close_and_commit (the server fast again, a slow reply still under way)
    annotates them in order and commits them all."""
    steps = [("walk north", "go north"), ("walk east", "go east"), ("open the door", "push"),
             ("open the window", "lift"), ("climb the stairs", "go up")]
    config = mnemo.Config(append_timeout=0.5, extraction_timeout=60.0)
    with ProviderServer(slots=1, tokens_per_second=1000.0) as server:
        async with served_session(store, server, config) as (_, mem, sid):
            infos = [await mem.append(sid, *step) for step in steps[:2]]
            server.tokens_per_second = 20.0
            infos += [await mem.append(sid, *step) for step in steps[2:]]
            server.tokens_per_second = 1000.0
            receipt = await mem.close_and_commit(sid)
            [episode] = await mem.episodes(sid)
            facts = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.EPISODIC])
    assert [i.index for i in infos] == [0, 1, 2, 3, 4]
    assert not all(i.annotated for i in infos[2:])
    assert all(i.trajectory_id is None for i in infos if not i.annotated)
    assert receipt.node_ids
    assert [s.line for s in episode.steps] == [f"{o} -> {a}" for o, a in steps]
    assert all(s.annotated and s.committed_in for s in episode.steps)
    assert len(facts) == len(steps)


async def test_a_close_waits_for_a_steps_annotation_within_the_extractions_time(
    store: str,
) -> None:
    """A step whose model answers neither within its append nor within the close's
    extraction_timeout: the append returns it unannotated, the close fails, the step kept
    unannotated; retried once the model answers, the close annotates and commits it."""
    llm = FakeLLM()
    held = llm.hold("state")
    config = mnemo.Config(append_timeout=0.1, extraction_timeout=0.5)
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO, config=config)
        sid = await mem.start_session("explore", repo=REPO)
        info = await mem.append(sid, "walk north", "go north")
        assert (info.index, info.annotated, info.trajectory_id) == (0, False, None)
        with pytest.raises(mnemo.PipelineError, match=r"not annotated|annotation timed out"):
            await mem.close_and_commit(sid, max_retries=0)
        assert await mem.session_state(sid) is mnemo.State.FAILED
        [episode] = await mem.episodes(sid)
        assert [(s.line, s.annotated) for s in episode.steps] == [
            ("walk north -> go north", False)]
        held.release()
        receipt = await mem.close_and_commit(sid)
        [episode] = await mem.episodes(sid)
    assert receipt.node_ids
    assert [(s.annotated, bool(s.committed_in)) for s in episode.steps] == [(True, True)]


@pytest.mark.slow
async def test_an_extraction_on_a_server_measured_slow_gets_the_time_its_calls_need(
    store: str,
) -> None:
    """A server measured slow (50 tokens a second: each extraction call takes longer than
    the whole extraction_timeout of 0.3 s allows): each request is given the time the
    speed says it needs, and so is the extraction it serves; the close commits every step
    (with the fixed deadline, "took more than 0.3 s of its calls' time")."""
    steps = [("walk north", "go north"), ("walk east", "go east")]
    config = mnemo.Config(append_timeout=30.0, extraction_timeout=0.3)
    with ProviderServer(slots=1, tokens_per_second=50.0) as server:
        async with served_session(store, server, config) as (llm, mem, sid):
            infos = [await mem.append(sid, *step) for step in steps]  # measured meanwhile
            assert llm.concurrency.unit_seconds is not None
            receipt = await mem.close_and_commit(sid, max_retries=0)
            [episode] = await mem.episodes(sid)
    assert all(i.annotated for i in infos)
    assert receipt.node_ids
    assert all(s.committed_in for s in episode.steps)


@pytest.mark.slow
async def test_a_close_waits_while_the_steps_keep_being_annotated(store: str) -> None:
    """Six steps appended faster than their model annotates them (each under 1 s, the six
    past the close's extraction_timeout of 2 s): the close waits while steps keep being
    annotated, at most that long for each, and commits them all."""
    llm = Timed(0.5)
    config = mnemo.Config(append_timeout=0.05, extraction_timeout=2.0)
    steps = [("walk north", "go north"), ("walk east", "go east"), ("open the door", "push"),
             ("open the window", "lift"), ("climb the stairs", "go up"), ("sit down", "sit")]
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO, config=config)
        sid = await mem.start_session("explore", repo=REPO)
        infos = [await mem.append(sid, *step) for step in steps]
        receipt = await mem.close_and_commit(sid, max_retries=0)
        [episode] = await mem.episodes(sid)
    assert not all(i.annotated for i in infos)
    assert receipt.node_ids
    assert all(s.annotated and s.committed_in for s in episode.steps)
