"""Pure ranking helpers for recall: reciprocal rank fusion and hop scoring."""

from __future__ import annotations

from collections.abc import Sequence


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[str]], k: int, weights: Sequence[float] | None = None
) -> dict[str, float]:
    """Fuses rankings (best first) into scores normalised so that first place in every ranking
    scores 1.0: score(d) = sum over rankings of w / (k + rank(d)), divided by its maximum."""
    if not rankings:
        return {}
    weights = [1.0] * len(rankings) if weights is None else list(weights)
    best = sum(weights) / (k + 1)
    if best <= 0:
        return {}
    scores: dict[str, float] = {}
    for weight, ranking in zip(weights, rankings, strict=True):
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + weight / (k + rank)
    return {item: score / best for item, score in scores.items()}


def hop_scores(
    parents: dict[str, float], edges: Sequence[tuple[str, str]], decay: float
) -> dict[str, float]:
    """Scores of nodes one hop from scored `parents` along `edges` (parent, child): the best
    parent's score times `decay`. Parents themselves are left out."""
    found: dict[str, float] = {}
    for parent, child in edges:
        if child in parents or parent not in parents:
            continue
        score = parents[parent] * decay
        if score > found.get(child, 0.0):
            found[child] = score
    return found
