"""A provider that answers exactly the shapes the API contract documents, and one that answers
in JSON mode, held by no grammar: every task mnemo asks goes through the HTTP adapters to it,
end to end through `Memory` (a session closed and committed, an ingest, a recall that plans,
re-ranks and reasons, a conversation's eviction through its tools), on both backends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import mnemo
from mnemo import NodeType
from mnemo.adapters.anthropic import Anthropic
from mnemo.adapters.hashing import HashEmbedder
from mnemo.adapters.openai import OpenAICompatible
from tests.adapters.provider_server import ProviderServer

REPO = "r"
STEPS = [
    ("walk north along the corridor", "go north"),
    ("walk south past the kitchen", "go south"),
    ("open door to the garden", "pull the handle"),
]
CONFIG = mnemo.Config(recall_planner="llm", recall_rerank=True, recall_synthesis=True)
# Every task a session, an ingest and a recall ask of the model.
TASKS = {"subgoal", "reward", "semantic", "procedural", "return", "merge_intent",
         "recall_plan", "recall_rerank", "recall_synthesis"}


@pytest.fixture(params=[("openai", "contract"), ("openai", "loose"),
                        ("anthropic", "contract"), ("anthropic", "loose")],
                ids=lambda p: "-".join(p))
def provider(request: pytest.FixtureRequest) -> Iterator[tuple[str, ProviderServer]]:
    adapter, shapes = request.param
    # The loose server answers as JSON mode does: it refuses json_schema and tools, so the
    # OpenAI-compatible adapter falls back to `response_format` json_object.
    loose = shapes == "loose" and adapter == "openai"
    with ProviderServer(shapes=shapes, json_schema=not loose, tools=not loose) as server:
        yield adapter, server


async def test_every_task_accepts_the_documented_shapes(
    store: str, provider: tuple[str, ProviderServer]
) -> None:
    """A session's close and commit, an ingest and a recall with reasoning all succeed on
    replies of exactly the documented shape (no step indices, no score of the last step
    though the procedural request asks for it) or as JSON mode writes them (keys in another
    order, numbers as strings, optional keys left out), through either adapter."""
    adapter, server = provider
    llm: OpenAICompatible | Anthropic = (
        OpenAICompatible("m", base_url=server.openai_url) if adapter == "openai"
        else Anthropic("m", base_url=server.url, api_key="k"))
    async with llm, mnemo.Memory(store, llm=llm, embedder=HashEmbedder(), config=CONFIG) as mem:
        await mem.open_repo(REPO)
        sid = await mem.start_session("explore the house", repo=REPO)
        for observation, action in STEPS:
            await mem.append(sid, observation, action)
        committed = await mem.close_and_commit(sid)
        # Its procedure's intent is close to one of the session's (cosine 0.81 with the
        # hashed embedder): the two are merged.
        ingested = await mem.ingest(REPO, mnemo.Trajectory("explore the house again", [
            mnemo.Step("walk north to the attic", "go north fast")]), source_id="again")
        result = await mem.recall(REPO, "walk north", k=3)
        await mem.conversation().save("t", [
            {"role": "user", "content": f"step {i}: deploy the billing service"}
            for i in range(12)])
        evicted = await mem.evict("t", token_budget=4000, eviction_fraction=0.5)
        procedures = await mem.get_nodes_by_type(REPO, [NodeType.PROCEDURAL])
        [episode] = await mem.episodes(sid)
    assert committed.node_ids
    assert ingested.node_ids
    assert sorted(n.text for n in procedures) == sorted([a for _, a in STEPS] + ["go north fast"])
    # The last step, unscored by the procedural reply, was scored by the "reward" task.
    assert all(step.reward == pytest.approx(0.8) for step in episode.steps)
    assert result.degraded == []
    assert result.reasoned is not None
    assert result.reasoned.startswith("As memory [1] says")
    assert evicted.error is None
    assert evicted.snapshot is not None
    assert TASKS <= set(server.tasks())
    if server.shapes == "loose" and isinstance(llm, OpenAICompatible):
        assert llm.structured_mode == "json"
