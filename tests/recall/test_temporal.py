"""Recall that respects time: what holds now first, a retired fact says so, and
`as_of` answers as the memory stood then."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

import mnemo
from mnemo.graph.model import now_utc
from tests.conftest import REPO

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
