"""The offline LLM's "contradiction" heuristic: two facts contradict when they
share a subject and a functional relation ("lives in", "is", "listens on", "moved to") and
then name different values: "Dana lives in Lisbon" / "Dana lives in Porto", "the cache is
enabled" / "the cache is not enabled". Relations that admit many values ("likes", "went to")
never contradict: a model is needed to tell more.
"""

from __future__ import annotations

from mnemo import text as _text

# Relations a subject has one value of at a time (the last words of the shared phrase).
_FUNCTIONAL = frozenset(
    "is are was were be lives live living resides reside located based moved moves move works "
    "work working employed runs run listens listen uses use using set costs cost named called "
    "married engaged dating version port default now became becomes prefers prefer owns own "
    "drives drive studies study".split()
)
_LINKING = frozenset("in at to on as for from with of the a an".split())
_NEGATION = frozenset("not no never isn't aren't wasn't doesn't don't didn't".split())
# A value longer than this is a clause, not a value: the facts say more than one thing.
MAX_VALUE_WORDS = 5


def contradicts(existing: str, new: str) -> bool:
    """Whether `new` ends `existing` by the heuristic of the module's docstring."""
    a, b = _text.tokens(existing), _text.tokens(new)
    shared = 0
    while shared < min(len(a), len(b)) and a[shared] == b[shared]:
        shared += 1
    head, rest_a, rest_b = a[:shared], a[shared:], b[shared:]
    relation = [w for w in head if w not in _LINKING]
    if len(relation) < 2 or relation[-1] not in _FUNCTIONAL:
        return False
    if not rest_a or not rest_b:
        return False
    if len(rest_a) > MAX_VALUE_WORDS or len(rest_b) > MAX_VALUE_WORDS:
        return False
    # Negation right after the relation: "is enabled" / "is not enabled".
    negated_a, negated_b = rest_a[0] in _NEGATION, rest_b[0] in _NEGATION
    if negated_a != negated_b:
        return True
    values_a = {w for w in rest_a if w not in _LINKING and w not in _NEGATION}
    values_b = {w for w in rest_b if w not in _LINKING and w not in _NEGATION}
    return bool(values_a) and bool(values_b) and not values_a & values_b
