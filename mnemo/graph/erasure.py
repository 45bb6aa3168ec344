"""What `forget` must re-word: an intent that outlives the source it has words of.

An INTENT is shared: a new one at or above `intent_identity_threshold` of an existing one is
dropped for it, and one at or above `intent_merge_threshold` is merged into it through the LLM
(the API contract), so its text may be a source's own wording, or hold words of several. Forgetting
a source deletes the intents only it linked; one that another source's procedures still use
stays, and would keep the forgotten source's words (the API contract: "nothing of the source can be
recalled"). It takes instead the wording of the oldest procedure still linked to it (each
PROCEDURAL node keeps its own intent's wording in `data["intent"]`), with that wording's
vector and that procedure's source; an intent left with no procedure that has a wording is
deleted (a routing node: the procedures stay recallable by themselves), and so is one left
with no link at all. A wording that cannot be embedded fails the forget, with nothing
deleted: deleting the intent instead would take a node of another source, which the API contract
keeps ("tags and intents left with no links").

The storage backends read the rows and write the result in the forget's own transaction; the
rule is here, once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from mnemo.graph.model import Vector

# The repo's embedder as a forget needs it: texts -> a float32 matrix, one row a text.
Embed = Callable[[Sequence[str]], Awaitable[Vector]]


@dataclass(frozen=True, slots=True)
class Heir:
    """The wording an intent takes once a source is forgotten, and whose it is."""

    text: str
    source_id: str | None


def heirs(
    intents: Iterable[str], procedures: Iterable[tuple[str, object, str | None]]
) -> tuple[dict[str, Heir], list[str]]:
    """(intent -> its heir, intents to delete) for `intents` (the ones the forgotten source
    created or re-worded), from `procedures`: (intent id, data, source id) of each procedure
    of another source linked to one of them, oldest first. An intent with no such procedure
    is not named: it is left without links, and goes with the other orphans."""
    linked: dict[str, list[tuple[object, str | None]]] = {}
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


@dataclass(frozen=True, slots=True)
class Scope:
    """What a source committed: its commits, the nodes they added, the intents they
    re-worded. The source is an ingested source (its commits name it), a session (its
    commits name it) or an episode (the commits its steps were committed in)."""

    commits: list[str]
    added: set[str]
    reworded: set[str]


# (intents the source created or re-worded, (intent, data, source) of other sources'
# procedures linked to them, oldest first): what `heirs` reads.
Inherited = tuple[list[str], list[tuple[str, object, str | None]]]


@dataclass(frozen=True, slots=True)
class Plan:
    """What a forget does to the intents beside deleting the source's own nodes: `intents`
    (those the source created or re-worded) are deleted when left without links, `heirs`
    re-worded (with their wording's vector), `dropped` deleted though linked."""

    intents: list[str]
    heirs: dict[str, tuple[Heir, Vector]]
    dropped: list[str]


# The delete itself, in one transaction: the ids of the nodes that went.
Delete = Callable[[Plan], Awaitable[list[str]]]

# Rounds a forget embeds outside the repo's lock before, having found the graph changed
# under it each time, it holds the lock for its embedding too.
ATTEMPTS = 3


async def forget(
    lock: Callable[[], AbstractAsyncContextManager[None]],
    read: Callable[[], Awaitable[Inherited]],
    embed: Embed,
    delete: Delete,
    check: Callable[[], Awaitable[None]] | None = None,
) -> list[str]:
    """A source's forget: the heirs' wordings are embedded before the repo's `lock` is taken
    (a slow embedder must not hold every other writer of the repo, in every process: commits
    decide their model calls before the lock too), then, under it, the rows are read again
    and the delete runs if nothing changed. A change (a commit, another forget) sends it
    round again; the last of `ATTEMPTS` rounds embeds under the lock, so a repo that keeps
    changing cannot starve it. Returns the ids of the nodes that went.

    `check` runs under the lock before a delete that writes heirs' vectors, and raises to
    stop it (the repo's vectors were re-embedded since `embed` was chosen: its wordings'
    vectors would not fit them).

    Raises:
        EmbeddingError: a wording could not be embedded (in time); nothing was deleted.
        Whatever `check` raises; nothing was deleted.
    """
    async def checked(plan: Plan) -> list[str]:
        if check is not None and plan.heirs:
            await check()
        return await delete(plan)

    for _ in range(ATTEMPTS - 1):
        seen = await read()
        plan = await inheritance(*seen, embed)
        async with lock():
            if await read() == seen:
                return await checked(plan)
    async with lock():
        return await checked(await inheritance(*await read(), embed))


async def inheritance(
    intents: list[str], procedures: Iterable[tuple[str, object, str | None]], embed: Embed
) -> Plan:
    """The plan of `heirs`, each with the vector of its wording (one call of `embed` for
    all).

    Raises:
        EmbeddingError: as `embed`.
    """
    found, dropped = heirs(intents, procedures)
    if not found:
        return Plan(intents, {}, dropped)
    vectors = await embed([h.text for h in found.values()])
    return Plan(intents, {i: (h, vectors[n]) for n, (i, h) in enumerate(found.items())},
                dropped)
