"""The HTTP adapters' own re-ask (the API contract): called directly, `OpenAICompatible` and
`Anthropic` ask once more when a structured reply is not valid JSON for the schema (prose, or an
object without a key the schema requires), then raise `LLMReplyError` naming the problem; through
a `Memory` that re-ask is the task's only one, so a model answering prose costs no more calls."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import pytest

import mnemo
from mnemo.adapters.anthropic import Anthropic
from mnemo.adapters.hashing import HashEmbedder
from mnemo.adapters.openai import OpenAICompatible
from mnemo.episode import reward_request
from mnemo.errors import LLMReplyError
from mnemo.ports import LLMRequest
from tests.adapters.provider_server import Answer, ProviderServer, VirtualClock

PROSE = Answer(text="this is not json at all")
NO_REWARD = Answer(data={"score": 0.7})
# What each bad reply's problem says, in the re-ask and in the error.
PROBLEMS = {"prose": (PROSE, "the reply is not valid JSON"),
            "missing key": (NO_REWARD, "the reply lacks 'reward', which the schema requires")}


def reward() -> LLMRequest:
    return reward_request(goal="serve the site", subgoal="check nginx", observation="nginx -t",
                          action="reload", next_observation="ok")


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as s:
        yield s


@pytest.fixture(params=["openai", "anthropic"])
async def llm(request: pytest.FixtureRequest,
              server: ProviderServer) -> AsyncIterator[OpenAICompatible | Anthropic]:
    adapter = (OpenAICompatible("m", base_url=server.openai_url, api_key="k", clock=VirtualClock())
               if request.param == "openai"
               else Anthropic("m", base_url=server.url, api_key="k", clock=VirtualClock()))
    async with adapter:
        yield adapter


@pytest.mark.parametrize("bad", PROBLEMS)
async def test_a_reply_not_json_for_the_schema_is_reasked_once_then_raises(
    server: ProviderServer, llm: OpenAICompatible | Anthropic, bad: str
) -> None:
    """Prose, or an object without the schema's required key, is shown back to the model with
    its problem once; a second one raises LLMReplyError naming the task and the problem."""
    answer, problem = PROBLEMS[bad]
    server.script(answer, answer, answer)
    named = rf"task 'reward' is not valid JSON for its schema after a re-ask: {re.escape(problem)}"
    with pytest.raises(LLMReplyError, match=named):
        await llm.generate(reward())
    first, second = server.requests
    assert second.messages[:len(first.messages)] == first.messages
    assert second.messages[-1]["content"].startswith(f"Your reply could not be used: {problem}")


@pytest.mark.parametrize("bad", PROBLEMS)
async def test_a_good_second_reply_is_returned(
    server: ProviderServer, llm: OpenAICompatible | Anthropic, bad: str
) -> None:
    """The reply to the re-ask is the answer, with the usage of both replies."""
    server.script(PROBLEMS[bad][0], Answer())
    response = await llm.generate(reward())
    assert response.data == {"reward": 0.8}
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (20, 10)
    assert len(server.requests) == 2


@pytest.mark.parametrize("adapter", ["openai", "anthropic"])
async def test_through_a_memory_a_prose_model_costs_no_more_calls(adapter: str) -> None:
    """A model answering the subgoal task in prose: it is asked twice (the adapter's re-ask, the
    task's only one), then the ingest fails naming the problem. The state and reward tasks,
    which read a paragraph or a bare value, are asked once: a prose state is the paragraph, a
    prose reward the neutral 0.5."""
    with ProviderServer() as server:
        server.answer_task("subgoal", PROSE)
        llm = (OpenAICompatible("m", base_url=server.openai_url, api_key="k")
               if adapter == "openai" else Anthropic("m", base_url=server.url, api_key="k"))
        async with llm, mnemo.Memory(":memory:", llm=llm, embedder=HashEmbedder()) as mem:
            await mem.open_repo("r")
            with pytest.raises(mnemo.PipelineError,
                               match="not valid JSON for its schema after a re-ask") as failed:
                await mem.ingest("r", mnemo.Trajectory("g", [
                    mnemo.Step("Disk on db1 is full.", "Remove WAL.")]), source_id="s")
            assert isinstance(failed.value.__cause__, LLMReplyError)
            assert Counter(server.tasks())["subgoal"] == 2
            assert mem.usage().re_asks == 1
            for task, answer in (("subgoal", Answer()), ("state", PROSE), ("reward", PROSE)):
                server.answer_task(task, answer)
            # The session's requests are told by its goal: a request of the failed ingest that
            # was under way may be recorded late.
            sid = await mem.start_session("keep db1 up", repo="r")
            await mem.append(sid, "Disk on db1 is full.", "Remove WAL.")
            await mem.append(sid, "db1 has room.", "Restart it.")
            [episode] = await mem.episodes(sid)
            assert mem.usage(sid).calls == 5
    session = [r.task for r in server.requests if "keep db1 up" in json.dumps(r.body)]
    assert Counter(session) == {"state": 2, "subgoal": 2, "reward": 1}
    assert [step.state_summary for step in episode.steps] == [PROSE.text] * 2
    assert episode.steps[0].reward == 0.5

