"""Helpers for the graph and recall tests: unit vectors, drafts and a recording merger."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import pytest

from mnemo.graph.contradiction import Contradicts, Question
from mnemo.graph.dedup import IntentMerges
from mnemo.graph.model import NodeDraft, NodeType, Vector, normalise_label
from mnemo.graph.ports import IntentPolicy
from mnemo.graph.vectors import VectorIndex

DIM = 8
REPO = "r"


def axis(i: int) -> Vector:
    """The unit vector along axis `i`."""
    vector = np.zeros(DIM, dtype=np.float32)
    vector[i] = 1.0
    return vector


def at_cosine(c: float, base: int = 0, other: int = 1) -> Vector:
    """A unit vector whose cosine with `axis(base)` is `c`."""
    vector = np.zeros(DIM, dtype=np.float32)
    vector[base], vector[other] = c, math.sqrt(1.0 - c * c)
    return vector


def draft(
    node_id: str,
    kind: NodeType,
    text: str,
    vector: Vector | None = None,
    data: dict[str, Any] | None = None,
) -> NodeDraft:
    """A draft; a TAG gets its normalised label as key."""
    return NodeDraft(
        id=node_id,
        type=kind,
        text=text,
        data=data if data is not None else {},
        vector=axis(DIM - 1) if vector is None else vector,
        key=normalise_label(text) if kind is NodeType.TAG else None,
    )


class Merger:
    """An `IntentMerges` that records the pairs it is asked and the batches they came in, and
    answers a fixed result for each."""

    def __init__(self, result: tuple[str, Vector] | None = None) -> None:
        self.result = result
        self.calls: list[tuple[str, str]] = []
        self.batches = 0

    async def __call__(
        self, pairs: Sequence[tuple[str, str]]
    ) -> list[tuple[str, Vector] | None]:
        self.calls.extend(pairs)
        self.batches += 1
        return [self.result] * len(pairs)

    async def one(self, existing: str, new: str) -> tuple[str, Vector] | None:
        """The same, as an `IntentMerger` of one pair."""
        return (await self([(existing, new)]))[0]


def pairwise(
    merge: Callable[[str, str], Awaitable[tuple[str, Vector] | None]],
) -> IntentMerges:
    """An `IntentMerges` that asks `merge` about each pair in turn."""

    async def merges(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, Vector] | None]:
        return [await merge(existing, new) for existing, new in pairs]

    return merges


def judged(contradicts: Callable[[str, str], bool]) -> Contradicts:
    """A `Contradicts` that decides each (existing, new) pair with `contradicts`."""

    async def judge(questions: Sequence[Question]) -> list[set[int]]:
        return [{p for p, existing in enumerate(q.existing) if contradicts(existing, q.new)}
                for q in questions]

    return judge


def policy(merge: Merger | None = None) -> IntentPolicy:
    return IntentPolicy(
        identity_threshold=0.95, merge_threshold=0.8, merge=merge if merge else Merger()
    )


def rounded(results: list[tuple[str, float]], places: int = 5) -> list[tuple[str, float]]:
    """Search results with their scores rounded, to compare with exact expectations."""
    return [(node_id, round(score, places)) for node_id, score in results]


def searches_of(index: VectorIndex, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that records, for every search of `index` from now on (`search` or
    `search_rows`; the search still answers), how many probe rows it took: which probes
    walked the index rather than being one product, and how many walks they took."""
    calls: list[int] = []
    search_rows = index.search_rows

    def recorded(queries: Any, *args: Any, **kwargs: Any) -> list[list[tuple[str, float]]]:
        calls.append(len(np.atleast_2d(queries)))
        return search_rows(queries, *args, **kwargs)

    monkeypatch.setattr(index, "search_rows", recorded)
    return calls


async def embed(texts: Sequence[str]) -> Vector:
    """The graph tests' `mnemo.graph.erasure.Embed`: a text's vector is the axis its length
    picks."""
    return np.stack([axis(len(text) % DIM) for text in texts])
