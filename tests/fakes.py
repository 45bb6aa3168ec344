"""Protocol fakes for the tests: a scripted LLM, a one-hot embedder, and an event recorder.

`FakeLLM` answers every task of the API contract's task table from the task inputs that mnemo
writes after the `INPUT:` line (`mnemo.calls.tasks.task_inputs`). The subgoal of a step is the
first word of its observation, lower-cased, and `FakeEmbedder` maps a text to the axis its first
word hashes to: so a test decides where trajectories split by the first word of each observation
("walk north", "walk south" stay together; "open door" starts a new trajectory).
"""

from __future__ import annotations

import inspect
import os
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar, overload

import anyio
import pytest

import mnemo
from mnemo.calls.tasks import task_inputs
from mnemo.graph.contradiction import contradicts as offline_contradicts
from mnemo.session import extracting
from mnemo.storage.ports import Backend
from mnemo.storage.sqlite import SqliteBackend
from mnemo.storage.sqlite.database import Database

T = TypeVar("T")


def first_word(text: str) -> str:
    words = text.split()
    return words[0] if words else ""


@overload
async def maybe_await(value: Awaitable[T]) -> T: ...
@overload
async def maybe_await(value: T) -> T: ...
async def maybe_await(value: Any) -> Any:
    """The value, awaited when the call returned an awaitable.

    the API contract does not say whether `session_state`, `session_context`, `recall` and the
    `*_async` calls are coroutines; the tests call them through this so either shape passes.
    """
    if inspect.isawaitable(value):
        return await value
    return value


