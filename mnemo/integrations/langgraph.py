"""`MnemoStore`: LangGraph's `BaseStore` over a mnemo repo.

```python
store = MnemoStore(mem, "agent", keys=("user_id",))
graph = builder.compile(store=store)
```

An item is one SEMANTIC fact whose scope is its namespace (label i under `keys[i]`), so
`mem.recall(repo, q, where={"user_id": "alice"})` finds what a graph stored under
`("alice", ...)`. `search(query=...)` is mnemo's recall inside the namespace prefix. No TTLs."""

from __future__ import annotations

import asyncio
import hashlib
import json
import operator
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from mnemo.config import Config
from mnemo.graph.model import Node, NodeType
from mnemo.graph.scope import Metadata

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
# The most items a filtered search or a listing of namespaces reads (`Config.max_results`).
MOST = Config().max_results


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
        """Runs the operations in order, each after the one before."""
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                node = await self._node(op.namespace, op.key)
                results.append(None if node is None else _item(node, Item))
            elif isinstance(op, PutOp):
                await self._put(op.namespace, op.key, op.value)
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(await self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(await self._namespaces(op))
            else:
                raise TypeError(f"MnemoStore cannot run a {type(op).__name__}")
        return results

    def _where(self, prefix: Sequence[str]) -> Metadata:
        """The scope of a namespace prefix: label i under `keys[i]`, else "langgraph.i"."""
        keys = [*self._keys, *(f"langgraph.{i}" for i in range(len(self._keys), len(prefix)))]
        return {MARK: True, **dict(zip(keys, prefix, strict=False))}

    async def _node(self, namespace: Sequence[str], key: str) -> Node | None:
        found = await self._mem.nodes_where(
            self._repo, {MARK: True, NAMESPACE: ".".join(namespace), KEY: key}, limit=1)
        return found[0] if found else None

    async def _put(self, namespace: Sequence[str], key: str,
                   value: Mapping[str, Any] | None) -> None:
        old = await self._node(namespace, key)
        digest = hashlib.sha256(json.dumps([list(namespace), key]).encode()).hexdigest()
        source = f"langgraph-{digest[:40]}"
        if old is not None:
            await self._mem.forget(self._repo, source)
        if value is None:
            return
        created = None if old is None else old.data.get("created_at") or old.created_at.isoformat()
        metadata = {**self._where(namespace), NAMESPACE: ".".join(namespace), KEY: key}
        await self._mem.remember(self._repo, _text(value), source_id=source, metadata=metadata,
                                 data={"value": dict(value), "created_at": created})

    async def _search(self, op: SearchOp) -> list[SearchItem]:
        want = max(op.offset, 0) + max(op.limit, 0)
        wide = want if not op.filter else MOST
        where = self._where(op.namespace_prefix)
        scored: list[tuple[Node, float | None]]
        if op.query:
            recalled = await self._mem.recall(self._repo, op.query, k=max(wide, 1),
                                              types=[NodeType.SEMANTIC], where=where)
            scored = [(m.node, m.score) for m in recalled.memories]
        else:
            nodes = await self._mem.nodes_where(self._repo, where, limit=max(wide, 1))
            scored = [(node, None) for node in nodes]
        kept = [_item(node, SearchItem, score) for node, score in scored
                if all(_fits(_value(node).get(k), v) for k, v in (op.filter or {}).items())]
        return kept[op.offset:want]

    async def _namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        found = {tuple(str(n.metadata[NAMESPACE]).split("."))
                 for n in await self._mem.nodes_where(self._repo, {MARK: True}, limit=MOST)}
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
    """What recall reads of a value: its fields as "name: value"."""
    fields = [f"{k}: {v if isinstance(v, str) else json.dumps(v)}" for k, v in value.items()]
    return "; ".join(fields) or "{}"


def _value(node: Node) -> dict[str, Any]:
    value = node.data["value"]
    assert isinstance(value, dict)
    return value


def _item(node: Node, kind: type[Any], score: float | None = None) -> Any:
    created = node.data.get("created_at")
    extra = {} if kind is Item else {"score": score}
    return kind(
        value=_value(node), key=str(node.metadata[KEY]),
        namespace=tuple(str(node.metadata[NAMESPACE]).split(".")),
        created_at=datetime.fromisoformat(created) if isinstance(created, str)
        else node.created_at, updated_at=node.created_at, **extra)
