"""`Memory.correct`: a fact's corrected wording retires the old fact as a contradiction does,
in a commit of the history that revert undoes; on each backend."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import mnemo
from mnemo.adapters.hashing import HashEmbedder
from mnemo.cli.history import origin
from mnemo.graph.model import Link, LinkType

REPO = "ops"
STEP = mnemo.Step(
    "The blog's gunicorn worker binds port 8001 on the web host.",
    "Point nginx at gunicorn on port 8001 and reload it.",
)


async def a_fact(mem: mnemo.Memory) -> mnemo.Node:
    await mem.open_repo(REPO)
    await mem.ingest(REPO, mnemo.Trajectory("Deploy the blog", [STEP]), source_id="log")
    facts = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])
    return next(f for f in facts if "8001" in f.text)


async def test_a_correction_retires_the_fact_and_revert_brings_it_back(store: str) -> None:
    """The corrected wording is a new live fact of the old one's type that SUPERSEDES it; the
    old one is kept, retired with valid_to; recall ranks the new one first and names it as
    the old one's successor; the history records the commit, and reverting it makes the old
    fact live again."""
    async with mnemo.Memory(store, embedder=HashEmbedder()) as mem:
        old = await a_fact(mem)
        text = "The blog's gunicorn worker binds port 8000 on the web host."
        receipt = await mem.correct(REPO, old.id, text)
        (new_id,) = receipt.node_ids
        new = await mem.get_node(REPO, new_id)
        retired = await mem.get_node(REPO, old.id)
        assert new is not None
        assert retired is not None
        assert (new.type, new.text, new.retired) == (old.type, text, False)
        assert retired.retired
        assert retired.valid_to is not None
        assert Link(new_id, old.id, LinkType.SUPERSEDES) in await mem.links(REPO)

        found = (await mem.recall(REPO, "which port does the gunicorn worker bind?")).memories
        ids = [m.node.id for m in found]
        assert ids.index(new_id) < ids.index(old.id)
        assert next(m for m in found if m.node.id == old.id).superseded_by == new_id

        (newest, *_) = await mem.history(REPO, limit=1)
        assert (newest.id, newest.node_ids, newest.retired, newest.corrects) == (
            receipt.changeset_id, (new_id,), (old.id,), old.id)
        assert [c.corrects for c in await mem.history(REPO)][1:] == [None]
        assert origin(newest, {}, None) == f"correction of {old.id}"
        await mem.revert(REPO, receipt.changeset_id)
        back = await mem.get_node(REPO, old.id)
        assert back is not None
        assert not back.retired
        assert await mem.get_node(REPO, new_id) is None


async def test_only_a_live_fact_is_corrected(store: str) -> None:
    """A node that is not a fact, a retired fact, an unknown node and a blank text are
    refused, and nothing is committed."""
    async with mnemo.Memory(store, embedder=HashEmbedder()) as mem:
        old = await a_fact(mem)
        (step, *_) = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.EPISODIC])
        await mem.correct(REPO, old.id, "The worker binds port 8000.")
        commits = len(await mem.history(REPO, limit=100))
        with pytest.raises(mnemo.InvalidInputError, match="not a live fact"):
            await mem.correct(REPO, step.id, "The worker binds port 8000.")
        with pytest.raises(mnemo.InvalidInputError, match="retired"):
            await mem.correct(REPO, old.id, "The worker binds port 8002.")
        with pytest.raises(mnemo.NotFoundError):
            await mem.correct(REPO, "semantic_missing", "The worker binds port 8000.")
        with pytest.raises(mnemo.InvalidInputError, match="blank"):
            await mem.correct(REPO, old.id, "  ")
        assert len(await mem.history(REPO, limit=100)) == commits


async def test_a_correction_to_what_a_live_fact_says_joins_it_and_retires_the_old(
    store: str,
) -> None:
    """Corrected to the wording of another live fact, the fact is retired and superseded by
    that one, whose id the receipt names (no second node of that wording); reverting the
    correction makes the old fact live again and leaves the other as it was."""
    async with mnemo.Memory(store, embedder=HashEmbedder()) as mem:
        old = await a_fact(mem)
        other = mnemo.Trajectory("Cache", [mnemo.Step("The cache TTL is ten minutes.", "ok")])
        await mem.ingest(REPO, other, source_id="cache")
        facts = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])
        said = next(f for f in facts if "TTL" in f.text)
        receipt = await mem.correct(REPO, old.id, said.text)
        assert receipt.node_ids == [said.id]
        retired = await mem.get_node(REPO, old.id)
        assert retired is not None
        assert retired.retired
        assert Link(said.id, old.id, LinkType.SUPERSEDES) in await mem.links(REPO)
        texts = [f.text for f in await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])]
        assert texts.count(said.text) == 1
        await mem.revert(REPO, receipt.changeset_id)
        back = await mem.get_node(REPO, old.id)
        assert back is not None
        assert not back.retired
        assert await mem.get_node(REPO, said.id) == said


async def test_a_correction_keeps_nothing_of_its_source_that_forget_erases(store: str) -> None:
    """A fact and a procedure corrected to wordings without the source's word "zebrinox",
    then the source forgotten: no node's text or data holds the word (not the concepts, nor
    the procedure's condition, intent and old instruction). A corrected procedure's
    instruction is its new text and its worth stays; a remembered fact's data, its source's,
    is not kept."""
    marker = "zebrinox"
    step = mnemo.Step(f"The {marker} router at the edge stopped answering pings.",
                      f"Check the {marker} uplink cable and restart the router.")
    async with mnemo.Memory(store, embedder=HashEmbedder()) as mem:
        await mem.open_repo(REPO)
        await mem.ingest(REPO, mnemo.Trajectory(f"Fix the {marker} router", [step]),
                         source_id="log")
        (fact, *_), (procedure, *_) = [await mem.get_nodes_by_type(REPO, [kind]) for kind in (
            mnemo.NodeType.SEMANTIC, mnemo.NodeType.PROCEDURAL)]
        text = "Restart the edge router from its admin page."
        new_ids = [(await mem.correct(REPO, old.id, text)).node_ids[0]
                   for old in (fact, procedure)]
        new_procedure = await mem.get_node(REPO, new_ids[1])
        assert new_procedure is not None
        assert new_procedure.data["instruction"] == text
        assert new_procedure.data["return_score"] == procedure.data["return_score"]
        await mem.forget(REPO, "log")
        left = await mem.get_nodes_by_type(REPO, list(mnemo.NodeType))
        assert {n.id for n in left} >= set(new_ids)
        assert not [n.id for n in left if marker in n.text or marker in repr(n.data)]
        (said,) = (await mem.remember(REPO, "The door code is 1234.", source_id="note",
                                      data={"ticket": 42})).node_ids
        (fixed,) = (await mem.correct(REPO, said, "The door code is 9999.")).node_ids
        corrected = await mem.get_node(REPO, fixed)
        assert corrected is not None
        assert corrected.data == {}


async def test_remember_again_of_the_same_fact_returns_the_first_receipt(store: str) -> None:
    """A script run twice: `remember` of the same text, data and metadata under its source id
    stores nothing and returns the first receipt (also when the fact joined another, and for
    calls racing); another text, data or metadata under that id is ConflictError until it is
    forgotten; a fact deleted or retired since is stored again."""
    async with mnemo.Memory(store, embedder=HashEmbedder()) as mem:
        await mem.open_repo(REPO)
        args: dict[str, Any] = {"source_id": "note", "data": {"ticket": 42},
                                "metadata": {"user_id": "alice"}}
        first = await mem.remember(REPO, "The door code is 1234.", **args)
        commits = len(await mem.history(REPO))
        assert await mem.remember(REPO, "The door code is 1234.", **args) == first
        assert len(await mem.history(REPO)) == commits
        for other in ({"data": {"ticket": 43}}, {"metadata": {"user_id": "bob"}}):
            with pytest.raises(mnemo.ConflictError, match="note"):
                await mem.remember(REPO, "The door code is 1234.", **{**args, **other})
        with pytest.raises(mnemo.ConflictError, match="note"):
            await mem.remember(REPO, "The door code is 9999.", **args)
        joined = await mem.remember(REPO, "The door code is 1234.", **{**args, "source_id": "b"})
        assert joined.node_ids == first.node_ids
        assert await mem.remember(REPO, "The door code is 1234.",
                                  **{**args, "source_id": "b"}) == joined
        raced = await asyncio.gather(*(mem.remember(REPO, "The gate code is 77.", source_id="c")
                                       for _ in range(3)))
        assert len({r.changeset_id for r in raced}) == 1
        facts = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])
        assert [f.text for f in facts].count("The gate code is 77.") == 1
        await mem.forget(REPO, "note")
        await mem.forget(REPO, "b")
        again = await mem.remember(REPO, "The door code is 9999.", **args)
        assert again.changeset_id != first.changeset_id
        await mem.delete_nodes(REPO, again.node_ids)  # by hand: the source id is free
        anew = await mem.remember(REPO, "The door code is 9999.", **args)
        assert anew.node_ids
        assert anew.node_ids != again.node_ids
        assert await mem.get_node(REPO, anew.node_ids[0]) is not None
        # Corrected since, the fact is retired: the same call stores it again, live, and the
        # retired one stays, superseded, as the correction left it.
        correction = await mem.correct(REPO, anew.node_ids[0], "The door code is 5555.")
        back = await mem.remember(REPO, "The door code is 9999.", **args)
        assert back.node_ids != anew.node_ids
        fact = await mem.get_node(REPO, back.node_ids[0])
        assert fact is not None
        assert (fact.text, fact.retired) == ("The door code is 9999.", False)
        retired = await mem.get_node(REPO, anew.node_ids[0])
        assert retired is not None
        assert retired.retired
        assert Link(correction.node_ids[0], retired.id, LinkType.SUPERSEDES) in await mem.links(
            REPO)
        assert await mem.remember(REPO, "The door code is 9999.", **args) == back
        await mem.forget(REPO, "note")  # both facts the source id stored go
        assert await mem.get_node(REPO, retired.id) is None
        assert await mem.get_node(REPO, fact.id) is None


async def test_remember_names_the_fact_its_words_joined(store: str) -> None:
    """A fact remembered again under another source, or one an ingest already extracted, is
    stored once; its receipt names that fact (it named none), as a correction's does."""
    async with mnemo.Memory(store, embedder=HashEmbedder()) as mem:
        fact = await a_fact(mem)
        (first,) = (await mem.remember(REPO, "The door code is 1234.", source_id="a")).node_ids
        again = await mem.remember(REPO, "The door code is 1234.", source_id="b")
        assert again.node_ids == [first]
        extracted = await mem.remember(REPO, fact.text, source_id="c")
        assert extracted.node_ids == [fact.id]
        await mem.forget(REPO, "a")
        assert await mem.get_node(REPO, first) is not None  # "b" still holds it
