"""The viewport: what an agent sees of a thread within a token budget, and the eviction zone.

Shares of the budget (Anima's Mneme): uncovered level-1 snapshots up to 15%, level-2
snapshots up to 5%, messages pinned to open goals (from before the boundary) up to 5%; the
messages from the boundary on get the rest, newest first. Within each share the newest items
that fit are kept, stopping at the first that does not, so what is shown is always a
contiguous recent stretch.

The eviction zone is the oldest part of what lies past the boundary: messages from the
boundary until they reach `eviction_fraction` of the budget (or of what is there, when that
is less), never the newest message, at least one message when there are two or more, and
extended over the tool results that follow its last message, so a tool call never leaves
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
    conn = db.conn
    state = read_state(db, thread_id)
    boundary = state.boundary_seq if state else 0
    l2_rows = conn.execute(
        f"SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE thread_id = ? AND level = 2"
        " ORDER BY start_seq DESC",
        (thread_id,),
    )
    l2, l2_used = _fit_newest(
        ((snapshot_tokens(s), s) for s in map(snapshot_from_row, l2_rows)),
        token_budget * L2_SHARE,
    )
    l1_rows = conn.execute(
        f"SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE thread_id = ? AND level = 1"
        " AND covered_by IS NULL ORDER BY start_seq DESC",
        (thread_id,),
    )
    l1, l1_used = _fit_newest(
        ((snapshot_tokens(s), s) for s in map(snapshot_from_row, l1_rows)),
        token_budget * L1_SHARE,
    )
    pin_rows = conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE thread_id = ? AND seq < ? AND id IN"
        " (SELECT message_id FROM pins WHERE thread_id = ?) ORDER BY seq DESC",
        (thread_id, boundary, thread_id),
    )
    pinned, pins_used = _fit_newest(
        ((m.tokens, m) for m in map(message_from_row, pin_rows)), token_budget * PIN_SHARE
    )
    remaining = token_budget - l2_used - l1_used - pins_used
    window: list[Message] = []
    used = 0
    cut = False
    for message in iter_messages(db, thread_id, from_seq=boundary, newest_first=True):
        if used + message.tokens > remaining:
            cut = True
            break
        window.append(message)
        used += message.tokens
    window.reverse()
    if cut:
        # A tool result whose call was cut off would be refused by chat APIs: drop it too.
        while window and window[0].is_tool_result:
            used -= window.pop(0).tokens
    past = conn.execute(
        "SELECT coalesce(sum(tokens), 0) FROM messages WHERE thread_id = ? AND seq >= ?",
        (thread_id, boundary),
    ).fetchone()[0]
    return Viewport(
        thread_id=thread_id,
        token_budget=token_budget,
        boundary_seq=boundary,
        messages=window,
        snapshots=l2 + l1,
        pinned=pinned,
        tokens=used + l2_used + l1_used + pins_used,
        tokens_past_boundary=int(past),
    )


def eviction_zone(
    past_boundary: Sequence[Message], token_budget: int, fraction: float
) -> list[Message]:
    """The oldest messages to evict (see the module doc); [] when fewer than two."""
    if len(past_boundary) < 2:
        return []
    total = sum(m.tokens for m in past_boundary)
    target = fraction * min(token_budget, total)
    zone: list[Message] = []
    used = 0
    newest = len(past_boundary) - 1
    for message in past_boundary[:newest]:
        if zone and used + message.tokens > target:
            break
        zone.append(message)
        used += message.tokens
    while len(zone) < newest and past_boundary[len(zone)].is_tool_result:
        zone.append(past_boundary[len(zone)])
    return zone


def snapshot_words(token_budget: int, level: int) -> int:
    """The word budget of one snapshot: a fifth of the level-1 share, or half the level-2
    share at about 1.6 tokens a word (so five do fit), between 16 and 600 words."""
    share = token_budget * L1_SHARE / FOLD_AFTER if level == 1 else token_budget * L2_SHARE / 2
    return max(16, min(600, math.floor(share * 0.6)))
