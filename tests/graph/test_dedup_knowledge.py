"""Facts and instructions are stored once, on each backend: one committed again joins the node
(its provenance grows), a near duplicate is merged through the LLM, and two that say different
things stay apart whatever their cosine (mnemo/graph/dedup.py)."""

from __future__ import annotations

from collections import Counter

import mnemo
from mnemo.graph import history
from mnemo.graph.model import Changeset, Link, LinkType, NodeType, Vector
from mnemo.graph.ports import GraphStore, IntentPolicy
from tests.graph._support import REPO, Merger, at_cosine, axis, draft, judged, policy

PROVENANCE = LinkType.PROVENANCE


def said(prefix: str, kind: NodeType, text: str, vector: Vector) -> Changeset:
    """One fact (or instruction) and the step it came from."""
    node, step = f"{prefix}-node", f"episodic_{prefix}:0"
    return Changeset(f"{prefix}-cs", REPO, [
        draft(step, NodeType.EPISODIC, f"step of {prefix}", axis(6)),
        draft(node, kind, text, vector),
    ], [Link(node, step, PROVENANCE)])


async def texts(graph: GraphStore, kind: NodeType = NodeType.SEMANTIC) -> list[str]:
    return sorted(n.text for n in await graph.get_nodes_by_type(REPO, [kind]))


async def test_a_fact_or_instruction_said_again_joins_the_node(graph: GraphStore) -> None:
    """The same fact (instruction) in a later commit adds no node: its step becomes the
    node's evidence too, and the record names the node it joined; applied again, the
    changeset adds nothing."""
    for kind in (NodeType.SEMANTIC, NodeType.PROCEDURAL):
        a, b = f"a{kind.value}", f"b{kind.value}"
        await graph.apply(said(a, kind, "Gunicorn listens on port 8000.", axis(0)),
                          intents=policy())
        receipt = await graph.apply(
            said(b, kind, "gunicorn listens on port 8000", at_cosine(0.99)), intents=policy())
        assert receipt.node_ids == [f"episodic_{b}:0"]
        assert await texts(graph, kind) == ["Gunicorn listens on port 8000."]
        steps = {n.node_id for n in await graph.neighbors(REPO, [f"{a}-node"], PROVENANCE)}
        assert steps == {f"episodic_{a}:0", f"episodic_{b}:0"}
        record = (await history.history(graph, REPO, 1))[0]
        assert record.joined == (f"{a}-node",)
        await graph.apply(said(b, kind, "gunicorn listens on port 8000", at_cosine(0.99)),
                          intents=policy())
        assert await texts(graph, kind) == ["Gunicorn listens on port 8000."]


async def test_facts_that_say_different_things_stay_apart(graph: GraphStore) -> None:
    """Another value, a negation or words the other lacks make two facts, however close their
    vectors: the cosine of "... port 8000" and "... port 8001" is 0.96 with the default
    embedder."""
    pairs = [("Gunicorn listens on port 8000.", "Gunicorn listens on port 8001."),
             ("The cache is enabled.", "The cache is not enabled."),
             ("Dana likes tea.", "Dana likes coffee.")]
    for n, (first, second) in enumerate(pairs):
        await graph.apply(said(f"x{n}", NodeType.SEMANTIC, first, axis(n)), intents=policy())
        await graph.apply(said(f"y{n}", NodeType.SEMANTIC, second, axis(n)), intents=policy())
    assert await texts(graph) == sorted(text for pair in pairs for text in pair)


async def test_a_near_duplicate_is_merged_through_the_llm(graph: GraphStore) -> None:
    """Between the thresholds, the LLM merges the two, asked with the fuller wording as the
    existing one; the node takes its answer when that keeps every word of the fuller
    wording, else the fuller wording itself."""
    fuller = "Gunicorn listens on port 8000 behind nginx."
    merged = ("Behind nginx, gunicorn listens on port 8000.", axis(3))
    merger = Merger(merged)
    await graph.apply(said("a", NodeType.SEMANTIC, "Gunicorn listens on port 8000.", axis(0)),
                      intents=policy(merger))
    await graph.apply(said("b", NodeType.SEMANTIC, fuller, at_cosine(0.9)),
                      intents=policy(merger))
    assert merger.calls == [(fuller, "Gunicorn listens on port 8000.")]
    assert await texts(graph) == [merged[0]]
    assert (await history.history(graph, REPO, 1))[0].reworded == ("a-node",)

    shorter = Merger(("Gunicorn is behind nginx.", axis(4)))
    await graph.apply(said("c", NodeType.SEMANTIC, "Redis listens on port 6379.", axis(2)),
                      intents=policy(shorter))
    await graph.apply(said("d", NodeType.SEMANTIC, "Redis listens on port 6379 locally.",
                           at_cosine(0.9, base=2, other=5)), intents=policy(shorter))
    assert "Redis listens on port 6379 locally." in await texts(graph)


