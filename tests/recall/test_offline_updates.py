"""The offline knowledge-update set (`tests/recall/offline_updates.py`) on the offline
defaults, on both backends."""

from __future__ import annotations

import pytest

import mnemo
from tests.recall.offline_updates import CASES, evaluate, remember


@pytest.mark.slow
async def test_the_value_that_holds_now_ranks_first(store: str) -> None:
    """With the offline LLM and the default embedder, every case's stale fact is retired by
    the later step that corrects it, and the first memory that names either value is live and
    names the current one."""
    async with mnemo.Memory(store) as mem:
        await remember(mem)
        missed = await evaluate(mem)
    assert len(CASES) >= 12
    assert [(case.question, why) for case, why in missed] == []


@pytest.mark.slow
async def test_facts_of_things_of_other_names_stay_live_and_each_name_finds_its_own(
    store: str,
) -> None:
    """Four steps of one ingest, each of a service of another name and port (offline LLM,
    default embedder): no fact retires another (the last retired the three before it, which
    then ranked the wrong one first), and each name and port recalls its own fact first."""
    async with mnemo.Memory(store) as mem:
        await mem.open_repo("r")
        await mem.ingest("r", mnemo.Trajectory("services", [mnemo.Step(
            f"The service number {i} named pear{i} listens on port {9000 + i}.", f"noted {i}")
            for i in range(4)]), source_id="services")
        facts = await mem.get_nodes_by_type("r", [mnemo.NodeType.SEMANTIC])
        assert len(facts) == 4
        assert not [f.text for f in facts if f.retired]
        for query, named in (("pear2", "pear2"), ("which port does pear1 listen on?", "pear1"),
                             ("port 9003", "pear3")):
            [first, *_] = (await mem.recall("r", query, k=3)).memories
            assert f"named {named} " in first.node.text, (query, first.node.text)