async def invoke(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Calls `fn` and awaits its result if needed (for `BlockingPortal.call`)."""
    return await maybe_await(fn(*args, **kwargs))


class Hold:
    """Holds every call of one LLM task until `release()`; `started` is set when one arrives."""

    def __init__(self) -> None:
        self.started = anyio.Event()
        self._released = anyio.Event()

    def release(self) -> None:
        self._released.set()

    async def pass_through(self) -> None:
        self.started.set()
        await self._released.wait()


def extracted_observations(llm: FakeLLM) -> list[str]:
    """Every step observation `llm`'s semantic task was asked about, in order."""
    return [
        step["observation"]
        for request in llm.calls
        if request.task == "semantic"
        for step in js(task_inputs(request))["steps"]
    ]


class FakeLLM:
    """A deterministic `mnemo.LLM` with failure, garbage and hold controls per task."""

    def __init__(self) -> None:
        self.calls: list[mnemo.LLMRequest] = []
        self.fail_tasks: set[str] = set()
        self.garbage_tasks: set[str] = set()
        self.holds: dict[str, Hold] = {}
        self.raised: list[Exception] = []
        # What the procedural task scores the last step of an episode (None: it leaves the
        # score out, and close asks the "reward" task).
        self.last_reward: float | None = 0.7

    def hold(self, task: str) -> Hold:
        """From now on, calls of `task` wait until the returned hold is released."""
        self.holds[task] = Hold()
        return self.holds[task]

    def release_all(self) -> None:
        for held in self.holds.values():
            held.release()

    def tasks(self) -> list[str]:
        return [request.task for request in self.calls]

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        self.calls.append(request)
        held = self.holds.get(request.task)
        if held is not None:
            await held.pass_through()
        # Checked after the hold, so a test can decide a held call's fate before releasing it.
        if request.task in self.fail_tasks:
            exc = RuntimeError("boom")
            self.raised.append(exc)
            raise exc
        if request.task in self.garbage_tasks:
            return mnemo.LLMResponse(text="not json", data=None)
        return self._answer(request.task, task_inputs(request))

    def _answer(self, task: str, inputs: dict[str, Any]) -> mnemo.LLMResponse:
        usage = mnemo.Usage(input_tokens=1, output_tokens=1)
        observation = str(inputs.get("observation", ""))
        if task == "state":
            return mnemo.LLMResponse(text=f"state: {observation}", usage=usage)
        if task == "subgoal":
            data: Any = {"reasoning": "", "subgoal": first_word(observation).lower()}
        elif task == "reward":
            data = {"reward": 0.7}
        elif task == "semantic":
            data = {
                "facts": [
                    {
                        "proposition": f"fact: {step['observation']}",
                        "concepts": [first_word(step["observation"])],
                        "confidence": 0.9,
                    }
                    for step in inputs.get("steps", [])
                ]
            }
        elif task == "procedural":
            data = {
                "instructions": [
                    {
                        "intent": f"do {first_word(step['observation'])}",
                        "condition": f"when {step['observation']}",
                        "instruction": step["action"],
                        "expected_outcome": "progress",
                    }
                    for step in inputs.get("steps", [])
                ]
            }
            if inputs.get("score_last_step") is True and self.last_reward is not None:
                data["last_reward"] = self.last_reward
        elif task == "return":
            data = {
                "scores": [
                    {"index": item["index"], "return_score": 7}
                    for item in inputs.get("instructions", [])
                ]
            }
        elif task == "merge_intent":
            existing = inputs.get("existing", "")
            data = {"intent": existing if isinstance(existing, str) else str(existing)}
        elif task == "merge_intents":
            data = {"intents": [{"index": pair["index"], "intent": str(pair["existing"])}
                                for pair in inputs.get("pairs", [])]}
        elif task == "contradiction":
            # The offline heuristic: a test states contradictions the way it reads them.
            data = {"contradicted": [
                pair["index"] for pair in inputs.get("pairs", [])
                if offline_contradicts(str(pair["existing"]), str(pair["new"]))
            ]}
        else:
            return mnemo.LLMResponse(usage=usage)
        return mnemo.LLMResponse(data=data, usage=usage)


class RecordingEmbedder(mnemo.HashEmbedder):
    """A `mnemo.HashEmbedder` that keeps every text it was asked to embed, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    async def embed(self, texts: Sequence[str]) -> Any:
        self.texts.extend(texts)
        return await super().embed(texts)


class FakeEmbedder:
    """A deterministic `mnemo.Embedder`: a text becomes the unit vector of its first word's axis.

    Texts with the same first word have cosine 1; different first words are orthogonal unless
    they hash to the same axis (the words the tests use are checked with `axis`).
    """

    def __init__(self, dim: int = 8) -> None:
        self.dim = dim
        self.fail = False
        self.calls = 0
        self.raised: list[Exception] = []

    def axis(self, text: str) -> int:
        return zlib.crc32(first_word(text).lower().encode()) % self.dim

    async def embed(self, texts: Sequence[str]) -> Sequence[Sequence[float]]:
        self.calls += 1
        if self.fail:
            exc = RuntimeError("embed boom")
            self.raised.append(exc)
            raise exc
        vectors = []
        for text in texts:
            vector = [0.0] * self.dim
            vector[self.axis(text)] = 1.0
            vectors.append(vector)
        return vectors


class _Waiter:
    def __init__(self, predicate: Callable[[mnemo.Event], bool]) -> None:
        self.predicate = predicate
        self.seen = anyio.Event()
        self.matched: list[mnemo.Event] = []

    def offer(self, event: mnemo.Event) -> None:
        if self.predicate(event):
            self.matched.append(event)
            self.seen.set()


class EventLog:
    """An `on_event` sink that records every event and lets a test wait for one."""

    def __init__(self) -> None:
        self.events: list[mnemo.Event] = []
        self._waiters: list[_Waiter] = []

    def __call__(self, event: mnemo.Event) -> None:
        self.events.append(event)
        for waiter in self._waiters:
            waiter.offer(event)

    def transitions(self, session_id: str) -> list[tuple[str, str]]:
        return [
            (str(e.data["from"]), str(e.data["to"]))
            for e in self.events
            if e.kind == "transition" and e.session_id == session_id
        ]

    @contextmanager
    def _waiting(self, predicate: Callable[[mnemo.Event], bool]) -> Iterator[_Waiter]:
        waiter = _Waiter(predicate)
        self._waiters.append(waiter)
        try:
            yield waiter
        finally:
            self._waiters.remove(waiter)

    async def wait_for(self, predicate: Callable[[mnemo.Event], bool]) -> mnemo.Event:
        """The first event recorded that matches, waiting (up to 5 s) when none has come yet."""
        with self._waiting(predicate) as waiter:
            for event in self.events:
                if predicate(event):
                    return event
            with anyio.fail_after(5):
                await waiter.seen.wait()
            return waiter.matched[0]

    async def wait_state(
        self, mem: mnemo.Memory, session_id: str, *states: mnemo.State, within: float = 5.0
    ) -> mnemo.State:
        """Waits (up to `within` s) until the session is in one of `states`, woken by its
        transitions.

        The waiter is registered before the state is read, so a transition that lands between
        the two is not missed.
        """

        def predicate(event: mnemo.Event) -> bool:
            return (
                event.kind == "transition"
                and event.session_id == session_id
                and event.data.get("to") in states
            )

        with self._waiting(predicate) as waiter, anyio.fail_after(within):
            current = await maybe_await(mem.session_state(session_id))
            if current in states:
                return mnemo.State(current)
            await waiter.seen.wait()
            return mnemo.State(js(waiter.matched[0].data)["to"])


async def leave_extracting(store: str | os.PathLike[str], llm: FakeLLM, *, repo: str,
                           embedder: mnemo.Embedder | None = None) -> str:
    """A Memory on `llm` closes a session of `repo` and goes away while it extracts (its lease
    ends at once: a Memory with that model may take the work over); `llm` keeps no hold or
    call of it."""
    async with mnemo.Memory(store, llm=llm, embedder=embedder or FakeEmbedder()) as mem:
        await mem.open_repo(repo)
        sid = await mem.start_session("explore", repo=repo)
        await mem.append(sid, "walk north to the kitchen", "go north")
        held = llm.hold("semantic")
        await mem.close(sid)
        with anyio.fail_after(10):
            await held.started.wait()
    llm.release_all()
    llm.holds.clear()
    llm.calls.clear()
    return sid


@asynccontextmanager
async def open_test_memory(path: str = ":memory:", **kw: Any) -> AsyncIterator[mnemo.Memory]:
    """A `mnemo.Memory` on the fakes; `llm`, `embedder`, `config`, `on_event` may be overridden."""
    kw.setdefault("llm", FakeLLM())
    kw.setdefault("embedder", FakeEmbedder())
    async with mnemo.Memory(path, **kw) as mem:
        yield mem


def sqlite_database(owner: mnemo.Memory | Backend) -> Database:
    """The SQLite database behind `owner` (for tests that look at or fault its rows)."""
    backend = owner._backend if isinstance(owner, mnemo.Memory) else owner
    assert isinstance(backend, SqliteBackend), "a test of SQLite internals on another backend"
    return backend.database


class Ops:
    """Accepted async operations and what their callbacks received (random programs), each
    to be called back exactly once; `by_session` keeps each session's (kind, result), in
    arrival order."""

    def __init__(self) -> None:
        self.accepted = 0
        self.results: dict[int, mnemo.OpResult] = {}
        self.twice: list[str] = []  # operations called back more than once
        self.by_session: dict[str, list[tuple[str, mnemo.OpResult]]] = {}
        self.arrived = anyio.Event()

    def callback(self, sid: str, kind: str) -> Callable[[mnemo.OpResult], None]:
        """The callback of the operation about to be accepted (count it once it is)."""
        number = self.accepted

        def record(result: mnemo.OpResult) -> None:
            # Kept, not asserted here: `deliver` logs what a callback raises, and goes on.
            if number in self.results:
                self.twice.append(f"operation {number} ({kind})")
            self.results[number] = result
            self.by_session.setdefault(sid, []).append((kind, result))
            self.arrived.set()

        return record

    def check(self) -> None:
        """No operation was called back twice, and none is still owed one."""
        assert not self.twice, f"called back twice: {self.twice}"
        assert len(self.results) == self.accepted, "an accepted operation got no callback"

    async def all_back(self, within: float) -> None:
        """Waits (up to `within` s) until every accepted operation was called back, then
        checks."""
        with anyio.fail_after(within):
            while len(self.results) < self.accepted:
                self.arrived = anyio.Event()
                await self.arrived.wait()
        self.check()


class Callbacks:
    """Makes callbacks (sync, or async with `kind="async"`) that record each result under its
    label, in the order they arrive."""

    def __init__(self, kind: str = "sync") -> None:
        self.kind = kind
        self.results: list[tuple[str, mnemo.OpResult]] = []
        self._arrived: anyio.Event | None = None

    def _record(self, label: str, result: mnemo.OpResult) -> None:
        self.results.append((label, result))
        if self._arrived is not None:
            self._arrived.set()

    def __call__(self, label: str) -> Callable[[mnemo.OpResult], Any]:
        if self.kind == "sync":
            return lambda result: self._record(label, result)

        async def callback(result: mnemo.OpResult) -> None:
            self._record(label, result)

        return callback

    async def wait(self, count: int, within: float = 5.0) -> list[tuple[str, mnemo.OpResult]]:
        """The results, once `count` came (up to `within` s). Waiters at once share one
        event: each made its own before, and the last one's replaced the others'."""
        with anyio.fail_after(within):
            while len(self.results) < count:
                if self._arrived is None or self._arrived.is_set():
                    self._arrived = anyio.Event()
                await self._arrived.wait()
        return self.results

    def labels(self) -> list[str]:
        return [label for label, _ in self.results]


def waiting_for_claims(monkeypatch: pytest.MonkeyPatch) -> anyio.Event:
    """Set when a close starts to wait for the step claims of another holder
    (`mnemo.session.extracting.settle`, wrapped for the test)."""
    waiting = anyio.Event()
    settle = extracting.settle

    async def noted(*args: Any, **kwargs: Any) -> None:
        waiting.set()
        await settle(*args, **kwargs)

    monkeypatch.setattr(extracting, "settle", noted)
    return waiting


def js(value: object) -> Any:
    """`value` (JSON a test reads back: a reply's data, a node's data, a request's inputs or
    messages) for the test to index; the assertions that read it are its check."""
    return value


def busy_once(
    call: Callable[..., Awaitable[Any]], refused: list[bool]
) -> Callable[..., Awaitable[Any]]:
    """`call`, its first call refused as a store busy past its lock timeout (noted in
    `refused`), the others passed on."""

    async def once(*args: Any, **kwargs: Any) -> Any:
        if not refused:
            refused.append(True)
            raise mnemo.StorageError("busy", "PostgreSQL: canceling statement due to lock timeout")
        return await call(*args, **kwargs)

    return once
