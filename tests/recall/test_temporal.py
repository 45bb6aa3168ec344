"""Recall that respects time: what holds now first, a retired fact says so, and
`as_of` answers as the memory stood then."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

import mnemo
from mnemo.graph.model import now_utc
from tests.conftest import REPO
from tests.fakes import FakeEmbedder, FakeLLM

SEMANTIC = [mnemo.NodeType.SEMANTIC]


async def tell(mem: mnemo.Memory, source: str, text: str, date: str) -> None:
    await mem.ingest(REPO, mnemo.Trajectory(f"chat on {date}", [mnemo.Step(text, "Note it.")]),
                     source_id=source)


async def test_the_fact_that_holds_now_comes_first(mem: mnemo.Memory) -> None:
    """After "Dana lives in Porto" contradicts "Dana lives in Lisbon", recall ranks Porto
    first and returns Lisbon below it, retired, with its successor and validity window."""
    await tell(mem, "m", "Dana lives in Lisbon.", "1 March 2023")
    await tell(mem, "j", "Dana lives in Porto.", "1 June 2023")
    memories = (await mem.recall(REPO, "Dana lives in Lisbon", types=SEMANTIC)).memories
    texts = [m.node.text for m in memories]
    porto = next(i for i, t in enumerate(texts) if "Porto" in t)
    lisbon = next(i for i, t in enumerate(texts) if "Lisbon" in t)
    assert porto < lisbon
    old, new = memories[lisbon], memories[porto]
    assert old.retired
    assert old.superseded_by == new.node.id
    assert (old.valid_from, old.valid_to) == (datetime(2023, 3, 1, tzinfo=UTC),
                                              datetime(2023, 6, 1, tzinfo=UTC))
    assert not new.retired
    assert (new.valid_from, new.valid_to) == (datetime(2023, 6, 1, tzinfo=UTC), None)


async def test_as_of_answers_as_the_memory_stood_then(mem: mnemo.Memory) -> None:
    """As of a time between the two ingests, Porto was not known yet and Lisbon was not
    retired; a naive datetime is UTC; a non-datetime is invalid input."""
    await tell(mem, "m", "Dana lives in Lisbon.", "1 March 2023")
    between = now_utc()
    await tell(mem, "j", "Dana lives in Porto.", "1 June 2023")
    then = (await mem.recall(REPO, "Dana lives", types=SEMANTIC, as_of=between)).memories
    assert [m.node.text for m in then if "Dana" in m.node.text] == ["fact: Dana lives in Lisbon."]
    assert not then[0].retired
    assert then[0].valid_to is None
    naive = between.replace(tzinfo=None)
    again = (await mem.recall(REPO, "Dana lives", types=SEMANTIC, as_of=naive)).memories
    assert [m.node.id for m in again] == [m.node.id for m in then]
    before = datetime(2000, 1, 1, tzinfo=UTC)
    assert (await mem.recall(REPO, "Dana lives", as_of=before)).memories == []
    with pytest.raises(mnemo.InvalidInputError):
        await mem.recall(REPO, "Dana lives", as_of="yesterday")  # type: ignore[arg-type]


async def test_a_retired_fact_comes_right_after_its_successor_whatever_their_scores(
    mem: mnemo.Memory,
) -> None:
    """A retired fact that matches the query better than its successor (which holds none of
    its words) comes right after it: the successor takes its place, at its score, and is the
    one memory of a recall for one."""
    await tell(mem, "m", "Dana lives in Lisbon.", "1 March 2023")
    await tell(mem, "j", "Dana lives in Porto.", "1 June 2023")
    for k in (1, 2, 10):
        memories = (await mem.recall(REPO, "Lisbon", k=k, types=SEMANTIC)).memories
        texts = [m.node.text for m in memories]
        assert texts == ["fact: Dana lives in Porto.", "fact: Dana lives in Lisbon."][:k]
    porto, lisbon = memories
    assert lisbon.retired
    assert lisbon.superseded_by == porto.node.id
    assert not porto.retired
    assert porto.score >= lisbon.score


class Reversing(FakeLLM):
    """The fake LLM, re-ranking every candidate list in reverse."""

    def _answer(self, task: str, inputs: dict[str, Any]) -> mnemo.LLMResponse:
        if task == "recall_rerank":
            return mnemo.LLMResponse(data={"order": list(range(len(inputs["memories"]), 0, -1))})
        return super()._answer(task, inputs)


async def test_a_reranking_never_puts_a_retired_fact_above_its_successor(
    store: str, embedder: FakeEmbedder
) -> None:
    """An LLM re-ranking that reverses the results still leaves each retired fact right after
    its successor."""
    async with mnemo.Memory(store, llm=Reversing(), embedder=embedder) as mem:
        await mem.open_repo(REPO, config=mnemo.Config(recall_rerank=True))
        await tell(mem, "m", "Dana lives in Lisbon.", "1 March 2023")
        await tell(mem, "o", "The Lisbon office opens at 9.", "1 April 2023")
        await tell(mem, "j", "Dana lives in Porto.", "1 June 2023")
        memories = (await mem.recall(REPO, "Dana lives in Lisbon", types=SEMANTIC)).memories
    texts = [m.node.text for m in memories]
    porto, lisbon = (texts.index(f"fact: Dana lives in {c}.") for c in ("Porto", "Lisbon"))
    assert porto == lisbon - 1


class Longest:
    """A custom re-ranker: the longest text first (no model), against BM25's bent for short
    texts."""

    def __init__(self) -> None:
        self.queries: list[str] = []

    async def rerank(self, query: str, texts: Sequence[str]) -> list[int]:
        self.queries.append(query)
        return sorted(range(len(texts)), key=lambda i: (-len(texts[i]), i))


async def test_a_custom_reranker_orders_the_recall(store: str, embedder: FakeEmbedder) -> None:
    """`Memory(reranker=...)` re-ranks every recall by its order (no Config switch, no model
    call); an object without `rerank` is refused at once."""
    ranker = Longest()
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=embedder, reranker=ranker) as mem:
        await mem.open_repo(REPO)
        await tell(mem, "m", "Dana moved to Lisbon with her two cats and a piano.", "1 May 2023")
        await tell(mem, "o", "The Lisbon office opens at 9.", "1 April 2023")
        await tell(mem, "p", "Lisbon trams run late on the weekend.", "1 June 2023")
        found = await mem.recall(REPO, "Lisbon", k=3, types=[mnemo.NodeType.EPISODIC])
        texts = [m.node.text for m in found.memories]
    assert ranker.queries == ["Lisbon"]
    assert len(texts) == 3
    assert [len(t) for t in texts] == sorted((len(t) for t in texts), reverse=True)
    with pytest.raises(mnemo.InvalidInputError, match="reranker"):
        mnemo.Memory(store, reranker="cross-encoder")  # type: ignore[arg-type]

async def test_valid_at_answers_with_the_facts_that_held_then(mem: mnemo.Memory) -> None:
    """Lisbon told as of 10 January 2023, Porto as of 1 May 2024: asked for June 2023 the
    recall answers Lisbon, for June 2024 Porto, for 2022 no fact of Dana, and the step that
    told a fact of another time is left out with it; a non-datetime is invalid input."""
    await tell(mem, "m", "Dana lives in Lisbon.", "10 January 2023")
    await tell(mem, "j", "Dana lives in Porto.", "1 May 2024")

    async def dana(moment: datetime, types: list[mnemo.NodeType] | None = SEMANTIC
                   ) -> list[mnemo.Recalled]:
        found = await mem.recall(REPO, "where did Dana live?", types=types, valid_at=moment)
        return [m for m in found.memories if "Dana" in m.node.text]

    june_2023 = await dana(datetime(2023, 6, 1, tzinfo=UTC))
    assert [m.node.text for m in june_2023] == ["fact: Dana lives in Lisbon."]
    assert june_2023[0].retired  # since, not then: it is not weighed down for it
    assert [m.node.text for m in await dana(datetime(2024, 6, 1))] == [
        "fact: Dana lives in Porto."]
    assert await dana(datetime(2022, 1, 1, tzinfo=UTC)) == []
    every_type = await dana(datetime(2023, 6, 1, tzinfo=UTC), None)
    assert every_type[0].node.text == "fact: Dana lives in Lisbon."
    assert all("Porto" not in m.node.text for m in every_type)
    with pytest.raises(mnemo.InvalidInputError):
        await mem.recall(REPO, "Dana", valid_at="June 2023")  # type: ignore[arg-type]


async def test_valid_at_and_as_of_answer_together(mem: mnemo.Memory) -> None:
    """As of a time before Porto was told, Lisbon had no end yet: asked for June 2024 it
    holds; as of now, it ended on 1 May 2024."""
    await tell(mem, "m", "Dana lives in Lisbon.", "10 January 2023")
    between = now_utc()
    await tell(mem, "j", "Dana lives in Porto.", "1 May 2024")
    june_2024 = datetime(2024, 6, 1, tzinfo=UTC)
    then = await mem.recall(REPO, "Dana lives", types=SEMANTIC, as_of=between,
                            valid_at=june_2024)
    assert [m.node.text for m in then.memories] == ["fact: Dana lives in Lisbon."]
    now = await mem.recall(REPO, "Dana lives", types=SEMANTIC, valid_at=june_2024)
    assert [m.node.text for m in now.memories if "Dana" in m.node.text] == [
        "fact: Dana lives in Porto."]
