"""The viewport: what an agent sees of a thread within a token budget, and the eviction zone.

Nothing hides from the agent (API.md): every message is in the viewport's messages (all of
them from the boundary on, when eviction keeps up), or before the boundary inside a
snapshot's range, or pinned and shown; what cannot be shown stays findable by search.

Shares of the budget (Anima's Mneme): the memory (pins and snapshots) gets up to 25%.
Messages pinned to open goals (from before the boundary) come first and may take all of it
(pins survive eviction intact), newest first, skipping any that does not fit; then uncovered
level-1 snapshots up to 15%, then level-2 snapshots up to 5%, within what the pins left.
Within each snapshot share the newest that fit are kept, stopping at the first that does
not, so the snapshots shown are a contiguous recent stretch. The messages from the boundary
on get the rest. When they do not all fit there, eviction is behind (`needs_eviction`, which
auto-eviction checks after each save): the viewport then gives up memory for them, oldest
snapshots first and pins last, and only when even the whole budget cannot hold them does it
keep the newest that fit.

The eviction zone is the oldest part of what lies past the boundary: messages from the
boundary until they reach `eviction_fraction` of the budget (or of what is there, when that
is less), never the newest message unless it alone exceeds the budget, at least one message,
and extended over the tool results that follow its last message, so a tool call never leaves
the window without its results.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.conversation.log import MESSAGE_COLUMNS, iter_messages, message_from_row, read_state
from mnemo.conversation.model import Message, Snapshot, Viewport
from mnemo.conversation.tokens import MESSAGE_OVERHEAD, count_tokens

L1_SHARE = 0.15
L2_SHARE = 0.05
PIN_SHARE = 0.05
MEMORY_SHARE = L1_SHARE + L2_SHARE + PIN_SHARE
# Level-1 snapshots fold into a level-2 one once this many are uncovered.
FOLD_AFTER = 5

T = TypeVar("T")

SNAPSHOT_COLUMNS = "id, thread_id, level, start_seq, end_seq, text, created_at, covered_by"


def snapshot_from_row(row: Sequence[Any]) -> Snapshot:
    sid, thread_id, level, start, end, text, created_at, covered_by = row
    return Snapshot(
        sid, thread_id, level, start, end, text, datetime.fromisoformat(created_at), covered_by
    )


def snapshot_tokens(snapshot: Snapshot) -> int:
    return count_tokens(snapshot.text) + MESSAGE_OVERHEAD


def _fit_newest(items: Iterable[tuple[int, T]], allowance: float) -> tuple[list[T], int]:
    """The newest items (given newest first with their cost) that fit, oldest first."""
    kept: list[T] = []
    used = 0
    for cost, item in items:
        if used + cost > allowance:
            break
        kept.append(item)
        used += cost
    kept.reverse()
    return kept, used


def read_viewport(db: SqliteUtilsDatabase, thread_id: str, token_budget: int) -> Viewport:
    """The thread's viewport (see the module doc), read in one go."""
    return layout(db, thread_id, token_budget)[0]


def needs_eviction(db: SqliteUtilsDatabase, thread_id: str, token_budget: int) -> bool:
    """Whether the boundary message would leave the viewport at the usual shares (the seed's
    rule for when to evict): the messages from the boundary on do not all fit beside the
    pins and snapshots."""
    return layout(db, thread_id, token_budget)[1]


