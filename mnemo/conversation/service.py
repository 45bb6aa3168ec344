"""`ConversationService`: conversation memory behind `Memory`'s thread calls, owning the
per-thread locks every `ConversationManager` of one Memory shares (the thread lock for
read-then-write of the log, the eviction lock for one eviction at a time)."""

from __future__ import annotations

import logging
import weakref
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial

import anyio
import numpy as np
import numpy.typing as npt

from mnemo.calls.retry import fail_after
from mnemo.calls.tasks import ask
from mnemo.config import DURATION_CEILINGS, Config
from mnemo.conversation.drafts import search_text
from mnemo.conversation.eviction import MAX_ATTEMPTS, EvictionTools, run_loop
from mnemo.conversation.model import (
    Compression,
    EvictionResult,
    Goal,
    Message,
    MessageView,
    SearchHit,
    Snapshot,
    Summary,
    ToolOutputPruner,
    Viewport,
)
from mnemo.conversation.ports import EvictionInputs, Shown, ThreadStore
from mnemo.conversation.prompts import eviction_request, fold_request, parse_summary
from mnemo.conversation.render import reduced, render_window
from mnemo.conversation.search import render_hits
from mnemo.conversation.viewport import (
    FOLD_AFTER,
    RECALL_HITS,
    context_zones,
    eviction_zone,
    layout,
    snapshot_words,
    with_recalled,
)
from mnemo.errors import (
    ConflictError,
    EmbeddingError,
    InvalidInputError,
    NotFoundError,
    StorageError,
    check_budget,
    check_count,
    check_id,
    check_models,
    check_name,
    check_seconds,
    check_text,
)
from mnemo.graph.scope import Where, pairs
from mnemo.graph.vectors import embed_within
from mnemo.ports import LLM, Embedder, Events, detect_dim
from mnemo.text import query_words

log = logging.getLogger("mnemo")


MAX_SEARCH_LIMIT = 100
MAX_RADIUS = 100
# Threads whose last viewport a Memory remembers for `search_messages(exclude_viewport_of=)`.
SHOWN_KEPT = 1024
# The most distinct metadata of a thread's messages passive recall reads for its scope; a
# thread with more is taken as sharing no pair (it recalls its own messages only).
SCOPES = 16


class KeyedLocks:
    """One `anyio.Lock` per key (`hold`), kept only while someone holds or awaits it."""

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[str, anyio.Lock] = weakref.WeakValueDictionary()

    def hold(self, key: str) -> anyio.Lock:
        return self._locks.setdefault(key, anyio.Lock())


