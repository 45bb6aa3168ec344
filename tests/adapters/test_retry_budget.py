"""One retry budget per task (`mnemo.calls.retry`): transport retries, the adapter's retries of
a cut reply and `calls.tasks.ask`'s re-asks all draw on it, so no layer multiplies another.

Adapters run over `httpx.MockTransport`; waits go through a `VirtualClock`, so no test sleeps.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest

from mnemo.adapters.anthropic import Anthropic
from mnemo.adapters.openai import OpenAICompatible
from mnemo.calls.retry import (
    Backoff,
    Budget,
    LimitedLLM,
    RetryPolicy,
    SystemClock,
    policy_from,
)
from mnemo.calls.tasks import ask
from mnemo.episode import parse_subgoal, subgoal_request
from mnemo.errors import InvalidInputError, LLMError, LLMTimeout
from mnemo.extraction.prompts import parse_facts, semantic_request
from mnemo.ports import LLMRequest, LLMResponse, Usage
from tests.adapters.provider_server import VirtualClock
from tests.fakes import FakeLLM

STEPS = [{"index": 0, "observation": "nginx listens on 8080", "action": "curl localhost:8080"}]
FACT = {"proposition": "Nginx listens on port 8080.", "concepts": ["nginx"], "confidence": 0.9}
GOOD: dict[str, Any] = {"facts": [FACT]}
BAD: dict[str, Any] = {"facts": [{"concepts": []}]}  # no "proposition": the semantic task refuses
FAST = Backoff(base=0.1, jitter=lambda: 1.0)

Reply = tuple[int, dict[str, Any], dict[str, str]]


def semantic() -> LLMRequest:
    return semantic_request(goal="serve the site", subgoal="configure nginx", steps=STEPS)


def data(value: dict[str, Any]) -> Reply:
    """A chat completion whose content is `value` as JSON."""
    message = {"role": "assistant", "content": json.dumps(value)}
    body = {
        "choices": [{"message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5},
    }
    return 200, body, {}


def too_many(retry_after: str) -> Reply:
    return 429, {"error": {"message": "Rate limit reached"}}, {"Retry-After": retry_after}


def failing(status: int = 500) -> Reply:
    return status, {"error": {"message": "upstream broke"}}, {}


class Provider:
    """A MockTransport handler answering from a script, repeating its last reply forever."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(json.loads(request.content))
        status, body, headers = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        return httpx.Response(status, json=body, headers=headers)


@asynccontextmanager
async def openai(
    provider: Callable[[httpx.Request], Any], clock: VirtualClock | SystemClock, **options: Any
) -> AsyncIterator[OpenAICompatible]:
    options.setdefault("backoff", FAST)
    async with OpenAICompatible(
        "m", base_url="http://provider.test/v1", api_key="k", clock=clock,
        transport=httpx.MockTransport(provider), **options,
    ) as adapter:
        yield adapter


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


# ---- calls --------------------------------------------------------------------------------


@pytest.mark.parametrize(("max_calls", "max_re_asks", "requests"),
                         [(1, 1, 1), (3, 5, 3), (5, 9, 5), (5, 2, 3)])
async def test_garbage_through_ask_makes_exactly_the_budgeted_calls(
    clock: VirtualClock, max_calls: int, max_re_asks: int, requests: int
) -> None:
    """A model that keeps answering what the task cannot read is asked until the calls or the
    re-asks run out (whichever first), then LLMError."""
    policy = RetryPolicy(max_calls=max_calls, max_re_asks=max_re_asks)
    provider = Provider(data(BAD))
    async with openai(provider, clock, retry=policy) as llm:
        with pytest.raises(LLMError, match=r"facts\[0\]\.proposition must be a string"):
            await ask(llm, semantic(), parse_facts)
    assert len(provider.requests) == requests


async def test_default_budget_re_asks_a_garbage_reply_once(clock: VirtualClock) -> None:
    """With no policy given, a garbage-answering model is re-asked once (the API contract: "re-ask
    once"): 2 requests, then LLMError naming the problem."""
    provider = Provider(data(BAD))
    async with openai(provider, clock) as llm:
        with pytest.raises(LLMError,
                           match=r"after 2 of 3 calls \(1 of 1 re-asks\).*proposition must"):
            await ask(llm, semantic(), parse_facts)
    assert len(provider.requests) == 2


