"""A fake model provider on 127.0.0.1, for the adapter tests and `scripts/bench_extraction.py`.

`ProviderServer` speaks three wire protocols over a real socket (stdlib `http.server`, one
thread per connection):

- OpenAI chat completions, `POST /v1/chat/completions` (structured output as `response_format`
  json_schema or json_object, or a forced function tool);
- OpenAI embeddings, `POST /v1/embeddings` (vectors come back in reverse order, so clients
  must sort by `index`; with `per_token=True` each text gets a list of vectors, one per word,
  as JSON numbers whatever the `encoding_format`, as llama-cpp-python's server does with a
  model that does not pool);
- Anthropic messages, `POST /v1/messages` (structured output as a forced tool).

A request with tools of its own (an eviction's `save_snapshot`, ...) rather than one forced
structured-output tool gets a call of the tool its `tool_choice` names, or of `save_snapshot`
(`everything_ok` once one is saved) for "required" / `{"type": "any"}`, when the server obeys
that form (`obeys`); otherwise, and without `tool_choice`, it answers in prose, as
llama-cpp-python's server does.

By default it answers mnemo's tasks with valid data (`task_data`: the subgoal of a step is the
first word of its observation, one fact and one procedure per step, ...); the task name is read
from the json_schema name or the forced tool's name, as mnemo's adapters send it. A test
scripts what comes next with `script(...)`: a queue of behaviours used in request order, then
the default again. Every request is recorded (`requests`), with its headers and JSON body.
"""

from __future__ import annotations

import base64
import json
import re
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio.lowlevel
import msgspec

from mnemo.calls.tasks import INPUT_MARKER


class _ByTask:
    def __repr__(self) -> str:
        return "BY_TASK"


BY_TASK: Any = _ByTask()


class _Longest:
    def __repr__(self) -> str:
        return "LONGEST"


# `Answer(data=LONGEST)`: the longest reply the request's schema allows, as a small model
# that runs on writes it under a server's grammar (llama.cpp's): every string to its
# `maxLength`, every list to its `maxItems`; a string without a bound runs on past any
# max_tokens, a list without one holds `_UNBOUNDED_ITEMS`.
LONGEST: Any = _Longest()
_UNBOUNDED_ITEMS = 16
_RAMBLE = "and the model keeps writing " * 2_000


@dataclass(frozen=True)
class Answer:
    """A 200 reply. For a structured request, `data` (by default the task's valid answer) is
    rendered the way the request asked: JSON content, a tool call's arguments, or a `tool_use`
    block. `text` instead replies in prose (or with malformed JSON); `tool_calls` replies with
    those calls; `fenced` wraps JSON content in a Markdown fence; `dim` overrides the embedding
    size; `finish` is the finish/stop reason."""

    data: Any = BY_TASK
    text: str | None = None
    tool_calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    fenced: bool = False
    usage: tuple[int, int] = (10, 5)
    dim: int | None = None
    finish: str | None = None


@dataclass(frozen=True)
class Fail:
    """An error reply: `status`, with `message` at `error.message` and extra `headers`."""

    status: int
    message: str = "something went wrong"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Raw:
    """A reply with exactly this status and body (e.g. a 200 that is not JSON), and extra
    `headers` (e.g. a content-encoding)."""

    body: bytes
    status: int = 200
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Slow:
    """Waits `seconds` (or until the server stops), then behaves as `then`."""

    seconds: float
    then: Any = field(default_factory=Answer)


@dataclass(frozen=True)
class Hangup:
    """Closes the connection without replying (a connection error for the client)."""


Behaviour = Answer | Fail | Raw | Slow | Hangup


def rate_limited(retry_after: str = "0") -> Fail:
    """A 429 with a `Retry-After` header."""
    return Fail(429, "Rate limit reached, slow down", {"Retry-After": retry_after})


def retry_at(unix_time: float) -> Fail:
    """A 429 whose `Retry-After` is an HTTP date."""
    return Fail(429, "Rate limit reached", {"Retry-After": formatdate(unix_time, usegmt=True)})