class ConversationService:
    """Threads, viewports, eviction, goals, search and erasure over one `ThreadStore`."""

    def __init__(
        self,
        store: ThreadStore,
        *,
        llm: LLM,
        embedder: Embedder,
        config: Config,
        events: Events,
        clock: Callable[[], datetime],
        limit: Callable[[LLM], LLM],
    ) -> None:
        self.store = store
        self.llm = llm
        self._limit = limit
        self.embedder = embedder
        self.timeout = config.extraction_timeout
        # Threads belong to no repo: the Memory's config bounds their texts and counts.
        self.config = config
        self.events = events
        self.clock = clock
        # Held while a call reads then writes a thread's log; while one evicts it.
        self.thread_locks = KeyedLocks()
        self.evict_locks = KeyedLocks()
        # What the last viewport laid out here showed of each thread, for `search_messages`.
        self._shown: OrderedDict[str, Shown] = OrderedDict()

    def model(self, llm: LLM | None) -> LLM:
        """A manager's or eviction's model: `llm` within its provider's limit, else the Memory's."""
        check_models(llm, None)
        return self.llm if llm is None else self._limit(llm)

    async def dimension(self) -> int:
        """The embedder's dimension, asking it now if it learns it from its first reply."""
        try:
            with fail_after(self.timeout):
                return await detect_dim(self.embedder)
        except TimeoutError as exc:
            raise EmbeddingError(f"the embedder timed out after {self.timeout:g} s") from exc
        except EmbeddingError:
            raise
        except Exception as exc:
            raise EmbeddingError(f"the embedder failed: {exc!r}") from exc

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """The float32 embeddings of `texts`, one call per batch within the timeout."""
        parts = [await embed_within(self.embedder, texts[part], self.timeout)
                 for part in batches(texts)]
        return np.concatenate(parts) if parts else np.zeros((0, await self.dimension()),
                                                             dtype=np.float32)

    async def message_vectors(self, messages: Sequence[Message]) -> npt.NDArray[np.float32]:
        """The vectors of one thread's `messages`, the missing ones embedded and stored first."""
        dim = await self.dimension()
        if not messages:
            return np.zeros((0, dim), dtype=np.float32)
        stored = await self.store.vectors(messages[0].thread_id)
        missing = [m for m in messages if m.id not in stored or stored[m.id].shape != (dim,)]
        texts = [search_text(m.content, m.data.get("tool_calls")) for m in missing]
        # Stored batch by batch: a load that fails part way keeps what it made.
        for part in batches(texts):
            fresh = await embed_within(self.embedder, texts[part], self.timeout)
            rows = [(m.id, fresh[i]) for i, m in enumerate(missing[part])]
            try:
                await self.store.save_vectors(messages[0].thread_id, rows)
            except StorageError as exc:
                # Kept to spare the next read the embedding: a read does not fail for it.
                log.warning("%s: %d message vectors not stored: %r", messages[0].thread_id,
                            len(rows), exc)
            stored.update(rows)
        return np.stack([stored[m.id] for m in messages]).astype(np.float32, copy=False)

    async def viewport(self, thread_id: str, token_budget: int) -> Viewport:
        check_id(thread_id, "thread_id")
        check_budget("token_budget", token_budget)
        goals = await self.store.open_goals(thread_id)
        view = layout(thread_id, token_budget,
                      await self.store.viewport_inputs(thread_id, token_budget),
                      recall=bool(goals))
        if goals:
            pinned = {m.id for m in view.pinned}
            view = with_recalled(view, await self.recalled(thread_id, goals, pinned))
        self._shown[thread_id] = Shown(frozenset(m.id for m in [*view.messages, *view.pinned]))
        self._shown.move_to_end(thread_id)
        while len(self._shown) > SHOWN_KEPT:
            self._shown.popitem(last=False)
        return view

    async def recalled(
        self, thread_id: str, goals: Sequence[Goal], shown: Collection[str], *,
        whole_thread: bool = False,
    ) -> list[SearchHit]:
        """Passive recall: up to `RECALL_HITS` past messages a search for the open `goals`'
        words finds, none of `shown` nor (unless `whole_thread`) of the thread's viewport.
        Within the thread's scope, the metadata pairs all its messages share: when they share
        none but carry some, only the thread's own; a thread without messages recalls none."""
        words = query_words(" ".join(goal.description for goal in goals))
        held = ([set(pairs(m)) for m in await self.store.scopes(thread_id, SCOPES + 1)]
                if words else [])
        if not held:
            return []
        shared = set.intersection(*held) if len(held) <= SCOPES else set()
        hits = await self.store.search(
            words, limit=min(MAX_SEARCH_LIMIT, RECALL_HITS + len(shown)), now=self.clock(),
            thread_id=thread_id if any(held) and not shared else None,
            exclude_viewport_of=None if whole_thread else thread_id,
            where={key: (value,) for key, value in shared} or None,
        )
        return [hit for hit in hits if hit.message_id not in shown][:RECALL_HITS]

    async def evict(
        self, thread_id: str, token_budget: int, eviction_fraction: float,
        llm: LLM | None = None,
    ) -> EvictionResult:
        check_id(thread_id, "thread_id")
        check_budget("token_budget", token_budget)
        check_fraction(eviction_fraction)
        model = self.model(llm)
        async with self.evict_locks.hold(thread_id):
            return await self._evict(thread_id, token_budget, eviction_fraction, model)

    async def auto_evict(
        self, thread_id: str, token_budget: int, eviction_fraction: float, llm: LLM
    ) -> None:
        """Evicts until the viewport of `token_budget` shows every message from the boundary
        on, or until the thread is purged meanwhile."""
        async with self.evict_locks.hold(thread_id):
            while layout(thread_id, token_budget,
                         await self.store.viewport_inputs(thread_id, token_budget)).behind:
                try:
                    result = await self._evict(thread_id, token_budget, eviction_fraction, llm)
                except NotFoundError:
                    break
                if result.boundary_after == result.boundary_before:
                    break

    async def _evict(
        self, thread_id: str, token_budget: int, eviction_fraction: float, llm: LLM
    ) -> EvictionResult:
        """One eviction under the caller's eviction lock, its model calls made to `llm`. A
        boundary another writer advanced meanwhile counts as this eviction; one that went back (a
        clear) is evicted again, up to `MAX_ATTEMPTS` times (then ConflictError). NotFoundError:
        a thread never saved."""
        read: int | None = None
        attempts = 0
        while True:
            inputs = await self.store.eviction_inputs(thread_id)
            if read is not None and inputs.boundary_seq > read:
                return EvictionResult(thread_id, read, inputs.boundary_seq, None, None, 0, 0)
            read = inputs.boundary_seq
            try:
                return await self._evict_from(
                    inputs, thread_id, token_budget, eviction_fraction, llm)
            except ConflictError:
                attempts += 1
                if attempts == MAX_ATTEMPTS:
                    raise

    async def _evict_from(
        self,
        inputs: EvictionInputs,
        thread_id: str,
        token_budget: int,
        eviction_fraction: float,
        llm: LLM,
    ) -> EvictionResult:
        boundary, past = inputs.boundary_seq, inputs.past_boundary
        goals = [{"id": g.id, "description": g.description} for g in inputs.goals]
        zone = eviction_zone(past, token_budget, eviction_fraction)
        if not zone:
            return EvictionResult(thread_id, boundary, boundary, None, None, 0, 0)
        span = (zone[0].seq, zone[-1].seq)
        tools = EvictionTools(
            zone=zone,
            goal_ids={g["id"] for g in goals},
            max_words=snapshot_words(token_budget, 1),
        )
        recalled = await self.recalled(thread_id, inputs.goals, ()) if inputs.goals else []
        zone_text, middle, recent = render_window(
            zone, *context_zones(past[len(zone):], token_budget, eviction_fraction))
        ask_round = partial(
            eviction_request, zone=zone_text, middle=middle, recent=recent, zone_start=span[0],
            zone_end=span[1], goals=goals, previous_snapshot=inputs.previous_snapshot,
            recalled=render_hits(recalled) if recalled else "", max_words=tools.max_words)
        error, usage = await run_loop(llm, tools, ask_round, goals=bool(goals),
                                      time_limit=self.timeout)
        # The model's snapshot, or, when it failed, an honest pointer rather than a summary.
        text = "\n".join(tools.snapshot_parts) or (
            f"Messages {span[0]}-{span[1]} left the context window without a summary (the memory "
            f"model failed: {(error or 'no snapshot')[:200]}). search_messages and view_messages "
            "still find them word for word.")
        after = zone[-1].seq + 1
        snapshot = await self.store.commit_eviction(
            thread_id, boundary_before=boundary, boundary_after=after, zone=span,
            snapshot_text=text, pins=tools.pins, now=self.clock(),
        )
        folded = await self._fold(thread_id, token_budget, llm)
        pinned = list(dict.fromkeys(mid for mid, _ in tools.pins))
        await self.events.emit(
            "thread_evicted", thread_id=thread_id, start_seq=span[0], end_seq=span[1],
            boundary=after, pinned=pinned, error=error,
        )
        return EvictionResult(
            thread_id=thread_id,
            boundary_before=boundary,
            boundary_after=after,
            start_seq=span[0],
            end_seq=span[1],
            evicted=len(zone),
            tokens_evicted=sum(m.tokens for m in zone),
            snapshot=snapshot,
            folded=folded,
            pinned=pinned,
            tool_calls=list(tools.calls),
            error=error,
            usage=usage,
        )

    async def _fold(self, thread_id: str, token_budget: int, llm: LLM) -> Snapshot | None:
        """Folds the oldest 5 uncovered level-1 snapshots into a level-2 one, when due; a
        failure is logged and left for the next eviction."""
        due = list((await self.store.uncovered_snapshots(thread_id))[:FOLD_AFTER])
        if len(due) < FOLD_AFTER:
            return None
        request = fold_request(
            snapshots=[{"start_seq": s.start_seq, "end_seq": s.end_seq, "text": s.text}
                       for s in due],
            max_words=(words := snapshot_words(token_budget, 2)),
        )
        try:
            with fail_after(self.timeout, stretches=True):
                text = await ask(llm, request, partial(parse_summary, max_words=words),
                                 any_reply=True)
        except Exception:
            # Folding is an optimisation of the viewport: the level-1 snapshots stay visible.
            log.warning("folding snapshots of thread %r failed", thread_id, exc_info=True)
            return None
        return await self.store.commit_fold(thread_id, due, text, self.clock())

    async def add_goal(self, thread_id: str, description: str) -> str:
        """See `Memory.add_goal`; the count of open goals is checked under the thread lock."""
        check_name(thread_id, "thread_id")
        check_text(description, "description", limit=self.config.max_text_chars)
        most = self.config.max_open_goals
        async with self.thread_locks.hold(thread_id):
            if len(await self.store.open_goals(thread_id)) >= most:
                raise InvalidInputError(
                    f"thread {thread_id!r} has {most:,} open goals, the most it may have "
                    "(Config.max_open_goals): complete one first")
            return await self.store.add_goal(thread_id, description.strip(), self.clock())

    async def complete_goal(self, goal_id: str) -> None:
        check_id(goal_id, "goal_id")
        await self.store.complete_goal(goal_id, self.clock())

    async def search_messages(
        self,
        query: str,
        *,
        thread_id: str | None,
        limit: int,
        exclude_viewport_of: str | None,
        where: Where | None = None,
    ) -> list[SearchHit]:
        """See `Memory.search_messages`; `exclude_viewport_of` leaves out what that thread's
        viewport showed here, else its messages from the boundary on."""
        check_text(query, "query", limit=self.config.max_text_chars, stored=False)
        check_count("limit", limit, minimum=1, maximum=MAX_SEARCH_LIMIT)
        if thread_id is not None:
            check_id(thread_id, "thread_id")
        if exclude_viewport_of is not None:
            check_id(exclude_viewport_of, "thread_id")
        words = query_words(query)
        if not words:
            return []
        return await self.store.search(
            words, limit=limit, now=self.clock(), thread_id=thread_id,
            exclude_viewport_of=exclude_viewport_of,
            shown=None if exclude_viewport_of is None else self._shown.get(exclude_viewport_of),
            where=where,
        )

    async def message_ids(self, prefix: str, *, limit: int) -> list[str]:
        check_id(prefix, "prefix")
        check_count("limit", limit, minimum=1, maximum=MAX_RADIUS)
        return await self.store.message_ids(prefix, limit)

    async def view_messages(self, message_id: str, *, radius: int) -> MessageView:
        check_id(message_id, "message_id")
        check_count("radius", radius, minimum=0, maximum=MAX_RADIUS)
        view = await self.store.view(message_id, radius)
        # The window's tool outputs are reduced to ok/error; `target` stays as stored.
        return replace(view, messages=[reduced(m) for m in view.messages])

    async def purge(self, thread_id: str) -> int:
        async with self.thread_locks.hold(thread_id), self.evict_locks.hold(thread_id):
            gone = await self.store.purge(thread_id)
            self._shown.pop(thread_id, None)  # a new thread of that id shows nothing yet
        await self.events.emit("thread_purged", thread_id=thread_id, messages=gone)
        return gone


