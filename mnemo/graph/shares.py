"""A fact or an instruction several commits are evidence for: a commit whose node joins one of
the graph's adds its contribution (wording, data, source) to the node's owners. Withdrawing
commits takes theirs off: a node left with none goes; else it keeps its wording if a remaining
contribution has it, or takes the oldest remaining one's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

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


def dumps(owners: Owners | None) -> str | None:
    return None if owners is None else json.dumps(owners, sort_keys=True)