REJECT_RESPONSE_FORMAT = Fail(
    400, "Invalid parameter: response_format of type json_schema is not supported with this model"
)
REJECT_TOOLS = Fail(400, "This server does not support tools / tool_choice")


@dataclass(frozen=True)
class Recorded:
    """One request the server received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    task: str | None
    mode: str | None
    at: float = 0.0  # time.monotonic() on arrival

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages = self.body.get("messages")
        return messages if isinstance(messages, list) else []


class ProviderServer:
    """The fake provider (see the module doc). Use as a context manager, or `start`/`stop`.

    `latency` delays every reply (the bench's model latency); `dim` is the embedding size;
    `every_nth_fails` replies with `flaky` instead of the default to every n-th request;
    `json_schema=False` makes it refuse `response_format` json_schema (like older Ollama,
    vLLM and llama.cpp servers), `tools=False` refuse tools (forced or a request's own), each
    with HTTP `refusal_status` (500: llama.cpp's server of 2024). `obeys` holds the forms of
    `tool_choice` it follows for a request's own tools: "named" (a tool's name; all that
    llama-cpp-python's server follows), "required" (llama.cpp's own server); hosted APIs follow
    both, the default. `per_token=True` answers embeddings with one vector per word.

    Like a real server under load: `slots` requests are answered at once and the rest queue
    (None: all at once); a request whose client gave up is still worked on to its end,
    holding its slot (llama-cpp-python's server does not notice a closed connection);
    `tokens_per_second` adds the reply's own tokens (4 characters a token, also reported as
    its usage) to its latency; `context` refuses a request whose prompt (4 characters a
    token) is longer, as llama.cpp does, and cuts a reply at what is left of it, or at the
    request's max_tokens when that is less (with either set, a reply is cut at max_tokens).

    `shapes` says how the default answers are shaped: "mnemo" as the schemas mnemo sends
    (`task_data`), "contract" exactly as the API contract's task table documents them
    (`contract_data`: no key beyond it), "loose" as a model in JSON mode writes them, bound
    by no grammar (`loose_data`).
    """

    def __init__(
        self,
        *,
        latency: float = 0.0,
        dim: int = 8,
        every_nth_fails: int = 0,
        flaky: Behaviour | None = None,
        json_schema: bool = True,
        tools: bool = True,
        slots: int | None = None,
        tokens_per_second: float | None = None,
        context: int | None = None,
        obeys: frozenset[str] = frozenset({"named", "required"}),
        per_token: bool = False,
        shapes: str = "mnemo",
        refusal_status: int = 400,
    ) -> None:
        self.latency = latency
        self.refusal_status = refusal_status
        self.slots = slots
        self._line: deque[object] = deque()  # requests waiting for a slot, first come first
        self._busy = 0
        self.tokens_per_second = tokens_per_second
        self.context = context
        # What a procedural answer that scores an episode's last step gives as its score.
        self.last_reward: Any = 0.8
        self.queued = 0
        self.max_queued = 0
        self.dim = dim
        self.every_nth_fails = every_nth_fails
        self.flaky: Behaviour = flaky or rate_limited("0")
        self.json_schema = json_schema
        self.tools = tools
        self.obeys = obeys
        self.per_token = per_token
        self.shapes = shapes
        self.requests: list[Recorded] = []
        self.statuses: list[int] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._script: deque[Behaviour] = deque()
        # What every request of a task gets, unless something is scripted (`answer_task`).
        self._by_task: dict[str, Behaviour] = {}
        self._lock = threading.Lock()
        self._turns = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._count = 0

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> ProviderServer:
        server = _Server(self)
        self._server = server
        # A short poll keeps `stop()` (which waits for the loop to notice) quick.
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> ProviderServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The Anthropic base URL (`{url}/v1/messages`)."""
        assert self._server is not None, "start the server first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def openai_url(self) -> str:
        """The OpenAI base URL (`{openai_url}/chat/completions`)."""
        return f"{self.url}/v1"

    # ---- scripting -------------------------------------------------------------------------

    def script(self, *behaviours: Behaviour) -> None:
        """Queues behaviours for the next requests, in order."""
        with self._lock:
            self._script.extend(behaviours)

    def answer_task(self, task: str, behaviour: Behaviour) -> None:
        """Every later request of `task` gets `behaviour` (scripted ones still come first)."""
        with self._lock:
            self._by_task[task] = behaviour

    def tasks(self) -> list[str | None]:
        return [r.task for r in self.requests]

    def _next(self, recorded: Recorded) -> Behaviour:
        with self._lock:
            self._count += 1
            if self._script:
                return self._script.popleft()
            if recorded.task in self._by_task:
                return self._by_task[recorded.task]
            if self.every_nth_fails and self._count % self.every_nth_fails == 0:
                return self.flaky
        if recorded.mode == "json_schema" and not self.json_schema:
            return replace(REJECT_RESPONSE_FORMAT, status=self.refusal_status)
        if recorded.mode in ("tool", "tools") and not self.tools:
            return replace(REJECT_TOOLS, status=self.refusal_status)
        return Answer()

    @contextmanager
    def _slot(self) -> Iterator[None]:
        """Holds one of the server's slots, queueing for it (first come, first served) when
        all are taken."""
        if self.slots is None:
            yield
            return
        me = object()
        with self._turns:
            self._line.append(me)
            self.queued = len(self._line) - 1 if self._busy < self.slots else len(self._line)
            self.max_queued = max(self.max_queued, self.queued)
            while not (self._line[0] is me and self._busy < self.slots):
                if self._stopping.is_set():
                    break
                self._turns.wait(0.05)
            self._line.remove(me)
            self._busy += 1
            self._turns.notify_all()
        try:
            yield
        finally:
            with self._turns:
                self._busy -= 1
                self._turns.notify_all()

    def _enter(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _leave(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def _answered(self, status: int) -> None:
        # Recorded before the reply goes out: a client that has its reply may look at once.
        with self._lock:
            self.statuses.append(status)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle's algorithm the body would wait
    # for the client's delayed ACK (40 ms on Linux) on every reply.
    disable_nagle_algorithm = True
    # Idle keep-alive connections give their thread back after this long.
    timeout = 10

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        assert isinstance(self.server, _Server)
        provider = self.server.provider
        length = int(self.headers.get("content-length", "0"))
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        task, mode = _task_and_mode(self.path, body)
        recorded = Recorded(
            self.path,
            {k.lower(): v for k, v in self.headers.items()},
            body,
            task,
            mode,
            time.monotonic(),
        )
        provider.requests.append(recorded)
        with provider._slot():
            provider._enter()
            try:
                if provider.latency:
                    provider._stopping.wait(provider.latency)
                self._behave(provider, provider._next(recorded), recorded)
            finally:
                provider._leave()

    def _behave(self, provider: ProviderServer, behaviour: Behaviour, request: Recorded) -> int:
        while isinstance(behaviour, Slow):
            provider._stopping.wait(behaviour.seconds)
            behaviour = behaviour.then
        if isinstance(behaviour, Hangup):
            provider._answered(0)
            self.close_connection = True
            return 0
        if isinstance(behaviour, Raw):
            self._send(behaviour.status, behaviour.body, behaviour.content_type,
                       headers=behaviour.headers)
            return behaviour.status
        if isinstance(behaviour, Fail):
            error = {"type": "error", "message": behaviour.message}
            payload: dict[str, Any] = {"error": error}
            if request.path.endswith("/messages"):
                payload = {"type": "error", "error": error}
            self._send(behaviour.status, json.dumps(payload).encode(), headers=behaviour.headers)
            return behaviour.status
        prompt = _prompt_tokens(request)
        if provider.context is not None and prompt > provider.context:
            self._send(400, json.dumps({"error": {
                "code": 400, "type": "exceed_context_size_error",
                "message": "the request exceeds the available context size, try increasing it",
                "n_prompt_tokens": prompt, "n_ctx": provider.context}}).encode())
            return 400
        reply = _render(request, behaviour, provider)
        if provider.tokens_per_second or provider.context is not None:
            room = None if provider.context is None else provider.context - prompt
            cap = request.body.get("max_tokens") or request.body.get("max_completion_tokens")
            if isinstance(cap, int) and (room is None or cap < room):
                room = cap  # a server stops at the request's max_tokens too
            written = _sized(reply, prompt, room)
            if provider.tokens_per_second:
                provider._stopping.wait(written / provider.tokens_per_second)
        self._send(200, json.dumps(reply).encode())
        return 200

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        assert isinstance(self.server, _Server)
        self.server.provider._answered(status)
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # The stdlib default backlog of 5 resets connections when a close opens dozens at once.
    request_queue_size = 256

    def __init__(self, provider: ProviderServer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.provider = provider

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out has closed its socket; the late reply's broken pipe is
        # expected, not worth a traceback on stderr.
        pass


# ---- reading requests -----------------------------------------------------------------------

_JSON_MODE_TASK = re.compile(r'JSON schema \(named "([\w-]+)"\)')


def _task_and_mode(path: str, body: dict[str, Any]) -> tuple[str | None, str | None]:
    """The task name and structured mode ("json_schema", "tool", "json" or None) of a request."""
    if path.endswith("/embeddings"):
        return None, None
    if _own_tools(body):
        return None, "tools"
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else choice.get("name")
        if isinstance(name, str):
            return name, "tool"
    response_format = body.get("response_format")
    if isinstance(response_format, dict):
        if response_format.get("type") == "json_schema":
            return response_format.get("json_schema", {}).get("name"), "json_schema"
        if response_format.get("type") == "json_object":
            system = " ".join(
                m.get("content", "") for m in body.get("messages", []) if m.get("role") == "system"
            )
            match = _JSON_MODE_TASK.search(system)
            return (match.group(1) if match else None), "json"
    return None, None


def _tool_names(body: dict[str, Any]) -> list[str]:
    names = []
    for tool in body.get("tools") or []:
        if isinstance(tool, dict):
            function = tool.get("function")
            name = function.get("name") if isinstance(function, dict) else tool.get("name")
            if isinstance(name, str):
                names.append(name)
    return names


def _forced_name(body: dict[str, Any]) -> str | None:
    choice = body.get("tool_choice")
    if not isinstance(choice, dict):
        return None
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else choice.get("name")
    return name if isinstance(name, str) else None


def _own_tools(body: dict[str, Any]) -> bool:
    """Whether the request carries tools of its own, not one forced structured-output tool."""
    names = _tool_names(body)
    return bool(names) and names != [_forced_name(body)]


def _tool_call(request: Recorded, obeys: frozenset[str]) -> tuple[str, dict[str, Any]] | None:
    """The call a request with its own tools gets, or None (prose) when the server does not
    obey its `tool_choice` (see `ProviderServer`)."""
    body = request.body
    choice = body.get("tool_choice")
    inputs = _inputs(request)
    named = _forced_name(body)
    required = choice == "required" or (isinstance(choice, dict) and choice.get("type") == "any")
    if named is not None and "named" in obeys:
        name = named
    elif required and "required" in obeys:
        saved = any(line.startswith("save_snapshot: ok") for line in inputs.get("done", []))
        name = "everything_ok" if saved else "save_snapshot"
    else:
        return None
    if name == "save_snapshot":
        zone = f"{inputs.get('zone_start', '?')}-{inputs.get('zone_end', '?')}"
        return name, {"text": f"Messages {zone} are about the deployment."}
    if name == "attach_messages_to_goals":
        return name, {"message_ids": [], "goal_ids": []}
    return name, {}


def _inputs(request: Recorded) -> dict[str, Any]:
    """The task inputs mnemo wrote after `INPUT:` in the latest user message that has them."""
    for message in reversed(request.messages):
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, str) and INPUT_MARKER in content:
            try:
                value = json.loads(content.rsplit(INPUT_MARKER, 1)[1])
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}
    return {}


def first_word(text: str) -> str:
    words = text.split()
    return words[0].lower() if words else ""


def task_data(task: str | None, inputs: dict[str, Any]) -> Any:
    """A valid answer to one of mnemo's tasks (None for an unknown or free-text task)."""
    steps = [s for s in inputs.get("steps", []) if isinstance(s, dict)]
    if task == "state":
        return {"state": f"The agent is at: {inputs.get('observation', 'somewhere')}"}
    if task == "subgoal":
        return {"reasoning": "same topic", "subgoal": first_word(inputs.get("observation", ""))}
    if task == "reward":
        return {"reward": 0.8}
    if task == "semantic":
        return {"facts": [
            {"proposition": f"The agent observed: {s.get('observation', '')}",
             "concepts": [first_word(s.get("observation", "")) or "general"],
             "confidence": 0.9, "steps": [s.get("index", i)]}
            for i, s in enumerate(steps)
        ]}
    if task == "procedural":
        scored = {"last_reward": 0.8} if inputs.get("score_last_step") is True else {}
        return {**scored, "instructions": [
            {"intent": f"handle {s.get('action', '')}",
             "condition": f"When {s.get('observation', '')}",
             "instruction": s.get("action", ""), "expected_outcome": "it works",
             "steps": [s.get("index", i)]}
            for i, s in enumerate(steps)
        ]}
    if task == "return":
        return {"scores": [
            {"index": item.get("index", i), "return_score": 7}
            for i, item in enumerate(inputs.get("instructions", []))
        ]}
    if task == "merge_intent":
        return {"intent": inputs.get("existing", "")}
    if task == "merge_intents":
        return {"intents": [{"index": p.get("index", i), "intent": p.get("existing", "")}
                            for i, p in enumerate(inputs.get("pairs", []))]}
    if task == "contradiction":  # a batch of pairs, or one pair as older builds asked
        return {"contradicted": []} if "pairs" in inputs else {"contradicts": False}
    if task == "memory_update":  # the newest user message, filed as context under "notes"
        said = [m.get("content", "") for m in inputs.get("conversation", [])
                if isinstance(m, dict) and m.get("role") == "user"]
        return {"files": [{"topic": "notes", "description": "Notes", "signals": ["context"],
                           "content": f"- {said[-1]}", "remove": []}] if said else []}
    memories = inputs.get("memories", [])
    if task == "recall_plan":
        return {"mode": "mixed", "tags": [first_word(inputs.get("query", "")) or "general"]}
    if task == "recall_rerank":
        return {"order": list(range(len(memories), 0, -1))}
    if task == "recall_synthesis":
        return {"answer": f"As memory [1] says: {memories[0] if memories else 'nothing'}"}
    if task in ("summary", "snapshot_fold"):
        return {"summary": "The conversation so far, in short."}
    if task == "eviction":  # asked as data: save_snapshot's arguments
        zone = f"{inputs.get('zone_start', '?')}-{inputs.get('zone_end', '?')}"
        return {"text": f"Messages {zone} are about the deployment."}
    return None


def contract_data(task: str | None, inputs: dict[str, Any]) -> Any:
    """The answer of the API contract's task table ("The LLM and embedder ports"), exactly its
    documented shape: facts and procedures without their steps, a procedural reply without
    the score of the last step it may be asked for. Extraction tasks the table does not list
    ("merge_intents", "contradiction") get prose, as from a model that does not know them;
    other tasks as `task_data`."""
    if task in ("merge_intents", "contradiction"):
        return None
    data = task_data(task, inputs)
    if task == "semantic":
        return {"facts": [{k: f[k] for k in ("proposition", "concepts", "confidence")}
                          for f in data["facts"]]}
    if task == "procedural":
        keys = ("intent", "condition", "instruction", "expected_outcome")
        return {"instructions": [{k: i[k] for k in keys} for i in data["instructions"]]}
    return data


# Keys a loose answer leaves out (mnemo reads them as absent), and keys whose numbers it
# writes as strings.
_LEFT_OUT = frozenset({"reasoning", "confidence", "condition", "expected_outcome",
                       "description", "signals", "remove"})
_AS_STRINGS = frozenset({"reward", "return_score", "index", "contradicted"})


def loose_data(task: str | None, inputs: dict[str, Any]) -> Any:
    """`contract_data` as a model in JSON mode writes it, held by no grammar: keys in
    reverse order, numbers as strings, optional keys left out."""
    return _loosened(contract_data(task, inputs), None)


def _loosened(value: Any, key: str | None) -> Any:
    if isinstance(value, dict):
        return {k: _loosened(v, k) for k, v in reversed(value.items()) if k not in _LEFT_OUT}
    if isinstance(value, list):
        return [_loosened(item, key) for item in value]
    if key in _AS_STRINGS and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


_ANSWERS = {"mnemo": task_data, "contract": contract_data, "loose": loose_data}


def vector(text: str, dim: int) -> list[float]:
    """A deterministic unit vector for `text`: the axis its first word hashes to."""
    out = [0.0] * dim
    out[zlib.crc32(first_word(text).encode()) % dim] = 1.0
    return out


# ---- writing replies ------------------------------------------------------------------------


def _render(request: Recorded, answer: Answer, provider: ProviderServer) -> dict[str, Any]:
    if request.path.endswith("/embeddings"):
        return _embeddings(request, answer, answer.dim or provider.dim, provider.per_token)
    if request.mode == "tools" and answer == Answer(usage=answer.usage, finish=answer.finish):
        call = _tool_call(request, provider.obeys)
        answer = replace(
            answer, data=None, tool_calls=(call,) if call else (),
            text=None if call else "Sure! Here is a summary of the conversation so far.",
        )
    data = answer.data
    text = answer.text
    if data is LONGEST:
        data = _longest(_schema_of(request.body))
    if data is BY_TASK:
        data = None if text is not None else _ANSWERS[provider.shapes](
            request.task, _inputs(request))
        if isinstance(data, dict) and "last_reward" in data:
            data["last_reward"] = provider.last_reward
        if data is None and text is None:
            text = f"The agent is at: {_inputs(request).get('observation', 'somewhere')}"
    if request.path.endswith("/messages"):
        return _anthropic(request, answer, data, text)
    return _openai_chat(request, answer, data, text)


def _openai_chat(request: Recorded, answer: Answer, data: Any, text: str | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None}
    calls = list(answer.tool_calls)
    if data is not None and request.mode == "tool":
        calls.append((request.task or "answer", data))
    elif data is not None:
        content = json.dumps(data)
        message["content"] = f"```json\n{content}\n```" if answer.fenced else content
    if text is not None:
        message["content"] = text
    if calls:
        message["tool_calls"] = [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(arguments)}}
            for i, (name, arguments) in enumerate(calls)
        ]
    finish = answer.finish or ("tool_calls" if calls else "stop")
    prompt, completion = answer.usage
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": request.body.get("model"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion},
    }


