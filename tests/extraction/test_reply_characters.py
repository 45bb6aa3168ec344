"""A model's reply is stored alike on both backends whatever characters it holds: a NUL
(PostgreSQL's text holds none) is dropped and a lone surrogate (not UTF-8) becomes "?"."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import mnemo
from tests.fakes import FakeEmbedder, FakeLLM


class Garbled(FakeLLM):
    """A `FakeLLM` whose state summaries, subgoals and facts carry a NUL and a lone surrogate."""

    def _answer(self, task: str, inputs: dict[str, Any]) -> mnemo.LLMResponse:
        reply = super()._answer(task, inputs)
        data: Any = reply.data
        if task == "state":
            return replace(reply, text=reply.text + "\x00\udcff")
        if task == "subgoal":
            return replace(reply, data={**data, "subgoal": data["subgoal"] + "\x00"})
        if task == "semantic":
            return replace(reply, data={"facts": [
                {**fact, "proposition": fact["proposition"] + " \x00\udcff"}
                for fact in data["facts"]]})
        return reply


async def test_a_nul_or_a_lone_surrogate_in_a_reply_is_stored_on_both_backends(
    store: str, embedder: FakeEmbedder
) -> None:
    """The step is annotated and the episode committed, and the fact reads the same on both
    (a lone surrogate failed the annotation and the extraction on both; a NUL, on PostgreSQL,
    where SQLite stored it)."""
    async with mnemo.Memory(store, llm=Garbled(), embedder=embedder) as mem:
        await mem.open_repo("r")
        sid = await mem.start_session("explore", repo="r")
        assert (await mem.append(sid, "walk north", "go north")).annotated
        await mem.close_and_commit(sid)
        facts = await mem.get_nodes_by_type("r", [mnemo.NodeType.SEMANTIC])
        assert [fact.text for fact in facts] == ["fact: walk north ?"]
        subgoals = await mem.get_nodes_by_type("r", [mnemo.NodeType.SUBGOAL])
        assert [node.text for node in subgoals] == ["walk"]
