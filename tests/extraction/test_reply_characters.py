"""A model's reply is stored alike on both backends whatever characters it holds: a NUL
(PostgreSQL's text holds none) is dropped and a lone surrogate (not UTF-8) becomes "?"."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import anyio
import pytest

import mnemo
from mnemo.calls.retry import LimitedLLM
from mnemo.calls.tasks import reply_data
from mnemo.errors import MAX_TEXT_CHARS_LIMIT
from tests.fakes import FakeEmbedder, FakeLLM


class Garbled(FakeLLM):
    """A `FakeLLM` whose state summaries, subgoals and facts carry a NUL and a lone surrogate;
    `as_text`: its facts come as JSON in the reply's text (escaped: `\\u0000`)."""

    def __init__(self, as_text: bool = False) -> None:
        super().__init__()
        self.as_text = as_text

    def _answer(self, task: str, inputs: dict[str, Any]) -> mnemo.LLMResponse:
        reply = super()._answer(task, inputs)
        data: Any = reply.data
        if task == "state":
            return replace(reply, text=reply.text + "\x00\udcff")
        if task == "subgoal":
            return replace(reply, data={**data, "subgoal": data["subgoal"] + "\x00"})
        if task == "semantic":
            facts = {"facts": [{**fact, "proposition": fact["proposition"] + " \x00\udcff"}
                               for fact in data["facts"]]}
            return mnemo.LLMResponse(text=json.dumps(facts)) if self.as_text else replace(
                reply, data=facts)
        return reply


@pytest.mark.parametrize("as_text", [False, True])
async def test_a_nul_or_a_lone_surrogate_in_a_reply_is_stored_on_both_backends(
    store: str, embedder: FakeEmbedder, as_text: bool
) -> None:
    """The step is annotated and the episode committed, and the fact reads the same on both
    (a lone surrogate failed the annotation and the extraction on both; a NUL, on PostgreSQL,
    where SQLite stored it), whether the reply's JSON came as data or in its text."""
    async with mnemo.Memory(store, llm=Garbled(as_text), embedder=embedder) as mem:
        await mem.open_repo("r")
        sid = await mem.start_session("explore", repo="r")
        assert (await mem.append(sid, "walk north", "go north")).annotated
        await mem.close_and_commit(sid)
        facts = await mem.get_nodes_by_type("r", [mnemo.NodeType.SEMANTIC])
        assert [fact.text for fact in facts] == ["fact: walk north ?"]
        subgoals = await mem.get_nodes_by_type("r", [mnemo.NodeType.SUBGOAL])
        assert [node.text for node in subgoals] == ["walk"]


class Verbose(FakeLLM):
    """A `FakeLLM` whose subgoals and instructions run past a million characters of words."""

    LONG = " ".join(f"w{i}z" for i in range(150_000))

    def _answer(self, task: str, inputs: dict[str, Any]) -> mnemo.LLMResponse:
        reply = super()._answer(task, inputs)
        data: Any = reply.data
        if task == "subgoal":
            return replace(reply, data={**data, "subgoal": self.LONG})
        if task == "procedural":
            return replace(reply, data={**data, "instructions": [
                {**item, "instruction": self.LONG} for item in data["instructions"]]})
        return reply


async def test_a_reply_past_the_text_limit_is_cut_to_it_on_both_backends(
    store: str, embedder: FakeEmbedder
) -> None:
    """A reply string past `MAX_TEXT_CHARS_LIMIT` is cut to it, so the episode commits on both
    backends: PostgreSQL's full-text index refused the whole text (StorageError "unavailable"
    at every commit) where SQLite stored it."""
    async with mnemo.Memory(store, llm=Verbose(), embedder=embedder) as mem:
        await mem.open_repo("r")
        sid = await mem.start_session("explore", repo="r")
        await mem.append(sid, "walk north", "go north")
        await mem.close_and_commit(sid)
        kinds = [mnemo.NodeType.SUBGOAL, mnemo.NodeType.PROCEDURAL]
        nodes = await mem.get_nodes_by_type("r", kinds)
        assert sorted(len(node.text) for node in nodes) == [MAX_TEXT_CHARS_LIMIT] * 2



class Listing:
    """A model answering 1,500 short facts as JSON text: 130,000 characters, every string of
    them short."""

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        facts = [{"proposition": f"walk north fact {i}", "confidence": 0.9} for i in range(1500)]
        return mnemo.LLMResponse(text=json.dumps({"facts": facts}, indent=2))


async def test_a_reply_whose_text_passes_the_limit_in_short_strings_is_read_whole() -> None:
    """Only a reply's strings are cut, never the JSON text that holds them: a reply of short
    facts past `MAX_TEXT_CHARS_LIMIT` reads whole (cut, it was not JSON)."""
    llm = LimitedLLM(Listing(), anyio.CapacityLimiter(1))
    response = await llm.generate(mnemo.LLMRequest(task="semantic", system="", messages=[]))
    assert len(response.text) > MAX_TEXT_CHARS_LIMIT
    data = reply_data(response, strict=True)
    assert isinstance(data, dict)
    assert len(data["facts"]) == 1500