def _anthropic(request: Recorded, answer: Answer, data: Any, text: str | None) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = []
    if text is not None:
        blocks.append({"type": "text", "text": text})
    calls = list(answer.tool_calls)
    if data is not None:
        calls.append((request.task or "answer", data))
    blocks += [
        {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": arguments}
        for i, (name, arguments) in enumerate(calls)
    ]
    prompt, completion = answer.usage
    return {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": request.body.get("model"),
        "content": blocks,
        "stop_reason": answer.finish or ("tool_use" if calls else "end_turn"),
        "usage": {"input_tokens": prompt, "output_tokens": completion},
    }


def _embeddings(
    request: Recorded, answer: Answer, dim: int, per_token: bool = False
) -> dict[str, Any]:
    texts = request.body.get("input", [])
    if isinstance(texts, str):
        texts = [texts]
    # As OpenAI: base64 of little-endian float32s when asked for, JSON numbers otherwise.
    packed = request.body.get("encoding_format") == "base64"
    items: list[dict[str, Any]] = [
        {"object": "embedding", "index": i, "embedding": _packed(v) if packed else v}
        for i, text in enumerate(texts)
        for v in [vector(str(text), dim)]
    ]
    if per_token:
        items = [
            {"object": "embedding", "index": i,
             "embedding": [vector(word, dim) for word in str(text).split() or [""]]}
            for i, text in enumerate(texts)
        ]
    prompt = answer.usage[0]
    return {
        "object": "list",
        "data": items[::-1],  # reversed on purpose: clients must order by index
        "model": request.body.get("model"),
        "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
    }


def _schema_of(body: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema a structured request asks its reply to match ({} when none)."""
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        schema = response_format.get("json_schema", {}).get("schema")
        return schema if isinstance(schema, dict) else {}
    for tool in body.get("tools") or []:
        function = tool.get("function", tool) if isinstance(tool, dict) else {}
        schema = function.get("parameters") or function.get("input_schema")
        if function.get("name") == _forced_name(body) and isinstance(schema, dict):
            return schema
    return {}


def _longest(schema: dict[str, Any]) -> Any:
    """The longest value `schema` allows (see `LONGEST`)."""
    kind = schema.get("type")
    if "enum" in schema:
        return max(schema["enum"], key=lambda value: len(json.dumps(value)))
    if kind == "object":
        return {name: _longest(sub) for name, sub in schema.get("properties", {}).items()}
    if kind == "array":
        return [_longest(schema.get("items", {}))
                for _ in range(schema.get("maxItems", _UNBOUNDED_ITEMS))]
    if kind == "string":
        bound = schema.get("maxLength")
        return _RAMBLE[:bound] if isinstance(bound, int) else _RAMBLE
    if kind in ("integer", "number"):
        return schema.get("maximum", 1)
    return True


def _prompt_tokens(request: Recorded) -> int:
    """The prompt's size in tokens, counted as 4 characters a token of its messages."""
    return sum(len(json.dumps(m.get("content") or "")) for m in request.messages) // 4 + 1


def _sized(reply: dict[str, Any], prompt: int, room: int | None) -> int:
    """Sets a chat reply's usage from its length (4 characters a token), cutting its text or
    tool arguments at `room` tokens (finish reason "length"); returns the tokens written."""
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices:
        return 0
    message = choices[0]["message"]
    calls = message.get("tool_calls") or []
    text = calls[0]["function"]["arguments"] if calls else (message.get("content") or "")
    written = len(text) // 4 + 1
    if room is not None and written > room:
        text, written = text[: max(room, 0) * 4], max(room, 0)
        if calls:
            calls[0]["function"]["arguments"] = text
        else:
            message["content"] = text
        choices[0]["finish_reason"] = "length"
    reply["usage"] = {"prompt_tokens": prompt, "completion_tokens": written,
                      "total_tokens": prompt + written}
    return written


def _packed(floats: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(floats)}f", *floats)).decode()


class AnyReply(msgspec.Struct):
    """Any JSON object as a `Transport`'s reply (for tests of the transport itself); its tokens
    are its usage's `total_tokens`."""

    usage: dict[str, int] = msgspec.field(default_factory=dict)

    def tokens(self) -> tuple[int | None, int | None]:
        return self.usage.get("total_tokens"), 0


# ---- virtual time ---------------------------------------------------------------------------


class VirtualClock:
    """A `Clock` whose sleeps return at once and move its time forward; records every sleep."""

    def __init__(self) -> None:
        self.time = 0.0
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.time

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.time += seconds
        await anyio.lowlevel.checkpoint()
