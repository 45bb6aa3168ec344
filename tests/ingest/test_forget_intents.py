"""forget and shared intents: an intent that outlives a forgotten source keeps none of its words
(mnemo/graph/erasure.py). Regression: a merged wording kept the
forgotten source's words, recallable."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import numpy as np
import pytest

import mnemo
from mnemo.adapters.offline import OfflineLLM
from mnemo.calls.tasks import task_inputs
from mnemo.graph import erasure
from mnemo.graph.erasure import IntentWording, heirs
from tests.backends import sql

REPO = "r"
N = mnemo.NodeType
TECHNICIAN = "The oven is broken and needs a technician."
REPAIRMAN = "The oven is broken and needs a repairman urgently."


class MergingLLM:
    """Offline answers, but an intent merge joins both wordings (a valid reply)."""

    def __init__(self) -> None:
        self.inner = OfflineLLM()
        self.merges = 0

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        if request.task == "merge_intent":
            self.merges += 1
            inputs = task_inputs(request)
            return mnemo.LLMResponse(data={"intent": f"{inputs['existing']} / {inputs['new']}"})
        return await self.inner.generate(request)


class OvenEmbedder(mnemo.HashEmbedder):
    """A HashEmbedder under which two texts about the oven are alike (cosine about 0.9: two
    such intents merge), failing once `failing` is set."""

    failing = False

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.failing:
            raise RuntimeError("embedder down")
        rows = np.array(await super().embed(texts), dtype=np.float32)
        for row, text in zip(rows, texts, strict=True):
            if "oven" in text.lower():
                row[0] += 1.5
                row /= np.linalg.norm(row)
        return rows


async def two_sources(mem: mnemo.Memory) -> None:
    """Source a's intent, re-worded by source b's merge (with `MergingLLM` and an
    `OvenEmbedder`)."""
    await mem.open_repo(REPO)
    for source, text in (("a", TECHNICIAN), ("b", REPAIRMAN)):
        steps = [mnemo.Step(text, "note that 0")]
        await mem.ingest(REPO, mnemo.Trajectory("fix the oven", steps), source_id=source)


@pytest.fixture
async def merged(store: str) -> AsyncIterator[tuple[mnemo.Memory, OvenEmbedder]]:
    """Source a's intent, re-worded by source b's merge into "a's words / b's words"."""
    llm, embedder = MergingLLM(), OvenEmbedder(384)
    async with mnemo.Memory(store, llm=llm, embedder=embedder) as mem:
        await two_sources(mem)
        assert llm.merges == 1
        [intent] = await mem.get_nodes_by_type(REPO, [N.INTENT])
        assert "technician" in intent.text
        assert "repairman" in intent.text
        yield mem, embedder


async def source_of(mem: mnemo.Memory, node_id: str) -> str | None:
    [(source,)] = await sql(mem, "SELECT source_id FROM nodes WHERE id = ?", node_id)
    return cast(str | None, source)


async def intent_and_procedures(mem: mnemo.Memory) -> tuple[mnemo.Node, list[mnemo.Node]]:
    [intent] = await mem.get_nodes_by_type(REPO, [N.INTENT])
    return intent, await mem.get_linked_nodes(REPO, [intent.id], mnemo.LinkType.HIERARCHICAL)


@pytest.mark.parametrize(("forgotten", "kept", "gone_word"),
                         [("b", "a", "repairman"), ("a", "b", "technician")])
async def test_an_intent_another_source_uses_takes_its_wording(
    merged: tuple[mnemo.Memory, OvenEmbedder], forgotten: str, kept: str, gone_word: str
) -> None:
    """Forgetting either source leaves the intent to the other's procedure, in that
    procedure's own wording, with that wording's vector and source; none of the forgotten
    source's words stays in its text or data, or can be recalled."""
    mem, embedder = merged
    await mem.forget(REPO, forgotten)
    intent, procedures = await intent_and_procedures(mem)
    [procedure] = [p for p in procedures if p.type is N.PROCEDURAL]
    assert await source_of(mem, procedure.id) == kept
    wording = str(procedure.data["intent"])
    assert (intent.text, intent.data["intent"]) == (wording, wording)
    assert await source_of(mem, intent.id) == kept
    assert gone_word not in repr((intent.text, intent.data))
    vectors = await mem._graph.vectors(REPO, [intent.id])
    expected = (await embedder.embed([wording]))[0]
    # SQLite keeps vectors as float16: equal within its precision.
    assert np.allclose(vectors[intent.id], expected, atol=1e-3)
    found = await mem.recall(REPO, f"oven {gone_word}", types=[N.INTENT], reinforce=False)
    assert all(gone_word not in m.node.text for m in found.memories)
    await mem.forget(REPO, kept)
    assert await mem.get_nodes_by_type(REPO, [N.INTENT, N.PROCEDURAL]) == []


async def test_a_forget_whose_wording_cannot_be_embedded_changes_nothing(
    merged: tuple[mnemo.Memory, OvenEmbedder],
) -> None:
    """The new wording's vector is made before anything is deleted: an embedder that fails
    fails the forget with EmbeddingError, and the source is whole (forgotten once it works).
    Deleting the shared intent instead would take a node source a still uses."""
    mem, embedder = merged
    before = await mem.get_nodes_by_type(REPO, list(N))
    embedder.failing = True
    with pytest.raises(mnemo.EmbeddingError):
        await mem.forget(REPO, "b")
    assert await mem.get_nodes_by_type(REPO, list(N)) == before
    embedder.failing = False
    assert await mem.forget(REPO, "b") > 0


