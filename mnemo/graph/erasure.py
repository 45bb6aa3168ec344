"""What withdrawing commits (`forget` of a source, `revert` of a commit) must re-word: an
intent that outlives the source it has words of (it takes the wording of the oldest other
source's procedure, or goes), and a fact or instruction other commits share. A wording that
cannot be embedded fails the forget with nothing deleted.

A fact or an instruction several commits are evidence for: a commit whose node joins one of
the graph's adds its contribution (wording, data, source) to the node's owners. Withdrawing
commits takes theirs off: a node left with none goes; else it keeps its wording if a remaining
contribution has it, or takes the oldest remaining one's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

from mnemo.graph.model import Vector
from mnemo.ports import JSONObject


@dataclass(frozen=True, slots=True)
class Contribution:
    """What one commit brought to a fact or an instruction: its own wording, data, source."""

    text: str
    data: JSONObject
    source_id: str | None


# A node's owners as stored: [commit id, or None for the creator, text, data, source id].
Owners = list[list[object]]


def joined(stored: Owners | None, node: Contribution, commit_id: str,
           brought: Contribution) -> Owners:
    """The owners of `node` (as it reads now) once `commit_id` joined it with `brought`."""
    owners = list(stored) if stored else [[None, node.text, node.data, node.source_id]]
    return [*owners, [commit_id, brought.text, brought.data, brought.source_id]]


@dataclass(frozen=True, slots=True)
class Left:
    """A node that stays after a withdrawal: what it reads now (`heir`), its owners (None: its
    creator alone), and whether its text changed."""

    heir: Contribution
    owners: Owners | None
    reworded: bool


def withdraw(
    stored: Owners | None, node: Contribution, *, created: bool, commits: set[str]
) -> Left | None:
    """What becomes of `node` (as it reads now) when `commits` are withdrawn (`created`: its
    creator among them): None when no owner is left."""
    owners = stored or [[None, node.text, node.data, node.source_id]]
    left = [o for o in owners if not (o[0] is None and created) and o[0] not in commits]
    if not left:
        return None
    keep = next((o for o in left if o[1] == node.text), left[0])
    data = keep[2] if isinstance(keep[2], dict) else {}
    heir = Contribution(str(keep[1]), data, None if keep[3] is None else str(keep[3]))
    alone = len(left) == 1 and left[0][0] is None
    return Left(heir, None if alone else left, heir.text != node.text)


# The repo's embedder as a forget needs it: texts -> a float32 matrix, one row a text.
Embed = Callable[[Sequence[str]], Awaitable[Vector]]


@dataclass(frozen=True, slots=True)
class IntentWording:
    """The wording an intent takes once a source is forgotten, and whose it is."""

    text: str
    source_id: str | None


def heirs(
    intents: Iterable[str], procedures: Iterable[tuple[str, object, str | None]]
) -> tuple[dict[str, IntentWording], list[str]]:
    """(intent -> its heir, intents to delete) for `intents` (those the forgotten source
    created or re-worded), from `procedures` of other sources linked to them, oldest first. An
    intent with no such procedure is left unlinked and goes with the other orphans."""
    linked: dict[str, list[tuple[object, str | None]]] = {}
    for intent_id, data, source_id in procedures:
        linked.setdefault(intent_id, []).append((data, source_id))
    found: dict[str, IntentWording] = {}
    dropped: list[str] = []
    for intent_id in dict.fromkeys(i for i in intents if i in linked):
        for data, source_id in linked[intent_id]:
            wording = data.get("intent") if isinstance(data, dict) else None
            if isinstance(wording, str) and wording.strip():
                found[intent_id] = IntentWording(wording, source_id)
                break
        else:
            dropped.append(intent_id)
    return found, dropped


@dataclass(frozen=True, slots=True)
class Scope:
    """What is withdrawn: the commits (`records`: all, to erase; `commits`: those not reverted
    yet) and the nodes, rewordings, joins, links and retirements they made."""

    records: list[str]
    commits: list[str]
    added: set[str]
    reworded: set[str]
    joined: set[str] = field(default_factory=set)
    links: list[tuple[str, str, str]] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)


# A fact or instruction the withdrawn commits created or joined: its id, what it reads now,
# its owners as stored, and whether they created it.
Shared = tuple[str, Contribution, Owners | None, bool]


@dataclass(frozen=True, slots=True)
class Inherited:
    """What `heirs` and `withdraw` read: the intents the commits created or re-worded,
    the procedures linked to them (oldest first), the facts and instructions the commits
    created or joined, and the commits."""

    intents: list[str]
    procedures: list[tuple[str, str, object, str | None]]
    shared: list[Shared] = field(default_factory=list)
    commits: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Plan:
    """What a withdrawal does beside deleting the commits' own nodes: `intents` go when left
    unlinked, `heirs` are re-worded, `dropped` deleted though linked; each of `shared` goes
    (None) or stays as `Left` says, with its new wording's vector."""

    intents: list[str]
    heirs: dict[str, tuple[IntentWording, Vector]]
    dropped: list[str]
    shared: dict[str, tuple[Left | None, Vector | None]] = field(default_factory=dict)

    @property
    def embedded(self) -> bool:
        """Whether it writes vectors made by the embedder."""
        return bool(self.heirs) or any(v is not None for _, v in self.shared.values())