def layout(db: SqliteUtilsDatabase, thread_id: str, token_budget: int) -> tuple[Viewport, bool]:
    """The viewport, and whether it had to give up memory (or messages) for the messages
    from the boundary on: then eviction is behind."""
    conn = db.conn
    state = read_state(db, thread_id)
    boundary = state.boundary_seq if state else 0
    memory = token_budget * MEMORY_SHARE
    pin_rows = conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE thread_id = ? AND seq < ? AND id IN"
        " (SELECT message_id FROM pins WHERE thread_id = ?) ORDER BY seq DESC",
        (thread_id, boundary, thread_id),
    )
    pinned: list[Message] = []
    pins_used = 0
    for pin in map(message_from_row, pin_rows):
        # Pins are not a contiguous stretch: a long one left out does not hide shorter ones.
        if pins_used + pin.tokens <= memory:
            pinned.append(pin)
            pins_used += pin.tokens
    pinned.reverse()
    l1_rows = conn.execute(
        f"SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE thread_id = ? AND level = 1"
        " AND covered_by IS NULL ORDER BY start_seq DESC",
        (thread_id,),
    )
    l1, l1_used = _fit_newest(
        ((snapshot_tokens(s), s) for s in map(snapshot_from_row, l1_rows)),
        min(token_budget * L1_SHARE, memory - pins_used),
    )
    l2_rows = conn.execute(
        f"SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE thread_id = ? AND level = 2"
        " ORDER BY start_seq DESC",
        (thread_id,),
    )
    l2, l2_used = _fit_newest(
        ((snapshot_tokens(s), s) for s in map(snapshot_from_row, l2_rows)),
        min(token_budget * L2_SHARE, memory - pins_used - l1_used),
    )
    past = int(
        conn.execute(
            "SELECT coalesce(sum(tokens), 0) FROM messages WHERE thread_id = ? AND seq >= ?",
            (thread_id, boundary),
        ).fetchone()[0]
    )
    shown: list[tuple[int, list[Snapshot] | list[Message]]] = [(snapshot_tokens(s), l2) for s in l2]
    shown += [(snapshot_tokens(s), l1) for s in l1]
    shown += [(m.tokens, pinned) for m in pinned]
    memory_used = l2_used + l1_used + pins_used
    crowded = past > token_budget - memory_used
    # Messages past the boundary are in no snapshot: they outrank the memory, which the
    # snapshots' ranges and search keep findable. Oldest snapshots go first, pins last.
    for cost, owner in shown:
        if past <= token_budget - memory_used:
            break
        owner.pop(0)
        memory_used -= cost
    window: list[Message] = []
    used = 0
    cut = False
    for message in iter_messages(db, thread_id, from_seq=boundary, newest_first=True):
        if used + message.tokens > token_budget - memory_used:
            cut = True
            break
        window.append(message)
        used += message.tokens
    window.reverse()
    if cut:
        # A tool result whose call was cut off would be refused by chat APIs: drop it too.
        while window and window[0].is_tool_result:
            used -= window.pop(0).tokens
    viewport = Viewport(
        thread_id=thread_id,
        token_budget=token_budget,
        boundary_seq=boundary,
        messages=window,
        snapshots=l2 + l1,
        pinned=pinned,
        tokens=used + memory_used,
        tokens_past_boundary=past,
    )
    return viewport, crowded


def eviction_zone(
    past_boundary: Sequence[Message], token_budget: int, fraction: float
) -> list[Message]:
    """The oldest messages to evict (see the module doc); [] when there is nothing to take."""
    # The newest message stays (the conversation goes on from it) unless it alone exceeds
    # the budget: no viewport can show it then, and only a snapshot keeps it in view.
    keep = 1 if past_boundary and past_boundary[-1].tokens <= token_budget else 0
    evictable = len(past_boundary) - keep
    if evictable <= 0:
        return []
    total = sum(m.tokens for m in past_boundary)
    target = fraction * min(token_budget, total)
    zone: list[Message] = []
    used = 0
    for message in past_boundary[:evictable]:
        if zone and used + message.tokens > target:
            break
        zone.append(message)
        used += message.tokens
    while len(zone) < evictable and past_boundary[len(zone)].is_tool_result:
        zone.append(past_boundary[len(zone)])
    return zone


def context_zones(
    rest: Sequence[Message], token_budget: int, fraction: float
) -> tuple[list[Message], list[Message]]:
    """What stays past the eviction zone, as the middle and the recent zone: the recent one
    is the newest messages up to `fraction` of the budget (or of what is there), at least
    one; the middle one the messages between."""
    target = fraction * min(token_budget, sum(m.tokens for m in rest))
    count = 0
    used = 0
    for message in reversed(rest):
        if count and used + message.tokens > target:
            break
        count += 1
        used += message.tokens
    split = len(rest) - count
    return list(rest[:split]), list(rest[split:])


def snapshot_words(token_budget: int, level: int) -> int:
    """The word budget of one snapshot: a fifth of the level-1 share, or half the level-2
    share at about 1.6 tokens a word (so five do fit), between 16 and 600 words."""
    share = token_budget * L1_SHARE / FOLD_AFTER if level == 1 else token_budget * L2_SHARE / 2
    return max(16, min(600, math.floor(share * 0.6)))
