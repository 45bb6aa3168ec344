"""Contradicted facts are retired, not deleted: before the commit's lock each new fact is
compared with the closest live facts of its type and the changeset's earlier ones, and the LLM
is asked once per commit (not when none is close; a repeat is left to deduplication). A retired
fact keeps `valid_to` and `retired_at`, linked from its successor by SUPERSEDES.

Without a model's judgement (the offline LLM, or a model that cannot answer), `contradicts`
judges a pair: two facts contradict when they say the same thing of the same subject with
another value. A fact is read as its content words, relations made one word, change words left
out and negated words marked. Two facts sharing a subject word and a relation contradict when
one denies a word the other states ("the cache is enabled" / "the cache is not enabled"), or
when every run of words one says beyond the shared ones is a specific value standing where the
other has another ("Dana lives in Lisbon" / "Dana moved to Porto"). Relations of many values
("likes"), other subjects or relations, and additions never contradict; nor do two facts each
about something specific the other never says, named right before their relation or by a naming
one ("pear2 listens on 9002" / "pear3 listens on 9003": two things, not one that changed).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import numpy as np

from mnemo import text as _text
from mnemo.graph.dedup import says_no_more
from mnemo.graph.model import TEMPORAL, Changeset, LinkType, Node, NodeDraft, NodeType
from mnemo.graph.scope import check_where, same
from mnemo.graph.vectors import TYPE_CODES, unit
from mnemo.ports import COSINE_TOLERANCE, cosine, reaches

if TYPE_CHECKING:
    from mnemo.graph.ports import IntentPolicy, RecallReads


@dataclass(frozen=True, slots=True)
class Question:
    """Does `new` end any of `existing` (facts of its type, close to it)?"""

    new: str
    existing: tuple[str, ...]


# Answers every question of one commit at once: the positions in `existing` each new fact ends.
Contradicts = Callable[[Sequence[Question]], Awaitable[list[set[int]]]]


@dataclass(frozen=True, slots=True)
class Retirement:
    """`retired` stops holding at `valid_to` (None: at the commit), succeeded by `successor`."""

    retired: str
    successor: str
    valid_to: datetime | None


async def retirements(
    graph: RecallReads, changeset: Changeset, intents: IntentPolicy,
    nearest: Mapping[str, list[tuple[str, float]]],
) -> list[Retirement]:
    """The facts the changeset's facts contradict, asked in one call of `intents.contradicts`
    (none without it): each new fact against `contradiction_candidates` live facts of its type
    per channel (vector, words) at cosine >= `contradiction_similarity`, and as many closest
    told before it in the changeset. A repeat at least `merge_threshold` close is not asked."""
    contradicts, candidates = intents.contradicts, intents.contradiction_candidates
    close, joined = intents.contradiction_similarity, intents.merge_threshold
    if contradicts is None or candidates <= 0:
        return []
    own = {n.id for n in changeset.nodes}
    told = _told(changeset)
    # A fact ends only facts of its own scope: searched inside it, then checked exactly.
    where = check_where(changeset.metadata)
    scope = None if where is None else await graph.scope(changeset.repo, where)
    facts = sorted((n for n in changeset.nodes if n.type in TEMPORAL), key=lambda n: told[n.id])
    earlier = _earlier(facts, candidates, close)
    asked: list[tuple[NodeDraft, list[Node | NodeDraft]]] = []
    for node in facts:
        kinds = [node.type]
        # The repo-wide nearest (`nearest`) serve an unscoped changeset only.
        by_vector = (nearest[node.id][:candidates] if scope is None
                     else await graph.search_vectors(changeset.repo, node.vector, candidates,
                                                     kinds, scope))
        similarity = {i: s for i, s in by_vector if reaches(s, close)}
        worded = [i for i, _ in await graph.search_text(
            changeset.repo, node.text, candidates, kinds, scope) if i not in similarity]
        if worded:
            similar = await graph.similarities(changeset.repo, worded, node.vector)
            similarity |= {i: similar[i] for i in worded if reaches(similar.get(i, -1.0), close)}
        fresh = [i for i in similarity if i not in own]
        olds: list[Node | NodeDraft] = [
            old for old in await graph.get_nodes(changeset.repo, fresh)
            if not old.retired and same(old.metadata, changeset.metadata)
            and not _one_fact(node.text, old.text, similarity[old.id], joined)]
        olds += [old for old in earlier[node.id]
                 if not _one_fact(node.text, old.text, cosine(node.vector, old.vector), joined)]
        if olds:
            asked.append((node, olds))
    if not asked:
        return []
    verdicts = await contradicts(
        [Question(node.text, tuple(old.text for old in olds)) for node, olds in asked])
    found: list[Retirement] = []
    seen: set[str] = set()
    for (node, olds), ended in zip(asked, verdicts, strict=True):
        for position, old in enumerate(olds):
            if position not in ended or old.id in seen:
                continue
            seen.add(old.id)
            if node.valid_from and old.valid_from and node.valid_from < old.valid_from:
                seen.add(node.id)
                found.append(Retirement(node.id, old.id, old.valid_from))
                break  # the new fact is retired: it ends nothing more
            found.append(Retirement(old.id, node.id, node.valid_from))
    return found


def _one_fact(new: str, old: str, similarity: float, joined: float) -> bool:
    """Whether `new` is `old` again: at least `joined` close, saying no more."""
    return reaches(similarity, joined) and says_no_more(new, old)


def _told(changeset: Changeset) -> dict[str, tuple[int, int]]:
    """When the changeset told each node: (its last PROVENANCE step or -1, its place)."""
    index = {n.id: n.data.get("index") for n in changeset.nodes if n.type is NodeType.EPISODIC}
    step: dict[str, int] = {}
    for link in changeset.links:
        at = index.get(link.dst)
        if link.type is LinkType.PROVENANCE and isinstance(at, int):
            step[link.src] = max(step.get(link.src, at), at)
    return {n.id: (step.get(n.id, -1), place) for place, n in enumerate(changeset.nodes)}


def _earlier(
    facts: Sequence[NodeDraft], candidates: int, close: float
) -> dict[str, list[NodeDraft]]:
    """For each fact (`facts` in the order they were told), the `candidates` closest facts of
    its type told before it, at a cosine of at least `close`, closest (then latest) first."""
    found: dict[str, list[NodeDraft]] = {n.id: [] for n in facts}
    if len(facts) < 2:
        return found
    similar = unit([n.vector for n in facts])
    similar = similar @ similar.T
    types = np.array([TYPE_CODES[n.type] for n in facts])
    # Pairs (i, j) with j told before i, of i's type, close enough: one array operation.
    pairs = (np.tri(len(facts), k=-1, dtype=bool) & (types[:, None] == types[None, :])
             & (similar.astype(np.float64) >= close - COSINE_TOLERANCE))
    for i, node in enumerate(facts):
        before = np.flatnonzero(pairs[i])
        # Closest first; ties: the latest told.
        before = before[np.lexsort((-before, -similar[i, before]))][:candidates]
        found[node.id] = [facts[int(j)] for j in before]
    return found


async def still_live(
    graph: RecallReads, repo: str, planned: list[Retirement], added: set[str]
) -> list[Retirement]:
    """The retirements that still apply under the lock (the old fact still there and live)."""
    pairs = [r for r in planned if r.retired in added or r.successor in added]
    existing = [i for r in pairs for i in (r.retired, r.successor) if i not in added]
    live = {n.id for n in await graph.get_nodes(repo, existing) if not n.retired}
    return [r for r in pairs if {r.retired, r.successor} <= added | live]


_LINKING = frozenset("in at to on as for from with of the a an".split())
# The longest run of words that counts as a value; a longer one is a clause.
MAX_VALUE_WORDS = 2

# The words of one relation, read as one ("=family"); "be" is the copula, which a fact may
# leave out ("the limit was raised to 500") without naming another relation.
_RELATIONS = {
    word: f"={family}"
    for family, words in {
        "be": "is are am 's",
        "live": "live lives living lived reside resides resided based located moved moves "
                "relocated",
        "serve": "listen listens listening bind binds bound serve serves served run runs",
        "work": "work works working worked employed",
        "use": "use uses using switch switched",
        "cost": "cost costs priced",
        "own": "own owns owned",
        "name": "named called",
        "marry": "married engaged dating",
        "prefer": "prefer prefers preferred",
        "study": "study studies studying",
        "expire": "expire expires",
    }.items()
    for word in words.split()}
_COPULA = "=be"
# Words that say only that something changed: a new fact may state a change with one of them
# instead of a relation ("the limit was raised to 500").
_CHANGE = frozenset(
    "now new newly changed change changes updated raised lowered increased decreased reduced "
    "bumped set upgraded downgraded pinned replaced renamed currently anymore longer".split())
# A word after one of these is denied ("not 8000", "instead of JSON", "moved from Lisbon").
_DENIAL = frozenset(
    "not no never nor isn't aren't wasn't weren't doesn't don't didn't won't can't cannot "
    "hasn't haven't instead from".split())
_NUMBERS = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve fifteen twenty thirty "
    "forty fifty sixty hundred thousand million half once twice".split())
_ASIDE = re.compile(r"\([^()]*\)")

# A fact as the frame rule reads it: (key, denied, specific) per content word, in order.
_Item = tuple[str, bool, bool]


def contradicts(existing: str, new: str) -> bool:
    """Whether `new` ends `existing`, by the heuristic of the module's docstring."""
    (a, _), (b, changed) = _items(existing), _items(new)
    keys_a, keys_b = {k for k, _, _ in a}, {k for k, _, _ in b}
    shared = keys_a & keys_b
    if not any(k[0] != "=" and len(k) >= 3 and any(c.isalpha() for c in k) for k in shared):
        return False  # no subject in common
    relations = {k for k in keys_a ^ keys_b if k[0] == "="} - {_COPULA}
    if relations or not (changed or any(k[0] == "=" for k in shared)):
        return False  # other relations, or none
    if _subject(a) - keys_b and _subject(b) - keys_a:
        return False  # each is about something the other never says
    stated_a, denied_a = {k for k, d, _ in a if not d}, {k for k, d, _ in a if d}
    stated_b, denied_b = {k for k, d, _ in b if not d}, {k for k, d, _ in b if d}
    if stated_a & denied_b or denied_a & stated_b:
        return True
    values_a, values_b = _values(a, shared), _values(b, shared)
    if not values_a or not values_b:
        return False
    return (all(_replaced(v, values_a) for v in values_b)
            or all(_replaced(v, values_b) for v in values_a))


