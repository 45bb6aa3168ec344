"""The speaker match: a candidate said by someone the query names scores higher."""

from __future__ import annotations

import pytest

import mnemo
from mnemo.graph.model import Changeset, Link, LinkType, NodeDraft, NodeType
from mnemo.graph.ports import GraphStore
from mnemo.recall.engine import Recaller
from mnemo.recall.query import query_names, without_names
from tests.fakes import RecordingEmbedder
from tests.graph._support import policy
from tests.recall.test_engine import EMBEDDER, check_invariants, graph

__all__ = ["graph"]  # the fixture, re-used


def test_query_names_are_capitalised_non_stopwords_without_possessives() -> None:
    """The first word counts too; "'s" goes; question words and "I" are not names."""
    assert query_names("Melanie's pets? What does Caroline like, and did I?") == {
        "melanie", "caroline"}
    assert query_names("what did you paint") == frozenset()


def test_the_dense_query_is_the_query_without_its_names() -> None:
    """Names and their possessives go, punctuation and all; a query of names alone stays; a
    capitalised first word is a name only with a possessive."""
    assert without_names("What did Melanie's kids paint?") == "What did kids paint?"
    assert without_names("Melanie's pets, and Caroline's?") == "pets, and"
    assert without_names("Restart the webserver") == "Restart the webserver"
    assert without_names("what did you paint") == "what did you paint"
    assert without_names("Melanie's Caroline?") == "Melanie's Caroline?"
    assert without_names("Caroline") == "Caroline"


async def test_the_dense_channel_embeds_the_query_without_its_names(graph: GraphStore) -> None:
    """By default recall embeds the query without the names it mentions (the words channel
    and the speaker match still see them); `recall_dense_without_names=False` embeds it
    whole."""
    embedder = RecordingEmbedder()
    assert embedder.dim == EMBEDDER.dim
    offline = mnemo.OfflineLLM()
    query = "Where does Caroline's nginx listen?"
    for whole in (False, True):
        embedder.texts.clear()
        config = mnemo.Config(recall_dense_without_names=not whole)
        recaller = Recaller(graph, embedder, config, planner=offline, llm=offline)
        result = await recaller.recall("r", query, k=3, types=None)
        check_invariants(result, 3, config)
        assert embedder.texts[0] == (query if whole else "Where does nginx listen?")


async def test_a_line_said_by_the_named_speaker_is_boosted(graph: GraphStore) -> None:
    """With recall_speaker_boost b, a step whose speaker the query names, and a fact made from
    that step, score 1 + b times more than a step that only mentions the name (which is
    divided by 1 + b: scores stay within [0, 1])."""
    texts = {
        "episodic_ep:0": "Caroline (8 May 2023): Thanks Melanie, I love swimming too",
        "episodic_ep:1": "Melanie (8 May 2023): I went swimming with the kids",
        "fact_1": "Went swimming with the kids at the lake",
    }
    vectors = await EMBEDDER.embed(list(texts.values()))
    drafts = [
        NodeDraft(node_id, NodeType.SEMANTIC if node_id == "fact_1" else NodeType.EPISODIC,
                  text, {"episode_id": "ep", "index": i}, vectors[i])
        for i, (node_id, text) in enumerate(texts.items())
    ]
    links = [Link("fact_1", "episodic_ep:1", LinkType.PROVENANCE)]
    await graph.apply(Changeset("cs-s", "s", drafts, links), intents=policy())
    offline = mnemo.OfflineLLM()

    async def scores(boost: float, query: str = "What swimming does Melanie do?"
                     ) -> dict[str, float]:
        config = mnemo.Config(value_weight=0.0, recall_neighbour_weight=0.0,
                              recall_mmr_lambda=1.0, recall_distinct_steps=False,
                              recall_speaker_boost=boost)
        recaller = Recaller(graph, EMBEDDER, config, planner=offline, llm=offline)
        result = await recaller.recall("s", query, k=3,
                                       types=[NodeType.EPISODIC, NodeType.SEMANTIC])
        check_invariants(result, 3, config)
        return {m.node.id: m.score for m in result.memories}

    plain, boosted = await scores(0.0), await scores(0.5)
    assert boosted["episodic_ep:1"] == pytest.approx(plain["episodic_ep:1"])
    assert boosted["fact_1"] == pytest.approx(plain["fact_1"])
    assert boosted["episodic_ep:0"] == pytest.approx(plain["episodic_ep:0"] / 1.5)
    # A query that names no speaker (or nobody) ranks as without the lever.
    for query in ("What swimming do the kids do?", "What swimming does Bob do?"):
        assert await scores(0.5, query) == pytest.approx(await scores(0.0, query))
