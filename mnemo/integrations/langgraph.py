"""`MnemoStore`: LangGraph's `BaseStore` over a mnemo repo.

```python
store = MnemoStore(mem, "agent", keys=("user_id",))
graph = builder.compile(store=store)
```

An item is one SEMANTIC fact whose scope is its namespace (label i under `keys[i]`), so
`mem.recall(repo, q, where={"user_id": "alice"})` finds what a graph stored under
`("alice", ...)`; a label, key or joined namespace past a metadata value's 512 characters is
there as its digest ("sha256:..."), the item's data holding it whole. `get`, `put` and
`delete` find an item whatever `keys` it was put under; `search(query=...)` is mnemo's recall
inside the namespace prefix, read under this store's `keys`. No TTLs.

A put writes the item's new version (a source of its own) before it forgets the versions
before it, so a reader never finds the item missing, and a process stopped in between leaves
two versions: every read takes the newest of the key's versions it finds as the item, and the
key's next put forgets the others."""

from __future__ import annotations

import asyncio
import hashlib
import json
import operator
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from mnemo.conversation.service import KeyedLocks
from mnemo.errors import InvalidInputError, check_json, check_text, has_words
from mnemo.graph.model import Node, NodeType
from mnemo.graph.scope import MAX_VALUE_CHARS, Metadata, check_metadata
from mnemo.ports import JSONObject

try:
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        Item,
        ListNamespacesOp,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
    )
except ImportError as exc:
    raise ImportError(
        'mnemo.integrations.langgraph needs LangGraph: pip install "pymnemo[langgraph]"') from exc

if TYPE_CHECKING:
    from mnemo.memory import Memory

__all__ = ["MnemoStore"]

MARK, NAMESPACE, KEY = "langgraph", "langgraph.namespace", "langgraph.key"
SOURCE = "langgraph.source"  # the source id of an item's version (each its own scope)
# The version and first time a batch checks its puts with: as long as a put's.
CHECKED_AS = ("0" * 16, "0001-01-01T00:00:00.000000+00:00")


