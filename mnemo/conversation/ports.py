"""`ThreadStore`, what conversation memory needs from a backend (each method one coarse step,
one transaction for a write), and the values it reads back."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from mnemo.conversation.drafts import MessageDraft, history_hash
from mnemo.conversation.model import (
    Compaction,
    Goal,
    Message,
    MessageView,
    SearchHit,
    Snapshot,
    ThreadInfo,
)
from mnemo.errors import ConflictError
from mnemo.graph.model import Vector
from mnemo.graph.scope import Metadata, Where


@dataclass(frozen=True, slots=True)
class ThreadState:
    """A thread's counters: next seq, stored history length, viewport start, history hash."""

    next_seq: int
    history_len: int
    boundary_seq: int
    history_hash: str | None = ""


def check_expected(
    thread_id: str, state: ThreadState, length: int | None, digest: str | None, seq: int | None
) -> None:
    """Refuses (ConflictError) an append checked against another stored history than `state`'s."""
    if (length is not None and state.history_len != length) or (
            seq is not None and state.next_seq != seq) or (
            digest is not None and state.history_hash not in (digest, None)):
        raise ConflictError(
            f"thread {thread_id!r} changed while saving: {state.history_len} messages "
            f"stored, expected {length}")


def next_hash(state: ThreadState, drafts: Sequence[MessageDraft], digest: str | None) -> (
    str | None
):
    """The history's hash once `drafts` are appended, chained onto `digest` (else the stored
    hash; an unknown one stays unknown)."""
    start = state.history_hash if digest is None else digest
    return None if start is None else history_hash((d.key for d in drafts), start)


@dataclass(frozen=True, slots=True)
class Shown:
    """The ids of the messages (pins included) that the last viewport of a thread showed."""

    ids: frozenset[str]


@dataclass(frozen=True, slots=True)
class ViewportInputs:
    """What the viewport's layout reads of a thread, bounded (lists newest first; `newest`
    stops past the token limit)."""

    boundary_seq: int
    pinned: list[Message]
    level1: list[Snapshot]
    level2: list[Snapshot]
    tokens_past_boundary: int
    newest: list[Message]


@dataclass(frozen=True, slots=True)
class EvictionInputs:
    """What an eviction starts from: boundary, messages from it, open goals, and the newest
    uncovered level-1 snapshot's text."""

    boundary_seq: int
    past_boundary: list[Message]
    goals: list[Goal]
    previous_snapshot: str


