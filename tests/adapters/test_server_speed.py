"""A request's time follows its server's measured speed (mnemo/adapters/limit.py,
`Transport.attempt_timeout`): 60 s is the first guess for a server not measured yet, a slow
server's requests get the time their `max_tokens` need there, and a timeout gives the retry
more; against a local fake server that slows."""

from __future__ import annotations

import pytest

from mnemo.adapters import _http
from mnemo.adapters._http import DEFAULT_TIMEOUT, MOST_TIMEOUT, Transport
from mnemo.adapters.openai import OpenAICompatible
from mnemo.episode import parse_subgoal, reward_request, subgoal_request
from mnemo.errors import LLMError, LLMTimeout
from mnemo.ports import LLMRequest
from tests.adapters.provider_server import Answer, ProviderServer


def reward() -> LLMRequest:
    return reward_request(goal="serve the site", subgoal="configure nginx",
                          observation="nginx listens on 8080", action="curl localhost:8080",
                          next_observation="200 OK")


def subgoal() -> LLMRequest:
    return subgoal_request(goal="serve the site", observation="nginx listens on 8080",
                           action="curl localhost:8080", previous_subgoal=None,
                           recent_steps=[])


# A reply of 52 tokens (4 characters a token).
LONG = Answer(data={"reasoning": "The step goes on with the same work. " * 5,
                    "subgoal": "serve the site"})


async def test_a_requests_time_is_the_first_guess_then_what_its_tokens_need() -> None:
    """Not measured, a request gets 60 s; measured slow (50 ms a token), a request of 1,000
    tokens gets 3 x 50 s, one of 100 tokens still 60 s, and none more than 600 s; a timeout
    given to the adapter is its time whatever the speed."""
    free = Transport("http://x", name="x", error=LLMError)
    capped = Transport("http://x", name="x", error=LLMError, timeout=30.0)
    assert free.attempt_timeout(1000) == DEFAULT_TIMEOUT
    free.limit.unit_seconds = capped.limit.unit_seconds = 0.05
    assert free.attempt_timeout(992) == pytest.approx(150.0)
    assert free.attempt_timeout(92) == DEFAULT_TIMEOUT
    assert free.attempt_timeout(99_000) == MOST_TIMEOUT
    assert capped.attempt_timeout(992) == 30.0
    await free.aclose()
    await capped.aclose()


@pytest.mark.slow
async def test_a_server_slower_than_the_first_guess_is_given_the_time_it_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server whose reply of 52 tokens takes 1 s where the first guess allows 0.5 s (60 s,
    scaled down): the time measured on an earlier reply (or, failing that, on the first
    attempt's timeout) gives the request what it needs, and the reply comes (with a fixed
    time, every attempt timed out). The speed learned is kept in the adapter's server profile
    for the next one."""
    with ProviderServer(tokens_per_second=50.0) as server:
        server.answer_task("subgoal", LONG)
        async with OpenAICompatible("m", base_url=server.openai_url) as llm:
            await llm.generate(reward())  # a short reply first: measured, the connection open
            monkeypatch.setattr(_http, "DEFAULT_TIMEOUT", 0.5)
            reply = await llm.generate(subgoal())
            assert parse_subgoal(reply) == "serve the site"
            profile = llm.server_profile()
    concurrency = profile.concurrency
    assert concurrency is not None
    assert concurrency.unit_seconds is not None
    assert concurrency.unit_seconds > 0
    async with OpenAICompatible("m", base_url=server.openai_url) as again:
        again.adopt_server_profile(profile)
        assert again.concurrency.unit_seconds == concurrency.unit_seconds


@pytest.mark.slow
async def test_a_timeout_given_to_the_adapter_stays_its_time() -> None:
    """The same slow server with `timeout=0.5` given: every attempt is cut at 0.5 s."""
    with ProviderServer(tokens_per_second=50.0) as server:
        server.answer_task("subgoal", LONG)
        async with OpenAICompatible("m", base_url=server.openai_url, timeout=0.5) as llm:
            with pytest.raises(LLMTimeout):
                await llm.generate(subgoal())
