"""`mnemo mcp` and `mnemo ui`: the commands that serve a memory to other programs, MCP
clients and a browser. Each imports its server (the `mcp` SDK, the web app) only when run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mnemo.cli._common import app, check_store, model_options, models
from mnemo.cli._database import CliError
from mnemo.cli._settings import Settings
from mnemo.storage.ports import is_postgres


@app.command()
@model_options()
async def mcp(
    *,
    settings: Settings,
    memory_dir: Annotated[Path | None, typer.Option(
        help="Root of the memory files (default: <db>.memory beside the db).",
        file_okay=False)] = None,
    memory_updates: Annotated[bool, typer.Option(
        help="Let persist_memory write memory files (off: it writes nothing).")] = True,
    reinforce: Annotated[bool, typer.Option(
        "--reinforce", help="Count the memories a recall returns as accesses, and mark the "
                            "memory files recall_memory returns used, as an agent's recall "
                            "does.")] = False,
    http: Annotated[
        bool, typer.Option("--http", help="Serve over streamable HTTP (at /mcp) instead of "
                                          "stdin/stdout.")
    ] = False,
    host: Annotated[str | None, typer.Option(
        help="With --http, the address to bind (default 127.0.0.1); any other "
             "needs a token.", show_default=False)] = None,
    port: Annotated[int | None, typer.Option(
        min=0, max=65535, show_default=False,
        help="With --http, the port to listen on (default 8766; 0: a free one).")] = None,
    token: Annotated[str | None, typer.Option(
        "--token", envvar="MNEMO_MCP_TOKEN", show_default=False,
        help="With --http, require this bearer token (16+ characters); prefer "
             "the environment variable, as other users can see a command line.")] = None,
    allow_host: Annotated[list[str] | None, typer.Option(
        "--allow-host", show_default=False,
        help="With --http, also answer requests for this host name (repeatable). "
             "Others are refused, against DNS rebinding.")] = None,
) -> None:
    """Serve the memory to MCP clients over stdin/stdout, or over streamable HTTP with --http
    (created if the file is missing)."""
    if not http and (host, port, allow_host) != (None, None, None):
        raise CliError("--host, --port and --allow-host go with --http")
    try:
        from mnemo.mcp.server import open_tools
        from mnemo.mcp.transport import DEFAULT_HOST, DEFAULT_PORT, Http, serve
    except ImportError as exc:
        raise CliError(
            f"the MCP server needs the `mcp` package ({exc}); install it with "
            "pip install --force-reinstall pymnemo") from exc
    served = Http(host or DEFAULT_HOST, DEFAULT_PORT if port is None else port, token,
                  tuple(allow_host or ())) if http else None
    check_store(settings.store, writes=True)
    if is_postgres(settings.store) and memory_dir is None:
        raise CliError("with a store URL, pass --memory-dir for the memory files")
    async with models(settings) as (chosen_llm, chosen_embedder), open_tools(
            settings.store, llm=chosen_llm, embedder=chosen_embedder, memory_dir=memory_dir,
            memory_updates=memory_updates, reinforce=reinforce, config=settings.config) as tools:
        await serve(tools, served)


@app.command()
@model_options(extraction=False)
async def ui(
    *,
    settings: Settings,
    host: Annotated[
        str, typer.Option(help="The address to bind; anything but 127.0.0.1 shows the memory "
                               "to the network.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="The port to listen on.")] = 8765,
    allow_writes: Annotated[bool, typer.Option(
        "--allow-writes", help="Let the recall playground count its results as "
                               "accesses, and a commit's page revert it.")] = False,
    token: Annotated[str | None, typer.Option(
        "--token", envvar="MNEMO_UI_TOKEN", show_default=False,
        help="Require this access token (16+ characters); prefer the "
             "environment variable, as other users can see a command line.")] = None,
    allow_host: Annotated[list[str] | None, typer.Option(
        "--allow-host", show_default=False,
        help="Also answer requests for this host name (repeatable; '*.domain' "
             "for its subdomains). Others are refused, against DNS rebinding.")] = None,
) -> None:
    """Serve a local web app to browse a memory: repos, graph, history, sessions, threads,
    recall."""
    check_store(settings.store, writes=False)
    try:
        from mnemo.ui import open_view, serve
        from mnemo.ui.guard import Access
    except ImportError as exc:
        raise CliError(
            f"the web app needs the `ui` extra ({exc}); install it with "
            "pip install 'pymnemo[ui]'") from exc
    async with models(settings) as (chosen_llm, chosen_embedder):
        access = Access.bound(host, allow_host or (), token)  # refused before the store opens
        async with open_view(settings.store, allow_writes=allow_writes, llm=chosen_llm,
                             embedder=chosen_embedder) as view:
            await serve(view, access, host=host, port=port, allow_writes=allow_writes)
