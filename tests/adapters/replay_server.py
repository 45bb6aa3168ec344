"""`ReplayServer`: replays a recorded local model server on 127.0.0.1.

A recording (`recordings/<server>.json`, sources in `recordings/README.md`) lists exchanges:
the structured mode of a request ("json_schema", "tool", "json", or "text" without a schema)
and the status and JSON body the server answered it with. Requests of a mode get that mode's
replies in order, the last one again and again; a mode the recording lacks is answered 404, so
a test sees an adapter asking for something the real server was never asked.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.adapters.provider_server import _task_and_mode

RECORDINGS = Path(__file__).parent / "recordings"


class ReplayServer:
    """Serves one recording; `requests` holds (mode, JSON body) of every request received."""

    def __init__(self, name: str) -> None:
        recording = json.loads((RECORDINGS / f"{name}.json").read_text())
        self.server_name: str = recording["server"]
        self._replies: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for exchange in recording["exchanges"]:
            self._replies[exchange["mode"]].append(exchange)
        self._served: dict[str, int] = defaultdict(int)
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._http = _Server(self)
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    def __enter__(self) -> ReplayServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)

    @property
    def url(self) -> str:
        """The OpenAI-style base URL (`{url}/chat/completions`)."""
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def modes(self) -> list[str]:
        return [mode for mode, _ in self.requests]

    def reply(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        _, mode = _task_and_mode("/v1/chat/completions", body)
        key = mode or "text"
        with self._lock:
            self.requests.append((key, body))
            replies = self._replies.get(key)
            if not replies:
                return 404, {"error": {"message": f"no recorded reply for mode {key!r}"}}
            index = min(self._served[key], len(replies) - 1)
            self._served[key] += 1
        return replies[index]["status"], replies[index]["body"]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        assert isinstance(self.server, _Server)
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        status, reply = self.server.replay.reply(body)
        payload = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, replay: ReplayServer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.replay = replay
