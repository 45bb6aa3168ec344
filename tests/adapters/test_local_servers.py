"""`OpenAICompatible` against recorded replies of the local servers people run: llama.cpp
(llama-cpp-python's server and an older llama-server), Ollama and vLLM; and what a small model
on a local server needs: a bounded state summary, a sampled temperature."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from mnemo.adapters.openai import OpenAICompatible
from mnemo.episode import parse_reward, parse_state, reward_request, state_request
from mnemo.ports import LLMRequest
from tests.adapters.provider_server import LONGEST, Answer, ProviderServer, VirtualClock
from tests.adapters.replay_server import ReplayServer


def reward() -> LLMRequest:
    return reward_request(goal="serve the site", subgoal="configure nginx",
                          observation="nginx listens on 8080", action="curl localhost:8080",
                          next_observation="200 OK")


@pytest.mark.parametrize(
    ("recording", "first_modes", "mode", "rewards"),
    [
        # HTTP 500 refusing json_schema; forced tool, its first reply's reward of 8 read as 1
        # (a bound guides a reply, and the reader clamps: no re-ask).
        ("llama_cpp_python", ["json_schema", "tool"], "tool", (1.0, 0.8)),
        # HTTP 500 refusing json_schema, then tools; JSON mode works.
        ("llama_server_b3777", ["json_schema", "tool", "json"], "json", (0.8, 0.8)),
        # Today's llama-server, recorded: json_schema answered (through a grammar).
        ("llama_server", ["json_schema"], "json_schema", (0.5, 0.5)),
        ("ollama", ["json_schema"], "json_schema", (0.8, 0.8)),
        ("vllm", ["json_schema"], "json_schema", (0.8, 0.8)),
    ],
)
async def test_each_server_gets_a_mode_that_works(
    recording: str, first_modes: list[str], mode: str, rewards: tuple[float, float],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first task finds the server's mode with no retry of a refusal; later ones go straight
    to it; each request carries the task's max_tokens."""
    with ReplayServer(recording) as server, caplog.at_level(logging.WARNING, "mnemo.adapters"):
        async with OpenAICompatible("m", base_url=server.url, clock=VirtualClock()) as llm:
            first = await llm.generate(reward())
            second = await llm.generate(reward())
            assert llm.structured_mode == mode
    assert (parse_reward(first), parse_reward(second)) == rewards
    assert server.modes() == [*first_modes, mode]
    assert {body["max_tokens"] for _, body in server.requests} == {reward().max_tokens}
    switches = [r for r in caplog.records if "refused structured output" in r.getMessage()]
    assert len(switches) == len(set(first_modes)) - 1
    assert not [r for r in caplog.records if "retry" in r.getMessage()]


async def test_a_state_summary_that_runs_on_ends_at_its_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A small model that repeats itself writes the state summary to the length its schema
    allows, where a server's grammar ends it: the reply is whole, under the request's
    max_tokens, read, and nothing is cut or asked again (as free text it ran to its cap)."""
    request = state_request(goal="serve the site", observation="nginx listens on 8080",
                            action="curl localhost:8080", previous_state=None)
    with ProviderServer(tokens_per_second=100_000.0) as server, caplog.at_level(logging.WARNING):
        server.answer_task("state", Answer(data=LONGEST))
        async with OpenAICompatible("m", base_url=server.openai_url) as llm:
            reply = await llm.generate(request)
    [sent] = server.requests
    assert sent.mode == "json_schema"
    assert reply.usage is not None
    assert request.max_tokens is not None
    assert reply.usage.output_tokens < request.max_tokens <= 160
    assert parse_state(reply).startswith("and the model keeps writing")
    assert not [r for r in caplog.records if "cut short" in r.getMessage()]


@pytest.mark.parametrize(("base_url", "sent"), [
    ("http://127.0.0.1:8080/v1", 0.2), ("http://localhost:11434/v1", 0.2),
    ("https://llm.example.com/v1", 0.0),
])
async def test_a_local_server_samples_at_the_temperature_small_models_need(
    base_url: str, sent: float
) -> None:
    """By default a server on this machine is asked for temperature 0.2 (a 135M model at 0
    repeats itself to its cap), any other for 0; one given explicitly is sent as given."""
    bodies: list[dict[str, object]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"message": {"content": '{"reward": 1}'}}]})

    transport = httpx.MockTransport(answer)
    for temperature in ("default", 0.7):
        async with OpenAICompatible("m", base_url=base_url, api_key="k", transport=transport,
                                    temperature=temperature) as llm:
            await llm.generate(reward())
    assert [body["temperature"] for body in bodies] == [sent, 0.7]
