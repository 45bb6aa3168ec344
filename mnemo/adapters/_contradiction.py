"""The offline LLM's "contradiction" heuristic: two facts contradict when they say the same
thing of the same subject with another value.

A fact is read as its content words, relations made one word, change words left out and
negated words marked. Two facts sharing a subject word and a relation contradict when one
denies a word the other states ("the cache is enabled" / "the cache is not enabled"), or when
every run of words one says beyond the shared ones is a specific value standing where the
other has another ("Dana lives in Lisbon" / "Dana moved to Porto"). Relations of many values
("likes"), other subjects or relations, and additions never contradict."""

from __future__ import annotations

import re

from mnemo import text as _text

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
    for word in words.split()
}
_COPULA = "=be"
# Words that say only that something changed: a new fact may state a change with one of them
# instead of a relation ("the limit was raised to 500").
_CHANGE = frozenset(
    "now new newly changed change changes updated raised lowered increased decreased reduced "
    "bumped set upgraded downgraded pinned replaced renamed currently anymore longer".split()
)
# A word after one of these is denied ("not 8000", "instead of JSON", "moved from Lisbon").
_DENIAL = frozenset(
    "not no never nor isn't aren't wasn't weren't doesn't don't didn't won't can't cannot "
    "hasn't haven't instead from".split()
)
_NUMBERS = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve fifteen twenty thirty "
    "forty fifty sixty hundred thousand million half once twice".split()
)
_ASIDE = re.compile(r"\([^()]*\)")

# A fact as the frame rule reads it: (key, denied, specific) per content word, in order.
_Item = tuple[str, bool, bool]


def contradicts(existing: str, new: str) -> bool:
    """Whether `new` ends `existing` by the heuristic of the module's docstring."""
    (a, _), (b, changed) = _items(existing), _items(new)
    keys_a, keys_b = {k for k, _, _ in a}, {k for k, _, _ in b}
    shared = keys_a & keys_b
    if not any(k[0] != "=" and len(k) >= 3 and any(c.isalpha() for c in k) for k in shared):
        return False  # no subject in common
    relations = {k for k in keys_a ^ keys_b if k[0] == "="} - {_COPULA}
    if relations or not (changed or any(k[0] == "=" for k in shared)):
        return False  # other relations, or none
    stated_a, denied_a = {k for k, d, _ in a if not d}, {k for k, d, _ in a if d}
    stated_b, denied_b = {k for k, d, _ in b if not d}, {k for k, d, _ in b if d}
    if stated_a & denied_b or denied_a & stated_b:
        return True
    values_a, values_b = _values(a, shared), _values(b, shared)
    if not values_a or not values_b:
        return False
    return (all(_replaced(v, values_a) for v in values_b)
            or all(_replaced(v, values_b) for v in values_a))


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
        for other_before, other_after, other in others
    )
