"""Every request mnemo builds carries a max_tokens sized to its task."""

from __future__ import annotations

import pytest

from mnemo.conversation.prompts import eviction_request, fold_request, summary_request
from mnemo.episode import reward_request, state_request, subgoal_request
from mnemo.extraction.prompts import (
    merge_intent_request,
    procedural_request,
    return_request,
    semantic_request,
)
from mnemo.memoryfiles.prompts import (
    memory_condense_request,
    memory_persist_request,
    memory_update_request,
)
from mnemo.ports import LLMRequest
from mnemo.recall.tasks import plan_request, synthesis_request

STEP = {"index": 0, "observation": "nginx listens on 8080", "action": "curl localhost:8080"}
INSTRUCTION = {"index": 0, "intent": "i", "condition": "c", "instruction": "x",
               "expected_outcome": "o"}


def every_request(steps: int) -> list[LLMRequest]:
    many = [dict(STEP, index=i) for i in range(steps)]
    return [
        state_request(goal="g", observation="o", action="a", previous_state=None),
        subgoal_request(goal="g", observation="o", action="a", previous_subgoal=None,
                        recent_steps=[]),
        reward_request(goal="g", subgoal="s", observation="o", action="a",
                       next_observation="n"),
        semantic_request(goal="g", subgoal="s", steps=many),
        procedural_request(goal="g", subgoal="s", steps=many),
        return_request(goal="g", subgoal="s", instructions=[INSTRUCTION] * steps, steps=many),
        merge_intent_request(existing="a", new="b"),
        plan_request(query="q"),
        synthesis_request(query="q", memories=["m"]),
        summary_request(previous_summary="", messages=[], max_words=100),
        fold_request(snapshots=[], max_words=100),
        eviction_request(zone="z", middle="", recent="", zone_start=0, zone_end=1, goals=[],
                         previous_snapshot="", max_words=100, done=[]),
        memory_update_request(conversation=[], files=[]),
        memory_persist_request(statement="s", files=[]),
        memory_condense_request(topic="t", description="d", entries=["e"], max_chars=4000),
    ]


@pytest.mark.parametrize("steps", [1, 40])
def test_every_task_asks_for_a_bounded_reply(steps: int) -> None:
    """Each task's request sets max_tokens, within the adapters' default cap of 4096."""
    for request in every_request(steps):
        assert request.max_tokens is not None, request.task
        assert 64 <= request.max_tokens <= 4096, (request.task, request.max_tokens)


def test_list_tasks_grow_with_their_inputs() -> None:
    """Tasks that answer per step or per instruction get more room for more of them."""
    small = {r.task: r.max_tokens for r in every_request(1)}
    large = {r.task: r.max_tokens for r in every_request(8)}
    for task in ("semantic", "procedural", "return"):
        assert large[task] > small[task], task  # type: ignore[operator]