def _subject(items: list[_Item]) -> set[str]:
    """What the fact is about, when something specific names it: the word right before its
    first relation ("pear2 listens on 9002"), and the name a naming relation gives ("the
    service number 2 named pear2"); a date or label leading the fact is not it."""
    first = next((i for i, (key, _, _) in enumerate(items) if key[0] == "="), None)
    if first is None:
        return set()
    around = items[max(first - 1, 0):first]
    if items[first][0] == "=name":
        around += items[first + 1:first + 2]
    return {key for key, _, specific in around if specific}


def _items(fact: str) -> tuple[list[_Item], bool]:
    """The fact's content words as (key, denied, specific), and whether it states a change. A
    word is denied only where it can be a value: a relation, something specific, or the word
    right after a relation ("is not enabled"; not "haven't done pottery")."""
    items: list[_Item] = []
    changed = denying = False
    for position, word in enumerate(_text.words(_ASIDE.sub(" ", fact))):
        lower = word.lower()
        if lower in _DENIAL:
            denying = True
            continue
        if lower in _CHANGE:
            changed = True
            continue
        if lower in _RELATIONS:
            key, specific = _RELATIONS[lower], False
        elif not (_text.is_stopword(lower) or lower in _LINKING):
            key = _text.stem(lower)
            specific = (lower in _NUMBERS or _text.is_identifier(word)
                        or (position > 0 and word[:1].isupper()))
        else:
            continue
        value = specific or key[0] == "=" or (bool(items) and items[-1][0][0] == "=")
        items.append((key, denying and value, specific))
        denying = False
    return items, changed


# A run of words beyond the shared ones, the shared words around it, and whether it can be a value.
_Run = tuple[str | None, str | None, bool]


def _values(items: list[_Item], shared: set[str]) -> list[_Run]:
    """The runs of words outside `shared`, each with the shared words around it and whether
    it can be a value: at most `MAX_VALUE_WORDS` words naming something specific, or one word
    right after a relation other than the copula ("works as a nurse"; not "is gorgeous")."""
    runs: list[_Run] = []
    before: str | None = None
    run: list[_Item] = []
    for key, denied, specific in [*items, ("", False, False)]:
        if key and key not in shared:
            run.append((key, denied, specific))
            continue
        if run:
            value = (len(run) <= MAX_VALUE_WORDS and any(s for _, _, s in run)) or (
                len(run) == 1 and before is not None and before[0] == "=" and before != _COPULA)
            runs.append((before, key or None, value))
            run = []
        before = key or None
    return runs


def _replaced(run: _Run, others: list[_Run]) -> bool:
    """Whether `run` is a value where `others` holds another, beside the same shared word."""
    before, after, value = run
    return value and any(
        other and ((before and other_before == before) or (after and other_after == after))
        for other_before, other_after, other in others)