async def test_a_429_storm_stops_at_the_budget(clock: VirtualClock) -> None:
    """Endless 429s: 3 requests (2 retries after the Retry-After), then LLMError naming 429."""
    provider = Provider(too_many("1"))
    async with openai(provider, clock) as llm:
        with pytest.raises(LLMError, match=r"3 attempts: HTTP 429.*3 of 3 calls"):
            await ask(llm, semantic(), parse_facts)
    assert len(provider.requests) == 3
    assert clock.sleeps == [1.0, 1.0]


async def test_transport_retries_and_reasks_share_the_budget(clock: VirtualClock) -> None:
    """Two 500s spend two of the 3 calls, so the unusable reply after them is not re-asked."""
    provider = Provider(failing(), failing(), data(BAD), data(GOOD))
    async with openai(provider, clock) as llm:
        with pytest.raises(LLMError, match=r"was unusable after 3 of 3 calls"):
            await ask(llm, semantic(), parse_facts)
    assert len(provider.requests) == 3


async def test_anthropic_draws_on_the_same_budget(clock: VirtualClock) -> None:
    """The Anthropic adapter's retries and re-asks count against the one budget too."""
    tool_use = {"type": "tool_use", "id": "t1", "name": "semantic", "input": BAD}
    bad = {"content": [tool_use], "stop_reason": "tool_use",
           "usage": {"input_tokens": 10, "output_tokens": 5}}
    provider = Provider(too_many("0"), (200, bad, {}))
    async with Anthropic(
        "claude", api_key="k", base_url="http://provider.test", clock=clock, backoff=FAST,
        transport=httpx.MockTransport(provider),
    ) as llm:
        with pytest.raises(LLMError, match=r"facts\[0\]\.proposition must be a string"):
            await ask(llm, semantic(), parse_facts)
    assert len(provider.requests) == 3


NO_MESSAGE: Reply = (200, {"id": "x", "object": "chat.completion"}, {})


async def test_a_reply_without_a_message_is_retried_like_other_garbage(
    clock: VirtualClock,
) -> None:
    """A 200 JSON body without choices is retried within the budget (a retry, not a re-ask),
    and the good reply after it is used."""
    provider = Provider(NO_MESSAGE, data(GOOD))
    booked: list[Usage] = []
    async with openai(provider, clock) as adapter:
        llm = LimitedLLM(adapter, anyio.CapacityLimiter(1), booked.append)
        assert await ask(llm, semantic(), parse_facts)
    total = sum(booked, Usage())
    assert (total.calls, total.retries, total.re_asks) == (2, 1, 0)
    assert len(provider.requests) == 2


@pytest.mark.parametrize("structured", [True, False])
async def test_replies_without_a_message_stop_at_the_budget(
    clock: VirtualClock, structured: bool
) -> None:
    """Only bodies without choices, structured or free text: 3 requests, then LLMError naming
    the problem and the budget."""
    provider = Provider(NO_MESSAGE)
    request = semantic() if structured else LLMRequest("state", "s", STEPS, None, None, None)
    async with openai(provider, clock) as llm:
        with pytest.raises(
            LLMError, match=r"3 attempts: HTTP 200 OK: the body is not the reply expected "
            r"\(Object missing required field `choices`\).*3 of 3 calls"
        ):
            await llm.generate(request)
    assert len(provider.requests) == 3


NO_CONTENT: Reply = (200, {"id": "msg", "type": "message"}, {})


@asynccontextmanager
async def anthropic(provider: Provider, clock: VirtualClock) -> AsyncIterator[Anthropic]:
    async with Anthropic(
        "claude", api_key="k", base_url="http://provider.test", clock=clock, backoff=FAST,
        transport=httpx.MockTransport(provider),
    ) as adapter:
        yield adapter


async def test_anthropic_retries_a_reply_without_content(clock: VirtualClock) -> None:
    """A Messages API 200 without a content list is retried; the good reply after it is used."""
    tool_use = {"type": "tool_use", "id": "t1", "name": "semantic", "input": GOOD}
    provider = Provider(NO_CONTENT, (200, {"content": [tool_use], "stop_reason": "tool_use"}, {}))
    async with anthropic(provider, clock) as llm:
        assert (await llm.generate(semantic())).data == GOOD
    assert len(provider.requests) == 2


