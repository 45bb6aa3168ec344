"""Usage is summed per session and repo, calls, retries and re-asks included; a Memory closes
the adapters it built, never those it was given, and an embedder that learns its dimension is
asked to before the repo records it."""

from __future__ import annotations

import numpy as np
import pytest

import mnemo
from mnemo.adapters.openai import OpenAICompatible
from mnemo.calls.retry import Backoff
from tests.adapters.provider_server import ProviderServer, rate_limited
from tests.conftest import REPO
from tests.fakes import FakeEmbedder, FakeLLM


async def test_usage_is_summed_per_session_and_repo(mem: mnemo.Memory, llm: FakeLLM) -> None:
    """Every LLM reply's usage (the fake reports 1 in, 1 out) is booked to its session and
    repo."""
    sid = await mem.start_session("explore", repo=REPO)
    await mem.append(sid, "walk north", "go north")
    after_append = mem.usage(sid)
    assert after_append.input_tokens == len(llm.calls)
    await mem.close_and_commit(sid)
    calls = len(llm.calls)
    assert mem.usage(sid) == mnemo.Usage(calls, calls)
    assert mem.usage(repo=REPO) == mnemo.Usage(calls, calls)
    assert mem.usage("session_unknown") == mnemo.Usage()
    assert mem.usage() == mnemo.Usage(calls, calls)
    assert (mem.usage(sid).calls, mem.usage().retries, mem.usage().re_asks) == (calls, 0, 0)


async def test_usage_counts_conversation_memorys_calls_in_the_total(
    mem: mnemo.Memory, llm: FakeLLM
) -> None:
    """An eviction's model calls count in `usage()`'s total (booked to no repo or session)."""
    history = [{"role": "user", "content": f"step {i}: deploy billing"} for i in range(12)]
    await mem.conversation().save("t", history)
    result = await mem.evict("t", token_budget=4000, eviction_fraction=0.5)
    assert result.usage is not None
    assert len(llm.calls) > 0
    assert mem.usage() == mnemo.Usage(len(llm.calls), len(llm.calls))
    assert mem.usage().calls == len(llm.calls)
    assert mem.usage(repo=REPO) == mnemo.Usage()


def test_usage_adds_call_counts_and_compares_what_was_spent() -> None:
    """`+` sums tokens, cost and the call counts; equality looks at tokens and cost only."""
    first = mnemo.Usage(1, 2, 0.5, calls=2, retries=1, re_asks=0)
    second = mnemo.Usage(3, 4, None, calls=3, retries=0, re_asks=2)
    total = first + second
    assert (total.input_tokens, total.output_tokens, total.cost) == (4, 6, 0.5)
    assert (total.calls, total.retries, total.re_asks) == (5, 1, 2)
    assert total == mnemo.Usage(4, 6, 0.5)


class OnceGarbledLLM(FakeLLM):
    """Answers the first "subgoal" task with something that is not JSON, then correctly."""

    def __init__(self) -> None:
        super().__init__()
        self.garbage_tasks.add("subgoal")

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        response = await super().generate(request)
        if request.task == "subgoal":
            self.garbage_tasks.discard("subgoal")
        return response


async def test_usage_counts_the_reask_of_an_unusable_reply(store: str) -> None:
    """An unusable reply asked again shows as one more call and one re-ask in mem.usage()."""
    llm = OnceGarbledLLM()
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        sid = await mem.start_session("explore", repo=REPO)
        await mem.append(sid, "walk north", "go north")
        usage = mem.usage(sid)
    assert llm.tasks().count("subgoal") == 2
    assert (usage.calls, usage.retries, usage.re_asks) == (len(llm.calls), 0, 1)


async def test_usage_counts_transport_retries(store: str) -> None:
    """A 429 retried by the adapter is booked in mem.usage(): every request is a call."""
    with ProviderServer() as server:
        server.script(rate_limited("0"))
        async with (
            OpenAICompatible(
                "m", base_url=server.openai_url, backoff=Backoff(base=0.001, cap=0.01)
            ) as llm,
            mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem,
        ):
            await mem.open_repo(REPO)
            sid = await mem.start_session("explore", repo=REPO)
            await mem.append(sid, "walk north", "go north")
            await mem.close_and_commit(sid)
            usage = mem.usage()
    assert server.statuses.count(429) == 1
    assert (usage.calls, usage.retries, usage.re_asks) == (len(server.requests), 1, 0)


async def test_usage_counts_no_call_the_retry_after_gate_refused(store: str) -> None:
    """After a 429 asking for 90 s (past max_retry_after), the appends that fail at the gate
    sent nothing, and `usage().calls` counts the one request the server got."""
    with ProviderServer() as server:
        server.script(rate_limited("90"))
        async with (
            OpenAICompatible("m", base_url=server.openai_url) as llm,
            mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem,
        ):
            await mem.open_repo(REPO)
            sid = await mem.start_session("explore", repo=REPO)
            for _ in range(3):
                with pytest.raises(mnemo.LLMError):
                    await mem.append(sid, "walk north", "go north")
            usage = mem.usage()
    assert server.statuses == [429]
    assert (usage.calls, usage.retries) == (1, 0)


class ClosingEmbedder(FakeEmbedder):
    """An embedder with an HTTP client to close, that learns its dimension late."""

    def __init__(self) -> None:
        super().__init__(dim=0)
        self.closed = 0
        self.detected = False

    async def detect_dim(self) -> int:
        self.dim, self.detected = 8, True
        return self.dim

    async def aclose(self) -> None:
        self.closed += 1


class ClosingLLM(FakeLLM):
    def __init__(self) -> None:
        super().__init__()
        self.closed = 0

    async def aclose(self) -> None:
        self.closed += 1


