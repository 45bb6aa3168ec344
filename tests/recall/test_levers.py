"""Recall levers: MMR, pseudo-relevance feedback, neighbouring steps, the query
side of an embedder, and the optional LLM re-ranking."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import mnemo
from mnemo.calls.tasks import task_inputs
from mnemo.graph.model import Changeset, Node, NodeDraft, NodeId, NodeType, now_utc
from mnemo.graph.ports import GraphStore
from mnemo.ports import LLMRequest, LLMResponse
from mnemo.recall.engine import Recaller
from mnemo.recall.model import adjacent_steps
from mnemo.recall.query import feedback_terms, query_side
from mnemo.recall.ranking import maximal_marginal_relevance
from mnemo.recall.tasks import LLMReranker, full_order, parse_rerank
from tests.backends import open_stores
from tests.fakes import js
from tests.graph._support import policy
from tests.recall.test_engine import EMBEDDER, REPO, check_invariants, graph

__all__ = ["graph"]  # the fixture, re-used


# A question's turn, a reply, the turn that answers it (two steps on), an unrelated turn.
TWO_APART = ["what did you paint last weekend", "guess", "a lake at sunrise, with my kids",
             "the weather was awful on monday"]


async def add_episode(graph: GraphStore, repo: str, episode: str, texts: list[str]) -> None:
    """Commits an episode's steps as the pipeline names them ("episodic_<episode>:<i>")."""
    vectors = await EMBEDDER.embed(texts)
    drafts = [NodeDraft(f"episodic_{episode}:{i}", NodeType.EPISODIC, text,
                        {"episode_id": episode, "index": i}, vectors[i])
              for i, text in enumerate(texts)]
    await graph.apply(Changeset(f"cs-{episode}", repo, drafts, []), intents=policy())


@pytest.fixture
async def words_alone(store: str) -> AsyncIterator[GraphStore]:
    """An empty graph whose words are searched by the store's own full-text search, where a
    step's document is its text alone: the neighbour lever's tests see the lever alone (the
    lexical index's windows would find the turn after by its neighbour's words already)."""
    async with open_stores(store, EMBEDDER.dim, lexical_dir="") as backend:
        yield backend.graph


