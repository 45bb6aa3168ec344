"""Every request mnemo builds carries a max_tokens sized to its task, and a schema whose
longest reply fits it."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest

from mnemo.adapters.openai import OpenAICompatible
from mnemo.calls.schema import most_tokens
from mnemo.calls.tasks import ask
from mnemo.conversation.prompts import (
    eviction_request,
    fold_request,
    parse_summary,
    summary_request,
)
from mnemo.episode import reward_request, state_request, subgoal_request
from mnemo.extraction.contradiction import contradiction_request
from mnemo.extraction.prompts import (
    merge_intent_request,
    merge_intents_request,
    procedural_request,
    return_request,
    semantic_request,
)
from mnemo.graph.contradiction import Question
from mnemo.memoryfiles.prompts import (
    memory_condense_request,
    memory_persist_request,
    memory_update_request,
    parse_condense,
    parse_persist,
)
from mnemo.ports import LLMRequest, LLMResponse
from mnemo.recall.tasks import (
    parse_plan,
    parse_rerank,
    parse_synthesis,
    plan_request,
    rerank_request,
    synthesis_request,
)
from tests.adapters.provider_server import LONGEST, Answer, ProviderServer

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
        merge_intents_request([("a", "b")] * steps),
        plan_request(query="q"),
        synthesis_request(query="q", memories=["m"]),
        rerank_request(query="q", memories=["m"] * min(steps, 20)),
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


@pytest.mark.parametrize("steps", [1, 40])
def test_every_task_s_longest_reply_fits_its_max_tokens(steps: int) -> None:
    """Each task's schema bounds every string and list, so that a model a server's grammar holds
    to it ends, and its max_tokens holds the longest reply the schema allows (up to the cap)."""
    contradiction, _ = contradiction_request([Question(new="n", existing=("e",) * steps)])
    eviction = partial(eviction_request, zone="z", middle="", recent="", zone_start=0,
                       zone_end=1, goals=[], previous_snapshot="", max_words=100, done=[])
    as_data = eviction(as_data=True)
    # The eviction's tools go without a schema (`as_data` is theirs); their arguments are bounded.
    sized = [(r.task, most_tokens(r.schema), r.max_tokens or 0)
             for r in [*every_request(steps), contradiction, as_data] if r.schema is not None]
    assert [task for task, longest, _ in sized if longest is None] == []
    tools = [(tool["name"], tool["parameters"]) for tool in eviction().tools or []]
    assert [name for name, arguments in tools
            if not isinstance(arguments, dict) or most_tokens(arguments) is None] == []
    # Past the 4096 cap, a list reply cut short keeps its whole items (`salvage`).
    assert [(task, longest, max_tokens) for task, longest, max_tokens in sized
            if longest is not None and longest > max_tokens < 4096] == []


LONGEST_TASKS: list[tuple[LLMRequest, Callable[[LLMResponse], object]]] = [
    (memory_persist_request(statement="The staging database is orders_stage on port 5433.",
                            files=[]), parse_persist),
    (memory_condense_request(topic="db", description="d", entries=["- a", "- b"],
                             max_chars=300), lambda r: parse_condense(r, max_chars=300)),
    (summary_request(previous_summary="", messages=[], max_words=100),
     lambda r: parse_summary(r, max_words=100)),
    (fold_request(snapshots=[], max_words=100), lambda r: parse_summary(r, max_words=100)),
    (synthesis_request(query="q", memories=["m"]), parse_synthesis),
    (plan_request(query="q"), parse_plan),
    (rerank_request(query="q", memories=["m"] * 20), parse_rerank),
]


async def test_a_model_writing_its_longest_replies_is_read_in_one_call() -> None:
    """A model writing the longest reply each schema allows (a small model that runs on under a
    server's grammar) ends within the request's max_tokens: one call a task, read."""
    with ProviderServer(context=1_000_000) as server:
        for request, _ in LONGEST_TASKS:
            server.answer_task(str(request.task), Answer(data=LONGEST))
        async with OpenAICompatible("m", base_url=server.openai_url, api_key="k",
                                    max_retries=0) as llm:
            for request, parse in LONGEST_TASKS:
                assert await ask(llm, request, parse), request.task
        tasks = server.tasks()
    assert tasks == [request.task for request, _ in LONGEST_TASKS]
