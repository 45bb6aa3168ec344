"""Knowledge first: a fact stands for the step it was extracted from, levers never lift an
unrelated step above a matching fact, and routes come after every memory."""

from __future__ import annotations

import mnemo
from mnemo.graph.model import Link, LinkType, Node, NodeId, NodeType, now_utc
from mnemo.recall.knowledge import matching_first, stand_ins
from tests.backends import open_stores
from tests.recall import fact_first
from tests.recall.fact_first import SESSIONS, SuiteLLM, remember
from tests.recall.test_engine import EMBEDDER, REPO, build, run

N = NodeType


def node(node_id: str, kind: NodeType) -> Node:
    return Node(id=NodeId(node_id), type=kind, text=node_id, data={}, created_at=now_utc())


FACT, STEP, OTHER = node("fact", N.SEMANTIC), node("step", N.EPISODIC), node("other", N.EPISODIC)


STEPS = {"fact": "step", "step": "step", "proc": "step"}
PROC = node("proc", N.PROCEDURAL)


def test_a_matching_fact_stands_in_for_its_step() -> None:
    """A fact matched at least half as well as its step stands in for it."""
    scored = [(0.6, STEP, None), (0.5, FACT, None)]
    found = stand_ins(scored, {"step": 0.9, "fact": 0.6}, STEPS, {})
    assert {step: item[1].id for step, item in found.items()} == {"step": "fact"}


def test_a_fact_that_barely_matches_leaves_its_step() -> None:
    """A fact the query's channels matched less than half as well as its step does not stand
    in for it, nor does a fact for a step that restates the query more closely."""
    scored = [(0.6, STEP, None), (0.2, FACT, None)]
    assert stand_ins(scored, {"step": 0.9, "fact": 0.3}, STEPS, {}) == {}
    assert stand_ins(scored, {"step": 0.9, "fact": 0.9}, STEPS, {"step": 0}) == {}
    # A fact that restates it as closely stands in.
    assert stand_ins(scored, {"step": 0.9, "fact": 0.9}, STEPS, {"step": 0, "fact": 0})


def test_a_question_of_what_to_do_is_answered_by_the_steps_procedure() -> None:
    """In procedural mode the procedure made from a step stands in for it, ahead of a fact
    that matches better and however little its own words match."""
    scored = [(0.6, STEP, None), (0.5, FACT, None), (0.3, PROC, None)]
    direct = {"step": 0.9, "fact": 0.8}
    assert stand_ins(scored, direct, STEPS, {})["step"][1].id == "fact"
    assert stand_ins(scored, direct, STEPS, {}, procedural=True)["step"][1].id == "proc"


async def test_a_fact_takes_its_steps_place_and_names_it_as_evidence(store: str) -> None:
    """Told in a step with four other facts, "Password reset emails expire after one hour"
    answers its question first; its step is its evidence, not another result."""
    async with mnemo.Memory(store, llm=SuiteLLM()) as mem:
        await remember(mem, [s for s in SESSIONS if s.goal == "Configure the API service"])
        result = await mem.recall(fact_first.REPO, "when do password reset emails expire?", k=5)
    first = result.memories[0]
    assert first.node.text == "Password reset emails expire after one hour."
    assert len(first.evidence) == 1
    assert first.evidence[0] not in [m.node.id for m in result.memories]


def test_a_lever_never_lifts_an_unrelated_step_above_a_matching_fact() -> None:
    """A neighbour (no hop-0 relevance) scored above a matching fact among the results is
    placed below it, at most at its score; a step that matches keeps its order."""
    ranked = [(0.9, OTHER, None), (0.8, STEP, None), (0.7, FACT, None)]
    out = matching_first(ranked, {"step": 1.0, "fact": 0.8}, {}, k=3)
    assert [(n.id, s) for s, n, _ in out] == [("step", 0.8), ("fact", 0.7), ("other", 0.7)]
    # A fact below the results is not lifted into them.
    assert matching_first(ranked, {"step": 1.0, "fact": 0.8}, {}, k=2) == ranked


async def test_the_readme_quickstart_answers_with_its_facts(store: str) -> None:
    """The README's quickstart, offline with the default embedder: the top 2 for "which port
    does gunicorn use?" are its two sentences, as facts or procedures (each naming port 8000;
    the action is both, one answer), no route."""
    async with mnemo.Memory(store) as mem:
        await mem.open_repo("assistant")
        sid = await mem.start_session("Deploy the blog", repo="assistant")
        await mem.append(sid, "nginx returns 502: nothing listens on port 8000.",
                         "Start gunicorn on port 8000 and reload nginx.")
        await mem.close_and_commit(sid)
        hits = (await mem.recall("assistant", "which port does gunicorn use?")).memories
    assert [h.node.type in (N.SEMANTIC, N.PROCEDURAL) for h in hits[:2]] == [True] * 2
    assert all("8000" in h.node.text for h in hits[:2])
    assert len({h.node.text for h in hits[:2]}) == 2
    kinds = [h.node.type in (N.SEMANTIC, N.PROCEDURAL, N.EPISODIC) for h in hits]
    assert kinds == sorted(kinds, reverse=True)
    assert hits[0].evidence


async def test_a_fact_that_stands_in_for_its_step_counts_an_access_of_it(store: str) -> None:
    """The step a returned fact was made from counts an access with it, as when the step was
    returned itself; it is its evidence, not another result."""
    async with open_stores(store, EMBEDDER.dim) as backend:
        await build(backend.graph,
                    [("fact", N.SEMANTIC, "the cache lives in redis on port 6379"),
                     ("step", N.EPISODIC, "the cache lives in redis on port 6379 said the admin")],
                    [Link("fact", "step", LinkType.PROVENANCE)])
        result = await run(backend.graph, "redis cache port", k=2)
        assert [m.node.id for m in result.memories] == ["fact"]
        assert result.memories[0].evidence == ("step",)
        stats = await backend.graph.access_stats(REPO, ["fact", "step"])
        assert stats["fact"][0] == stats["step"][0] == 1
