"""The values of conversation memory and its retrieval and compression policies; policies
check their arguments when built."""

from __future__ import annotations

import base64
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from mnemo.conversation.render import memory_block, render_view
from mnemo.errors import (
    MAX_COUNT,
    ConflictError,
    InvalidInputError,
    check_budget,
    check_count,
    storable_text,
)
from mnemo.graph.scope import Metadata
from mnemo.ports import JSONObject, ToolCall, Usage


@dataclass(frozen=True, slots=True)
class _Retrieval:
    """A retrieval policy of `k` (an integer >= 1, else InvalidInputError)."""

    k: int = 10

    def __post_init__(self) -> None:
        check_count(f"{type(self).__name__}.k", self.k, minimum=1, maximum=MAX_COUNT)


@dataclass(frozen=True, slots=True)
class Recent(_Retrieval):
    """Retrieval: the last `k` turns of the uncompacted messages (a turn starts at a user message
    that is not a tool's output)."""


@dataclass(frozen=True, slots=True)
class Semantic(_Retrieval):
    """Retrieval: the `k` uncompacted messages most similar to the query, in log order, with the
    calls or results that complete their tool calls; without a query, the last `k`."""


@dataclass(frozen=True, slots=True)
class Summary:
    """Compression: when the uncompacted messages exceed `max_tokens`, all but the last `keep`
    (never a tool result without its call) are rolled into one summary by the LLM (task
    "summary"). Raises InvalidInputError for `max_tokens` < 1 or `keep` < 0."""

    max_tokens: int = 4000
    keep: int = 5

    def __post_init__(self) -> None:
        check_budget("Summary.max_tokens", self.max_tokens)
        check_count("Summary.keep", self.keep, maximum=MAX_COUNT)


@dataclass(frozen=True, slots=True)
class ToolOutputPruner:
    """Compression: tool outputs longer than `max_chars` are cut, with a note, in what `load`
    returns; the stored log keeps them whole."""

    max_chars: int = 4000

    def __post_init__(self) -> None:
        check_count("ToolOutputPruner.max_chars", self.max_chars, minimum=1,
                    maximum=MAX_ITEM_CHARS)


Retrieval = Recent | Semantic

# A thread's preamble, its instructions: its first messages (at most `PREAMBLE_MESSAGES`) while
# their roles are these. With `keep_system`, `load` gives them first whatever it selects and a
# summary never takes them.
PREAMBLE_ROLES = ("system", "developer")
PREAMBLE_MESSAGES = 8
Compression = Summary | ToolOutputPruner


# `data["content"]` of a message saved without a content key.
NO_CONTENT: JSONObject = {"mnemo": "no content key"}
# Where a message keeps an OpenAI Responses item whole (the Agents SDK's items): its text,
# which search, embedding and eviction read, is the first `Config.max_text_chars` characters.
ITEM_KEY = "openai_item"
# The longest item kept whole, as JSON: about a million tokens, past any model's context.
MAX_ITEM_CHARS = 4_000_000
# An item kept with a lone surrogate: this, then its JSON's UTF-8 in base64, each surrogate
# encoded alone (escaped JSON reads two adjacent ones back as one character).
_SURROGATES = "utf-8+surrogates:"


def kept_item(item: object) -> str:
    """`item` (a JSON value holding a NUL or a lone surrogate, which no store keeps) as text
    both stores keep and `Message.item` gives back equal: its JSON, a NUL escaped; with a lone
    surrogate, `_SURROGATES` and its UTF-8 in base64."""
    kept = json.dumps(item, ensure_ascii=False)
    if storable_text(kept):
        return kept
    return _SURROGATES + base64.b64encode(kept.encode("utf-8", "surrogatepass")).decode()


