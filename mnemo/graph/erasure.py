"""What `forget` must re-word: an intent that outlives the source it has words of.

An INTENT is shared: a new one at or above `intent_identity_threshold` of an existing one is
dropped for it, and one at or above `intent_merge_threshold` is merged into it through the LLM
(API.md), so its text may be a source's own wording, or hold words of several. Forgetting a
source deletes the intents only it linked; one that another source's procedures still use
stays, and would keep the forgotten source's words (API.md: "nothing of the source can be
recalled"). It takes instead the wording of the oldest procedure still linked to it (each
PROCEDURAL node keeps its own intent's wording in `data["intent"]`), with that wording's
vector and that procedure's source; an intent left with no procedure that has a wording is
deleted (a routing node: the procedures stay recallable by themselves).

The storage backends read the rows and write the result in the forget's own transaction; the
rule is here, once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mnemo.graph.model import Vector

# The repo's embedder as a forget needs it: texts -> a float32 matrix, one row a text.
Embed = Callable[[Sequence[str]], Awaitable[Vector]]


@dataclass(frozen=True, slots=True)
class Heir:
    """The wording an intent takes once a source is forgotten, and whose it is."""

    text: str
    source_id: str | None


def heirs(
    intents: Iterable[str], procedures: Iterable[tuple[str, Any, str | None]]
) -> tuple[dict[str, Heir], list[str]]:
    """(intent -> its heir, intents to delete) for `intents` (the ones the forgotten source
    created or re-worded), from `procedures`: (intent id, data, source id) of each procedure
    of another source linked to one of them, oldest first. An intent with no such procedure
    is not named: it is left without links, and goes with the other orphans."""
    linked: dict[str, list[tuple[Any, str | None]]] = {}
    for intent_id, data, source_id in procedures:
        linked.setdefault(intent_id, []).append((data, source_id))
    found: dict[str, Heir] = {}
    dropped: list[str] = []
    for intent_id in dict.fromkeys(intents):
        candidates = linked.get(intent_id)
        if not candidates:
            continue
        for data, source_id in candidates:
            wording = data.get("intent") if isinstance(data, dict) else None
            if isinstance(wording, str) and wording.strip():
                found[intent_id] = Heir(wording, source_id)
                break
        else:
            dropped.append(intent_id)
    return found, dropped


async def inheritance(
    intents: Iterable[str], procedures: Iterable[tuple[str, Any, str | None]], embed: Embed
) -> tuple[dict[str, tuple[Heir, Vector]], list[str]]:
    """`heirs`, each with the vector of its wording (one call of `embed` for all).

    Raises:
        EmbeddingError: as `embed`; nothing is forgotten then.
    """
    found, dropped = heirs(intents, procedures)
    if not found:
        return {}, dropped
    vectors = await embed([h.text for h in found.values()])
    return {i: (h, vectors[n]) for n, (i, h) in enumerate(found.items())}, dropped
