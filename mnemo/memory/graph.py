"""`Memory`'s methods over the graph: lookups, the commit history, maintenance, re-embedding."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING

from mnemo.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    check_count,
    check_id,
    check_json,
    check_name,
    check_text,
    names_id,
)
from mnemo.graph.reads import (
    MAX_IDS,
    MAX_OFFSET,
    RESULTS,
    link_type_of,
    literal,
    node_id_list,
    node_types,
)
from mnemo.graph.scope import check_metadata, check_where
from mnemo.memory.sessions import Parts

if TYPE_CHECKING:
    from mnemo.config import Config
    from mnemo.graph.history import CommitDiff, CommitRecord
    from mnemo.graph.maintenance import ConsolidationReport, DecayReport, ValidationReport
    from mnemo.graph.model import CommitReceipt, Link, LinkType, Node, NodeType, Vector
    from mnemo.graph.ports import IntentPolicy
    from mnemo.graph.reembed import ReembedProgress, Unstaged
    from mnemo.ports import Embedder, JSONObject, JSONValue

# Nodes embedded in one call by `reembed`, by default, and at most.
REEMBED_BATCH = 256
MAX_REEMBED_BATCH = 10_000


class GraphMethods(Parts):
    async def get_node(self, repo: str, node_id: str) -> Node | None:
        """The node, or None if the repo has no such node."""
        await self._repos.checked(repo, lambda _: check_id(node_id, "node_id"))
        nodes = await self._graph.get_nodes(repo, [node_id])
        return nodes[0] if nodes else None

    async def get_nodes_by_type(self, repo: str, types: Iterable[NodeType]) -> list[Node]:
        """Every node of these types, oldest first."""
        kinds = await self._repos.checked(repo, lambda _: node_types(types))
        return await self._graph.get_nodes_by_type(repo, kinds)

    async def node_ids(self, repo: str, prefix: str, *, limit: int = 2) -> list[str]:
        """The ids of the repo's nodes that `prefix` (a short id shown by a tool) names, sorted,
        at most `limit` (1..100): those that start with it or whose digits do (`5d3a43c3`
        names `semantic_5d3a43c3...`; `085d80d9:3` a step's id with its index).

        Raises:
            InvalidInputError: a blank prefix, or a limit outside 1..100.
            NotFoundError: an unknown repo.
        """
        def check(_: Config) -> None:
            check_id(prefix, "prefix")
            check_count("limit", limit, minimum=1, maximum=MAX_IDS)

        await self._repos.checked(repo, check)
        head, colon, index = prefix.partition(":")
        # What the store returns starts with `head` or, when it holds no `_` (digits, or a
        # kind cut anywhere), holds it after an underscore; `names_id` keeps those it names.
        starts = [literal(head)] if "_" in head else [literal(head), "%\\_" + literal(head)]
        found: set[str] = set()
        for start in starts:
            found.update(await self._graph.node_ids(
                repo, f"{start}%{literal(colon + index)}", "" if colon else "%:%", limit))
        return [node_id for node_id in sorted(found) if names_id(prefix, node_id)][:limit]

    async def get_linked_nodes(
        self, repo: str, node_ids: Sequence[str], link_type: LinkType | None = None
    ) -> list[Node]:
        """The nodes linked to any of `node_ids` (either direction), not those themselves."""
        kind = link_type_of(link_type)
        ids = await self._repos.checked(repo, lambda config: node_id_list(node_ids, config))
        neighbors = await self._graph.neighbors(repo, ids, kind)
        asked = set(ids)
        linked = [n.node_id for n in neighbors if n.node_id not in asked]
        return await self._graph.get_nodes(repo, linked)

    async def links(self, repo: str) -> list[Link]:
        """Every link of the repo (`src`, `dst`, `type`), by type, source, destination.

        Raises:
            NotFoundError: an unknown repo.
        """
        await self._repos.checked(repo, lambda _: None)
        return await self._graph.links(repo)

    async def latest(
        self,
        repo: str,
        *,
        types: Iterable[NodeType | str] = ("semantic", "procedural"),
        top_k: int = 10,
    ) -> list[Node]:
        """The newest nodes of these types, newest first.

        Raises:
            InvalidInputError: a `top_k` below 1 or past `Config.max_results`, or a bad type.
            NotFoundError: an unknown repo.
        """
        def check(config: Config) -> list[NodeType]:
            check_count("top_k", top_k, minimum=1, maximum=config.max_results, setting=RESULTS)
            return node_types(types)

        return await self._graph.latest(repo, await self._repos.checked(repo, check), top_k)

    async def search_nodes(
        self,
        repo: str,
        query: str,
        *,
        limit: int = 20,
        types: Iterable[NodeType] | None = None,
        where: Mapping[str, object] | None = None,
    ) -> list[Node]:
        """Nodes whose text holds any word of `query` (full text, BM25), best first: a plain
        lookup without recall's embedding, hops, value or reinforcement; `where` as `recall`'s.

        Raises:
            InvalidInputError: a blank query or one past `Config.max_text_chars`, a limit below
                1 or past `Config.max_results`, or a malformed `where`.
            NotFoundError: an unknown repo.
        """
        def check(config: Config) -> list[NodeType] | None:
            check_text(query, "query", limit=config.max_text_chars, stored=False)
            check_count("limit", limit, minimum=1, maximum=config.max_results, setting=RESULTS)
            return None if types is None else node_types(types)

        scoped = check_where(where)
        kinds = await self._repos.checked(repo, check)
        scope = None if scoped is None else await self._graph.scope(repo, scoped)
        found = await self._graph.search_text(repo, query, limit, kinds, scope)
        return await self._graph.get_nodes(repo, [node_id for node_id, _ in found])

    async def delete_nodes(self, repo: str, node_ids: Sequence[str]) -> int:
        """Deletes nodes with their links, vectors and search entries; returns how many. An
        ingested source whose SOURCE node is deleted is no longer known: it ingests anew."""
        ids = await self._repos.checked(repo, lambda config: node_id_list(node_ids, config))
        return await self._graph.delete_nodes(repo, ids)

    async def correct(self, repo: str, node_id: str, text: str) -> CommitReceipt:
        """Corrects a fact: commits `text` as a new fact of the old one's type and scope, with
        none of the old data but its confidence, return score and a LangGraph item's address
        (`graph.model.kept`: a procedure's instruction is `text`, an item's value reads as
        `{"text": text}`), and retires the old one as a contradicting fact does (the new one
        SUPERSEDES it). The correction is a commit like any other (`revert` undoes it) and
        calls no model but the repo's embedder. Returns the commit's receipt: the new fact's
        id, or, when a live fact already says `text`, that fact's (it then supersedes the old
        one).

        Raises:
            InvalidInputError: a blank text or one past `Config.max_text_chars`, or a node that
                is not a live fact (a SEMANTIC or PROCEDURAL node not retired).
            NotFoundError: an unknown repo or node.
            EmbeddingError: the text could not be embedded within `Config.extraction_timeout`;
                nothing was stored.
        """
        from mnemo.graph.model import TEMPORAL, correction

        await self._repos.checked(repo, lambda config: check_text(
            text, "text", limit=config.max_text_chars))
        old = await self.get_node(repo, node_id)  # which checks the id first
        if old is None:
            raise NotFoundError("node", node_id)
        if old.type not in TEMPORAL or old.retired:
            raise InvalidInputError(
                f"node {node_id!r} is not a live fact (a {old.type.value} node"
                f"{', retired' if old.retired else ''}): only facts are corrected")
        vector, generation, policy = await self._fact_vector(repo, old.type, text)
        changeset = correction(repo, old, text, vector, generation)
        return await self._naming_joined(await self._graph.apply(changeset, intents=policy))

    async def _naming_joined(self, receipt: CommitReceipt, *, report: bool = True
                             ) -> CommitReceipt:
        """A one-fact commit's receipt, reported ("changeset_applied") with `report`; when the
        fact joined a live fact of the same words rather than creating one, naming that fact."""
        from mnemo.graph.model import NodeId

        record = None if receipt.node_ids else await self._graph.commit_record(
            receipt.repo, receipt.changeset_id)
        if record:
            receipt = replace(receipt, node_ids=[NodeId(i) for i in record.joined])
        if report:
            await self._events.applied(receipt.repo, receipt.node_ids, receipt.changeset_id)
        return receipt

    async def remember(
        self, repo: str, text: str, *, source_id: str, data: Mapping[str, JSONValue] | None = None,
        metadata: dict[str, str | int | float | bool] | None = None,
    ) -> CommitReceipt:
        """Stores `text` as it is, one SEMANTIC fact (no model but the embedder; it retires no
        fact), with `data` as its data and `metadata` as its scope, recorded as the source
        `source_id` (`forget(source_id)` erases it). Returns the commit's receipt, naming
        the fact (a live fact of the same words in the same scope, when there is one). The
        same text, data and metadata under a source id taken by them stores nothing and
        returns the first call's receipt, while its fact is live.

        Raises:
            InvalidInputError: a blank text or one past `Config.max_text_chars`, a source id
                that is no name, data that is not JSON within that bound, or a bad metadata.
            ConflictError: the source id is taken by another text, data or metadata (forget
                it first).
            NotFoundError: an unknown repo.
            EmbeddingError: as `correct`'s; nothing was stored.
        """
        import hashlib
        import json
        import uuid

        from mnemo.graph.model import Changeset, NodeDraft, NodeType, now_utc
        from mnemo.graph.ports import SideWrite, SourceForgotten, SourceRecorded, SourceTaken

        scoped = check_metadata(metadata)
        check_name(source_id, "source_id")
        body: JSONObject = dict(data or {})
        await self._repos.checked(repo, lambda config: (
            check_text(text, "text", limit=config.max_text_chars),
            check_json(body, "data", limit=config.max_text_chars)))
        digest = hashlib.sha256(json.dumps([text, body, scoped], sort_keys=True).encode())

        async def known() -> CommitReceipt | list[SideWrite]:
            """The first call's receipt while its fact is live, else what this call's commit
            writes beside it: a record of the source id that gives way to its own (the fact
            deleted, or retired by a correction or contradiction, which stays)."""
            found = await self._graph.ingested(repo, source_id)
            if found is None:
                return []
            if found[0] != digest.hexdigest():
                raise ConflictError(f"source {source_id!r} of repo {repo!r} is taken by another"
                                    " text, data or metadata; forget it first to replace it")
            first = await self._naming_joined(found[1], report=False)
            facts = [await self.get_node(repo, node_id) for node_id in first.node_ids]
            if any(fact is not None and not fact.retired for fact in facts):
                return first
            return [SourceForgotten(repo, source_id)]

        if not isinstance(first := await known(), list):
            return first
        vector, generation, policy = await self._fact_vector(repo, NodeType.SEMANTIC, text)
        node = NodeDraft(f"semantic_{uuid.uuid4().hex}", NodeType.SEMANTIC, text, body, vector,
                         source_id=source_id)
        changeset = Changeset(f"changeset_{uuid.uuid4().hex}", repo, [node],
                              generation=generation, metadata=scoped)
        record = SourceRecorded(repo, source_id, digest.hexdigest(), changeset.id,
                                now_utc().isoformat())
        while True:
            try:
                return await self._naming_joined(
                    await self._graph.apply(changeset, intents=policy, also=[*first, record]))
            except SourceTaken:
                # Another call recorded the source meanwhile (or, forgotten since, it is free).
                if not isinstance(first := await known(), list):
                    return first

    async def _fact_vector(
        self, repo: str, kind: NodeType, text: str
    ) -> tuple[Vector, int, IntentPolicy]:
        """The vector of a fact's text by the repo's embedder (within `extraction_timeout`),
        its generation, and the commit policy of a fact stated as it is (no contradiction)."""
        from mnemo.extraction.contradiction import intent_policy
        from mnemo.extraction.entities import vector_text
        from mnemo.graph.vectors import embed_within

        await self._repos.refresh(repo)
        runtime = self._repos.embedding(repo)
        vector = await embed_within(runtime.embedder, [vector_text(kind, text)],
                                     runtime.config.extraction_timeout)
        llm = self._repos.limits.llm_for(runtime.llm, runtime.config, repo)
        policy = replace(intent_policy(runtime.config, runtime.embedder, llm, repo,
                                       self._repos.refresh), contradicts=None)
        return vector[0], runtime.generation, policy

    async def nodes_where(
        self, repo: str, where: Mapping[str, object], *, limit: int | None = 100,
        offset: int = 0,
    ) -> list[Node]:
        """`limit` nodes of the scope `where` (as `recall`'s) after the first `offset`, in the
        order added, read through the scope index in one query (`limit=None`: all of them,
        as the store held them at one moment).

        Raises:
            InvalidInputError: a malformed or empty `where`, a limit below 1 or past
                `Config.max_results`, or an offset below 0 or past `MAX_OFFSET`.
            NotFoundError: an unknown repo.
        """
        scope = check_where(where)
        if scope is None:
            raise InvalidInputError("nodes_where needs a where with at least one key")
        check_count("offset", offset, maximum=MAX_OFFSET)
        await self._repos.checked(repo, lambda config: None if limit is None else check_count(
            "limit", limit, minimum=1, maximum=config.max_results, setting=RESULTS))
        return await self._graph.scope_nodes(repo, scope, MAX_OFFSET if limit is None else limit,
                                             offset)

    async def history(self, repo: str, *, limit: int = 20) -> list[CommitRecord]:
        """The repo's `limit` newest commits (sessions', ingests', reverts and maintenance),
        newest first: id, time, session or source, and the ids of what each added, retired,
        reworded or (maintenance) removed.

        Raises:
            InvalidInputError: a limit below 1 or past `Config.max_results`.
            NotFoundError: an unknown repo.
        """
        from mnemo.graph import history as commit_history

        await self._repos.checked(repo, lambda config: check_count(
            "limit", limit, minimum=1, maximum=config.max_results, setting=RESULTS))
        return await commit_history.history(self._graph, repo, limit)

    async def commit_diff(self, repo: str, commit_id: str) -> CommitDiff:
        """What one commit changed: the nodes it added, the facts it retired (those still in
        the graph), and the links it added.

        Raises:
            InvalidInputError: no such commit in the repo.
            NotFoundError: an unknown repo.
        """
        from mnemo.graph import history as commit_history

        await self._repos.checked(repo, lambda _: check_id(commit_id, "commit_id"))
        return await commit_history.diff(self._graph, repo, commit_id)

    async def revert(self, repo: str, commit_id: str) -> CommitDiff:
        """Undoes one commit in one transaction: what only it made goes, what other commits
        share stays (with their wording), the facts it retired hold again, and an ingested
        source's id is free again. The history records the revert and keeps the commit,
        marked `reverted_by`. Returns what was undone.

        Raises:
            InvalidInputError: no such commit in the repo.
            ConflictError: the commit is a revert, was reverted or is maintenance, or a later
                commit built on it (retired one of its facts, or linked to a node only it
                holds); the message names the commit to revert first.
            EmbeddingError: a shared node's new wording could not be embedded; nothing went.
            NotFoundError: an unknown repo.
        """
        from mnemo.extraction.entities import wordings
        from mnemo.graph import history as commit_history

        await self._repos.checked(repo, lambda _: check_id(commit_id, "commit_id"))
        await self._repos.refresh(repo)
        runtime = self._repos.embedding(repo)
        return await commit_history.revert(
            self._graph, repo, commit_id, generation=runtime.generation,
            embed=wordings(runtime.embedder, runtime.config.extraction_timeout))

    async def consolidate(self, repo: str, *, full: bool = False) -> ConsolidationReport:
        """Merges SEMANTIC near-duplicates (raw cosine >= `Config.consolidate_threshold`) into
        the most confident (then oldest), keeping links and merged metadata, then deletes tags
        left unlinked. Only nodes not compared before, unless `full`. Safe while sessions commit.

        Raises:
            NotFoundError: an unknown repo.
        """
        from mnemo.graph import maintenance

        runtime = await self._repos.known(repo)
        return await maintenance.consolidate(self._graph, repo, runtime.config, full=full)

    async def decay(self, repo: str, *, now: datetime | None = None) -> DecayReport:
        """Deletes the memories whose value (recency x frequency x reward) at `now` is below
        `Config.decay_threshold`, then the routing and source nodes left unlinked. Safe while
        sessions commit.

        Raises:
            InvalidInputError: a `now` that is not a datetime.
            NotFoundError: an unknown repo.
        """
        if now is not None and not isinstance(now, datetime):
            raise InvalidInputError(f"now must be a datetime, got {type(now).__name__}")
        from mnemo.graph import maintenance

        runtime = await self._repos.known(repo)
        return await maintenance.decay(self._graph, repo, runtime.config, now=now)

    async def validate_episodic(self, repo: str) -> ValidationReport:
        """Checks episodic integrity (step links, dangling links, vector sizes, the full-text
        index) and repairs what it can: missing step links, dangling links, the full-text index.

        Raises:
            NotFoundError: an unknown repo.
        """
        await self._repos.known(repo)
        await self._repos.refresh(repo)
        from mnemo.graph import maintenance

        return await maintenance.validate_episodic(self._graph, repo)

    async def reembed(
        self,
        repo: str,
        *,
        embedder: Embedder | None = None,
        progress: Callable[[ReembedProgress], Awaitable[None] | None] | None = None,
        batch_size: int = REEMBED_BATCH,
    ) -> int:
        """Makes every node's vector of the repo again with `embedder`, switches to the new
        vectors at once, and records `embedder` as the repo's (a Memory opened later without
        an embedder runs it). Returns how many nodes got a new vector. `embedder=None` uses
        the Memory's embedder, else the repo's own (a retired hashed embedder's repo gets
        `hash2` of its dimension). The dimension may change.

        Nodes are embedded `batch_size` at a time (each batch within
        `Config.extraction_timeout`) and staged beside the old vectors, while the repo is read
        and written as before; one transaction then switches (PostgreSQL then rebuilds its
        HNSW index without holding up commits; searches are exact meanwhile). Open sessions go
        on; what they embedded before the switch is embedded again when they commit. Cut short
        before the switch, the repo keeps its old vectors and the staged ones: run it again
        with the same embedder to carry on. Other Memories use the new embedder from their
        next call on the repo.

        `progress` (sync or async) gets a `ReembedProgress` at each stage (also emitted as
        `"reembed_progress"`, the end as `"repo_reembedded"`); what it raises is logged.

        Raises:
            StorageError: "read_only" on an inspecting Memory; any other reason when the store
                fails (the repo is then as it was).
            NotFoundError: an unknown repo.
            InvalidInputError: an embedder that is not an `Embedder`, a `batch_size` outside
                1..10,000, or a `progress` that is not callable.
            EmbeddingError: the embedder failed, returned vectors of another size than it
                declares, took longer than `Config.extraction_timeout` for a batch, or cannot
                be built here (a recorded embedder without its key); the repo is as it was.
            ConflictError: the repo is being re-embedded by another Memory.
        """
        from mnemo.extraction.entities import vector_text
        from mnemo.graph import reembed as reembedding
        from mnemo.graph.reembed import ReembedProgress
        from mnemo.graph.vectors import embed_within
        from mnemo.ports import deliver, model_name

        self._works("reembed")
        check_count("batch_size", batch_size, minimum=1, maximum=MAX_REEMBED_BATCH)
        if progress is not None and not callable(progress):
            raise InvalidInputError(f"progress must be a callable, got {progress!r}")
        runtime = await self._repos.known(repo)
        await self._repos.refresh(repo)
        target, dim = await self._repos.reembed_target(repo, embedder)
        limit = runtime.config.extraction_timeout

        async def embed_nodes(nodes: Sequence[Unstaged]) -> Vector:
            return await embed_within(target, [vector_text(n.type, n.text) for n in nodes],
                                       limit)

        async def report(update: ReembedProgress) -> None:
            if progress is not None:
                await deliver(progress, update, "reembed progress")
            await self._events.emit("reembed_progress", repo=repo, stage=update.stage,
                                     done=update.done, total=update.total)

        uri = model_name(target)
        done = await reembedding.reembed(
            self._graph, repo, embedder=uri, dim=dim, embed=embed_nodes,
            batch=batch_size, report=report,
        )
        self._repos.reembedded(repo, target, dim, done.generation)
        await report(ReembedProgress(repo, "indexing", done.vectors, done.vectors))
        await self._graph.vectors_switched(repo, dim)
        await report(ReembedProgress(repo, "done", done.vectors, done.vectors))
        await self._events.emit("repo_reembedded", repo=repo, embedder=uri, dim=dim,
                                nodes=done.vectors, resumed=done.resumed)
        return done.vectors