async def count_of(mem: mnemo.Memory) -> int:
    return len(await mem.get_nodes_by_type(REPO, list(N)))


async def test_forget_erases_an_intent_it_reworded_that_has_no_link_left(
    merged: tuple[mnemo.Memory, OvenEmbedder],
) -> None:
    """b's merge re-worded a's intent, then both procedures were deleted by id (which leaves
    the intent without links): forget("b") deletes the intent too, as an orphan, instead of
    leaving b's words there, and counts each node that went once."""
    mem, _ = merged
    procedures = await mem.get_nodes_by_type(REPO, [N.PROCEDURAL])
    await mem.delete_nodes(REPO, [p.id for p in procedures])
    before = await count_of(mem)
    gone = await mem.forget(REPO, "b")
    assert await mem.get_nodes_by_type(REPO, [N.INTENT]) == []
    assert gone == before - await count_of(mem)


async def test_forget_counts_only_nodes_that_were_there(
    merged: tuple[mnemo.Memory, OvenEmbedder],
) -> None:
    """The intent b re-worded was deleted by id before the forget: its record still names
    it, and the forget does not count it (SQLite did)."""
    mem, _ = merged
    [intent] = await mem.get_nodes_by_type(REPO, [N.INTENT])
    await mem.delete_nodes(REPO, [intent.id])
    before = await count_of(mem)
    gone = await mem.forget(REPO, "b")
    assert gone == before - await count_of(mem)


class HeldEmbedder(OvenEmbedder):
    """An OvenEmbedder whose calls, while `hold` is set, run `hold` first (counted)."""

    hold: Any = None
    held = 0

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.hold is not None:
            self.held += 1
            await self.hold()
        return await super().embed(texts)


async def test_forget_embeds_outside_the_repo_lock(store: str) -> None:
    """While a forget waits for its embedder, another Memory commits to the repo (it failed
    busy: the forget held the repo's lock, across processes, for the embedder's
    time). The commit changed what the forget had read, so it reads and embeds again."""
    embedder = HeldEmbedder(384)
    config = mnemo.Config(busy_timeout=0.5)
    async with mnemo.Memory(store, llm=MergingLLM(), embedder=embedder) as a, \
            mnemo.Memory(store, llm=OfflineLLM(), embedder=OvenEmbedder(384), config=config) as b:
        await two_sources(a)

        async def commit_meanwhile() -> None:
            embedder.hold = None
            steps = [mnemo.Step(TECHNICIAN, "write it down")]
            await b.ingest(REPO, mnemo.Trajectory("fix it again", steps), source_id="c")

        embedder.hold = commit_meanwhile
        await a.forget(REPO, "b")
        assert embedder.held == 1
        [intent] = await a.get_nodes_by_type(REPO, [N.INTENT])
        assert "repairman" not in repr((intent.text, intent.data))
        linked = await a.get_linked_nodes(REPO, [intent.id], mnemo.LinkType.HIERARCHICAL)
        assert sorted([str(await source_of(a, n.id)) for n in linked]) == ["a", "c"]


async def test_a_forget_that_keeps_meeting_changes_embeds_under_the_lock(
    store: str,
) -> None:
    """Each embedding outside the lock meets a new commit: the last of `erasure.ATTEMPTS`
    rounds embeds under the lock, so the forget ends, the intent in a's wording."""
    embedder = HeldEmbedder(384)
    async with mnemo.Memory(store, llm=MergingLLM(), embedder=embedder) as a, \
            mnemo.Memory(store, llm=OfflineLLM(), embedder=OvenEmbedder(384)) as b:
        await two_sources(a)

        async def commit_meanwhile() -> None:
            if embedder.held == erasure.ATTEMPTS - 1:
                embedder.hold = None
            steps = [mnemo.Step(TECHNICIAN, f"note that {embedder.held}")]
            await b.ingest(REPO, mnemo.Trajectory("fix it", steps),
                           source_id=f"c{embedder.held}")

        embedder.hold = commit_meanwhile
        await a.forget(REPO, "b")
        assert embedder.held == erasure.ATTEMPTS - 1
        [intent] = await a.get_nodes_by_type(REPO, [N.INTENT])
        assert "repairman" not in repr((intent.text, intent.data))
        linked = await a.get_linked_nodes(REPO, [intent.id], mnemo.LinkType.HIERARCHICAL)
        assert sorted([str(await source_of(a, n.id)) for n in linked]) == [
            "a", *(f"c{i}" for i in range(1, erasure.ATTEMPTS))]


def test_the_heir_is_the_oldest_linked_procedure_with_a_wording() -> None:
    """Rows come oldest first; a procedure without a usable wording is passed over, an
    intent none of whose procedures has one is dropped, one with none linked is left to
    the orphans."""
    rows = [
        ("i1", {"instruction": "x"}, "s1"),
        ("i1", {"intent": "  "}, "s1"),
        ("i1", {"intent": "boil water"}, None),
        ("i1", {"intent": "boil more water"}, "s2"),
        ("i2", {"intent": 3}, "s2"),
        ("i2", None, "s2"),
    ]
    found, dropped = heirs(["i1", "i2", "i3", "i1"], rows)
    assert found == {"i1": IntentWording("boil water", None)}
    assert dropped == ["i2"]
