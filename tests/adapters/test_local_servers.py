"""`OpenAICompatible` against recorded replies of the local servers people run: llama.cpp
(llama-cpp-python's server and an older llama-server), Ollama and vLLM."""

from __future__ import annotations

import logging

import pytest

from mnemo.adapters.openai import OpenAICompatible
from mnemo.episode.prompts import parse_reward, reward_request, state_request
from mnemo.ports import LLMRequest
from tests.adapters.provider_server import VirtualClock
from tests.adapters.replay_server import ReplayServer


def reward() -> LLMRequest:
    return reward_request(goal="serve the site", subgoal="configure nginx",
                          observation="nginx listens on 8080", action="curl localhost:8080",
                          next_observation="200 OK")


def state() -> LLMRequest:
    return state_request(goal="serve the site", observation="nginx listens on 8080",
                         action="curl localhost:8080", previous_state=None)


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


async def test_llama_cpp_python_state_summary_is_capped(caplog: pytest.LogCaptureFixture) -> None:
    """A looping state summary stops at the task's 256 tokens, and the log says it was cut."""
    with ReplayServer("llama_cpp_python") as server, caplog.at_level(logging.WARNING):
        async with OpenAICompatible("m", base_url=server.url, clock=VirtualClock()) as llm:
            response = await llm.generate(state())
    assert response.text.startswith("The agent is serving the site.")
    [(mode, body)] = server.requests
    assert (mode, body["max_tokens"]) == ("text", 256)
    assert any("'state' was cut short at max_tokens=256" in r.getMessage()
               for r in caplog.records)


async def test_ollama_state_summary_is_not_flagged(caplog: pytest.LogCaptureFixture) -> None:
    """A summary that ended on its own is returned with no warning."""
    with ReplayServer("ollama") as server, caplog.at_level(logging.WARNING):
        async with OpenAICompatible("m", base_url=server.url, clock=VirtualClock()) as llm:
            response = await llm.generate(state())
    assert "nginx listens on port 8080" in response.text
    assert not caplog.records