# The delete itself, in one transaction: the ids of the nodes that went.
Delete = Callable[[Plan], Awaitable[list[str]]]

# Rounds a forget embeds outside the lock before it embeds under the lock (no starvation).
ATTEMPTS = 3


async def forget(
    lock: Callable[[], AbstractAsyncContextManager[None]],
    read: Callable[[], Awaitable[Inherited]],
    embed: Embed,
    delete: Delete,
    check: Callable[[], Awaitable[None]] | None = None,
) -> list[str]:
    """A source's forget: the heirs' wordings are embedded before the repo's `lock`, then
    under it the rows are read again and the delete runs if nothing changed, else it goes
    round again (the last round embeds under the lock). `check` runs under the lock before a
    delete that writes vectors, and raises to stop it. Returns the ids of the nodes that went.
    On any error (EmbeddingError, what `check` raises) nothing was deleted."""
    async def checked(plan: Plan) -> list[str]:
        if check is not None and plan.embedded:
            await check()
        return await delete(plan)

    for _ in range(ATTEMPTS - 1):
        seen = await read()
        plan = await inheritance(seen, embed)
        async with lock():
            if await read() == seen:
                return await checked(plan)
    async with lock():
        return await checked(await inheritance(await read(), embed))


async def inheritance(inherited: Inherited, embed: Embed) -> Plan:
    """The plan of `heirs` and `withdraw`, new wordings embedded in one call."""
    commits = set(inherited.commits)
    left = {node_id: withdraw(owners, now, created=created, commits=commits)
            for node_id, now, owners, created in inherited.shared}
    procedures: list[tuple[str, object, str | None]] = []
    for intent_id, node_id, data, source in inherited.procedures:
        kept = left.get(node_id)
        if kept is not None:  # withdrawn from, it stays: as it will read
            data, source = kept.heir.data, kept.heir.source_id
        if kept is not None or node_id not in left:
            procedures.append((intent_id, data, source))
    found, dropped = heirs(inherited.intents, procedures)
    stays = {i: x for i, x in left.items() if x is not None}
    reworded = [i for i, x in stays.items() if x.reworded]
    texts = [h.text for h in found.values()] + [stays[i].heir.text for i in reworded]
    made: Iterator[Vector] = iter(await embed(texts) if texts else ())
    shared: dict[str, tuple[Left | None, Vector | None]] = {i: (x, None) for i, x in left.items()}
    found_with = {i: (h, next(made)) for i, h in found.items()}
    shared.update((i, (stays[i], next(made))) for i in reworded)
    return Plan(inherited.intents, found_with, dropped, shared)
