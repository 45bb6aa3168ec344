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
    Quadratic in len(order), as one matrix product: callers pass a bounded head."""
    if lam >= 1.0 or len(order) < 3:
        return list(order)
    top = max((relevance[i] for i in order), default=0.0)
    scale = top if top > 0 else 1.0
    dim = next((len(v) for v in vectors.values()), 0)
    rows = np.zeros((len(order), dim), dtype=np.float32)
    for row, item in enumerate(order):
        vector = vectors.get(item)
        if vector is not None:
            rows[row] = vector
    # Every pairwise cosine; an item without a vector is a zero row, so it neither penalises
    # nor is penalised. A row that is not finite counts as no vector (its NaN would win every
    # argmax below).
    cosines = np.nan_to_num(_cosines(rows), nan=0.0, posinf=0.0, neginf=0.0)
    # Each item's score to pick it: lam x relevance - (1 - lam) x its highest cosine to the
    # items chosen so far (never below 0). A chosen item's gain becomes -inf, so its score
    # stays -inf: four numpy calls a pick, on arrays this small each costs its call alone.
    gain = lam * np.array([relevance[i] for i in order], dtype=np.float64) / scale
    penalties = (1.0 - lam) * cosines.astype(np.float64)
    nearest = np.zeros(len(order), dtype=np.float64)
    score = gain.copy()
    chosen: list[str] = []
    for _ in range(len(order)):
        # argmax takes the first of equals: ties keep `order`, as a stable sort would.
        best = int(score.argmax())
        chosen.append(order[best])
        gain[best] = -np.inf
        np.maximum(nearest, penalties[best], out=nearest)
        np.subtract(gain, nearest, out=score)
    return chosen


# Rows of cosines one product computes: a whole head of thousands in one call held the GIL
# (and so the event loop) for seconds.
_BLOCK = 256


def _cosines(rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """`rows @ rows.T`. A small product by einsum (in OpenBLAS's threads it was slower, by
    milliseconds when the cores are busy), a large one by `_BLOCK` rows a call."""
    out: npt.NDArray[np.float32]
    if len(rows) <= _BLOCK:
        out = np.einsum("id,jd->ij", rows, rows)
        return out
    out = np.empty((len(rows), len(rows)), dtype=np.float32)
    for start in range(0, len(rows), _BLOCK):
        np.matmul(rows[start:start + _BLOCK], rows.T, out=out[start:start + _BLOCK])
    return out