async def test_a_fact_joins_no_fact_it_contradicts_or_that_is_retired(
    graph: GraphStore,
) -> None:
    """A fact the contradiction check pairs with an existing one is not joined to it, though
    alike; nor is one identical to a retired fact: that one holds again, as a node of its
    own."""
    contradicts = judged(lambda old, new: new.endswith(" now") or "blue" in new)
    judging = IntentPolicy(0.95, 0.8, Merger(), contradicts)
    for prefix, text, at in (("a", "the cache is enabled", 0), ("b", "the cache is enabled now", 0),
                             ("x", "the door is red", 1), ("y", "the door is blue", 1),
                             ("z", "the door is red", 1)):
        await graph.apply(said(prefix, NodeType.SEMANTIC, text, axis(at)), intents=judging)
    nodes = await graph.get_nodes_by_type(REPO, [NodeType.SEMANTIC])
    assert Counter((n.text, n.retired) for n in nodes) == Counter({
        ("the cache is enabled", True): 1, ("the cache is enabled now", False): 1,
        ("the door is red", True): 1, ("the door is blue", False): 1,
        ("the door is red", False): 1})


async def test_the_quickstart_run_twice_recalls_each_sentence_once(store: str) -> None:
    """README's quickstart, run twice: each fact and instruction is one node, both sessions'
    steps its evidence, and a recall answers each sentence once (a fact and an instruction of
    one wording are one answer)."""
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(64)) as mem:
        await mem.open_repo(REPO)
        for _ in range(2):
            sid = await mem.start_session("Deploy the blog", repo=REPO)
            await mem.append(sid, "nginx returns 502: nothing listens on port 8000.",
                             "Start gunicorn on port 8000 and reload nginx.")
            await mem.close_and_commit(sid)
        knowledge = await mem.get_nodes_by_type(REPO, [NodeType.SEMANTIC, NodeType.PROCEDURAL])
        assert len(knowledge) == len({(n.type, n.text) for n in knowledge}) == 3
        for node in knowledge:
            assert len(await mem.get_linked_nodes(REPO, [node.id], PROVENANCE)) == 2
        found = await mem.recall(REPO, "which port does gunicorn use?")
        said = [m.node.text for m in found.memories
                if m.node.type in (NodeType.SEMANTIC, NodeType.PROCEDURAL)]
        assert "Start gunicorn on port 8000 and reload nginx." in said
        assert len(said) == len(set(said)), said


async def test_a_fact_joins_none_of_another_scope(graph: GraphStore) -> None:
    """The same fact said in two scopes (the metadata of the session or ingest that said it)
    is two nodes; said twice in one changeset, or again in one of the scopes, it joins that
    scope's node."""
    def scoped(prefix: str, user: str, count: int = 1) -> Changeset:
        nodes = [draft(f"{prefix}-{user}{n or ''}", NodeType.SEMANTIC, "Dana likes tea.",
                       axis(0)) for n in range(count)]
        return Changeset(f"{prefix}-cs", REPO, nodes, [], metadata={"user_id": user})

    await graph.apply(scoped("a", "alice"), intents=policy())
    await graph.apply(scoped("b", "bob"), intents=policy())
    await graph.apply(scoped("d", "carol", 2), intents=policy())  # d-carol1 joins d-carol
    await graph.apply(scoped("c", "alice"), intents=policy())
    nodes = await graph.get_nodes_by_type(REPO, [NodeType.SEMANTIC])
    assert sorted(n.id for n in nodes) == ["a-alice", "b-bob", "d-carol"]
    assert {str(n.id): n.metadata for n in nodes}["b-bob"] == {"user_id": "bob"}
    assert (await history.history(graph, REPO, 1))[0].joined == ("a-alice",)
