"""The viewport: what an agent sees of a thread within a token budget, and the eviction zone.
Nothing hides: a message is shown, pinned, or in a snapshot's range and found by search. Pins
take up to `PIN_SHARE`, snapshots the rest of `MEMORY_SHARE` (a level's newest one whole, beyond
the level's share), messages from the boundary the remainder (when eviction is behind they take
snapshots' then pins' room); passive recall takes what is left, up to `RECALL_SHARE`. OpenAI's
Chat Completions and Responses and Anthropic's Messages refuse a tool result without its call
before it, and a call its results do not follow: the window and the boundary start only where no
result lacks its call, nor an item the reasoning before it (`safe_cuts`), `load` leaves such
results out, and a call's stored results come with it (the window runs to the newest message;
`load` adds them). A call whose result is not stored yet is shown as is."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import replace
from itertools import accumulate
from typing import TypeVar

from mnemo.conversation.drafts import MESSAGE_OVERHEAD, count_tokens
from mnemo.conversation.model import Message, SearchHit, Snapshot, Viewport
from mnemo.conversation.ports import ViewportInputs
from mnemo.conversation.render import recalled_line

L1_SHARE = 0.15
L2_SHARE = 0.05
# The snapshots' and the pins' share (the pins first), the seed's 25%.
MEMORY_SHARE = 0.25
# The most of the budget pins keep for themselves (eviction keeps it free for them).
PIN_SHARE = 0.5
# Level-1 snapshots fold into a level-2 one once this many are uncovered.
FOLD_AFTER = 5
# Passive recall: at most this many past messages, in at most this share of the budget.
RECALL_HITS = 5
RECALL_SHARE = 0.1

T = TypeVar("T")


def snapshot_tokens(snapshot: Snapshot) -> int:
    return count_tokens(snapshot.text) + MESSAGE_OVERHEAD


def _fit(items: Iterable[tuple[int, T]], allowance: float, *,
         newest: bool = False) -> tuple[list[T], int]:
    """The items (with their cost) that fit in `allowance`: with `newest`, a recent stretch up
    to the first that does not fit, oldest first; else in order, skipping those that do not."""
    kept: list[T] = []
    used = 0
    for cost, item in items:
        if used + cost <= allowance:
            kept.append(item)
            used += cost
        elif newest:
            break
    return kept[::-1] if newest else kept, used


def _share(snapshots: Sequence[Snapshot], share: float, room: float) -> float:
    """A level's allowance: its share, or its newest snapshot's size (`snapshots` newest
    first) when that is larger, within the memory's `room`."""
    newest = snapshot_tokens(snapshots[0]) if snapshots else 0
    return min(max(share, newest), room)


def layout(
    thread_id: str, token_budget: int, inputs: ViewportInputs, *, recall: bool = False
) -> Viewport:
    """The viewport (`behind`: the messages from the boundary on took memory's room, or one is
    a result lacking its call). `inputs` are read with a token limit of at least
    `token_budget`; with `recall`, older snapshots leave recall its share."""
    # Fitted newest first, kept oldest first: the order they are given up in below.
    pinned, pins_used = _fit(((m.tokens, m) for m in inputs.pinned), token_budget * PIN_SHARE)
    pinned.reverse()
    memory = token_budget * MEMORY_SHARE
    l1, l1_used = _fit(((snapshot_tokens(s), s) for s in inputs.level1),
                       _share(inputs.level1, token_budget * L1_SHARE, memory - pins_used),
                       newest=True)
    l2, l2_used = _fit(((snapshot_tokens(s), s) for s in inputs.level2),
                       _share(inputs.level2, token_budget * L2_SHARE,
                              memory - pins_used - l1_used), newest=True)
    past = inputs.tokens_past_boundary
    shown: list[tuple[int, list[Snapshot] | list[Message]]] = [(snapshot_tokens(s), l2) for s in l2]
    shown += [(snapshot_tokens(s), l1) for s in l1]
    shown += [(m.tokens, pinned) for m in pinned]
    memory_used = l2_used + l1_used + pins_used
    # Behind only where eviction can move the boundary: the newest message stays unless it
    # alone is past the budget.
    movable = len(inputs.newest) > 1 or past > token_budget
    crowded = movable and past > token_budget - memory_used
    # Messages past the boundary outrank the memory: oldest snapshots go first, pins last.
    for cost, owner in shown:
        if past <= token_budget - memory_used:
            break
        owner.pop(0)
        memory_used -= cost
    # `newest` ends with the first message past the store's limit, so this fit cuts where a
    # walk of the whole thread would.
    window, used = _fit(((m.tokens, m) for m in inputs.newest), token_budget - memory_used,
                        newest=True)
    safe = safe_cuts(inputs.newest[::-1])
    while not safe[len(inputs.newest) - len(window)]:
        used -= window.pop(0).tokens
    # The room left goes to the pins not shown yet (those past their share, or given up).
    shown_ids = {m.id for m in pinned}
    more, more_used = _fit(
        ((m.tokens, m) for m in inputs.pinned if m.id not in shown_ids),
        token_budget - memory_used - used,
    )
    memory_used += more_used
    pinned = sorted([*pinned, *more], key=lambda m: m.seq)
    shown_ids.update(m.id for m in more)
    # Then to the snapshots before those shown, newest first, level 1 before level 2.
    room = token_budget - memory_used - used - (token_budget * RECALL_SHARE if recall else 0)
    for level, kept in ((inputs.level1, l1), (inputs.level2, l2)):
        older, older_used = _fit(((snapshot_tokens(s), s) for s in level[len(kept):]), room,
                                 newest=True)
        room -= older_used
        kept[:0] = older
        memory_used += older_used
    return Viewport(
        thread_id=thread_id,
        token_budget=token_budget,
        boundary_seq=inputs.boundary_seq,
        messages=window,
        snapshots=l2 + l1,
        pinned=pinned,
        tokens=used + memory_used,
        tokens_past_boundary=past,
        pins_left_out=[m.id for m in reversed(inputs.pinned) if m.id not in shown_ids],
        behind=crowded or not safe[0],
    )


