"""The session state machine, as data.

`EDGES` is the transitions table; `answer(state, event)` gives every (state, event) pair a
deliberate answer: a destination, a rejection reason, or "stale" for a background result that
arrives when the session is no longer waiting for it. The `transitions` machine only ever
fires edges that `answer` allowed; its callbacks never await I/O: effects run
outside it, and their results come back as triggers.

```
            start_episode            close                 extraction_succeeded
   IDLE ─────────────────▶ COLLECTING ─────▶ EXTRACTING ─────────────────────────▶ READY
    ▲                        │  ▲ append      │   │ auto_committed                  │ │
    │                        └──┘             │   └──────────────▶ IDLE             │ │
    │             commit (retry) ┌────────────┘ extraction_failed                   │ │
    │                            │            ▼                                     │ │
    └──── discard ──────────── FAILED ◀───────┘          IDLE ◀── commit/discard ───┘ │
```
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from transitions import Machine


class State(StrEnum):
    IDLE = "idle"
    COLLECTING = "collecting"
    EXTRACTING = "extracting"
    READY = "ready"
    FAILED = "failed"


S = State

# What a caller can ask of a session...
CALLS: Final = ("start_episode", "append", "close", "commit", "discard")
# ...and what background work reports back.
RESULTS: Final = ("extraction_succeeded", "extraction_failed", "auto_committed")

EDGES: Final[list[dict[str, str]]] = [
    {"trigger": "start_episode", "source": S.IDLE, "dest": S.COLLECTING},
    {"trigger": "append", "source": S.COLLECTING, "dest": S.COLLECTING},
    {"trigger": "close", "source": S.COLLECTING, "dest": S.EXTRACTING},
    {"trigger": "extraction_succeeded", "source": S.EXTRACTING, "dest": S.READY},
    {"trigger": "extraction_failed", "source": S.EXTRACTING, "dest": S.FAILED},
    # Auto-commit: the close's extraction commits by itself and the session is idle again.
    {"trigger": "auto_committed", "source": S.EXTRACTING, "dest": S.IDLE},
    {"trigger": "commit", "source": S.READY, "dest": S.IDLE},
    # In FAILED, commit retries the extraction.
    {"trigger": "commit", "source": S.FAILED, "dest": S.EXTRACTING},
    {"trigger": "discard", "source": S.READY, "dest": S.IDLE},
    {"trigger": "discard", "source": S.FAILED, "dest": S.IDLE},
]

_DESTINATIONS: Final = {(State(e["source"]), e["trigger"]): State(e["dest"]) for e in EDGES}

# Why each call is refused where there is no edge (the API contract's state table).
REFUSALS: Final[dict[State, dict[str, str]]] = {
    S.IDLE: {"append": "not_collecting", "close": "not_collecting", "commit": "not_ready",
             "discard": "not_discardable"},
    S.COLLECTING: {"start_episode": "not_idle", "commit": "not_ready",
                   "discard": "not_discardable"},
    S.EXTRACTING: dict.fromkeys(CALLS, "extraction_in_progress"),
    S.READY: {"start_episode": "not_idle", "append": "not_idle", "close": "not_idle"},
    S.FAILED: {"start_episode": "session_failed", "append": "session_failed",
               "close": "session_failed"},
}


@dataclass(frozen=True, slots=True)
class Move:
    """The event is allowed and leads to `dest`."""

    dest: State


@dataclass(frozen=True, slots=True)
class Refuse:
    """The event is refused with `reason`."""

    reason: str


@dataclass(frozen=True, slots=True)
class Stale:
    """A background result for a wait that is over: logged and dropped."""


Answer = Move | Refuse | Stale


def answer(state: State, event: str) -> Answer:
    """The deliberate answer to `event` in `state`, for every pair."""
    dest = _DESTINATIONS.get((state, event))
    if dest is not None:
        return Move(dest)
    if event in RESULTS:
        return Stale()
    if event in CALLS:
        return Refuse(REFUSALS[state][event])
    raise ValueError(f"unknown session event {event!r}")


class SessionModel:
    """The object `transitions` moves: it holds one session's `state`."""

    state: State

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id


class SharedMachine:
    """One `transitions.Machine` shared by every session model.

    Sharing keeps an idle session to a few small objects (BENCHMARKS.md: RSS per session).
    """

    def __init__(self) -> None:
        self._machine = Machine(
            model=None,
            states=list(State),
            transitions=EDGES,
            initial=S.IDLE,
            auto_transitions=False,
            # Per-model queues (transitions >= 0.9.1): one session's trigger never waits on
            # another's. The stubs only know the bool form.
            queued="model",  # type: ignore[arg-type]
            send_event=False,
        )

    def add(self, model: SessionModel, state: State) -> None:
        self._machine.add_model(model, initial=state)

    def force(self, model: SessionModel, state: State) -> None:
        """Puts the model in `state` without an event: the store says another Memory moved
        the session there."""
        self._machine.set_state(state, model=model)

    def remove(self, model: SessionModel) -> None:
        self._machine.remove_model(model)

    @staticmethod
    def fire(model: SessionModel, event: str) -> State:
        """Fires an event `answer` allowed; returns the new state."""
        model.trigger(event)  # type: ignore[attr-defined]
        return model.state