async def test_anthropic_replies_without_content_stop_at_the_budget(clock: VirtualClock) -> None:
    """Only Messages API bodies without content: 3 requests, then LLMError naming it."""
    provider = Provider(NO_CONTENT)
    async with anthropic(provider, clock) as llm:
        with pytest.raises(LLMError, match=r"3 attempts: HTTP 200 OK: the body is not the reply "
                           r"expected \(Object missing required field `content`\).*3 of 3 calls"):
            await llm.generate(semantic())
    assert len(provider.requests) == 3


# ---- seconds ------------------------------------------------------------------------------


async def test_retry_after_past_the_budget_fails_at_once(clock: VirtualClock) -> None:
    """A Retry-After of an hour, past the task's 120 s, fails at once without waiting."""
    provider = Provider(too_many("3600"))
    async with openai(provider, clock) as llm:
        with pytest.raises(LLMError, match=r"HTTP 429.*asked to wait 3600 s"):
            await llm.generate(semantic())
    assert len(provider.requests) == 1
    assert clock.sleeps == []


async def test_retry_after_past_the_seconds_left_fails_at_once(clock: VirtualClock) -> None:
    """With 10 s per task, a 4 s Retry-After is waited, a following 8 s one (6 s left) is not."""
    provider = Provider(too_many("4"), too_many("8"), data(GOOD))
    async with openai(provider, clock, retry=RetryPolicy(max_seconds=10)) as llm:
        with pytest.raises(LLMError, match=r"wait 8 s \(Retry-After\), past the 6.0 s left"):
            await llm.generate(semantic())
    assert clock.sleeps == [4.0]
    assert len(provider.requests) == 2


async def test_backoff_stops_when_the_seconds_run_out(clock: VirtualClock) -> None:
    """Many calls allowed but 1 s in all: after waiting 0.4 s, a 0.8 s wait no longer fits."""
    policy = RetryPolicy(max_calls=10, max_seconds=1.0)
    backoff = Backoff(base=0.4, jitter=lambda: 1.0)
    provider = Provider(failing(503))
    async with openai(provider, clock, retry=policy, backoff=backoff) as llm:
        with pytest.raises(LLMError, match="HTTP 503"):
            await llm.generate(semantic())
    assert clock.sleeps == [0.4]
    assert len(provider.requests) == 2


async def test_an_attempt_is_cut_to_the_seconds_left() -> None:
    """A provider that never answers is abandoned when the task's seconds run out."""

    async def silent(request: httpx.Request) -> httpx.Response:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with openai(silent, SystemClock(), retry=RetryPolicy(max_seconds=0.05)) as llm:
        with anyio.fail_after(10):
            with pytest.raises(LLMTimeout, match=r"1 attempts: no reply within 0.0"):
                await llm.generate(semantic())


# ---- the offline / fake path ----------------------------------------------------------------


def subgoal() -> LLMRequest:
    return subgoal_request(goal="g", observation="o", action="a", previous_subgoal=None,
                           recent_steps=[])


@pytest.mark.parametrize("max_calls", [1, 2, 4])
async def test_ask_with_a_fake_llm_honours_the_budget(max_calls: int) -> None:
    """An LLM without a transport answering garbage is asked max_calls times (re-asks
    allowed), then LLMError."""
    llm = FakeLLM()
    llm.garbage_tasks.add("subgoal")
    policy = RetryPolicy(max_calls=max_calls, max_re_asks=max_calls)
    with pytest.raises(LLMError, match=rf"unusable after {max_calls} of {max_calls} calls"):
        await ask(llm, subgoal(), parse_subgoal, policy=policy)
    assert len(llm.calls) == max_calls


async def test_an_llms_own_policy_is_used() -> None:
    """An LLM's own `retry_policy` sets its tasks' budget, also behind LimitedLLM."""

    class Patient(FakeLLM):
        retry_policy = RetryPolicy(max_calls=5, max_re_asks=4)

    llm = Patient()
    llm.garbage_tasks.add("subgoal")
    with pytest.raises(LLMError):
        await ask(LimitedLLM(llm, anyio.CapacityLimiter(1)), subgoal(), parse_subgoal)
    assert len(llm.calls) == 5