class ThreadStore(Protocol):
    """Every thread's log, compactions, vectors, goals, pins, snapshots and search index; a
    write computed from a stale read changes nothing."""

    async def state(self, thread_id: str) -> ThreadState | None:
        """The thread's counters, None for a thread never saved (or purged)."""

    async def threads(self) -> list[ThreadInfo]:
        """Every stored thread (not purged), oldest first, with its number of messages."""

    async def append(
        self,
        thread_id: str,
        drafts: Sequence[MessageDraft],
        *,
        recorded_at: datetime,
        vectors: Sequence[Vector] | None = None,
        expected_len: int | None = None,
        expected_hash: str | None = None,
        expected_seq: int | None = None,
    ) -> list[Message]:
        """Appends `drafts` (with their vectors) after the stored history, chaining their keys
        onto its hash; ConflictError, writing nothing, when the stored length is not
        `expected_len`, the next seq not `expected_seq`, or a known hash not `expected_hash`."""

    async def first_difference(
        self, thread_id: str, keys: Sequence[bytes]
    ) -> tuple[int, Message] | None:
        """(index in the history, message) of the first stored message whose key is not
        `keys`'s there (they are the history's last: a ttl erases its oldest); None when all
        match."""

    async def expire(self, thread_id: str, cutoff: datetime) -> int:
        """Erases the messages recorded before `cutoff` and what only covered them; returns
        how many messages went."""

    async def pop(self, thread_id: str) -> Message | None:
        """Erases the newest message and the compactions holding it; returns it (None if none).
        The seq counter is untouched; the history is one shorter, its hash unknown."""

    async def compactions(self, thread_id: str) -> list[Compaction]:
        """The thread's compaction records, by start."""

    async def raw(self, thread_id: str, from_seq: int = 0, limit: int | None = None,
                  newest: bool = False) -> list[Message]:
        """The thread's stored messages from seq `from_seq` on, by seq: at most `limit`, the
        first ones or, with `newest`, the last ones."""

    async def count(self, thread_id: str) -> int:
        """How many messages the thread stores."""

    async def uncompacted(self, thread_id: str) -> tuple[list[Compaction], list[Message]]:
        """The compactions and every message none of them covers, by seq, read together."""

    async def preamble(self, thread_id: str) -> list[Message]:
        """The thread's first messages while their role is in `model.PREAMBLE_ROLES` (at most
        `model.PREAMBLE_MESSAGES`), by seq."""

    async def recent_turns(
        self, thread_id: str, k: int
    ) -> tuple[list[Compaction], list[Message]]:
        """The compactions and uncompacted messages of the last `k` turns, by seq."""

    async def add_compaction(
        self, thread_id: str, start_seq: int, end_seq: int, summary_text: str, now: datetime,
        *, replaces: Collection[int] | None = None,
    ) -> Compaction:
        """Records that `summary_text` stands for messages `start_seq`..`end_seq`, replacing
        the records inside (`replaces`, when given, names those the writer saw). NotFoundError:
        a thread never saved; InvalidInputError: a range past the last seq or partly
        overlapping a compaction; ConflictError: the records inside are not `replaces`."""

    async def vectors(self, thread_id: str) -> dict[str, Vector]:
        """The stored vector of each message of the thread that has one, by message id."""

    async def save_vectors(self, thread_id: str, rows: Sequence[tuple[str, Vector]]) -> None:
        """Stores (or replaces) vectors of existing messages (SQLite: StorageError("busy")
        after a tenth of a second's wait)."""

    async def clear(self, thread_id: str) -> None:
        """Deletes the thread's messages, vectors, compactions, snapshots, goals and pins, and
        starts a new history; the seq counter goes on (no seq is reused)."""

    async def purge(self, thread_id: str) -> int:
        """Erases the thread without a trace (its counter too); returns how many messages went."""

    async def add_goal(self, thread_id: str, description: str, now: datetime) -> str:
        """Adds an open goal to the thread; returns its id ("goal_<hex>")."""

    async def complete_goal(self, goal_id: str, now: datetime) -> int:
        """Marks the goal completed and releases its pins; returns how many went (NotFoundError for
        no such goal)."""

    async def open_goals(self, thread_id: str) -> list[Goal]:
        """The thread's open goals, oldest first."""

    async def viewport_inputs(self, thread_id: str, token_limit: int) -> ViewportInputs:
        """What the viewport is laid out from, `newest` bounded by `token_limit`; an unknown
        thread gives empty inputs."""

    async def eviction_inputs(self, thread_id: str) -> EvictionInputs:
        """What an eviction of the thread starts from (NotFoundError when never saved)."""

    async def commit_eviction(
        self,
        thread_id: str,
        *,
        boundary_before: int,
        boundary_after: int,
        zone: tuple[int, int],
        snapshot_text: str,
        pins: Sequence[tuple[str, str]],
        now: datetime,
    ) -> Snapshot | None:
        """Writes the level-1 snapshot of `zone` and the pins and moves the boundary, in one
        transaction; raises ConflictError, writing nothing, when the boundary moved meanwhile."""

    async def uncovered_snapshots(self, thread_id: str) -> list[Snapshot]:
        """The thread's level-1 snapshots no level-2 one covers, oldest first."""

    async def commit_fold(
        self, thread_id: str, covered: Sequence[Snapshot], text: str, now: datetime
    ) -> Snapshot | None:
        """Writes the level-2 snapshot over `covered` and marks them, unless one was covered or
        deleted meanwhile (then nothing, None)."""

    async def snapshots(self, thread_id: str) -> list[Snapshot]:
        """Every snapshot of the thread, covered ones included, by level then start."""

    async def search(
        self,
        words: Sequence[str],
        *,
        limit: int,
        now: datetime,
        thread_id: str | None = None,
        exclude_viewport_of: str | None = None,
        shown: Shown | None = None,
        where: Where | None = None,
    ) -> list[SearchHit]:
        """The best `limit` messages matching any of `words` (`search.rank_by_recency`), within
        `thread_id` and `where`, without what `exclude_viewport_of`'s viewport shows; each with
        a snippet."""

    async def scopes(self, thread_id: str, limit: int) -> list[Metadata]:
        """The distinct metadata of the thread's messages (`{}` for those saved without), at
        most `limit`."""

    async def message_ids(self, prefix: str, limit: int) -> list[str]:
        """The ids of stored messages that start with `prefix`, sorted, at most `limit`."""

    async def view(self, message_id: str, radius: int) -> MessageView:
        """The message, `radius` messages on each side, and the nearest level-1 snapshots
        (NotFoundError for no such message)."""