@dataclass(frozen=True, slots=True)
class Message:
    """One stored message of a thread: `seq` (0-based, never reused), `content` (its text), `data`
    (every other key as saved) and `tokens` (its cost in a context window)."""

    id: str
    thread_id: str
    seq: int
    role: str
    content: str
    data: JSONObject
    recorded_at: datetime
    tokens: int = 0
    # Who the message belongs to (`save`/`append`'s `metadata`; `mnemo.graph.scope`).
    metadata: Metadata = field(default_factory=dict)

    def to_dict(self) -> JSONObject:
        """The message as saved: `role`, `content` (unless it had none), the other keys."""
        out = {"role": self.role, "content": self.content, **self.data}
        if out["content"] == NO_CONTENT:
            del out["content"]
        return out

    @property
    def item(self) -> JSONObject | None:
        """The OpenAI Responses item kept whole (`ITEM_KEY`; one holding a NUL or a lone
        surrogate is kept as its escaped JSON), None for none."""
        kept = self.data.get(ITEM_KEY)
        if isinstance(kept, str):
            kept = json.loads(base64.b64decode(kept.removeprefix(_SURROGATES)).decode(
                "utf-8", "surrogatepass") if kept.startswith(_SURROGATES) else kept)
        return kept if isinstance(kept, dict) else None

    def parts(self, kind: str) -> list[JSONObject]:
        """The content parts of type `kind` (Anthropic's shape: "tool_use", "tool_result")."""
        parts = self.data.get("content")
        if not isinstance(parts, list):
            return []
        return [p for p in parts if isinstance(p, dict) and p.get("type") == kind]

    @property
    def is_tool_result(self) -> bool:
        """A tool's output: role "tool" (or "function"), or a user message of tool_result
        parts (Anthropic's shape)."""
        parts = self.data.get("content")
        return self.role in {"tool", "function"} or (
            isinstance(parts, list) and 0 < len(self.parts("tool_result")) == len(parts))

    @property
    def starts_turn(self) -> bool:
        """A user message that is not a tool's output: where `Recent` counts a turn. A user
        message holding tool_result parts (Anthropic's shape) goes on the assistant's turn."""
        return self.role == "user" and not self.parts("tool_result")

    @property
    def tool_call_count(self) -> int:
        """How many tool calls this message makes (OpenAI's or Anthropic's shape)."""
        calls = self.data.get("tool_calls")
        return (len(calls) if isinstance(calls, list) else 0) + len(self.parts("tool_use"))


def replaced_compactions(
    thread_id: str,
    start_seq: int,
    end_seq: int,
    overlapping: Sequence[tuple[int, int]],
    expected: Collection[int] | None,
) -> list[int]:
    """The start seqs of the `overlapping` compactions inside a new one's range `start_seq`
    to `end_seq`. InvalidInputError: one only partly overlaps the range (or holds it);
    ConflictError: they are not `expected` (another writer compacted meanwhile)."""
    for s, e in overlapping:
        if not (start_seq <= s and e <= end_seq):
            raise InvalidInputError(
                f"compaction {start_seq}-{end_seq} overlaps compaction {s}-{e} of"
                f" thread {thread_id!r} without containing it")
    inside = [s for s, _ in overlapping]
    if expected is not None and set(inside) != set(expected):
        raise ConflictError(
            f"thread {thread_id!r} was compacted by another writer meanwhile")
    return inside


@dataclass(frozen=True, slots=True)
class Compaction:
    """A summary that stands for the messages `start_seq`..`end_seq` (both inclusive) in
    `load`. Also readable as a mapping (`c["summary_text"]`) for dict-style callers."""

    thread_id: str
    start_seq: int
    end_seq: int
    summary_text: str
    created_at: datetime

    def __getitem__(self, key: str) -> object:
        if key not in {"thread_id", "start_seq", "end_seq", "summary_text", "created_at"}:
            raise KeyError(key)
        return getattr(self, key)


def compacted_floor(compactions: Sequence[Compaction]) -> int:
    """The lowest seq that the compactions (sorted by start) do not cover from 0 upwards."""
    floor = 0
    for c in compactions:
        if c.start_seq > floor:
            break
        floor = max(floor, c.end_seq + 1)
    return floor


