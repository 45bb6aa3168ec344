"""`mnemo doctor`: checks the store, the LLM and the embedder the settings choose, with one
small real call each, and prints what it found (exit 1 when a check fails).

The LLM is asked the `"state"` task (one short paragraph, which every provider and the offline
LLM answer) about one line; the embedder embeds one short text. A store that does not exist
is reported, not created.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import typer
from rich.table import Table
from rich.text import Text

from mnemo.adapters.hashing import HashEmbedder
from mnemo.adapters.minilm import default_embedder
from mnemo.adapters.offline import OfflineLLM
from mnemo.adapters.uri import embedder_from_uri, llm_from_uri, model_uri
from mnemo.cli._common import Json, app, check_store
from mnemo.cli._database import CliError
from mnemo.cli._output import print_json, shorten, stdout_console
from mnemo.cli._settings import ConfigOpt, EmbedderOpt, LlmOpt, Settings, StoreOpt, resolve
from mnemo.errors import MnemoError
from mnemo.memory import Memory
from mnemo.ports import LLM, Embedder, LLMRequest

# Each real call gets this long: a slow provider is a finding, not a hang.
CALL_SECONDS = 60.0
PROBE = "The agent ran `nginx -t` and the configuration test passed."


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    ok: bool
    detail: str
    seconds: float

    def as_json(self) -> dict[str, Any]:
        return {"check": self.check, "ok": self.ok, "detail": self.detail,
                "seconds": round(self.seconds, 3)}


async def _probe(check: str, work: Callable[[], Awaitable[str]]) -> Finding:
    start = time.monotonic()
    try:
        with anyio.fail_after(CALL_SECONDS):
            detail = await work()
    except TimeoutError:
        return Finding(check, False, f"no answer within {CALL_SECONDS:.0f} s",
                       time.monotonic() - start)
    except (MnemoError, CliError, OSError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        return Finding(check, False, message, time.monotonic() - start)
    return Finding(check, True, detail, time.monotonic() - start)


async def _close(model: object) -> None:
    close = getattr(model, "aclose", None)
    if close is not None:
        with anyio.move_on_after(2, shield=True):
            await close()


async def diagnose(settings: Settings) -> list[Finding]:
    """One finding each for the store, the LLM and the embedder."""

    async def store() -> str:
        check_store(settings, writes=False)
        async with Memory(settings.store, llm=OfflineLLM(), embedder=HashEmbedder()) as mem:
            repos = await mem.list_repos()
            live = await mem.list_sessions()
        names = ", ".join(repos) if repos else "none"
        return f"{settings.store}: {len(repos)} repos ({names}), {len(live)} live sessions"

    async def llm() -> str:
        model: LLM = llm_from_uri(settings.llm) if settings.llm is not None else OfflineLLM()
        try:
            reply = await model.generate(LLMRequest(
                task="state",
                system="Summarise the environment's state in one short sentence.",
                messages=[{"role": "user", "content": PROBE}],
                max_tokens=40,
            ))
        finally:
            await _close(model)
        return f"{model_uri(model)} answered: {shorten(reply.text or str(reply.data), 80)!r}"

    async def embedder() -> str:
        model: Embedder = (
            embedder_from_uri(settings.embedder) if settings.embedder is not None
            else default_embedder()
        )
        try:
            vectors = await model.embed([PROBE])
        finally:
            await _close(model)
        return f"{model_uri(model)} made a vector of dimension {len(vectors[0])}"

    return [
        await _probe("store", store),
        await _probe("llm", llm),
        await _probe("embedder", embedder),
    ]


@app.command()
def doctor(
    store: StoreOpt = None,
    llm: LlmOpt = None,
    embedder: EmbedderOpt = None,
    config: ConfigOpt = None,
    as_json: Json = False,
) -> None:
    """Check the store, the LLM and the embedder (one small real call each)."""

    try:
        settings = resolve(store=store, llm=llm, embedder=embedder, config=config)
    except CliError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    findings = anyio.run(diagnose, settings)
    if as_json:
        print_json({
            "ok": all(f.ok for f in findings),
            "sources": dict(settings.sources),
            "checks": [f.as_json() for f in findings],
        })
    else:
        table = Table(title="mnemo doctor", title_justify="left")
        table.add_column("check")
        table.add_column("result")
        table.add_column("from")
        table.add_column("found", overflow="fold")
        for f in findings:
            table.add_row(
                f.check, Text("ok", style="green") if f.ok else Text("FAIL", style="bold red"),
                settings.sources.get(f.check, ""), Text(f"{f.detail} ({f.seconds:.2f} s)"),
            )
        stdout_console().print(table)
    if not all(f.ok for f in findings):
        raise typer.Exit(1)
