"""Recall: from a query to the repo's most valuable relevant memories (Mnemosyne's pipeline;
docs/DECISIONS.md says where mnemo departs from it): plan the query's mode and search tags; hop
0, BM25 and cosine fused by reciprocal rank; hops through routing nodes whose raw cosine to the
query reaches the type's threshold; provenance; value; reinforcement of what is returned; and
an optional synthesis."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import anyio

from mnemo import cpu
from mnemo.config import Config
from mnemo.errors import EmbeddingError, StorageError, first_error
from mnemo.graph.model import LinkType, Node, NodeId, NodeType, Vector, node_value, now_utc
from mnemo.graph.ports import NodeContext, PendingRead, RecallReads, VectorsMoved
from mnemo.graph.scope import Scope, Where
from mnemo.ports import LLM, Embedder, Reranker
from mnemo.recall import hops, ranking
from mnemo.recall.model import (
    Candidate,
    ReadContext,
    Recalled,
    RecallResult,
    ResultSelection,
    Touched,
    Trace,
    best_first,
    restatements_first,
)
from mnemo.recall.query import (
    FEEDBACK_DOCS,
    INLINE_CHARS,
    Plan,
    QueryParts,
    TagVectors,
    feedback_terms,
    restatement,
    speaker_boosts,
    split,
)
from mnemo.recall.tasks import planned, reranked, synthesis

__all__ = ["RecallResult", "Recalled", "Recaller", "Touched"]

log = logging.getLogger("mnemo")

N = NodeType
# Nodes that route a search to memories rather than being memories themselves.
ROUTING = (N.TAG, N.INTENT, N.SUBGOAL)
MEMORIES = (N.SEMANTIC, N.EPISODIC, N.PROCEDURAL)
# MMR orders the best 4 x k, at most this many (its cost grows with the square); a head longer
# than `MMR_ON_LOOP` is ordered off the loop.
MMR_HEAD = 2_000
MMR_ON_LOOP = 64

Scored = ranking.Scored[Candidate]


class _ScopeMoved(Exception):
    """A node of a scope's listed members went while a recall read them."""