def with_recalled(view: Viewport, hits: Sequence[SearchHit]) -> Viewport:
    """`view` with the recalled `hits` (best first) that fit in the room it leaves, up to
    `RECALL_SHARE` of its budget."""
    room = min(view.token_budget * RECALL_SHARE, view.token_budget - view.tokens)
    kept, used = _fit(
        ((count_tokens(recalled_line(hit)) + MESSAGE_OVERHEAD, hit) for hit in hits), room)
    return replace(view, recalled=kept, tokens=view.tokens + used)


def eviction_zone(
    past_boundary: Sequence[Message], token_budget: int, fraction: float
) -> list[Message]:
    """The oldest messages past the boundary up to `eviction_fraction` of the budget, ending
    where the messages left hold no tool result without its call (`safe_cuts`): at the first
    such place from there on, else the last before it, else past the newest message, which
    otherwise stays unless it alone exceeds the budget. [] when there is nothing to take."""
    keep = 1 if past_boundary and past_boundary[-1].tokens <= token_budget else 0
    evictable = len(past_boundary) - keep
    target = fraction * min(token_budget, sum(m.tokens for m in past_boundary))
    end = leading(past_boundary[:evictable], target)
    safe = safe_cuts(past_boundary)
    ends = ([i for i in range(end, evictable + 1) if safe[i]]
            or [i for i in range(end - 1, 0, -1) if safe[i]] or [safe.index(True, end)])
    return list(past_boundary[:ends[0]])


def context_zones(
    rest: Sequence[Message], token_budget: int, fraction: float
) -> tuple[list[Message], list[Message]]:
    """What stays past the eviction zone: the recent zone (newest up to `fraction` of the
    budget, one at least) and the middle one."""
    target = fraction * min(token_budget, sum(m.tokens for m in rest))
    split = len(rest) - leading(reversed(rest), target)
    return list(rest[:split]), list(rest[split:])


def leading(messages: Iterable[Message], target: float) -> int:
    """How many of `messages`, from the first, fit in `target` tokens; at least one."""
    sizes = list(accumulate(message.tokens for message in messages))
    return max(1, bisect_right(sizes, target)) if sizes else 0


def tool_ids(message: Message) -> tuple[set[str], set[str]]:
    """The ids of the tool calls `message` makes, and of those it answers: Chat Completions'
    `tool_calls` and `tool_call_id`, Anthropic's tool_use and tool_result parts, or the
    `call_id` of a Responses item (`ITEM_KEY`), which answers when its type is `*_output`."""
    calls, item = message.data.get("tool_calls"), message.item
    output = item is not None and str(item.get("type")).endswith("_output")
    made = _ids([*(calls if isinstance(calls, list) else []), *message.parts("tool_use")], "id")
    answers = _ids(message.parts("tool_result"), "tool_use_id")
    (answers if output else made).update(_ids([item], "call_id"))
    return made, answers | _ids([message.data], "tool_call_id")


def _ids(items: Iterable[object], field: str) -> set[str]:
    return {item[field] for item in items
            if isinstance(item, dict) and isinstance(item.get(field), str)}


def answered_at(messages: Sequence[Message]) -> list[int]:
    """For each of `messages`, the index of the latest one before it making a call it answers: -1
    when none does, its own when it answers none (a result without ids pairs with nothing); the
    item after a Responses reasoning item is tied to it too (neither is sent without the other)."""
    made: dict[str, int] = {}
    out: list[int] = []
    for i, message in enumerate(messages):
        calls, answered = tool_ids(message)
        at = max((made[c] for c in answered if c in made), default=-1) if answered else i
        item = messages[i - 1].item if i else None
        out.append(min(at, i - 1) if item is not None and item.get("type") == "reasoning"
                   else at)
        made.update(dict.fromkeys(calls, i))
    return out


def safe_cuts(messages: Sequence[Message]) -> list[bool]:
    """For each i from 0 to len(messages), whether messages[i:] hold no tool result without
    its call: where a view of them or the eviction boundary may start."""
    lows = [*accumulate(reversed(answered_at(messages)), min, initial=len(messages))][::-1]
    return [low >= i for i, low in enumerate(lows)]


def snapshot_words(token_budget: int, level: int) -> int:
    """The word budget of one snapshot (a fifth of the level-1 share, or half the level-2
    share, at about 1.6 tokens a word), between 16 and 600 words."""
    share = token_budget * L1_SHARE / FOLD_AFTER if level == 1 else token_budget * L2_SHARE / 2
    return max(16, min(600, math.floor(share * 0.6)))
