"""The value function: how much a node is worth beyond its relevance to a query.

value = recency decay x frequency floor x reward; a recall ranks by
relevance x value ^ `Config.value_weight`, and `decay` deletes what is worth less than
`Config.decay_threshold`.

- recency: 2^(-age / half-life), age counted from the last access (or creation) in whole
  hours, so that the same memories rank alike whether a run took seconds or minutes;
- frequency: log(1 + accesses) / log(1 + 10), never below `frequency_floor` (so a node
  nobody has recalled yet is not buried, and ten recalls make it count double);
- reward: what the pipeline learned of the node (an EPISODIC step's reward, a PROCEDURAL
  instruction's return score / 10, a SEMANTIC fact's confidence), softened to 0.5 + r / 2 so a
  failed step is still found, just after a successful one; 1 for nodes without one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime

from mnemo.config import Config
from mnemo.graph.model import NodeType

_FULL_FREQUENCY = 10  # accesses at which frequency reaches 1
_LOG_FULL_FREQUENCY = math.log1p(_FULL_FREQUENCY)
_NUMBER = (int, float)  # `int | float` is a new union object at each use

def recency(age_days: float, half_life_days: float) -> float:
    """2^(-age / half-life): 1 when new, 1/2 after one half-life."""
    return float(2.0 ** (-max(age_days, 0.0) / half_life_days))


def frequency(access_count: int, floor: float) -> float:
    """log(1 + accesses) / log(1 + 10), capped at 1 and never below `floor`, so a node nobody
    has recalled yet is not buried and ten recalls make it count double."""
    raw = math.log1p(max(access_count, 0)) / math.log1p(_FULL_FREQUENCY)
    return max(floor, min(1.0, raw))


def reward(kind: NodeType, data: Mapping[str, object]) -> float:
    """What the pipeline learned of the node, in [0.5, 1]: an EPISODIC step's `reward`, a
    PROCEDURAL instruction's `return_score` / 10, a SEMANTIC fact's `confidence` (0.5 when
    missing), softened to 0.5 + r / 2 so a failed step still counts, just less; 1 for the other
    types."""
    raw: object
    if kind is NodeType.EPISODIC:
        raw = data.get("reward")
    elif kind is NodeType.PROCEDURAL:
        score = data.get("return_score")
        raw = score / 10 if isinstance(score, _NUMBER) else None
    elif kind is NodeType.SEMANTIC:
        raw = data.get("confidence")
    else:
        return 1.0
    if not isinstance(raw, _NUMBER) or math.isnan(raw):
        raw = 0.5
    return 0.5 + min(max(float(raw), 0.0), 1.0) / 2


def node_value(
    kind: NodeType,
    data: Mapping[str, object],
    *,
    created_at: datetime,
    last_access: datetime | None,
    access_count: int,
    now: datetime,
    config: Config,
) -> float:
    """A node's worth apart from any query, in (0, 1]: recency decay x frequency floor x reward.

    Recency counts whole hours from the last access, or from creation for a node never
    recalled, with `config.recency_half_life_days`; the frequency factor never drops below
    `config.frequency_floor`. Naive datetimes are taken as UTC. Recall multiplies it by the
    relevance; `decay` deletes what falls below `config.decay_threshold`.
    """
    # `recency`, `frequency` and `reward` written out, the same operations in the same order
    # (recall values 50-100 nodes a query: the calls took half of its 2.3 us).
    seen = created_at if created_at.tzinfo is not None else _utc(created_at)
    if last_access is not None:
        last = last_access if last_access.tzinfo is not None else _utc(last_access)
        if last > seen:
            seen = last
    age_days = (((now if now.tzinfo is not None else _utc(now)) - seen).total_seconds()
                // 3600 / 24)
    raw = math.log1p(access_count if access_count > 0 else 0) / _LOG_FULL_FREQUENCY
    floor = config.frequency_floor
    return (
        float(2.0 ** (-(age_days if age_days > 0.0 else 0.0) / config.recency_half_life_days))
        * max(floor, min(1.0, raw))
        * reward(kind, data)
    )


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
