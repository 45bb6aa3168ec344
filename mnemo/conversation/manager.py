"""`ConversationManager`: save and load over one Memory's thread log, with a retrieval
(`Recent`, `Semantic`), a compression (`Summary`, `ToolOutputPruner`) and a ttl."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from mnemo import cpu
from mnemo.calls.retry import fail_after
from mnemo.calls.tasks import ask
from mnemo.config import Config
from mnemo.conversation.drafts import (
    COMPARED,
    MessageDraft,
    check_history,
    draft,
    history_hash,
    message_key,
)
from mnemo.conversation.model import (
    Compaction,
    Compression,
    Message,
    Retrieval,
    Semantic,
    Summary,
    ToolOutputPruner,
)
from mnemo.conversation.ports import ThreadState
from mnemo.conversation.prompts import parse_summary, summary_request
from mnemo.conversation.render import compaction_message, flat, prune_tool_outputs, recalled_message
from mnemo.conversation.viewport import answered_at, leading, safe_cuts, tool_ids
from mnemo.errors import (
    ConflictError,
    EmbeddingError,
    InvalidInputError,
    check_count,
    check_id,
    check_name,
    check_text,
)
from mnemo.graph.model import Vector
from mnemo.graph.reads import MAX_OFFSET
from mnemo.graph.scope import Metadata, check_metadata
from mnemo.graph.vectors import unit
from mnemo.ports import LLM, JSONObject

if TYPE_CHECKING:
    from mnemo.conversation.service import ConversationService

log = logging.getLogger("mnemo")

# What one summary request may hold, in tokens (at least this, or 4x the Summary's max_tokens).
SUMMARY_CHUNK_TOKENS = 8000
SUMMARY_MESSAGE_CHARS = 2000
SUMMARY_TOOL_CHARS = 300
# Appends of one save whose length another writer changed before it gives up (see save).
MAX_SAVE_ATTEMPTS = 5


@dataclass(eq=False)
class ConversationManager:
    """Saves and loads threads with one retrieval and compression policy; get one from
    `Memory.conversation(...)` (managers of one Memory share its per-thread locks)."""

    _service: ConversationService = field(repr=False)
    _: KW_ONLY
    retrieval: Retrieval
    compression: tuple[Compression, ...]
    ttl: float | None
    auto_evict_budget: int | None
    eviction_fraction: float
    clock: Callable[[], datetime] = field(repr=False)
    llm: LLM
    # The preamble (`PREAMBLE_ROLES`) first in `load`, never summarised.
    keep_system: bool = False

    @property
    def max_text_chars(self) -> int:
        """The longest text a message may hold (the Memory's `Config.max_text_chars`)."""
        return self._service.config.max_text_chars

    def __await__(self) -> Generator[object, None, ConversationManager]:
        """`await mem.conversation(...)` gives the manager too (the factory is synchronous)."""
        yield from ()
        return self

    async def save(
        self, thread_id: str, messages: Sequence[Mapping[str, object]],
        metadata: Mapping[str, object] | None = None,
    ) -> list[Message]:
        """Stores the messages of `messages` (the full history so far) past the stored length,
        each with the next seq and `metadata`; returns them ([] when nothing was new). The
        history must extend the stored one (compared by hash). New messages are then embedded
        (`Semantic`), summarised (`Summary`) and evicted (`auto_evict_budget`); a failure there
        is logged, never raised.

        Raises:
            InvalidInputError: a history that does not extend the stored one (naming the first
                seq that differs), a bad thread id, or a message past the Config's bounds;
                nothing is stored.
            ConflictError: other writers changed the thread under each of `MAX_SAVE_ATTEMPTS`
                attempts."""
        check_name(thread_id, "thread_id")
        history = check_history(messages)
        scoped = check_metadata(metadata)
        return await self._written(thread_id, partial(self._append_new, thread_id, history, scoped))

    async def append(
        self, thread_id: str, messages: Sequence[Mapping[str, object]],
        metadata: Mapping[str, object] | None = None,
    ) -> list[Message]:
        """Stores `messages`, new messages only, after the thread's stored ones and returns them;
        then as after `save`. Raises InvalidInputError as `save` does for its new messages."""
        check_name(thread_id, "thread_id")
        history = check_history(messages)
        scoped = check_metadata(metadata)
        self._check_count(len(history))
        drafted = await cpu.run(partial(_drafts, history, 0, self._service.config, scoped),
                                _chars(history))
        vectors = await self._embed(thread_id, drafted, {})
        if not drafted:
            return []
        return await self._written(thread_id, lambda: self._service.store.append(
            thread_id, list(drafted.values()), recorded_at=self.clock(), vectors=vectors))

    async def _written(
        self, thread_id: str, write: Callable[[], Awaitable[list[Message]]]
    ) -> list[Message]:
        """What `write` appends under the thread lock, the `Summary` policies' summaries made
        under it too, then evicted (`auto_evict_budget`)."""
        async with self._service.thread_locks.hold(thread_id):
            appended = await write()
            for policy in self.compression if appended else ():
                if isinstance(policy, Summary):
                    await self._summarise(thread_id, policy)
        if appended and self.auto_evict_budget is not None:
            await self._service.auto_evict(
                thread_id, self.auto_evict_budget, self.eviction_fraction, self.llm)
        return appended

    def _check_count(self, new: int) -> None:
        most = self._service.config.max_messages_per_save
        if new > most:
            raise InvalidInputError(
                f"messages holds {new:,} new messages, more than the {most:,} one call "
                "stores (Config.max_messages_per_save): save the history in slices of it")

    async def _embed(
        self, thread_id: str, drafts: Mapping[int, MessageDraft], done: dict[int, Vector]
    ) -> list[Vector] | None:
        """With `Semantic` retrieval, the vectors of `drafts` (those not in `done` embedded into
        it); None without it, or when the embedder failed (logged: load embeds them later)."""
        if not isinstance(self.retrieval, Semantic):
            return None
        missing = [i for i in drafts if i not in done]
        if not missing:  # nothing to ask the embedder, not even its dimension
            return [done[i] for i in drafts]
        try:
            fresh = await self._service.embed([drafts[i].text for i in missing])
        except EmbeddingError:
            log.warning("embedding new messages of %r failed", thread_id, exc_info=True)
            return None
        done.update(zip(missing, fresh, strict=True))
        return [done[i] for i in drafts]

    async def _append_new(
        self, thread_id: str, history: Sequence[Mapping[str, object]], metadata: Metadata
    ) -> list[Message]:
        """`save`'s write: one the store's compare-and-set refuses is tried again, up to
        `MAX_SAVE_ATTEMPTS` times (each message embedded once)."""
        store = self._service.store
        vectors: dict[int, Vector] = {}  # by index in `history`
        keys: list[bytes] = []  # of the history's first messages, as far as a check needed
        attempts = 0
        while True:
            state = await store.state(thread_id) or ThreadState(0, 0, 0)
            stored = state.history_len
            known = min(stored, len(history))
            keys += await cpu.run(partial(_keys, history, len(keys), known),
                                  _chars(history[len(keys):known]))
            digest = await self._extends(thread_id, history, keys[:stored], state)
            if len(history) <= stored:
                return []
            self._check_count(len(history) - stored)
            drafts = await cpu.run(
                partial(_drafts, history, stored, self._service.config, metadata),
                _chars(history[stored:]))
            embedded = await self._embed(thread_id, drafts, vectors)
            try:
                return await store.append(
                    thread_id, list(drafts.values()), recorded_at=self.clock(), vectors=embedded,
                    expected_len=stored, expected_hash=digest, expected_seq=state.next_seq,
                )
            except ConflictError:
                attempts += 1
                if attempts == MAX_SAVE_ATTEMPTS:
                    raise

    async def _extends(self, thread_id: str, history: Sequence[Mapping[str, object]],
                       keys: Sequence[bytes], state: ThreadState) -> str:
        """The hash of the history's first `state.history_len` messages (their `keys`), checked
        to be the stored ones (by hash, else one by one to name the first that differs)."""
        stored = state.history_len
        digest = history_hash(keys)
        if len(keys) == stored and digest == state.history_hash:
            return digest
        found = await self._service.store.first_difference(thread_id, keys)
        if found is not None:
            index, message = found
            was = message.to_dict()
            differs = ", ".join(k for k in COMPARED if history[index].get(k) != was.get(k))
            where = (f"messages[{index}] differs from the stored message seq {message.seq} in "
                     f"{differs or 'a key'}")
        elif state.history_hash is not None and len(keys) == stored:
            where = "it differs in messages the ttl erased"
        else:
            return digest
        raise InvalidInputError(
            f"messages does not extend the {stored:,} messages stored in thread {thread_id!r}"
            f": {where} (of role, content, name, tool_calls and tool_call_id); nothing was "
            "stored. save takes the whole history so far; append takes new messages only")

    async def load(self, thread_id: str, query: str | None = None) -> list[JSONObject]:
        """The thread for a model: with `keep_system` its preamble (its leading system
        messages), compactions as system messages, passive recall for open goals, then the
        retrieval's selection of the other uncompacted messages (tool outputs pruned). A ttl
        erases older messages first; an unknown thread is [].

        Raises:
            InvalidInputError: a blank thread id, or a bad query.
            EmbeddingError: `Semantic` with a query, and embedding failed."""
        if query is not None:
            check_text(query, "query", limit=self._service.config.max_text_chars, stored=False)
        await self._expire(thread_id)
        service = self._service
        preamble = await service.store.preamble(thread_id) if self.keep_system else []
        first = {m.id for m in preamble}
        if isinstance(self.retrieval, Semantic):
            compactions, pool = await service.store.uncompacted(thread_id)
            pool = [m for m in pool if m.id not in first]
            chosen = pool[-self.retrieval.k:]
            if query is not None and pool:
                vectors = await service.message_vectors(pool)
                chosen = top_k(pool, vectors, (await service.embed([query]))[0], self.retrieval.k)
            picked = with_tool_pairs(chosen, pool)
        else:
            compactions, picked = await service.store.recent_turns(thread_id, self.retrieval.k)
            picked = [m for m in picked if m.id not in first]
        # Less each tool result whose call is not before it (compacted, expired, never saved).
        shown = [m for m, at in zip(picked, answered_at(picked), strict=True) if at >= 0]
        out = [m.to_dict() for m in preamble] + [compaction_message(c) for c in compactions]
        goals = await service.store.open_goals(thread_id)
        if goals:
            hits = await service.recalled(thread_id, goals, first | {m.id for m in shown},
                                          whole_thread=True)
            out.extend([recalled_message(hits)] if hits else [])
        out.extend(m.to_dict() for m in shown)
        for policy in self.compression:
            if isinstance(policy, ToolOutputPruner):
                out = prune_tool_outputs(out, policy.max_chars)
        return out

    async def save_compaction(
        self, thread_id: str, start_seq: int, end_seq: int, summary_text: str
    ) -> Compaction:
        """Records that `summary_text` stands for messages `start_seq`..`end_seq` (inclusive) in
        `load`, replacing the compactions inside the range.

        Raises:
            InvalidInputError: a blank id or summary, a bad range, or one that partly overlaps an
                existing compaction.
            NotFoundError: the thread was never saved."""
        check_id(thread_id, "thread_id")
        check_count("start_seq", start_seq)
        check_count("end_seq", end_seq, minimum=start_seq)
        check_text(summary_text, "summary_text", limit=self._service.config.max_text_chars)
        async with self._service.thread_locks.hold(thread_id):
            return await self._service.store.add_compaction(
                thread_id, start_seq, end_seq, summary_text, self.clock())

    async def compactions(self, thread_id: str) -> list[Compaction]:
        """The thread's compaction records, by start_seq."""
        await self._expire(thread_id)
        return await self._service.store.compactions(thread_id)

    async def raw(self, thread_id: str, *, from_seq: int = 0, limit: int | None = None,
                  newest: bool = False) -> list[Message]:
        """The thread's stored messages (after the ttl's erasure, if any) from seq `from_seq`
        on, by seq: every one, or at most `limit`, the first ones or, with `newest`, the last
        ones.

        Raises:
            InvalidInputError: a blank thread id, or a `from_seq` or `limit` that is not an
                integer from 0 to 2**63 - 1.
        """
        check_count("from_seq", from_seq, maximum=MAX_OFFSET)
        if limit is not None:
            check_count("limit", limit, maximum=MAX_OFFSET)
        await self._expire(thread_id)
        return await self._service.store.raw(thread_id, from_seq, limit, newest)

    async def count(self, thread_id: str) -> int:
        """How many messages the thread stores (after the ttl's erasure, if any)."""
        await self._expire(thread_id)
        return await self._service.store.count(thread_id)

    async def pop(self, thread_id: str) -> Message | None:
        """Erases the thread's newest message and returns it (None if none; no seq reused)."""
        check_id(thread_id, "thread_id")
        service = self._service
        async with service.thread_locks.hold(thread_id), service.evict_locks.hold(thread_id):
            return await service.store.pop(thread_id)

    async def clear(self, thread_id: str) -> None:
        """Deletes the thread's messages, compactions, vectors, snapshots, goals and pins and starts
        a new history; seqs are not reused."""
        check_id(thread_id, "thread_id")
        service = self._service
        async with service.thread_locks.hold(thread_id), service.evict_locks.hold(thread_id):
            await service.store.clear(thread_id)

    async def purge(self, thread_id: str) -> int:
        """Erases the thread and its seq counter, leaving nothing of it in the database file;
        returns how many messages went."""
        check_id(thread_id, "thread_id")
        return await self._service.purge(thread_id)

    async def _expire(self, thread_id: str) -> None:
        """Erases what the ttl ended of the thread (a blank thread id refused)."""
        check_id(thread_id, "thread_id")
        if self.ttl is not None:
            cutoff = self.clock() - timedelta(seconds=self.ttl)
            await self._service.store.expire(thread_id, cutoff)

    async def _summarise(self, thread_id: str, policy: Summary) -> None:
        """Compacts all but the last `keep` uncompacted messages (less the preamble with
        `keep_system`) into a rolling summary when they exceed `max_tokens`, in chunks. Under
        the thread lock; failures are logged."""
        service = self._service
        compactions, tail = await service.store.uncompacted(thread_id)
        if self.keep_system:
            first = {m.id for m in await service.store.preamble(thread_id)}
            tail = [m for m in tail if m.id not in first]
        if sum(m.tokens for m in tail) <= policy.max_tokens or len(tail) <= policy.keep:
            return
        safe = safe_cuts(tail)  # the kept tail holds no tool result without its call
        split = next((i for i in range(len(tail) - policy.keep, 0, -1) if safe[i]), 0)
        if split == 0:
            return
        pending = tail[:split]
        max_words = max(48, policy.max_tokens * 3 // 16)
        parse = partial(parse_summary, max_words=max_words)
        chunk_tokens = max(SUMMARY_CHUNK_TOKENS, 4 * policy.max_tokens)
        while pending:
            fits = leading(pending, chunk_tokens)
            chunk, pending = pending[:fits], pending[fits:]
            previous = max((c for c in compactions if c.end_seq < chunk[0].seq),
                           key=lambda c: c.end_seq, default=None)
            # The new record replaces the compactions inside its range: their summaries go in.
            inner = [c for c in compactions if chunk[0].seq < c.start_seq < chunk[-1].seq]
            request = summary_request(
                previous_summary=previous.summary_text if previous else "",
                messages=_summary_inputs(chunk, inner),
                max_words=max_words,
            )
            try:
                with fail_after(service.timeout, stretches=True):
                    summary = await ask(self.llm, request, parse, any_reply=True)
            except Exception:
                # The messages stay uncompacted and whole: load shows them, nothing is lost.
                log.warning("summarising thread %r failed", thread_id, exc_info=True)
                return
            start = previous.start_seq if previous else chunk[0].seq
            seen = [c.start_seq for c in compactions
                    if start <= c.start_seq and c.end_seq <= chunk[-1].seq]
            try:
                record = await service.store.add_compaction(
                    thread_id, start, chunk[-1].seq, summary, self.clock(), replaces=seen)
            except (ConflictError, InvalidInputError):
                # Another Memory compacted the thread meanwhile: its record stands.
                log.warning("thread %r was compacted by another writer while summarising; "
                            "this summary is dropped", thread_id, exc_info=True)
                return
            compactions = [c for c in compactions if not start <= c.start_seq <= chunk[-1].seq]
            compactions.append(record)
            await service.events.emit(
                "thread_compacted", thread_id=thread_id, start_seq=start, end_seq=chunk[-1].seq)


def _summary_inputs(chunk: Sequence[Message], inner: Sequence[Compaction]) -> list[JSONObject]:
    """The "summary" task's messages: the chunk's, each cut short, and each inner compaction
    as a "summary" message at its start seq, in seq order."""
    items = [(m.seq, m.role, flat(m.content, SUMMARY_TOOL_CHARS if m.is_tool_result
                                   else SUMMARY_MESSAGE_CHARS)) for m in chunk]
    items += [(c.start_seq, "summary", c.summary_text) for c in inner]
    return [{"seq": seq, "role": role, "text": text}
            for seq, role, text in sorted(items, key=lambda item: item[0])]


def _drafts(
    history: Sequence[Mapping[str, object]], start: int, config: Config, metadata: Metadata,
) -> dict[int, MessageDraft]:
    return {i: replace(draft(history[i], i, config), metadata=metadata)
            for i in range(start, len(history))}


def _keys(history: Sequence[Mapping[str, object]], start: int, end: int) -> list[bytes]:
    return [message_key(history[i], i) for i in range(start, end)]


def _chars(messages: Sequence[Mapping[str, object]]) -> int:
    """About what checking and hashing `messages` reads, in characters (`cpu.run`)."""
    return sum(len(c) if isinstance(c := m.get("content"), str) else 64 for m in messages)


def with_tool_pairs(picked: Sequence[Message], pool: Sequence[Message]) -> list[Message]:
    """`picked` (of `pool`) plus the messages of `pool` that complete their tool calls, by seq."""
    ids = {m.seq: set[str]().union(*tool_ids(m)) for m in pool}
    chosen = {m.seq for m in picked}
    while True:
        wanted = set[str]().union(*(ids[seq] for seq in chosen))
        more = {seq for seq, own in ids.items() if own & wanted} - chosen
        if not more:
            return [m for m in pool if m.seq in chosen]
        chosen |= more


def top_k(
    messages: Sequence[Message], vectors: npt.NDArray[np.float32], query: npt.NDArray[np.float32],
    k: int,
) -> list[Message]:
    """The `k` messages whose vectors are most cosine-similar to `query`; ties go to the newer
    message. Returned by seq."""
    scores = unit(vectors) @ unit(query)[0]  # a zero vector scores 0
    # Sort by score, then by recency (seq): lexsort takes its primary key last.
    order = np.lexsort((-np.array([m.seq for m in messages]), -scores))[:k]
    return sorted((messages[i] for i in order), key=lambda m: m.seq)
