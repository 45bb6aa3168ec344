"""Random programs of sessions and async operations with faults injected: storage
errors from the driver, non-mnemo errors from the graph, LLMs failing annotation or extraction.

Whatever happens, every accepted operation gets exactly one callback, no session wedges (once
the faults stop, it settles and takes a valid operation at once), and no accepted step is lost
(an episode holds exactly the appends reported ok since it started)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import ExitStack, asynccontextmanager
from typing import Any, cast

import anyio
import anyio.from_thread
import psycopg
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, rule, run_state_machine_as_test

import mnemo
from mnemo import State
from mnemo.storage.postgres.store import PostgresBackend
from tests.backends import backend_of, is_sqlite
from tests.fakes import EventLog, FakeLLM, Ops, invoke, open_test_memory, sqlite_database

REPO = "r"
KINDS = ["append", "append", "append", "close", "commit", "discard", "start_episode"]


class Faults:
    def __init__(self) -> None:
        self.storage = 0  # the next N database jobs fail as "database is locked"
        self.apply = 0  # the next N graph commits raise a ValueError


class FaultyPrograms(RuleBasedStateMachine):
    sessions = Bundle("sessions")

    def __init__(self, store: str = ":memory:") -> None:
        super().__init__()
        self.llm = FakeLLM()
        self.events = EventLog()
        self.faults = Faults()
        self.ops = Ops()
        with ExitStack() as setup:
            self.portal = setup.enter_context(anyio.from_thread.start_blocking_portal())
            self.mem = setup.enter_context(
                self.portal.wrap_async_context_manager(
                    open_test_memory(store, llm=self.llm, on_event=self.events)
                )
            )
            self.call("open_repo", REPO)
            self._inject()
            self.stack = setup.pop_all()
        self.steps: dict[str, int] = {}  # appends reported ok in the open episode
        self.ended: set[str] = set()

    def _inject(self) -> None:
        graph, faults = self.mem._graph, self.faults
        real_apply = graph.apply
        if is_sqlite(self.mem):
            database = sqlite_database(self.mem)
            real_call = database._call

            async def call(fn: Callable[[], Any]) -> Any:
                if faults.storage > 0:
                    faults.storage -= 1

                    def locked() -> None:
                        raise sqlite3.OperationalError("database is locked")

                    return await real_call(locked)
                return await real_call(fn)

            database._call = call  # type: ignore[method-assign]
        else:
            pg = cast(PostgresBackend, backend_of(self.mem)).postgres
            real_connection = pg.connection

            @asynccontextmanager
            async def connection() -> AsyncIterator[Any]:
                async with real_connection() as conn:
                    if faults.storage > 0:
                        faults.storage -= 1
                        raise psycopg.errors.LockNotAvailable("canceling statement: lock timeout")
                    yield conn

            pg.connection = connection  # type: ignore[method-assign]

        async def apply(*args: Any, **kwargs: Any) -> Any:
            if faults.apply > 0:
                faults.apply -= 1
                raise ValueError("a vector of the wrong shape")
            return await real_apply(*args, **kwargs)

        graph.apply = apply  # type: ignore[method-assign]

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.portal.call(lambda: invoke(getattr(self.mem, name), *args, **kwargs))

    @rule(target=sessions)
    def start_session(self) -> str:
        self.faults.storage = 0
        sid: str = self.call("start_session", "explore the house", repo=REPO)
        self.steps[sid] = 0
        return sid

    @rule(storage=st.integers(0, 3), apply=st.integers(0, 1),
          failing=st.sets(st.sampled_from(["state", "semantic"])))
    def set_faults(self, storage: int, apply: int, failing: set[str]) -> None:
        self.faults.storage, self.faults.apply = storage, apply
        self.portal.call(self._fail_tasks, failing)

    def _fail_tasks(self, failing: set[str]) -> None:
        self.llm.fail_tasks.clear()
        self.llm.fail_tasks.update(failing)

    @rule(sid=sessions, kind=st.sampled_from(KINDS))
    def submit(self, sid: str, kind: str) -> None:
        args: tuple[Any, ...] = {
            "append": ("walk north", "go north"), "start_episode": ("open the door",)
        }.get(kind, ())
        callback = self.ops.callback(sid, kind)
        try:
            self.call(f"{kind}_async", sid, *args, callback=callback)
        except mnemo.SessionError as refused:
            reason = refused.reason
        except mnemo.NotFoundError:
            reason = "unknown"
        except mnemo.StorageError:
            # Accepting reads the session's row: a storage fault refuses the operation (no
            # callback is owed), as it refuses a sync call.
            reason = "storage"
        else:
            self.ops.accepted += 1
            return
        assert reason in {
            "invalid_operation", "invalid_queued_operation", "pending_queue_full",
            "session_failed", "storage",
        } or (reason == "unknown" and sid in self.ended)

    @rule(sid=sessions)
    def end_session(self, sid: str) -> None:
        try:
            self.call("end_session", sid)
        except mnemo.NotFoundError:
            assert sid in self.ended
        except mnemo.StorageError:
            return  # nothing changed: the session goes on
        else:
            self.ended.add(sid)

    @rule()
    def settle(self) -> None:
        """Faults stop; every accepted op is called back once; every live session comes to
        rest, holds exactly its reported appends, and takes a valid operation at once."""
        self.faults.storage = self.faults.apply = 0
        self.portal.call(self._fail_tasks, set())
        self.portal.call(self.ops.all_back, 10)
        for sid in list(self.steps):
            if sid in self.ended:
                continue
            self._count_steps(sid)
            state = self._at_rest(sid)
            self._still_usable(sid, state)

    def _count_steps(self, sid: str) -> None:
        for kind, result in self.ops.by_session.pop(sid, []):
            if not result.ok:
                continue
            if kind == "append":
                self.steps[sid] += 1
            elif kind == "start_episode":
                self.steps[sid] = 0

    def _at_rest(self, sid: str) -> State:
        state: State = self.call("session_state", sid)
        if state is State.EXTRACTING:
            state = self.portal.call(
                lambda: self.events.wait_state(self.mem, sid, State.READY, State.FAILED)
            )
            self.portal.call(self.ops.all_back, 10)
            self._count_steps(sid)
        return state

    def _still_usable(self, sid: str, state: State) -> None:
        if state is State.COLLECTING:
            [info] = [s for s in self.call("list_sessions") if s.id == sid]
            assert info.steps == self.steps[sid], "an accepted step was lost (or one added)"
            self.call("append", sid, "walk south", "go south")
            self.steps[sid] += 1
        elif state is State.READY:
            assert self.call("commit", sid) is not None
        elif state is State.FAILED:
            self.call("discard", sid)
        else:
            assert state is State.IDLE
            self.call("start_episode", sid, "read the note")
            self.steps[sid] = 0

    def teardown(self) -> None:
        """Closing answers whatever is still owed (memory_closed): then every accepted
        operation has had exactly one callback."""
        self.stack.close()
        self.ops.check()


@pytest.mark.slow
def test_faulty_programs(fresh_stores: Callable[[], str]) -> None:
    """Random programs of async operations, with storage faults (SQLite's "database is
    locked", PostgreSQL's lock timeout), failing commits and failing LLM tasks: every accepted
    operation is called back once, and no session is wedged; on each backend."""

    class OnAFreshStore(FaultyPrograms):
        def __init__(self) -> None:
            super().__init__(fresh_stores())

    run_state_machine_as_test(
        OnAFreshStore, settings=settings(max_examples=40, stateful_step_count=25, deadline=None)
    )