class MnemoStore(BaseStore):
    """LangGraph's `BaseStore` over the repo `repo` of `mem`; `keys` names the metadata key of each
    namespace label. Async calls run on the Memory's loop, sync ones from any other thread: make
    the store inside the Memory's running loop."""

    supports_ttl = False

    def __init__(self, mem: Memory, repo: str, *, keys: Sequence[str] = ()) -> None:
        self._mem, self._repo, self._keys = mem, repo, tuple(keys)
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._thread = threading.get_ident()  # the loop's, when there is one
        # A lock per key being put (by `_digest`): this store's puts of one key run in turn.
        self._puts = KeyedLocks()

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """`abatch`, run on the Memory's event loop and waited for from this thread (RuntimeError on
        that loop's own thread)."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("MnemoStore's sync calls need it made inside the Memory's loop")
        if threading.get_ident() == self._thread:
            raise RuntimeError("a sync MnemoStore call on the Memory's own loop would block it:"
                               " use the async calls (abatch, ainvoke)")
        return asyncio.run_coroutine_threadsafe(self.abatch(list(ops)), loop).result()

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Runs the operations in order, each after the one before, once all are checked: an
        operation of another kind is TypeError, a put of a value mnemo would refuse
        InvalidInputError, before any runs."""
        ops = list(ops)
        for op in ops:
            if not isinstance(op, GetOp | PutOp | SearchOp | ListNamespacesOp):
                raise TypeError(f"MnemoStore cannot run a {type(op).__name__}")
        puts = [(op, op.value) for op in ops if isinstance(op, PutOp) and op.value is not None]
        if puts:
            limit = (await self._mem.repo_config(self._repo)).max_text_chars
            version, created = CHECKED_AS
            for op, value in puts:
                text, data, metadata = self._draft(op.namespace, op.key, value,
                                                   _source_id(_digest(""), version), created)
                what = f"the value of item {op.key!r}"
                check_text(text, what, limit=limit)
                check_json(data, f"{what} as JSON", limit=limit)
                check_metadata(metadata)
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                versions = await self._versions(op.namespace, op.key)
                results.append(_item(versions[-1], Item) if versions else None)
            elif isinstance(op, PutOp):
                await self._put(op.namespace, op.key, op.value)
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(await self._search(op))
            else:
                results.append(await self._namespaces(op))
        return results

    def _where(self, prefix: Sequence[str]) -> Metadata:
        """The scope of a namespace prefix: label i under `keys[i]`, else "langgraph.i" (the
        labels first: a scope is read by its first key's range)."""
        keys = [*self._keys, *(f"langgraph.{i}" for i in range(len(self._keys), len(prefix)))]
        return {**dict(zip(keys, map(_short, prefix), strict=False)), MARK: True}

    async def _every(self, where: Metadata) -> list[Node]:
        """Every node of the scope `where`, in the order added, read at one moment (pages
        read one after another would skip an item while another put moves the rows)."""
        return await self._mem.nodes_where(self._repo, where, limit=None)

    @staticmethod
    def _scope(namespace: Sequence[str], key: str) -> Metadata:
        """The scope of one item, whatever `keys` it was put under: its key and joined
        namespace (two namespaces that join alike are told apart by `_identity`)."""
        return {KEY: _short(key), NAMESPACE: _short(".".join(namespace)), MARK: True}

    async def _versions(self, namespace: Sequence[str], key: str) -> list[Node]:
        """The versions of one item, oldest first (the last is the item)."""
        found = await self._every(self._scope(namespace, key))
        return [n for n in found if _identity(n) == (tuple(namespace), key)]

    def _draft(self, namespace: Sequence[str], key: str, value: Mapping[str, Any], source: str,
               created: str | None) -> tuple[str, JSONObject, Metadata]:
        """The text, data and scope of an item's version (InvalidInputError for a value that
        is not JSON)."""
        data: JSONObject = {"value": dict(value), "namespace": list(namespace), "key": key,
                            "created_at": created}
        return _text(value), data, {**self._scope(namespace, key), **self._where(namespace),
                                    SOURCE: source}

    async def _put(self, namespace: Sequence[str], key: str,
                   value: Mapping[str, Any] | None) -> None:
        """Writes a new version then forgets the older ones (a None value: forgets them all),
        each with what `Memory.correct` made of it."""
        digest = _digest(json.dumps([list(namespace), key]))
        async with self._puts.hold(digest):
            old = await self._versions(namespace, key)
            if value is None:
                for node in old:
                    await self._forget(namespace, key, node, digest)
                return
            source = _source_id(digest, uuid.uuid4().hex[:16])
            text, data, metadata = self._draft(
                namespace, key, value, source, _created(old[-1]).isoformat() if old else None)
            await self._mem.remember(self._repo, text, source_id=source, metadata=metadata,
                                     data=data)
            # Only the versions before this one: a later one is another put's, newer.
            versions = await self._versions(namespace, key)
            sources = [_source(node, digest) for node in versions]
            for older in versions[:sources.index(source)] if source in sources else ():
                await self._forget(namespace, key, older, digest)

    async def _forget(self, namespace: Sequence[str], key: str, version: Node,
                      digest: str) -> None:
        """Forgets one version of an item, with what `Memory.correct` made of it (one stored
        without versions, by its source)."""
        source = _source(version, digest)
        if SOURCE not in version.metadata:
            await self._mem.forget(self._repo, source)
            return
        await self._mem.forget_where(self._repo, {**self._scope(namespace, key), SOURCE: source})

    async def _search(self, op: SearchOp) -> list[SearchItem]:
        """A query's recall ranks at most `Config.max_results` items: InvalidInputError past
        it. Without a query (or a blank one, as LangGraph's own stores read it), every item of
        the prefix is read."""
        want = max(op.offset, 0) + max(op.limit, 0)
        where = self._where(op.namespace_prefix)
        scored: list[tuple[Node, float | None]]
        if op.query and has_words(op.query):
            most = (await self._mem.repo_config(self._repo)).max_results
            if want > most:
                raise InvalidInputError(
                    f"offset + limit is {want:,}, more than the {most:,} items a search with a"
                    " query ranks (Config.max_results)")
            recalled = await self._mem.recall(self._repo, op.query,
                                              k=max(most if op.filter else want, 1),
                                              types=[NodeType.SEMANTIC], where=where)
            scored = [(m.node, m.score) for m in recalled.memories]
        else:
            scored = [(node, None) for node in await self._every(where)]
        newest: dict[tuple[tuple[str, ...], str], tuple[Node, float | None]] = {}
        for node, score in scored:  # the newest of the versions read, at the first's rank
            held = newest.setdefault(_identity(node), (node, score))
            if node.created_at >= held[0].created_at:
                newest[_identity(node)] = node, held[1]
        kept = [_item(node, SearchItem, score) for node, score in newest.values()
                if all(_fits(_value(node).get(k), v) for k, v in (op.filter or {}).items())]
        return kept[op.offset:want]

    async def _namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        found = {_identity(n)[0] for n in await self._every({MARK: True})}
        found = {ns for ns in found if all(_matches(c.match_type, c.path, ns)
                                           for c in op.match_conditions or ())}
        if op.max_depth is not None:
            found = {ns[:op.max_depth] for ns in found}
        return sorted(found)[op.offset:op.offset + op.limit]


