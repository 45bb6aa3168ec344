"""`mnemo doctor`: checks the distribution, the store, the LLM and the embedder with small real
calls, and unless `--quick` measures an HTTP model's server: its structured-output modes, how
many requests it serves at once, whether each task's reply fits its `max_tokens`, and its speed
with the seconds each task's request then gets; exit 1 on a failure."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Annotated

import anyio
import typer
from rich.console import Console
from rich.text import Text

from mnemo.adapters._http import CHARS_PER_TOKEN, Transport
from mnemo.adapters._model import reply_cap
from mnemo.adapters.anthropic import Anthropic
from mnemo.adapters.hashing import HashEmbedder
from mnemo.adapters.limit import Limit
from mnemo.adapters.minilm import default_embedder
from mnemo.adapters.offline import OfflineLLM
from mnemo.adapters.openai import OpenAICompatible
from mnemo.adapters.uri import embedder_from_uri, llm_from_uri, with_settings
from mnemo.calls.tasks import read_reply
from mnemo.cli._common import Json, app, check_store, close, model_options
from mnemo.cli._database import CliError
from mnemo.cli._output import print_json, stdout_console, table
from mnemo.cli._settings import Settings
from mnemo.episode import RewardReply, reward_request, state_request, subgoal_request
from mnemo.errors import LLMReplyError, MnemoError, first_error
from mnemo.extraction.prompts import procedural_request, semantic_request
from mnemo.memory import Memory
from mnemo.ports import LLM, Embedder, JSONObject, LLMRequest, model_name
from mnemo.text import shorten
from mnemo.version import DISTRIBUTION, foreign_distributions, installed_version

# Each real call (or batch sent at once) gets this long.
CALL_SECONDS = 60.0
PROBE = "The agent ran `nginx -t` and the configuration test passed."
GOAL = "Check the web server's configuration."
AT_ONCE = (1, 2, 4)


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    ok: bool
    detail: str
    seconds: float

    def as_json(self) -> dict[str, object]:
        return {**asdict(self), "seconds": round(self.seconds, 3)}


@dataclass(frozen=True, slots=True)
class TaskFit:
    """One task asked once: the tokens its reply used against its cap (None: not reported)."""

    task: str
    ok: bool
    max_tokens: int
    output_tokens: int | None
    detail: str
    seconds: float
    timeout: float | None = None  # what one request of the task gets, once measured

    @property
    def fits(self) -> bool | None:
        """Whether the reply stayed under its cap (None: the server reported no usage)."""
        if self.output_tokens is None:
            return None
        return self.output_tokens < self.max_tokens

    def as_json(self) -> dict[str, object]:
        out = {**asdict(self), "fits": self.fits, "seconds": round(self.seconds, 3)}
        del out["timeout"]
        return {**out, "timeout_seconds": None if self.timeout is None else round(self.timeout, 1)}


@dataclass(slots=True)
class ServerReport:
    modes: list[Finding] = field(default_factory=list)
    at_once: dict[int, float] = field(default_factory=dict)
    at_once_error: str | None = None
    served_at_once: int | None = None
    concurrency: int | None = None
    tasks: list[TaskFit] = field(default_factory=list)
    tokens_per_second: float | None = None

    @property
    def ok(self) -> bool:
        """Whether mnemo can work with this server: a structured mode works and every task
        was answered (a reply cut at its cap is a warning, not a failure)."""
        return any(m.ok for m in self.modes) and all(t.ok for t in self.tasks)

    def as_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "structured_modes": [m.as_json() for m in self.modes],
            "at_once_seconds": {str(n): round(s, 3) for n, s in self.at_once.items()},
            "at_once_error": self.at_once_error,
            "served_at_once": self.served_at_once,
            "concurrency": self.concurrency,
            "tasks": [t.as_json() for t in self.tasks],
            "tokens_per_second": (None if self.tokens_per_second is None
                                  else round(self.tokens_per_second, 1))}


async def timed(check: str, work: Callable[[], Awaitable[str]]) -> Finding:
    """Runs `work` under `CALL_SECONDS`; its problem, if any, becomes the finding's detail."""
    start = time.monotonic()
    try:
        with anyio.fail_after(CALL_SECONDS):
            ok, detail = True, await work()
    except TimeoutError:
        ok, detail = False, f"no answer within {CALL_SECONDS:.0f} s"
    except (MnemoError, CliError, OSError) as exc:
        ok, detail = False, one_line(exc)
    return Finding(check, ok, detail, time.monotonic() - start)


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def state_probe() -> LLMRequest:
    return state_request(goal=GOAL, observation=PROBE, action="nginx -t", previous_state=None)