def covered(seq: int, compactions: Sequence[Compaction]) -> bool:
    return any(c.start_seq <= seq <= c.end_seq for c in compactions)


@dataclass(frozen=True, slots=True)
class ThreadInfo:
    """A stored thread as `Memory.list_threads` reports it: how many raw messages it holds,
    the seq its next message gets, and where its viewport starts (`boundary_seq`)."""

    id: str
    messages: int
    next_seq: int
    boundary_seq: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What eviction kept of messages `start_seq`..`end_seq`; 5 uncovered level-1 snapshots fold
    into one level-2 snapshot, which `covered_by` then names."""

    id: str
    thread_id: str
    level: int
    start_seq: int
    end_seq: int
    text: str
    created_at: datetime
    covered_by: str | None = None


def untold(start_seq: int, end_seq: int) -> str:
    """The text of a snapshot of messages `start_seq`..`end_seq` whose summary was erased with
    older messages it also told (a ttl ended them)."""
    return (f"Messages {start_seq}-{end_seq} left the context window; their summary went with "
            "older messages a ttl erased. search_messages and view_messages still find them "
            "word for word.")


GOAL_OPEN, GOAL_COMPLETED = "open", "completed"


@dataclass(frozen=True, slots=True)
class Goal:
    """A goal of a thread; messages pinned to it stay visible until it completes."""

    id: str
    thread_id: str
    description: str
    status: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Viewport:
    """What an agent sees of a thread within `token_budget` tokens: `messages` from the eviction
    boundary on, `snapshots`, `pinned` messages of open goals, `pins_left_out` (pins that did
    not fit) and `recalled` messages found for the open goals (see `viewport`). `behind` while
    eviction is behind: the messages from the boundary on leave the memory too little room
    (`evict` until it is False, as `auto_evict_budget` does)."""

    thread_id: str
    token_budget: int
    boundary_seq: int
    messages: list[Message]
    snapshots: list[Snapshot]
    pinned: list[Message]
    tokens: int
    tokens_past_boundary: int
    pins_left_out: list[str] = field(default_factory=list)
    recalled: list[SearchHit] = field(default_factory=list)
    behind: bool = False

    def to_messages(self) -> list[JSONObject]:
        """The viewport as chat messages: a memory system message (untrusted), then the rest."""
        out: list[JSONObject] = []
        block = memory_block(self.snapshots, self.pinned, self.recalled)
        if block:
            out.append({"role": "system", "content": block})
        out.extend(m.to_dict() for m in self.messages)
        return out


@dataclass(frozen=True, slots=True)
class EvictionResult:
    """What one eviction did: the zone `start_seq`..`end_seq`, the boundary's move, the level-1
    `snapshot` written, the level-2 one `folded`, the messages `pinned`, and `error` when the
    LLM failed (the snapshot is then a note pointing to search)."""

    thread_id: str
    boundary_before: int
    boundary_after: int
    start_seq: int | None
    end_seq: int | None
    evicted: int
    tokens_evicted: int
    snapshot: Snapshot | None = None
    folded: Snapshot | None = None
    pinned: list[str] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    error: str | None = None
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One message found by `search_messages`: `rank` is its score, higher is better (bm25,
    negated, times a recency weight), and `snippet` about 300 characters around the match."""

    message_id: str
    thread_id: str
    seq: int
    snippet: str
    rank: float
    role: str = ""


@dataclass(frozen=True, slots=True)
class MessageView:
    """A message in context: up to `radius` messages on each side of the `target`, oldest first
    (tool outputs as "ok" or "error"), and the nearest level-1 snapshots before and after it."""

    target: Message
    messages: list[Message]
    snapshots_before: list[Snapshot]
    snapshots_after: list[Snapshot]

    def render(self) -> str:
        """The view as text for a model: snapshots before, the messages, snapshots after."""
        return render_view(self)