async def test_the_fake_path_stops_when_the_seconds_run_out() -> None:
    """Replies taking 50 s each: no call starts once the task's 120 s are spent."""
    clock = VirtualClock()

    class Slow(FakeLLM):
        async def generate(self, request: LLMRequest) -> LLMResponse:
            await clock.sleep(50)
            return await super().generate(request)

    llm = Slow()
    llm.garbage_tasks.add("subgoal")
    policy = RetryPolicy(max_calls=10, clock=clock, max_re_asks=10)
    with pytest.raises(LLMError, match=r"3 of 10 calls \(2 of 10 re-asks\), 150.0 of 120 s"):
        await ask(llm, subgoal(), parse_subgoal, policy=policy)
    assert len(llm.calls) == 3


# ---- what it cost ---------------------------------------------------------------------------


async def test_limited_llm_books_calls_retries_and_reasks(clock: VirtualClock) -> None:
    """A task that met a 429 and an invalid reply books 3 calls, 1 retry and 1 re-ask."""
    provider = Provider(too_many("0"), data(BAD), data(GOOD))
    booked: list[Usage] = []
    async with openai(provider, clock) as adapter:
        llm = LimitedLLM(adapter, anyio.CapacityLimiter(1), booked.append)
        facts = await ask(llm, semantic(), parse_facts)
    assert facts
    total = sum(booked, Usage())
    assert (total.calls, total.retries, total.re_asks) == (3, 1, 1)
    assert (total.input_tokens, total.output_tokens) == (20, 10)


async def test_a_failed_task_still_books_its_calls(clock: VirtualClock) -> None:
    """A 429 storm's calls are booked although the task raised."""
    provider = Provider(too_many("0"))
    booked: list[Usage] = []
    async with openai(provider, clock) as adapter:
        llm = LimitedLLM(adapter, anyio.CapacityLimiter(1), booked.append)
        with pytest.raises(LLMError):
            await ask(llm, semantic(), parse_facts)
    total = sum(booked, Usage())
    assert (total.calls, total.retries, total.re_asks) == (3, 2, 0)


# ---- the policy -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: RetryPolicy(max_calls=0),
        lambda: RetryPolicy(max_seconds=0),
        lambda: RetryPolicy(max_seconds=10**400),
        lambda: RetryPolicy(max_re_asks=-1),
        lambda: policy_from(None, max_retries=-1),
    ],
)
def test_a_bad_policy_is_refused(make: Callable[[], object]) -> None:
    """No calls, no seconds or more than a day's, negative re-asks or negative retries are
    InvalidInputError."""
    with pytest.raises(InvalidInputError):
        make()


def test_max_retries_is_shorthand_for_max_calls() -> None:
    """`max_retries=n` means n + 1 calls; backoff and clock replace the policy's."""
    clock = VirtualClock()
    policy = policy_from(
        RetryPolicy(max_seconds=7), max_retries=4, backoff=FAST, clock=clock
    )
    assert (policy.max_calls, policy.max_seconds, policy.backoff) == (5, 7, FAST)
    assert policy.clock is clock


def test_a_bare_call_after_one_a_transport_took_up_in_one_task_is_counted() -> None:
    """A task's budget counts each call once: one a transport took up (and charged when it
    sent it), then one of an LLM without a transport (a wrapper asking a local model after a
    hosted one); a call a transport took up and never sent counts as none."""
    budget = Budget(RetryPolicy())
    before = budget.mark()
    budget.taken += 1  # what `Transport.post_json` does, charging when it sends
    budget.charge()
    budget.charge_bare(before)
    assert budget.calls == 1
    before = budget.mark()
    budget.charge_bare(before)
    assert budget.calls == 2
    before = budget.mark()
    budget.taken += 1  # refused at the Retry-After gate: taken up, never sent
    budget.charge_bare(before)
    assert budget.calls == 2


async def test_a_call_cancelled_waiting_for_its_slot_is_booked_as_none() -> None:
    """A call cancelled while another holds the only slot never reached the model: it books
    no call (one that reached it and failed books one)."""
    booked: list[Usage] = []
    slots = anyio.CapacityLimiter(1)
    llm = LimitedLLM(FakeLLM(), slots, booked.append)
    holder = object()
    await slots.acquire_on_behalf_of(holder)
    with anyio.move_on_after(0.05):  # the wait, which no release ends, is cut short
        await llm.generate(subgoal())
    slots.release_on_behalf_of(holder)
    assert [usage.calls for usage in booked] == [0]
    await llm.generate(subgoal())
    assert sum(usage.calls for usage in booked) == 1