async def probe_server(uri: str, llm: LLM) -> ServerReport:
    report = ServerReport(modes=await _modes(uri, llm))
    await _at_once(uri, report)
    report.concurrency = planned_concurrency(llm, report.served_at_once)
    requests = _task_requests()
    report.tasks = [await _fit(llm, request) for request in requests]
    transport = getattr(llm, "transport", None)
    if isinstance(transport, Transport) and transport.limit.unit_seconds:
        report.tokens_per_second = 1 / transport.limit.unit_seconds
        cap = getattr(llm, "max_tokens", 0)
        report.tasks = [
            # The prompt in tokens, counted as the transport estimates it (its JSON).
            replace(fit, timeout=transport.attempt_timeout(
                reply_cap(request.max_tokens, cap),
                len(json.dumps([request.system, request.messages, request.schema]))
                // CHARS_PER_TOKEN))
            for fit, request in zip(report.tasks, requests, strict=True)]
    return report


def planned_concurrency(llm: LLM, served_at_once: int | None) -> int:
    """How many requests mnemo keeps in flight with `llm`: its pinned `concurrency`, else the
    parallel probe's estimate (1 without one), at most its `max_concurrency`."""
    limit = getattr(llm, "concurrency", None)
    if isinstance(limit, Limit) and limit.pinned is not None:
        return limit.pinned
    estimate = served_at_once or 1
    return min(estimate, limit.ceiling) if isinstance(limit, Limit) else estimate


async def _modes(uri: str, llm: LLM) -> list[Finding]:
    findings = []
    request = reward_request(goal=GOAL, subgoal="check the configuration", observation=PROBE,
                             action="nginx -t", next_observation=None)
    modes = (("json_schema", "tool", "json") if isinstance(llm, OpenAICompatible)
             else ("tool",) if isinstance(llm, Anthropic) else ())
    for mode in modes:
        model = llm if isinstance(llm, Anthropic) else llm_from_uri(
            with_settings(uri, structured=mode))

        async def ask(model: LLM = model) -> str:
            try:  # an adapter re-asks a reply that is not JSON for the schema, then raises
                reply = await model.generate(request)
                read_reply(reply, RewardReply, "reward")
            except (ValueError, LLMReplyError) as exc:
                raise CliError(f"the reply is not the task's: {exc}") from exc
            return f"answered {reply.data!r}"

        try:
            findings.append(await timed(mode, ask))
        finally:
            if model is not llm:
                await close(model)
    return findings


async def _at_once(uri: str, report: ServerReport) -> None:
    """Sends 1, 2 and 4 copies of one short request together; records each batch's wall time
    and the estimate of how many the server serves at once."""
    # An adapter of its own, pinned so that every copy goes out at once.
    model = llm_from_uri(with_settings(uri, max_concurrency=max(AT_ONCE), concurrency=max(AT_ONCE)))
    # Each copy short, so that the wait is the server's queue, not the reply: cut on purpose,
    # so the adapter's warnings for it are not shown (an error still is).
    request = replace(state_probe(), schema=None, max_tokens=16)
    logger = logging.getLogger("mnemo")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        # An unmeasured batch first opens every connection and warms the server's prompt cache.
        for n in (max(AT_ONCE), *AT_ONCE):
            start = time.monotonic()
            with anyio.fail_after(CALL_SECONDS), first_error():
                async with anyio.create_task_group() as tg:
                    for _ in range(n):
                        tg.start_soon(model.generate, request)
            report.at_once[n] = time.monotonic() - start
    except TimeoutError:
        report.at_once_error = f"a batch took longer than {CALL_SECONDS:.0f} s"
    except MnemoError as exc:
        report.at_once_error = one_line(exc)
    finally:
        logger.setLevel(level)
        await close(model)
    report.served_at_once = served_at_once(report.at_once)


def served_at_once(walls: dict[int, float]) -> int | None:
    """How many requests the server answers at once, from the wall time of batches of n:
    the best `n * wall(1) / wall(n)`, rounded and at most n (None without wall(1))."""
    one = walls.get(1)
    if not one:
        return None
    return max([1, *(min(n, round(n * one / wall)) for n, wall in walls.items() if wall > 0)])


def _task_requests() -> list[LLMRequest]:
    step: JSONObject = {"index": 0, "observation": PROBE, "action": "nginx -t"}
    subgoal = "check the configuration"
    return [
        state_probe(),
        subgoal_request(goal=GOAL, observation=PROBE, action="nginx -t",
                        previous_subgoal=None, recent_steps=[]),
        reward_request(goal=GOAL, subgoal=subgoal, observation=PROBE, action="nginx -t",
                       next_observation=None),
        semantic_request(goal=GOAL, subgoal=subgoal, steps=[step]),
        procedural_request(goal=GOAL, subgoal=subgoal, steps=[step])]


async def _fit(llm: LLM, request: LLMRequest) -> TaskFit:
    cap = reply_cap(request.max_tokens, getattr(llm, "max_tokens", request.max_tokens or 0))
    used: list[int | None] = [None]

    async def ask() -> str:
        reply = await llm.generate(request)
        # Summed over the re-asks of an unusable reply, if there were any.
        used[0] = reply.usage.output_tokens if reply.usage is not None else None
        return "answered"

    found = await timed(request.task, ask)
    return TaskFit(request.task, found.ok, cap, used[0], found.detail, found.seconds)


async def diagnose(settings: Settings, *,
                   measure: bool = True) -> tuple[list[Finding], ServerReport | None]:
    """One finding each for the store, the LLM and the embedder, and the LLM server's
    measurements (None for the offline LLM, with `measure=False`, or when the LLM failed)."""
    async def package() -> str:
        foreign = foreign_distributions()
        if foreign:
            raise CliError(
                f"{', '.join(foreign)} also installed here, with a `mnemo` package of its own "
                f"that overwrites {DISTRIBUTION}'s files or is overwritten by them: install "
                f"{DISTRIBUTION} in an environment without it")
        return f"{DISTRIBUTION} {installed_version()}"

    async def store() -> str:
        check_store(settings.store, writes=False)
        async with Memory(settings.store, llm=OfflineLLM(), embedder=HashEmbedder(),
                          inspect=True) as mem:
            repos = await mem.list_repos()
            live = await mem.list_sessions()
        names = ", ".join(repos) if repos else "none"
        return f"{settings.store}: {len(repos)} repos ({names}), {len(live)} live sessions"

    built: list[LLM] = []

    async def llm() -> str:
        uri = settings.llm_uri
        model: LLM = llm_from_uri(uri) if uri is not None else OfflineLLM()
        built.append(model)
        reply = await model.generate(state_probe())
        return f"{model_name(model)} answered: {shorten(reply.text or str(reply.data), 80)!r}"

    async def embedder() -> str:
        model: Embedder = (
            embedder_from_uri(settings.embedder) if settings.embedder is not None
            else default_embedder())
        try:
            vectors = await model.embed([PROBE])
        finally:
            await close(model)
        return f"{model_name(model)} made a vector of dimension {len(vectors[0])}"

    findings = [await timed("package", package), await timed("store", store)]
    report: ServerReport | None = None
    try:
        # The LLM finding's time is the latency of its one call.
        findings.append(await timed("llm", llm))
        uri = settings.llm_uri if findings[-1].ok else None
        if measure and uri is not None and not isinstance(built[0], OfflineLLM):
            report = await probe_server(uri, built[0])
    finally:
        for model in built:
            await close(model)
    findings.append(await timed("embedder", embedder))
    return findings, report


@app.command()
@model_options(extraction=False)
async def doctor(
    *,
    settings: Settings,
    quick: Annotated[bool, typer.Option(
        "--quick", help="One call each; do not measure the LLM's server.")] = False,
    as_json: Json = False,
) -> None:
    """Check the store, the LLM and the embedder, and measure the LLM's server: latency,
    structured modes, requests served at once, and whether each task's reply fits."""
    findings, report = await diagnose(settings, measure=not quick)
    ok = all(f.ok for f in findings) and (report is None or report.ok)
    if as_json:
        print_json({
            "ok": ok, "sources": dict(settings.sources), "checks": [f.as_json() for f in findings],
            "server": report.as_json() if report is not None else None})
    else:
        console = stdout_console()
        console.print(table("mnemo doctor", ("check", "result", "from", "found~"), [
            (f.check, _verdict(f.ok, "FAIL"), settings.sources.get(f.check, ""),
             Text(f"{f.detail} ({f.seconds:.2f} s)")) for f in findings]))
        if report is not None:
            _print_server(console, report, findings[2].seconds)
    if not ok:
        raise typer.Exit(1)


def _verdict(ok: bool | None, warn: str = "CUT") -> Text:
    if ok is None:
        return Text("?", style="yellow")
    return Text("ok", style="green") if ok else Text(warn, style="bold red")


def _print_server(console: Console, report: ServerReport, latency: float) -> None:
    shown = table("LLM server", ("measure", "result", "found~"))
    shown.add_row("latency", _verdict(True), f"one call in {latency:.2f} s")
    for mode in report.modes:
        shown.add_row(f"structured: {mode.check}", _verdict(mode.ok, "FAIL"),
                      Text(f"{shorten(mode.detail, 160)} ({mode.seconds:.2f} s)"))
    walls = ", ".join(f"{n} in {report.at_once[n]:.2f} s" for n in AT_ONCE if n in report.at_once)
    if report.at_once_error is not None:
        walls = f"{walls}; then {report.at_once_error}" if walls else report.at_once_error
    served = report.served_at_once
    shown.add_row("requests at once", _verdict(served is not None, "FAIL"),
                  Text(f"{walls} -> serves about {served} at once" if served else walls))
    shown.add_row("concurrency", Text("->"),
                  f"mnemo will keep {report.concurrency} request(s) in flight (probe estimate)")
    for task in report.tasks:
        verdict = _verdict(task.fits) if task.ok else _verdict(False, "FAIL")
        if not task.ok:
            found = shorten(task.detail, 160)
        elif task.output_tokens is None:
            found = f"no token count reported (max_tokens {task.max_tokens})"
        else:
            found = f"{task.output_tokens} of max_tokens {task.max_tokens} tokens" + (
                "" if task.fits else ": the reply reached the cap and was cut")
        if task.timeout is not None:
            found += f"; a request gets {task.timeout:.0f} s"
        shown.add_row(f"task: {task.task}", verdict, Text(f"{found} ({task.seconds:.2f} s)"))
    if report.tokens_per_second is not None:
        shown.add_row("speed", Text("->"), f"about {report.tokens_per_second:.0f} tokens a "
                      "second (a reply's, with a tenth of its prompt's and its overhead): "
                      "a request's time follows it")
    console.print(shown)