async def test_a_memory_closes_the_adapters_it_built_and_no_other(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The models given to a Memory, to open_repo and to start_session stay open (their owner
    closes them); an adapter the Memory built from a repo's recorded URI is closed once with
    it."""
    closed: list[str] = []
    close = OpenAICompatible.aclose

    async def recorded(adapter: OpenAICompatible) -> None:
        closed.append(adapter.name)
        await close(adapter)

    monkeypatch.setattr(OpenAICompatible, "aclose", recorded)
    llm, repo_llm, session_llm = ClosingLLM(), ClosingLLM(), ClosingLLM()
    embedder = ClosingEmbedder()
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem:
        await mem.open_repo("a", llm=repo_llm, embedder=embedder)
        await mem.open_repo("a", llm=repo_llm, embedder=embedder)
        assert embedder.detected
        sid = await mem.start_session("explore", repo="a", llm=session_llm)
        await mem.append(sid, "walk north", "go north")
    assert (llm.closed, repo_llm.closed, session_llm.closed, embedder.closed) == (0, 0, 0, 0)

    given = OpenAICompatible("m", base_url="http://127.0.0.1:9/v1")
    async with mnemo.Memory(store, llm=given, embedder=FakeEmbedder()) as mem:
        await mem.open_repo("b")  # records the URI of `given`
    assert closed == []
    async with mnemo.Memory(store, embedder=FakeEmbedder()):
        pass  # runs repo b's recorded LLM: an adapter of its own
    assert closed == [given.name]
    await given.aclose()


async def test_a_repo_reopened_with_an_embedder_of_another_dimension_is_refused(
    store: str,
) -> None:
    """A repo written with 8-dimensional vectors, reopened under a 16-dimensional default,
    refuses recall, ingest and new sessions with an EmbeddingError naming both dimensions;
    reads that need no embedding still work."""
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder(8)) as mem:
        await mem.open_repo(REPO)
        sid = await mem.start_session("explore", repo=REPO)
        await mem.append(sid, "walk north", "go north")
        await mem.close_and_commit(sid)
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder(16)) as mem:
        assert await mem.get_nodes_by_type(REPO, [mnemo.NodeType.EPISODIC])
        for attempt in (
            mem.recall(REPO, "walk"),
            mem.start_session("again", repo=REPO),
            mem.ingest(REPO, mnemo.Trajectory("g", [mnemo.Step("o", "a")]), source_id="s"),
        ):
            with pytest.raises(mnemo.EmbeddingError, match=r"dimension 8.*dimension 16"):
                await attempt


async def test_a_repo_opened_with_another_embedder_of_its_dimension_says_so(
    store: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A repo written by one embedder, opened with another of the same dimension (OpenAI's
    ada-002 and 3-small are both 1536): recall would compare two spaces, so a warning names
    both and `reembed`; the same embedder again says nothing."""
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=mnemo.HashEmbedder(dim=8)) as mem:
        await mem.open_repo(REPO)
        await mem.ingest(REPO, mnemo.Trajectory("g", [mnemo.Step("walk north", "go")]),
                         source_id="s")
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=mnemo.HashEmbedder(dim=8)) as mem:
        await mem.open_repo(REPO)
    assert "vectors were made by" not in caplog.text
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder(8)) as mem:
        await mem.open_repo(REPO)
    said = [r.getMessage() for r in caplog.records if "vectors were made by" in r.getMessage()]
    assert len(said) == 1
    assert "made by hash2:8, and tests.fakes.FakeEmbedder is given" in said[0]
    assert "reembed" in said[0]
    caplog.clear()
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder(8)) as mem:
        await mem.open_repo(REPO, embedder=mnemo.HashEmbedder(dim=8))  # given to the repo
    said = [r.getMessage() for r in caplog.records if "vectors were made by" in r.getMessage()]
    assert len(said) == 1
    assert "made by tests.fakes.FakeEmbedder, and hash2:8 is given" in said[0]


async def test_a_managers_model_given_back_to_evict_is_counted_once(
    mem: mnemo.Memory, llm: FakeLLM
) -> None:
    """`mem.evict(..., llm=manager.llm)`: the manager's model, metered already, is not metered
    a second time."""
    history = [{"role": "user", "content": f"step {i}: deploy billing"} for i in range(12)]
    manager = mem.conversation()
    await manager.save("t", history)
    await mem.evict("t", token_budget=4000, eviction_fraction=0.5, llm=manager.llm)
    assert mem.usage().calls == len(llm.calls)
    assert mem.usage() == mnemo.Usage(len(llm.calls), len(llm.calls))


async def test_an_embedder_whose_dim_is_a_numpy_integer_opens_and_reembeds(store: str) -> None:
    """`dim` as a numpy integer (`vectors.shape[1]`, an array's item) is accepted as its number:
    the repo's record holds the int, so the store reads back after ingest and re-embed."""
    numpy_dim = FakeEmbedder(8)
    numpy_dim.dim = np.int64(8)  # type: ignore[assignment]
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=numpy_dim) as mem:
        await mem.open_repo(REPO)
        await mem.ingest(REPO, mnemo.Trajectory("g", [mnemo.Step("walk north", "go")]),
                         source_id="s")
        assert (await mem.recall(REPO, "walk")).memories
        wider = FakeEmbedder(16)
        wider.dim = np.int64(16)  # type: ignore[assignment]
        assert await mem.reembed(REPO, embedder=wider)
        assert (await mem.recall(REPO, "walk")).memories
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder(16)) as mem:
        assert (await mem.recall(REPO, "walk")).memories