@dataclass(frozen=True, slots=True)
class Recaller:
    """What a recall needs: the graph, the repo's embedder and config, and its models
    (`planner` None: the offline heuristics; `llm` None: no synthesis)."""

    graph: RecallReads
    embedder: Embedder
    config: Config
    planner: LLM | None = None
    llm: LLM | None = None
    # The search tags' vectors of earlier recalls (a Memory shares one).
    tag_vectors: TagVectors = field(default_factory=TagVectors)
    # The generation of the repo's vectors `embedder` makes (None: not checked).
    generation: int | None = None
    # Orders the best `Config.recall_rerank_candidates` (None: the retrieval's order stands).
    reranker: Reranker | None = None

    async def recall(
        self,
        repo: str,
        query: str,
        *,
        k: int,
        types: Iterable[NodeType] | None,
        reinforce: bool = True,
        as_of: datetime | None = None,
        valid_at: datetime | None = None,
        where: Where | None = None,
    ) -> RecallResult:
        """With `where`, every candidate comes from inside that scope: the channels search its
        nodes only, and what hops bring from outside is dropped before anything is ranked. A scoped
        recall runs again, once, when a node it found went before it was read (an item replaced
        by a put, the new version added after the search)."""
        asked = (repo, query, k, types, reinforce, ranking.When(as_of, valid_at), where)
        try:
            return await self._recall(*asked, again=True)
        except _ScopeMoved:
            return await self._recall(*asked, again=False)

    async def _recall(
        self, repo: str, query: str, k: int, types: Iterable[NodeType] | None, reinforce: bool,
        when: ranking.When, where: Where | None, *, again: bool,
    ) -> RecallResult:
        trace = Trace()
        # What the store keeps in memory is brought up to it once, here, not at each read.
        async with self.graph.reading(repo):
            scope = None if where is None else await self.graph.scope(repo, where)
            trace.mark("look")
            config = self.config
            wanted = None if types is None else {NodeType(t) for t in types}
            degraded: list[str] = []
            plan = await planned(self.planner, query, degraded) if self.planner else None
            plan, parts = await split(query, dense_without_names=config.recall_dense_without_names,
                                      plan=plan)
            trace.mark("plan")
            searched = None if wanted is None else list(wanted | set(ROUTING))
            # With the vectors on the event loop (a small store), the words search is begun now
            # and runs on its thread while the query is embedded; else it runs beside the dense
            # channel's thread in hop 0.
            on_loop = self.graph.vectors_on_loop(repo)
            per_channel = max(config.recall_candidates, 2 * k)
            words = (self.graph.start_search_text(repo, parts.terms, per_channel, searched, scope)
                     if on_loop else None)
            found: dict[str, Candidate] = {}
            # The dense channel's cosine of each node it found at hop 0.
            meaning: dict[str, float] = {}
            routes: list[tuple[str, Candidate]] = []
            try:
                vectors = await self._vectors(parts.dense, plan.tags, degraded)
                query_vector = None if vectors is None else vectors[0]
                trace.mark("embed")
                if words is None:
                    words = self.graph.start_search_text(repo, parts.terms, per_channel, searched,
                                                         scope)
                if self.generation is not None:
                    # Before any vector is compared: whether another Memory re-embedded the repo.
                    moved = await self.graph.generation(repo)
                    if moved != self.generation:
                        raise VectorsMoved(moved)

                async def zero() -> None:
                    found.update(await self._hop_zero(repo, parts.terms, words, query_vector,
                                                      searched, per_channel, on_loop, scope,
                                                      meaning))

                async def route() -> None:
                    if vectors is not None:
                        routes.extend(await hops.routes(self.graph, config, repo, *vectors,
                                                        scope))

                await _in_turn(route, zero) if on_loop else await _side_by_side(zero, route)
            finally:
                if words is not None:
                    words.discard()
            matched = ranking.Matched({node_id: c.score for node_id, c in found.items()}, meaning)
            trace.mark("hop0")
            reranking = self.reranker is not None
            width = max(k, config.recall_rerank_candidates) if reranking else k
            # Ranking picks from the best `depth` candidates (read); the others are only touched.
            depth = max(4 * width, config.recall_candidates)
            followed = await hops.follow(self.graph, config, repo, found, routes, query_vector, k,
                                         depth)
            if scope is not None:
                await hops.keep_inside(self.graph, repo, scope, found)
                followed = [(i, c) for i, c in followed if i in found]
            trace.mark("hops")
            context = await self._context(repo, found, followed, k, depth, trace)
            if again and scope is not None and any(
                    i not in context.nodes for i, _ in followed[:depth]):
                raise _ScopeMoved
            if scope is not None:  # what provenance and neighbours brought in
                await hops.keep_inside(self.graph, repo, scope, found)
            boosts = await speaker_boosts(self.graph, repo, parts.names, context,
                                          config.recall_speaker_boost)
            if boosts:
                trace.mark("speaker")
            ranked = await self._rank(repo, found, context, parts, plan, wanted, width, boosts,
                                      matched, when)
            ranked = (await ranking.in_time(self.graph, repo, ranked, when))[:width]
            trace.mark("rank")
            if reranking:
                reordered = await reranked(self.reranker, query, ranked, k, degraded)
                ranked = (reordered if when.valid_at is not None
                          else ranking.successors_first(reordered, ranked)[:k])
                trace.mark("rerank")
            ranked = ranking.above_their_steps(ranked, matched)
            if reranking or config.recall_mmr_lambda < 1.0:
                ranked = ranking.descending(ranked)
            if ranked and reinforce:
                await self._reinforce(repo, ranked, degraded)
            trace.mark("reinforce")
            reasoned = (await synthesis(self.llm, query, ranked, degraded)
                        if config.recall_synthesis and self.llm is not None else None)
            trace.mark("synthesis")
            touched = await hops.pure(lambda: sorted(
                (Touched(NodeId(i), c.phase, c.hop, c.score) for i, c in found.items()),
                key=lambda t: (-t.score, t.node_id)), len(found))
            return RecallResult(ranked, reasoned, query, plan.mode, touched, trace.stages, degraded)

    async def _vectors(self, query: str, tags: Sequence[str],
                       degraded: list[str]) -> tuple[Vector, Vector] | None:
        """The query's vector and its tags'; None when the embedder fails (the words alone
        answer, and `degraded` says why)."""
        try:
            vectors = await self.tag_vectors.embed(self.embedder, query, tags)
        except EmbeddingError as exc:
            log.warning("recall without its dense channel: %s", exc)
            degraded.append(f"embedding: {exc}")
            return None
        return vectors[0], vectors[1:]

    async def _reinforce(self, repo: str, ranked: list[Recalled], degraded: list[str]) -> None:
        """Counts an access of each returned memory and of a returned fact's one step; a refused
        write costs the counts (logged, and named in `degraded`), never the recall."""
        ids = [*dict.fromkeys([*(r.node.id for r in ranked),
                               *(r.evidence[0] for r in ranked if len(r.evidence) == 1)])]
        try:
            await self.graph.reinforce(repo, ids, now_utc())
        except StorageError as exc:
            log.warning("recall in %s: the access counts of %d memories were not written: %r",
                        repo, len(ranked), exc)
            degraded.append(f"access counts: {exc!r}")

    async def _hop_zero(
        self, repo: str, terms: str, words: PendingRead[list[tuple[str, float]]],
        vector: Vector | None,
        searched: list[NodeType] | None, width: int, on_loop: bool, scope: Scope | None,
        meaning: dict[str, float],
    ) -> dict[str, Candidate]:
        """Hop 0's candidates, `width` per channel: the words and dense channels fused by
        reciprocal rank (pseudo-relevance feedback when on); `meaning` gets the dense cosines."""
        config = self.config
        lexical: list[tuple[str, float]] = []
        dense: list[tuple[str, float]] = []

        async def by_words() -> None:
            lexical.extend(await words.result())

        async def by_meaning() -> None:
            if vector is not None:
                dense.extend(await self.graph.search_vectors(repo, vector, width, searched,
                                                             scope))

        await _in_turn(by_meaning, by_words) if on_loop else await _side_by_side(by_words,
                                                                               by_meaning)
        lexical_ids = [node_id for node_id, _ in lexical]
        meaning.update((node_id, score) for node_id, score in dense if score > 0.0)
        rankings, weights = [lexical_ids, list(meaning)], [1.0, config.recall_dense_weight]
        expanded = (await self._feedback(repo, terms, lexical_ids, width, searched, scope)
                    if config.recall_prf_terms and lexical_ids else [])
        if expanded:  # nothing added (or found by it): nothing to weigh
            # Below the query's own ranking: the added words are guesses.
            rankings.append(expanded)
            weights.append(0.5)
            lexical_ids = [*lexical_ids, *expanded]
        fused = ranking.reciprocal_rank_fusion(rankings, config.rrf_k, weights)
        in_lexical = set(lexical_ids)
        return {
            node_id: Candidate(
                score,
                "hybrid" if node_id in in_lexical and node_id in meaning
                else "lexical" if node_id in in_lexical else "dense",
                0,
            )
            for node_id, score in fused.items()}

    async def _feedback(
        self, repo: str, terms: str, best: list[str], width: int, searched: list[NodeType] | None,
        scope: Scope | None,
    ) -> list[str]:
        """The ranking of a second lexical query: `terms` and the words the best hits share."""
        documents = [n.text for n in await self.graph.get_nodes(repo, best[:FEEDBACK_DOCS])]
        n = self.config.recall_prf_terms
        # Every word of every document is read: long texts are read off the loop.
        extra = await cpu.run(lambda: feedback_terms(terms, documents, n),
                              sum(map(len, documents)) + len(terms), on_loop_below=INLINE_CHARS + 1)
        if not extra:
            return []
        found = await self.graph.search_text(repo, f"{terms} {' '.join(extra)}", width, searched,
                                             scope)
        return [node_id for node_id, _ in found]

    async def _context(
        self, repo: str, found: dict[str, Candidate], ranked: list[tuple[str, Candidate]],
        k: int, depth: int, trace: Trace,
    ) -> ReadContext:
        """The nodes, access stats and steps of the best `depth` candidates (`ranked`, best
        first), then, in the same read, what provenance and neighbours bring in."""
        best = [i for i, _ in ranked[:depth]]
        # An episodic hit among the best 2k brings its SOURCE (and the facts made from it)
        # at half its score.
        top = {i for i, _ in ranked[: 2 * k]}
        offers: dict[str, Candidate] = {}

        def more(first: NodeContext) -> tuple[list[str], tuple[NodeType, ...]]:
            """What provenance and neighbours bring in (run by the store where it reads)."""
            nodes: dict[str, Node] = {n.id: n for n in first.nodes}
            arrived: list[str] = []
            for link in first.links:
                origin = nodes.get(link.origin)  # None if deleted between the statements
                if origin is None or origin.type is not N.EPISODIC or link.origin not in top:
                    continue
                parent = found[link.origin]
                candidate = Candidate(parent.score / 2, "provenance", parent.hop + 1)
                if hops.offer(found, link.node_id, candidate) and link.node_id not in nodes:
                    arrived.append(link.node_id)
            offers.update(hops.neighbour_offers(self.config, found, nodes, k))
            return ([*dict.fromkeys([*arrived, *(i for i in offers if i not in nodes)])],
                    (N.SEMANTIC, N.PROCEDURAL))

        read = await self.graph.node_context(repo, best, MEMORIES, LinkType.PROVENANCE, more)

        def gathered() -> ReadContext:
            context = ReadContext({n.id: n for n in read.nodes}, dict(read.stats), {},
                                  dict(read.vectors))
            context.add_steps(read.links)
            for node_id, candidate in offers.items():
                if node_id in context.nodes:
                    hops.offer(found, node_id, candidate)
            return context

        context = await hops.pure(gathered, len(read.nodes) + len(read.links))
        trace.mark("provenance")
        return context

    async def _rank(
        self,
        repo: str,
        found: dict[str, Candidate],
        context: ReadContext,
        parts: QueryParts,
        plan: Plan,
        wanted: set[NodeType] | None,
        k: int,
        boosts: Mapping[str, float],
        matched: ranking.Matched,
        when: ranking.When,
    ) -> list[Recalled]:
        config = self.config
        direct = matched.fused
        nodes, stats = context.nodes, context.stats
        out = ranking.left_out(nodes.values(), context.sources, when) if (
            when.as_of or when.valid_at) else set()
        weights = ranking.MODE_WEIGHTS.get(plan.mode, {})
        now = now_utc()
        restated: dict[str, int] = {}
        steps: dict[str, str] = {}
        stand_ins: dict[str, list[Scored]] = {}

        def score() -> tuple[list[Scored], list[Scored]]:
            """The memories and the leads (routes, sources) among the candidates, scored and
            ordered; fills `restated`, `steps` and `stand_ins`."""
            scored: list[Scored] = []
            for node_id, candidate in found.items():
                node = nodes.get(node_id)
                if (node is None or (wanted is not None and node.type not in wanted)
                        or node_id in out):
                    continue
                count, last = stats.get(node_id, (0, None))
                value = node_value(node.type, node.data, created_at=node.created_at,
                                   last_access=last, access_count=count, now=now,
                                   config=config)
                score = (candidate.score * value**config.value_weight
                         * weights.get(node.type, 1.0))
                score *= boosts.get(node_id, 1.0) * ranking.weight(node, when)
                if wanted is None and node.type in ROUTING:
                    score *= config.hop_decay  # a route, not a memory: below what it leads to
                candidate.score = score
                scored.append((score, node, candidate))
                tier = None if node.type in ROUTING else restatement(parts.words, node.text)
                if tier is not None:
                    restated[node_id] = tier
            if config.recall_distinct_steps:
                steps.update(context.steps_of([n for _, n, _ in scored]))
                stand_ins.update(ranking.stand_ins(scored, matched, context.sources, restated,
                                                   procedural=plan.mode == "procedural"))
            if restated:
                scored = restatements_first(scored, restated)
            else:
                scored.sort(key=best_first)
            if wanted is not None:
                return scored, []
            # Routes and sources lead to memories: after every memory, out of the diversity.
            return ([item for item in scored if item[1].type in MEMORIES],
                    [item for item in scored if item[1].type not in MEMORIES])

        # Scoring reads every candidate's text (restatement): long texts count as more items.
        chars = sum(len(n.text) for n in nodes.values())
        scored, leads = await hops.pure(score, len(found) + chars // hops.CHARS_PER_ITEM)
        if config.recall_mmr_lambda < 1.0:
            scored = await self._diversify(repo, scored, min(4 * k, MMR_HEAD),
                                           context.vectors)

        def pick() -> list[Recalled]:
            """The k results: a step's further facts after every other step's, routes last."""
            ordered = ranking.matching_first(scored, direct, restated, k)
            picks = ResultSelection(config, k, steps, context.sources, stand_ins,
                                    ranking.strong(direct, context.nodes))
            picks.take(ordered)
            picks.take(picks.deferred, defer=False)
            picks.take(leads)
            return picks.ranked

        return await hops.pure(pick, len(scored))

    async def _diversify(
        self, repo: str, scored: list[Scored], n: int, known: Mapping[str, Vector]
    ) -> list[Scored]:
        """The best `n` of `scored` in MMR order, then the rest; vectors come with the nodes
        (`known`), the missing asked of the store."""
        head = scored[:n]
        vectors: dict[str, Vector] = {
            node.id: known[node.id] for _, node, _ in head if node.id in known}
        missing = [node.id for _, node, _ in head if node.id not in known]
        if missing:
            vectors.update(await self.graph.vectors(repo, missing))
        by_id: dict[str, Scored] = {item[1].id: item for item in head}
        order = await cpu.run(lambda: ranking.maximal_marginal_relevance(
            list(by_id), {i: item[0] for i, item in by_id.items()}, vectors,
            self.config.recall_mmr_lambda), len(by_id), on_loop_below=MMR_ON_LOOP + 1)
        return [by_id[i] for i in order] + scored[n:]


async def _side_by_side(*calls: Callable[[], Coroutine[object, object, None]]) -> None:
    """Runs the calls at once; the first failure is raised as itself, and cancels the others."""
    with first_error():
        async with anyio.create_task_group() as group:
            for call in calls:
                group.start_soon(call)


async def _in_turn(*calls: Callable[[], Coroutine[object, object, None]]) -> None:
    for call in calls:
        await call()