def unit(*values: float) -> np.ndarray:
    vector = np.asarray(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


def test_mmr_with_lambda_one_keeps_the_order() -> None:
    """lambda = 1 ranks by relevance alone."""
    order = ["a", "b", "c"]
    vectors = {"a": unit(1, 0), "b": unit(1, 0), "c": unit(0, 1)}
    assert maximal_marginal_relevance(order, {"a": 1.0, "b": 0.9, "c": 0.5}, vectors, 1.0) == order


def test_mmr_moves_a_near_duplicate_below_a_distinct_item() -> None:
    """A near copy of the first result drops below a less relevant but different one."""
    relevance = {"a": 1.0, "b": 0.95, "c": 0.7}
    vectors = {"a": unit(1, 0), "b": unit(1, 0.05), "c": unit(0, 1)}
    assert maximal_marginal_relevance(["a", "b", "c"], relevance, vectors, 0.5) == ["a", "c", "b"]


def test_mmr_never_penalises_an_item_without_a_vector() -> None:
    """Without a vector an item competes on relevance alone, and every item comes back once."""
    relevance = {"a": 1.0, "b": 0.95, "c": 0.7}
    vectors = {"a": unit(1, 0), "c": unit(1, 0)}
    result = maximal_marginal_relevance(["a", "b", "c"], relevance, vectors, 0.5)
    assert result == ["a", "b", "c"]



def mmr_reference(
    order: list[str], relevance: dict[str, float], vectors: dict[str, np.ndarray], lam: float
) -> list[str]:
    """MMR as written in the paper, one pick at a time in plain Python (float64 cosines)."""
    top = max(relevance.values(), default=0.0) or 1.0
    chosen: list[str] = []
    left = list(order)
    while left:
        def mmr(item: str) -> float:
            v = vectors.get(item)
            near = max((float(np.dot(v.astype(np.float64), vectors[c].astype(np.float64)))
                        for c in chosen if c in vectors and v is not None), default=0.0)
            return lam * relevance[item] / top - (1 - lam) * max(near, 0.0)

        pick = max(left, key=mmr)  # the first of equals, as the order has them
        chosen.append(pick)
        left.remove(pick)
    return chosen


@pytest.mark.slow
@settings(max_examples=200)
@given(data=st.data(), n=st.integers(3, 25), lam=st.sampled_from([0.0, 0.3, 0.5, 0.7, 0.9]))
def test_mmr_picks_as_the_greedy_definition_does(
    data: st.DataObject, n: int, lam: float
) -> None:
    """Each pick maximises lam x relevance / best - (1 - lam) x its highest cosine to the
    picks so far; every item comes back once. Relevances and vectors are drawn from a few
    distinct values (no near ties, where float32 and float64 could pick differently)."""
    order = [f"n{i}" for i in range(n)]
    relevance = {i: data.draw(st.sampled_from([0.2, 0.5, 0.9, 1.0])) for i in order}
    basis = [unit(1, 0, 0), unit(0, 1, 0), unit(0, 0, 1), unit(1, 1, 0)]
    vectors = {i: basis[data.draw(st.integers(0, 3))] for i in order
               if data.draw(st.booleans())}
    result = maximal_marginal_relevance(order, relevance, vectors, lam)
    assert sorted(result) == sorted(order)
    assert result == mmr_reference(order, relevance, vectors, lam)



def test_mmr_returns_every_item_once_beside_a_vector_that_is_not_finite() -> None:
    """A NaN vector neither penalises nor is picked again: every item comes back once (a
    faster loop repeated the NaN item)."""
    relevance = {"a": 1.0, "b": 0.9, "c": 0.8, "d": 0.7}
    vectors = {"a": unit(1, 0), "b": np.array([np.nan, 0.0], dtype=np.float32),
               "c": unit(0, 1), "d": unit(1, 1)}
    result = maximal_marginal_relevance(["a", "b", "c", "d"], relevance, vectors, 0.5)
    assert sorted(result) == ["a", "b", "c", "d"]


def test_feedback_terms_are_shared_content_words_absent_from_the_query() -> None:
    """Words in at least two hits, not in the query, not stopwords or numbers, most shared
    first."""
    documents = [
        "Caroline went to the pride parade in Boston last June",
        "Caroline said the parade in Boston was loud",
        "the parade again, 2023",
        "Melanie painted a lake",
    ]
    terms = feedback_terms("When did Caroline go to a parade?", documents, 3)
    assert terms == ["boston"]
    assert feedback_terms("parade", documents, 1) == ["caroline"]
    assert feedback_terms("parade", documents, 0) == []


def test_feedback_terms_are_whole_words_as_a_search_splits_them() -> None:
    """A word with combining marks ("हिन्दी": a virama and vowel signs) is fed back whole,
    as the search splits it (`text.query_words`), and a word the query already has is
    known in any of its spellings (composed or not). Before, PRF split words with its own
    pattern, which stops at a mark: "हिन्दी" came back as "हिन", and a decomposed "café" in
    the query did not count as the composed one of the hits."""
    documents = [
        "the हिन्दी class met at the cafe\u0301 again",
        "हिन्दी poems read at the café",
        "a class of हिन्दी",
    ]
    assert feedback_terms("class", documents, 3) == ["हिन्दी", "café"]
    assert feedback_terms("cafe\u0301 class", documents, 3) == ["हिन्दी"]
    # A contraction's first half is no content word; an identifier is one, whole.
    chat = ["I didn't set max_connections", "she doesn\u2019t know max_connections", "didn't",
            "we didn\u02bct", "you didn\u02bct", "they didn\u2018t", "I didn\u2018t"]
    assert feedback_terms("server", chat, 3) == ["max_connections"]


def test_a_reranker_order_keeps_every_candidate_once() -> None:
    """The reply's numbers first (1-based, strangers and repeats dropped), then the rest."""
    reply = LLMResponse(data={"order": [3, 3, 9, 1, True]})
    assert full_order(parse_rerank(reply), 4) == [2, 0, 1, 3]
    assert full_order([-1, 1, "0", 1.0], 3) == [1, 0, 2]
    with pytest.raises(ValueError, match="order"):
        parse_rerank(LLMResponse(data={"ranking": [1]}))


class PrefixedEmbedder:
    """Embeds queries as the hashed vector of 'q ' + text."""

    dim = EMBEDDER.dim

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return await EMBEDDER.embed(list(texts))

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return await EMBEDDER.embed([f"q {t}" for t in texts])


async def test_a_query_is_embedded_by_the_query_side_when_there_is_one() -> None:
    """An embedder with embed_queries embeds queries through it; others through embed."""
    prefixed = PrefixedEmbedder()
    assert np.allclose(await query_side(prefixed).embed(["x"]), await EMBEDDER.embed(["q x"]))
    assert query_side(EMBEDDER) is EMBEDDER


class Reranker:
    """A fake LLM that reverses every candidate list it is asked to re-rank."""

    def __init__(self) -> None:
        self.requests: list[LLMRequest] = []

    async def generate(self, request: LLMRequest) -> LLMResponse:
        self.requests.append(request)
        if request.task != "recall_rerank":
            raise mnemo.LLMError(f"unexpected task {request.task}")
        memories = js(task_inputs(request))["memories"]
        return LLMResponse(data={"order": list(range(len(memories), 0, -1))})


async def recall(graph: GraphStore, config: mnemo.Config, llm: mnemo.LLM, k: int) -> list[str]:
    offline = mnemo.OfflineLLM()
    recaller = Recaller(graph, EMBEDDER, config, planner=offline, llm=llm,
                        reranker=LLMReranker(llm) if config.recall_rerank else None)
    result = await recaller.recall(REPO, "nginx postgres webserver database error", k=k,
                                   types=None)
    check_invariants(result, k, config)
    return [m.node.id for m in result.memories]


async def test_the_llm_reranks_the_candidates_in_one_call(graph: GraphStore) -> None:
    """With recall_rerank the LLM's order of the best candidates is the result's, cut to k."""
    # value_weight 0: reinforcement by the first recall must not move the second.
    plain = await recall(graph, mnemo.Config(value_weight=0.0), mnemo.OfflineLLM(), 20)
    llm = Reranker()
    config = mnemo.Config(recall_rerank=True, recall_rerank_candidates=20, value_weight=0.0)
    reranked = await recall(graph, config, llm, 3)
    assert len(llm.requests) == 1
    assert reranked == list(reversed(plain))[:3]


async def test_the_offline_llm_keeps_the_order_and_a_failure_is_not_fatal(
    graph: GraphStore,
) -> None:
    """Offline re-ranking keeps the retrieval's order; a failing LLM leaves it too."""
    plain = await recall(graph, mnemo.Config(value_weight=0.0), mnemo.OfflineLLM(), 3)
    config = mnemo.Config(recall_rerank=True, value_weight=0.0)
    assert await recall(graph, config, mnemo.OfflineLLM(), 3) == plain

    class Broken:
        async def generate(self, request: LLMRequest) -> LLMResponse:
            raise mnemo.LLMError("down")

    assert await recall(graph, config, Broken(), 3) == plain


async def test_mmr_and_feedback_recall_within_the_invariants(graph: GraphStore) -> None:
    """With MMR and feedback on, a recall still returns at most k, best first, once each."""
    config = mnemo.Config(recall_mmr_lambda=0.5, recall_prf_terms=4)
    ids = await recall(graph, config, mnemo.OfflineLLM(), 4)
    assert len(ids) == 4


def step_node(episode: str, index: int | str) -> Node:
    return Node(NodeId(f"episodic_{episode}:{index}"), NodeType.EPISODIC, "t",
                {"episode_id": episode, "index": index}, now_utc())


def test_adjacent_steps_are_the_neighbours_in_the_episode() -> None:
    """Index +-1 (and +-2 with width 2), never below 0; nothing for other types or a node
    without its place."""
    assert adjacent_steps(step_node("ep", 3)) == ["episodic_ep:2", "episodic_ep:4"]
    assert adjacent_steps(step_node("ep", 0), width=2) == ["episodic_ep:1", "episodic_ep:2"]
    assert adjacent_steps(step_node("ep", "3")) == []
    fact = Node(NodeId("f"), NodeType.SEMANTIC, "t", {"episode_id": "ep", "index": 1}, now_utc())
    assert adjacent_steps(fact) == []


async def test_the_turn_after_a_hit_comes_in_as_its_neighbour(words_alone: GraphStore) -> None:
    """With recall_neighbour_weight the next step of the episode, sharing no word with the
    query, is recalled one hop out at that share of the hit's score."""
    graph = words_alone
    await add_episode(graph, "n", "ep", [
        "what did you paint last weekend",
        "a lake at sunrise, with my kids",
        "the weather was awful on monday",
    ])
    offline = mnemo.OfflineLLM()

    async def ids(config: mnemo.Config) -> dict[str, mnemo.Recalled]:
        recaller = Recaller(graph, EMBEDDER, config, planner=offline, llm=offline)
        result = await recaller.recall("n", "what did Melanie paint", k=3, types=None)
        check_invariants(result, 3, config)
        return {m.node.id: m for m in result.memories}

    assert "episodic_ep:1" not in await ids(
        mnemo.Config(value_weight=0.0, recall_neighbour_weight=0.0, recall_mmr_lambda=1.0)
    )
    found = await ids(
        mnemo.Config(value_weight=0.0, recall_neighbour_weight=0.8, recall_mmr_lambda=1.0)
    )
    assert (found["episodic_ep:1"].phase, found["episodic_ep:1"].hop) == ("hop", 1)
    assert found["episodic_ep:1"].score == pytest.approx(0.8 * found["episodic_ep:0"].score)


async def test_the_index_finds_a_turn_by_the_words_of_the_turns_around_it(
    graph: GraphStore,
) -> None:
    """Through the lexical index, a step whose own words share nothing with the query is
    found by the words channel itself (hop 0) when a step within two of it holds them, with
    the neighbour lever off; a step three away is not; a forgotten step's words find nothing
    more."""
    await add_episode(graph, "x", "x", TWO_APART)
    offline = mnemo.OfflineLLM()
    config = mnemo.Config(value_weight=0.0, recall_mmr_lambda=1.0, recall_neighbour_weight=0.0)

    async def found() -> dict[str, mnemo.Recalled]:
        recaller = Recaller(graph, EMBEDDER, config, planner=offline, llm=offline)
        result = await recaller.recall("x", "what did Melanie paint", k=4, types=None)
        check_invariants(result, 4, config)
        return {m.node.id: m for m in result.memories}

    first = await found()
    assert first["episodic_x:2"].phase in ("lexical", "hybrid")
    assert first["episodic_x:2"].hop == 0
    assert "episodic_x:3" not in first
    await graph.delete_nodes("x", ["episodic_x:0"])
    assert set(await found()) == set()


async def test_a_step_comes_before_its_neighbours_on_the_words_it_says(
    graph: GraphStore,
) -> None:
    """Every document around it holds "pear2", but the step that says it is the words
    channel's first hit, above its shorter neighbour's document."""
    await add_episode(graph, "p", "p", [f"the service named pear{i} listens on port 900{i}"
                                        for i in range(1, 5)])
    hits = await graph.search_text("p", "pear2", 4)
    assert len(hits) == 4
    assert hits[0][0] == "episodic_p:1"
    assert hits[0][1] > hits[1][1]


async def test_neighbour_width_brings_the_steps_that_far_from_a_hit(
    words_alone: GraphStore,
) -> None:
    """recall_neighbour_width 2 offers the steps two away from a hit too, at the same share
    of its score; at 1 only the adjacent ones. A width below 1 is refused."""
    graph = words_alone
    await add_episode(graph, "w", "w", TWO_APART)
    offline = mnemo.OfflineLLM()

    async def found(width: int) -> dict[str, mnemo.Recalled]:
        config = mnemo.Config(value_weight=0.0, recall_mmr_lambda=1.0,
                              recall_neighbour_weight=0.8, recall_neighbour_width=width)
        recaller = Recaller(graph, EMBEDDER, config, planner=offline, llm=offline)
        result = await recaller.recall("w", "what did Melanie paint", k=4, types=None)
        check_invariants(result, 4, config)
        return {m.node.id: m for m in result.memories}

    assert "episodic_w:2" not in await found(1)
    wide = await found(2)
    assert (wide["episodic_w:2"].phase, wide["episodic_w:2"].hop) == ("hop", 1)
    assert wide["episodic_w:2"].score == pytest.approx(0.8 * wide["episodic_w:0"].score)
    with pytest.raises(mnemo.InvalidInputError, match="recall_neighbour_width"):
        mnemo.Config(recall_neighbour_width=0)
