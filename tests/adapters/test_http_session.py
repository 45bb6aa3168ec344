"""End to end over a real socket: a `Memory` session whose every LLM task (and, in one test,
every embedding) is answered by the local `ProviderServer`, healthy or flaky."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import mnemo
from mnemo import NodeType
from mnemo.adapters.anthropic import Anthropic
from mnemo.adapters.embeddings import OpenAIEmbedder
from mnemo.adapters.openai import OpenAICompatible
from mnemo.calls.retry import Backoff
from mnemo.ports import LLM, Embedder
from tests.adapters.provider_server import Answer, Fail, ProviderServer, rate_limited
from tests.fakes import FakeEmbedder

REPO = "r"
# First words decide the trajectories: the server's subgoal is the observation's first word.
STEPS = [
    ("walk north along the corridor", "go north"),
    ("walk south past the kitchen", "go south"),
    ("open door to the garden", "pull the handle"),
]
FAST = Backoff(base=0.001, cap=0.01)


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as s:
        yield s


async def record_and_commit(mem: mnemo.Memory) -> str:
    """Opens a repo, records STEPS in one episode, closes and commits; the session's id."""
    await mem.open_repo(REPO)
    sid = await mem.start_session("explore the house", repo=REPO)
    for observation, action in STEPS:
        await mem.append(sid, observation, action)
    receipt = await mem.close_and_commit(sid)
    assert receipt.node_ids
    return sid


async def run_session(llm: LLM, embedder: Embedder) -> dict[NodeType, list[mnemo.Node]]:
    """`record_and_commit` in a new Memory; the nodes by type."""
    async with mnemo.Memory(":memory:", llm=llm, embedder=embedder) as mem:
        await record_and_commit(mem)
        types = (NodeType.EPISODIC, NodeType.SEMANTIC, NodeType.PROCEDURAL, NodeType.SUBGOAL)
        return {kind: await mem.get_nodes_by_type(REPO, [kind]) for kind in types}


def assert_nothing_lost(nodes: dict[NodeType, list[mnemo.Node]]) -> None:
    """Every step, and the one fact and one procedure the server extracts per step, is there."""
    assert sorted(n.text for n in nodes[NodeType.SEMANTIC]) == sorted(
        f"The agent observed: {obs}" for obs, _ in STEPS
    )
    assert sorted(n.text for n in nodes[NodeType.PROCEDURAL]) == sorted(a for _, a in STEPS)
    assert len(nodes[NodeType.EPISODIC]) == len(STEPS)
    assert sorted(n.text for n in nodes[NodeType.SUBGOAL]) == ["open", "walk"]


def test_the_fake_embedder_separates_the_trajectories() -> None:
    """The two subgoals land on different axes, so they form two trajectories."""
    embedder = FakeEmbedder()
    assert embedder.axis("walk") != embedder.axis("open")


async def test_session_through_openai_compatible(server: ProviderServer) -> None:
    """Every task goes over HTTP; the committed graph holds every step, fact and procedure."""
    async with OpenAICompatible("m", base_url=server.openai_url) as llm:
        nodes = await run_session(llm, FakeEmbedder())
    assert_nothing_lost(nodes)
    tasks = set(server.tasks())
    assert {"state", "subgoal", "reward", "semantic", "procedural", "return"} <= tasks
    assert llm.total_usage.input_tokens > 0


@pytest.mark.parametrize("adapter", ["openai", "anthropic"])
async def test_an_unusable_reward_is_the_neutral_half(
    server: ProviderServer, adapter: str
) -> None:
    """The API contract: a step's reward is 0.5 when it cannot be parsed. A reward of
    {"reward": "very good"} scores every step 0.5 and the session commits, each step's reward
    asked once (the reward's reader never refuses a reply, so nothing is re-asked); the last
    step is scored by the procedural task, whose score reads "very good" as none, so the
    "reward" task is asked for it too."""
    server.answer_task("reward", Answer(data={"reward": "very good"}))
    server.last_reward = "very good"
    llm: OpenAICompatible | Anthropic = (
        OpenAICompatible("m", base_url=server.openai_url) if adapter == "openai"
        else Anthropic("m", base_url=server.url, api_key="k")
    )
    async with llm, mnemo.Memory(":memory:", llm=llm, embedder=FakeEmbedder()) as mem:
        [episode] = await mem.episodes(await record_and_commit(mem))
    assert [step.reward for step in episode.steps] == [0.5] * len(STEPS)
    assert server.tasks().count("reward") == len(STEPS)


