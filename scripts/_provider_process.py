"""The fake provider of `tests/adapters/provider_server.py` in a process of its own.

A model server is another process: its HTTP work never holds the client's GIL. The same fake in
the bench's own process (a thread per connection) does: with 32 replies due at once, each of its
threads waits for the GIL the client's event loop holds (the interpreter hands it over every
5 ms), so replies come back later than the server sent them and the client's CPU and the
server's add up on one core. `ProviderProcess` runs the unchanged `ProviderServer` in a child
process (multiprocessing, spawn) and answers the bench's two questions over a pipe: set the
latency, and the arrival times of the requests since a given count.
"""

from __future__ import annotations

import multiprocessing
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _serve(pipe: Connection, options: dict[str, Any]) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.adapters.provider_server import ProviderServer

    with ProviderServer(**options) as server:
        pipe.send(server.openai_url)
        while True:
            try:
                command, value = pipe.recv()
            except EOFError:
                return
            if command == "latency":
                server.latency = float(value)
                pipe.send(None)
            elif command == "arrivals":
                pipe.send([r.at for r in server.requests[int(value):]])
            else:
                return


class ProviderProcess:
    """`ProviderServer(**options)` in a child process; a context manager."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._pipe: Connection | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        self.openai_url = ""

    def __enter__(self) -> ProviderProcess:
        context = multiprocessing.get_context("spawn")
        mine, theirs = context.Pipe()
        self._process = context.Process(target=_serve, args=(theirs, self._options),
                                        daemon=True)
        self._process.start()
        self._pipe = mine
        self.openai_url = str(mine.recv())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pipe is not None:
            self._pipe.send(("stop", None))
            self._pipe.close()
        if self._process is not None:
            self._process.join(timeout=5)

    def _ask(self, command: str, value: object) -> Any:
        assert self._pipe is not None, "enter the context first"
        self._pipe.send((command, value))
        return self._pipe.recv()

    @property
    def latency(self) -> float:
        return float(self._options.get("latency", 0.0))

    @latency.setter
    def latency(self, seconds: float) -> None:
        self._options["latency"] = seconds
        self._ask("latency", seconds)

    def arrivals(self, since: int = 0) -> list[float]:
        """`time.monotonic()` on arrival of each request from the `since`-th on (the clock is
        the machine's, shared with this process)."""
        return list(self._ask("arrivals", since))
