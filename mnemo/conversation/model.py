"""The values of conversation memory: stored messages, compactions, snapshots, the viewport,
eviction results, search hits and message views, and the retrieval and compression policies.

Every value is frozen. Policies validate their arguments when built, so a bad `Recent(k=0)`
fails where it is written, before any thread is touched.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from mnemo.conversation.render import memory_block, render_view
from mnemo.errors import ConflictError, InvalidInputError
from mnemo.graph.scope import Metadata
from mnemo.ports import JSONObject, ToolCall, Usage

# ---- policies -----------------------------------------------------------------------------


def _positive(owner: str, name: str, value: object, *, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInputError(f"{owner}.{name} must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True, slots=True)
class _Retrieval:
    """A retrieval policy of `k` (turns or messages).

    Raises:
        InvalidInputError: `k` is not an integer >= 1.
    """

    k: int = 10

    def __post_init__(self) -> None:
        _positive(type(self).__name__, "k", self.k)


@dataclass(frozen=True, slots=True)
class Recent(_Retrieval):
    """Retrieval: the last `k` turns of the uncompacted messages (a turn starts at a user
    message that is not a tool's output, `Message.starts_turn`; with fewer than `k` turns,
    every uncompacted message). A tool result whose call is not in the selection (compacted
    or expired) is left out. Raises InvalidInputError for a `k` that is not an integer >= 1.
    """


@dataclass(frozen=True, slots=True)
class Semantic(_Retrieval):
    """Retrieval: the `k` uncompacted messages most similar to the query, in log order, with
    the calls or results that complete their tool calls. Without a query, the last `k`. A
    tool result whose call is not among the uncompacted messages is left out.

    Each message is embedded once, by the Memory's default embedder, when first saved (or when
    first needed, if that failed); the vectors are float32 blobs beside the messages. Raises
    InvalidInputError for a `k` that is not an integer >= 1.
    """


@dataclass(frozen=True, slots=True)
class Summary:
    """Compression: when the uncompacted messages exceed `max_tokens`, all but the last `keep`
    of them are summarised by the LLM (task "summary") into one compaction record that also
    absorbs the previous automatic summary, so a thread carries one rolling summary. When
    the kept messages would start with a tool result, they start at its call instead: a
    result never loses its call to a summary.

    A failed summary (the LLM raised, timed out or kept answering garbage) is logged and leaves
    the messages uncompacted; `save` never raises because of it.

    Raises:
        InvalidInputError: `max_tokens` < 1 or `keep` < 0.
    """

    max_tokens: int = 4000
    keep: int = 5

    def __post_init__(self) -> None:
        _positive("Summary", "max_tokens", self.max_tokens)
        _positive("Summary", "keep", self.keep, minimum=0)


@dataclass(frozen=True, slots=True)
class ToolOutputPruner:
    """Compression: tool outputs longer than `max_chars` are cut (with a note saying how much
    was cut) in what `load` returns; an output that is a list of parts is cut in its text
    parts, which share the `max_chars`. The stored log keeps them whole.

    Raises:
        InvalidInputError: `max_chars` is not an integer >= 1.
    """

    max_chars: int = 4000

    def __post_init__(self) -> None:
        _positive("ToolOutputPruner", "max_chars", self.max_chars)


Retrieval = Recent | Semantic
Compression = Summary | ToolOutputPruner


# ---- stored values ------------------------------------------------------------------------

# `data["content"]` of a message saved without a content key. No content is a JSON object, so
# the marker cannot be mistaken for one; a message stored before it has None there instead
# and loads with `"content": None`, which chat APIs take as no content.
NO_CONTENT: JSONObject = {"mnemo": "no content key"}


@dataclass(frozen=True, slots=True)
class Message:
    """One stored message of a thread.

    `seq` is 0-based per thread and never reused. `content` is the message's text (for a
    message whose content was a list of parts or None, their text; the original is then in
    `data["content"]`, and `NO_CONTENT` there when the message had no content key); `data`
    holds every other key of the message dict as saved (`name`, `tool_calls`,
    `tool_call_id`, ...). `tokens` is what the message costs in a context window.
    """

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
        """The message as it was saved: `role`, `content` (unless it had none) and the other
        keys."""
        out = {"role": self.role, "content": self.content, **self.data}
        if out["content"] == NO_CONTENT:
            del out["content"]
        return out

    @property
    def is_tool_result(self) -> bool:
        """A tool's output: role "tool" (or "function"), or a user message of tool_result
        parts (Anthropic's shape)."""
        if self.role in {"tool", "function"}:
            return True
        parts = self.data.get("content")
        return (
            isinstance(parts, list)
            and bool(parts)
            and all(isinstance(p, dict) and p.get("type") == "tool_result" for p in parts)
        )

    @property
    def starts_turn(self) -> bool:
        """A user message that is not a tool's output: where `Recent` counts a turn. A user
        message holding tool_result parts (Anthropic's shape) goes on the assistant's turn."""
        if self.role != "user":
            return False
        parts = self.data.get("content")
        return not (
            isinstance(parts, list)
            and any(isinstance(p, dict) and p.get("type") == "tool_result" for p in parts)
        )

    @property
    def tool_call_count(self) -> int:
        """How many tool calls this message makes (OpenAI `tool_calls` or Anthropic
        tool_use parts)."""
        calls = self.data.get("tool_calls")
        count = len(calls) if isinstance(calls, list) else 0
        parts = self.data.get("content")
        if isinstance(parts, list):
            count += sum(1 for p in parts if isinstance(p, dict) and p.get("type") == "tool_use")
        return count


def replaced_compactions(
    thread_id: str,
    start_seq: int,
    end_seq: int,
    overlapping: Sequence[tuple[int, int]],
    expected: Collection[int] | None,
) -> list[int]:
    """The start seqs of the compactions (of `overlapping`, the stored ones meeting the
    range) that a new one over `start_seq`..`end_seq` replaces: those it contains.

    Raises:
        InvalidInputError: one only partly overlaps the range (or holds it).
        ConflictError: `expected` (the start seqs the writer saw inside, when it says) is not
            what the store holds: another writer compacted meanwhile.
    """
    for s, e in overlapping:
        if not (start_seq <= s and e <= end_seq):
            raise InvalidInputError(
                f"compaction {start_seq}-{end_seq} overlaps compaction {s}-{e} of"
                f" thread {thread_id!r} without containing it"
            )
    inside = [s for s, _ in overlapping]
    if expected is not None and set(inside) != set(expected):
        raise ConflictError(
            f"thread {thread_id!r} was compacted by another writer meanwhile"
        )
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
    """What eviction kept of messages `start_seq`..`end_seq` that left the viewport.

    `level` 1 is written by one eviction; 5 uncovered level-1 snapshots fold into one level-2
    snapshot, which then `covered_by` names on each of them.
    """

    id: str
    thread_id: str
    level: int
    start_seq: int
    end_seq: int
    text: str
    created_at: datetime
    covered_by: str | None = None


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
    """What an agent sees of a thread within `token_budget` tokens.

    - `messages`: from the eviction boundary on, oldest first: all of them when eviction
      keeps up, else the newest ones that fit.
    - `snapshots`: level-2 (up to 5% of the budget) then uncovered level-1 (up to 15%),
      oldest first.
    - `pinned`: messages before the boundary pinned to an open goal, oldest first, each
      whole: they come first, up to half the budget, and take any room the rest leaves.
    - `pins_left_out`: the ids of pinned messages that did not fit (oldest first): only
      when pins alone pass what the budget can hold beside the messages. Each stays inside a
      snapshot's range and is found by a search that excludes this viewport.
    - `recalled`: while the thread has open goals, past messages (of this thread, before the
      boundary, and of other threads) that a search for the goals' words finds, best first,
      none of them shown or pinned here: up to 5, in the room the rest leaves, up to 10% of
      the budget (passive recall).

    Unused memory goes to the messages, and the messages from the boundary on take memory
    (oldest snapshots first, pins last) rather than leave the view. `tokens` is what all of it
    costs; `tokens_past_boundary` counts every message from the boundary on, fitted or not.
    """

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

    def to_messages(self) -> list[JSONObject]:
        """The viewport as chat messages: one system message holding the snapshots, pinned
        and recalled messages (marked as untrusted memory), when there are any, then the
        messages."""
        out: list[JSONObject] = []
        block = memory_block(self.snapshots, self.pinned, self.recalled)
        if block:
            out.append({"role": "system", "content": block})
        out.extend(m.to_dict() for m in self.messages)
        return out


@dataclass(frozen=True, slots=True)
class EvictionResult:
    """What one eviction did.

    The zone was messages `start_seq`..`end_seq` (None when there was nothing to evict); the
    boundary moved from `boundary_before` to `boundary_after`. `snapshot` is the level-1
    snapshot written (None only when there was nothing to evict, or when another `Memory` on
    the store moved the boundary meanwhile: that eviction counts, `evicted` is 0 and the zone
    None, since this call wrote nothing), `folded` the level-2
    snapshot made when 5 level-1 snapshots were uncovered, `pinned` the ids of the messages
    pinned. When the LLM failed (raised, timed out, or saved no snapshot, e.g. it answered in
    prose), `error` says how and `snapshot` is a note pointing the agent to search.
    """

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
    """A message in context: `messages` holds up to `radius` messages on each side of the
    `target` (and it), oldest first, with tool outputs reduced to "ok" or "error";
    `snapshots_before` / `snapshots_after` the 3 nearest level-1 snapshots starting at or
    before the target and after it."""

    target: Message
    messages: list[Message]
    snapshots_before: list[Snapshot]
    snapshots_after: list[Snapshot]

    def render(self) -> str:
        """The view as text for a model: snapshots before, the messages, snapshots after."""
        return render_view(self)