async def test_flaky_provider_loses_nothing(server: ProviderServer) -> None:
    """With every third request rate-limited and 6 calls per task, nothing is lost."""
    # 6, not the default 3: concurrent tasks share the failures, so 3 could all land on one.
    server.every_nth_fails = 3
    server.flaky = rate_limited("0")
    async with OpenAICompatible(
        "m", base_url=server.openai_url, backoff=FAST, max_retries=5
    ) as llm:
        nodes = await run_session(llm, FakeEmbedder())
    assert_nothing_lost(nodes)
    assert server.statuses.count(429) >= 5


async def test_flaky_5xx_provider_loses_nothing(server: ProviderServer) -> None:
    """With every other request failing with a 503 and 6 calls per task, nothing is lost."""
    server.every_nth_fails = 2
    server.flaky = Fail(503, "try again")
    async with OpenAICompatible(
        "m", base_url=server.openai_url, backoff=FAST, max_retries=5
    ) as llm:
        nodes = await run_session(llm, FakeEmbedder())
    assert_nothing_lost(nodes)


async def test_server_without_json_schema(server: ProviderServer) -> None:
    """A server that refuses json_schema (older Ollama, vLLM, llama.cpp) still works: the
    adapter switches to a forced tool once, and keeps it."""
    server.json_schema = False
    async with OpenAICompatible("m", base_url=server.openai_url) as llm:
        nodes = await run_session(llm, FakeEmbedder())
    assert_nothing_lost(nodes)
    assert llm.structured_mode == "tool"
    assert server.statuses.count(400) <= 3  # only the calls already in flight when it switched


async def test_session_through_anthropic(server: ProviderServer) -> None:
    """The same session through the Messages API."""
    async with Anthropic("claude-test", api_key="k", base_url=server.url) as llm:
        nodes = await run_session(llm, FakeEmbedder())
    assert_nothing_lost(nodes)
    assert {r.path for r in server.requests} == {"/v1/messages"}


async def test_session_with_http_embeddings(server: ProviderServer) -> None:
    """LLM and embeddings both over HTTP; the dimension is detected before the repo opens."""
    async with (
        OpenAICompatible("m", base_url=server.openai_url) as llm,
        OpenAIEmbedder("e", base_url=server.openai_url) as embedder,
    ):
        assert await embedder.detect_dim() == server.dim
        nodes = await run_session(llm, embedder)
    assert_nothing_lost(nodes)
    assert any(r.path == "/v1/embeddings" for r in server.requests)


TRIP = mnemo.Trajectory("explore the house", [mnemo.Step(obs, act) for obs, act in STEPS])


async def test_a_memory_leaves_the_adapters_it_was_given_open(
    server: ProviderServer, store: str, tmp_path: Path
) -> None:
    """Two Memories share one LLM and one embedder over HTTP: the first closing leaves them
    open for the second's ingest, and for `MemoryFiles.update` once both have closed."""
    async with (
        OpenAICompatible("m", base_url=server.openai_url) as llm,
        OpenAIEmbedder("e", base_url=server.openai_url) as embedder,
    ):
        async with mnemo.Memory(store, llm=llm, embedder=embedder) as second:
            async with mnemo.Memory(store, llm=llm, embedder=embedder) as first:
                await first.open_repo(REPO)
                assert (await first.ingest(REPO, TRIP, source_id="first")).node_ids
            await second.open_repo(REPO)
            assert (await second.ingest(REPO, TRIP, source_id="second")).node_ids
        files = mnemo.MemoryFiles(tmp_path / "files", min_iterations=1)
        history = [{"role": "user", "content": "We deploy on Tuesdays."},
                   {"role": "assistant", "content": "Noted."}]
        update = await files.update(history, llm=llm, iterations=1)
        assert update.error is None
        assert update.written


async def test_a_memory_leaves_the_overrides_it_was_given_open(
    server: ProviderServer, store: str
) -> None:
    """The models given to `open_repo` and to `start_session` stay open once the Memory has
    closed: their owner may use them again."""
    async with (
        OpenAICompatible("repo", base_url=server.openai_url) as repo_llm,
        OpenAICompatible("session", base_url=server.openai_url) as session_llm,
        OpenAIEmbedder("e", base_url=server.openai_url) as embedder,
    ):
        async with mnemo.Memory(store) as mem:
            await mem.open_repo(REPO, llm=repo_llm, embedder=embedder)
            sid = await mem.start_session("explore the house", repo=REPO, llm=session_llm)
            await mem.append(sid, *STEPS[0])
            await mem.close_and_commit(sid)
            await mem.end_session(sid)
        async with mnemo.Memory(store, llm=session_llm, embedder=embedder) as again:
            await again.open_repo(REPO, llm=repo_llm)
            assert (await again.ingest(REPO, TRIP, source_id="again")).node_ids