def _matches(kind: str, path: Sequence[str], namespace: tuple[str, ...]) -> bool:
    """Whether `namespace` starts (`kind` "prefix") or ends with `path`, "*" matching any."""
    if len(namespace) < len(path):
        return False
    part = namespace[:len(path)] if kind == "prefix" else namespace[len(namespace) - len(path):]
    return all(p in ("*", n) for p, n in zip(path, part, strict=True))


# LangGraph's filter operators; an order compares the two sides as floats.
OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "$eq": operator.eq, "$ne": operator.ne,
    "$gt": lambda a, b: float(a) > float(b), "$gte": lambda a, b: float(a) >= float(b),
    "$lt": lambda a, b: float(a) < float(b), "$lte": lambda a, b: float(a) <= float(b)}


def _fits(value: Any, wanted: Any) -> bool:
    """Whether a value matches a filter's value as LangGraph's InMemoryStore matches it: a dict
    with "$" keys by its operators, another dict key by key, a list element by element, else
    by equality. Raises ValueError on an unknown operator (TypeError, ValueError where `float`
    does on an order's side)."""
    if isinstance(wanted, dict):
        if any(str(k).startswith("$") for k in wanted):
            return all(_operator(name)(value, arg) for name, arg in wanted.items())
        return isinstance(value, dict) and all(_fits(value.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list | tuple):
        return (isinstance(value, list | tuple) and len(value) == len(wanted)
                and all(map(_fits, value, wanted)))
    return bool(value == wanted)


def _operator(name: str) -> Callable[[Any, Any], bool]:
    if name not in OPERATORS:
        raise ValueError(f"unsupported filter operator {name!r}: use {', '.join(OPERATORS)}")
    return OPERATORS[name]


def _text(value: Mapping[str, Any]) -> str:
    """What recall reads of a value: its fields as "name: value"; InvalidInputError for a
    field that is not JSON."""
    try:
        fields = [f"{k}: {v if isinstance(v, str) else json.dumps(v, allow_nan=False)}"
                  for k, v in value.items()]
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"a LangGraph item's value must be JSON: {exc}") from exc
    return "; ".join(fields) or "{}"


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _short(text: str) -> str:
    """`text` as a metadata value: itself, or past `MAX_VALUE_CHARS` its `_digest`."""
    return text if len(text) <= MAX_VALUE_CHARS else _digest(text)


def _source(node: Node, digest: str) -> str:
    """The source of an item's version (of one stored without `SOURCE`: the key's own)."""
    return str(node.metadata.get(SOURCE, _source_id(digest)))


def _source_id(digest: str, version: str = "") -> str:
    """The source id of the item of key `_digest` `digest`, of one version (none: the id of an
    item stored without versions)."""
    return f"langgraph-{digest[7:47]}" + (f"-{version}" if version else "")


def _identity(node: Node) -> tuple[tuple[str, ...], str]:
    """An item's namespace and key (from its metadata when its data lacks them)."""
    namespace = node.data.get("namespace")
    if isinstance(namespace, list):
        return tuple(map(str, namespace)), str(node.data["key"])
    return tuple(str(node.metadata[NAMESPACE]).split(".")), str(node.metadata[KEY])


def _created(node: Node) -> datetime:
    """When the item was first put (its oldest version's time)."""
    created = node.data.get("created_at")
    return datetime.fromisoformat(created) if isinstance(created, str) else node.created_at


def _value(node: Node) -> dict[str, Any]:
    """The item's value; for a fact `Memory.correct` rewrote, `{"text": <its wording>}`."""
    value = node.data.get("value")
    return value if isinstance(value, dict) else {"text": node.text}


def _item(node: Node, kind: type[Any], score: float | None = None) -> Any:
    namespace, key = _identity(node)
    extra = {} if kind is Item else {"score": score}
    return kind(value=_value(node), key=key, namespace=namespace, created_at=_created(node),
                updated_at=node.created_at, **extra)
