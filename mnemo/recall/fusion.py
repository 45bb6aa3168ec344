"""Pure ranking helpers for recall: reciprocal rank fusion, hop scoring and maximal marginal
relevance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt


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


def maximal_marginal_relevance(
    order: Sequence[str],
    relevance: Mapping[str, float],
    vectors: Mapping[str, npt.NDArray[np.float32]],
    lam: float,
) -> list[str]:
    """`order` re-ranked greedily: each next item maximises lam x relevance / best relevance -
    (1 - lam) x its highest cosine to the items already chosen (Carbonell and Goldstein, 1998).
    `vectors` are unit rows; an item without one is never penalised. lam = 1 keeps `order`.
    Quadratic in len(order): callers pass a bounded head."""
    if lam >= 1.0 or len(order) < 3:
        return list(order)
    top = max((relevance[i] for i in order), default=0.0)
    scale = top if top > 0 else 1.0
    left = list(order)
    chosen: list[str] = []
    # The highest cosine of each item left to any chosen item, updated as items are chosen.
    nearest = dict.fromkeys(left, 0.0)
    while left:
        best = max(left, key=lambda i: lam * relevance[i] / scale - (1.0 - lam) * nearest[i])
        left.remove(best)
        chosen.append(best)
        picked = vectors.get(best)
        if picked is None:
            continue
        for item in left:
            vector = vectors.get(item)
            if vector is not None:
                nearest[item] = max(nearest[item], float(vector @ picked))
    return chosen