def check_fraction(value: object) -> None:
    """Raises InvalidInputError unless `value` is an eviction fraction, in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise InvalidInputError(f"eviction_fraction must be in (0, 1], got {value!r}")


def compressions(
    compression: Compression | Sequence[Compression] | None,
) -> tuple[Compression, ...]:
    items = () if compression is None else tuple(
        compression if isinstance(compression, list | tuple) else [compression])
    for item in items:
        if not isinstance(item, Summary | ToolOutputPruner):
            raise InvalidInputError(
                f"compression must be mnemo.Summary or mnemo.ToolOutputPruner (or a list of "
                f"them), got {item!r}")
    return items


def ttl_seconds(ttl: float | timedelta | None) -> float | None:
    if ttl is None:
        return None
    return check_seconds("ttl", ttl.total_seconds() if isinstance(ttl, timedelta) else ttl,
                         DURATION_CEILINGS["age"])


# One embedder call takes at most this many messages, and this many characters.
BATCH_TEXTS = 64
BATCH_CHARS = 256_000


def batches(texts: Sequence[str]) -> list[slice]:
    """`texts` cut into consecutive batches of at most `BATCH_TEXTS` texts and `BATCH_CHARS`
    characters (a longer text alone)."""
    out: list[slice] = []
    start = chars = 0
    for end, text in enumerate(texts):
        if end > start and (end - start == BATCH_TEXTS or chars + len(text) > BATCH_CHARS):
            out.append(slice(start, end))
            start, chars = end, 0
        chars += len(text)
    if start < len(texts):
        out.append(slice(start, len(texts)))
    return out
