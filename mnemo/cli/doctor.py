"""`mnemo doctor`: checks the distribution, the store, the LLM and the embedder with small real
calls, and unless `--quick` measures an HTTP model's server (`_probe`); exit 1 on a failure."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from mnemo.adapters.hashing import HashEmbedder
from mnemo.adapters.minilm import default_embedder
from mnemo.adapters.offline import OfflineLLM
from mnemo.adapters.uri import embedder_from_uri, llm_from_uri
from mnemo.cli._common import Json, app, check_store, close, model_options
from mnemo.cli._database import CliError
from mnemo.cli._output import print_json, stdout_console, table
from mnemo.cli._probe import AT_ONCE, PROBE, Finding, ServerReport, probe_server, state_probe, timed
from mnemo.cli._settings import Settings
from mnemo.memory import Memory
from mnemo.ports import LLM, Embedder, model_name
from mnemo.text import shorten
from mnemo.version import DISTRIBUTION, foreign_distributions, installed_version


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
