"""Scopes: the flat metadata a session, an ingest or a message carries (who a memory belongs
to), and the `where` filter that selects by it. A metadata is stored as its canonical JSON (two
nodes share a scope when those are equal: `same`), and each pair indexed as (key, `encoded`
value), which a `where` reads: a value keeps its JSON type ("1", "true" and '"1"' differ).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from mnemo.errors import InvalidInputError, check_text
from mnemo.ports import JSONObject, JSONValue

Scalar = str | int | float | bool
Metadata = dict[str, Scalar]
# key -> the encoded values any of which matches; every key must match.
Where = dict[str, tuple[str, ...]]

MAX_KEYS = 32
MAX_KEY_CHARS = 64
MAX_VALUE_CHARS = 512
MAX_WHERE_VALUES = 1_000
# The longest encoded value `node_scopes` holds as it is; a longer one it holds by digest, so
# an index entry fits a PostgreSQL btree page beside a repo name of 1,000 bytes.
MAX_INDEXED_CHARS = 256


def check_metadata(metadata: object, what: str = "metadata") -> Metadata:
    """`metadata` checked (None is `{}`), as a new dict (an integral float as its integer):
    InvalidInputError for a non-dict, more than `MAX_KEYS` keys, a key not a non-blank string
    of at most `MAX_KEY_CHARS`, or a value not a str (at most `MAX_VALUE_CHARS`), an int of 64
    bits, a finite float or a bool."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidInputError(f"{what} must be a dict, got {type(metadata).__name__}")
    if len(metadata) > MAX_KEYS:
        raise InvalidInputError(f"{what} has {len(metadata)} keys, more than {MAX_KEYS}")
    return {_key(key, what): _value(value, f"{what}[{key!r}]") for key, value in metadata.items()}


def check_where(where: object) -> Where | None:
    """`where` as key -> encoded values; None for None or `{}` (no filter). InvalidInputError
    for a non-dict, a bad key or value, or an empty list of values or one past
    `MAX_WHERE_VALUES`."""
    if where is None:
        return None
    if not isinstance(where, Mapping):
        raise InvalidInputError(f"where must be a dict, got {type(where).__name__}")
    if len(where) > MAX_KEYS:
        raise InvalidInputError(f"where has {len(where)} keys, more than {MAX_KEYS}")
    out: Where = {}
    for key, wanted in where.items():
        name = _key(key, "where")
        values = wanted if isinstance(wanted, list | tuple | set | frozenset) else [wanted]
        if not values or len(values) > MAX_WHERE_VALUES:
            raise InvalidInputError(
                f"where[{key!r}] lists {len(values)} values: between 1 and {MAX_WHERE_VALUES}")
        out[name] = tuple(sorted({encoded(_value(v, f"where[{key!r}]")) for v in values}))
    return out or None


def parse_where(pairs: Iterable[str]) -> JSONObject | None:
    """"KEY=VALUE" texts (a string; "KEY:=JSON" for a number or true/false) as a `where`, a
    key given twice meaning any of its values; None when there are none. InvalidInputError
    for a text without "=" or a KEY:=VALUE that is not JSON."""
    where: dict[str, list[JSONValue]] = {}
    for pair in pairs:
        key, sign, value = pair.strip().partition("=")
        if not sign:
            raise InvalidInputError(f"where {pair!r}: expected KEY=VALUE")
        parsed: JSONValue = value
        if key.endswith(":"):
            key = key[:-1]
            try:
                parsed = json.loads(value)
            except ValueError as exc:
                raise InvalidInputError(f"where {pair!r}: {value!r} is not JSON") from exc
        where.setdefault(key, []).append(parsed)
    return {k: v[0] if len(v) == 1 else v for k, v in where.items()} or None


def encoded(value: Scalar) -> str:
    """A value as the scope index holds it: its JSON, an integral float as its integer."""
    return json.dumps(_integral(value) if isinstance(value, float) else value)


def _integral(value: float) -> int | float:
    """An integral float as its integer, any other float as it is."""
    return int(value) if value.is_integer() else value


def indexed(value: str) -> str:
    """An encoded value as `node_scopes` holds it: itself, or past `MAX_INDEXED_CHARS`
    "sha256:" and its digest (never JSON, so never another value)."""
    if len(value) <= MAX_INDEXED_CHARS:
        return value
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()


def canonical(metadata: Mapping[str, Scalar]) -> str | None:
    """The stored text of a metadata (sorted JSON), None for an empty one."""
    return json.dumps(dict(metadata), sort_keys=True) if metadata else None


def pairs(metadata: Mapping[str, Scalar]) -> list[tuple[str, str]]:
    """The (key, encoded value) rows the scope index holds for a node of this metadata."""
    return [(key, encoded(value)) for key, value in sorted(metadata.items())]


def matches(metadata: Mapping[str, Scalar], where: Where | None) -> bool:
    """Whether a metadata is inside `where` (every key present with one of its values)."""
    return where is None or all(
        key in metadata and encoded(metadata[key]) in values for key, values in where.items())


def same(a: Mapping[str, Scalar], b: Mapping[str, Scalar]) -> bool:
    """Whether two metadata are one scope (what a deduplication may join across)."""
    return canonical(a) == canonical(b)


def _key(key: object, what: str) -> str:
    return check_text(key, f"{what} key", limit=MAX_KEY_CHARS, setting=None)


def _value(value: object, what: str) -> Scalar:
    """`value` checked (an int between -2**63 and 2**63 - 1), an integral float as its integer."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise InvalidInputError(f"{what} must be an int between -2**63 and 2**63 - 1")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInputError(f"{what} must be a finite number, got {value!r}")
        return _integral(value)
    if isinstance(value, str):
        return check_text(value, what, limit=MAX_VALUE_CHARS, blank_ok=True, setting=None)
    raise InvalidInputError(
        f"{what} must be a str, int, float or bool, got {type(value).__name__}")


# A scope of at most this many nodes is searched over its own nodes; a larger one by a search
# of the repo `WIDEN` times as wide, its hits outside the scope dropped.
SCOPE_LIMIT = 10_000
WIDEN = 10


@dataclass(frozen=True, slots=True)
class Scope:
    """A `where` as a store resolved it for one read: its nodes, id -> (rowid, type), when at
    most `SCOPE_LIMIT`, else None."""

    where: Where
    members: dict[str, tuple[int, str]] | None

    def ids(self, kinds: Collection[str] | None) -> list[str]:
        """The members (of `kinds`); only when `members` is known."""
        assert self.members is not None
        return [i for i, (_, kind) in self.members.items() if kinds is None or kind in kinds]
