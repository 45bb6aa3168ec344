"""The `mnemo` commands that look inside a memory and fill it (see `mnemo.cli`)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import anyio
import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from mnemo.cli._common import (
    Json,
    Where,
    Yes,
    app,
    check_repo,
    confirm,
    model_options,
    open_memory,
    runs,
    store_options,
)
from mnemo.cli._database import CliError
from mnemo.cli._ids import short_ids
from mnemo.cli._output import (
    emit,
    json_text,
    print_json,
    recall_table,
    stderr_console,
    stdout_console,
    table,
)
from mnemo.cli._settings import Settings
from mnemo.graph.model import NodeType
from mnemo.graph.reads import node_types
from mnemo.graph.scope import parse_where
from mnemo.jsonable import hit_json, label, recall_json, session_json
from mnemo.session.machine import State
from mnemo.text import shorten


class ExportFormat(StrEnum):
    JSON = "json"
    GRAPHML = "graphml"


@app.command()
@runs
async def demo(
    db: Annotated[
        Path,
        # Not MNEMO_STORE: the demo deletes its database first, and must not take the user's.
        typer.Option("--store", "--db", help="The demo's SQLite file; made anew (a memory "
                     "already there is deleted once you agree, or with --force).",
                     dir_okay=False),
    ] = Path("demo.db"),
    data: Annotated[Path | None, typer.Option(
        help="A conversation JSON (default: the shipped demo conversation).")] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Delete a memory already at --store without asking.")
    ] = False,
    as_json: Json = False,
) -> None:
    """Replay a week of an assistant's work into a fresh database offline, then recall. Each
    session is also saved as conversation thread `demo/N` (for `mnemo search`)."""
    from mnemo.cli.demo import holds_memory, run_demo

    if holds_memory(db):
        await confirm(f"{db} holds a memory: delete it for good and replay the demo there?",
                      given=force, flag="--force", as_json=as_json)
    summary = await run_demo(db, data, console=Console(quiet=True) if as_json else stdout_console())
    if as_json:
        print_json(summary)


@app.command()
@model_options()
async def ingest(
    file: Annotated[Path, typer.Argument(help="A conversation JSON or a LoCoMo-style file.")],
    repo: Annotated[str | None, typer.Option(
        "--repo", "-r", help="The repo to fill (default: the file's 'repo').")] = None,
    prefix: Annotated[str | None, typer.Option(
        help="Source id prefix for a conversation file (default: its stem).")] = None,
    threads: Annotated[bool, typer.Option(
        help="Also save each session as a conversation thread (for search).")] = True,
    *,
    settings: Settings,
    as_json: Json = False,
) -> None:
    """Ingest a file: each session becomes one source (idempotent: again adds nothing)."""
    from mnemo.cli.ingest import check_sources, ingest_file, load_file
    from mnemo.config import Config
    from mnemo.storage.ports import is_postgres

    if not file.is_file():
        raise CliError(f"no file at {file}")
    parsed = load_file(file, prefix=prefix)
    target = repo or parsed.repo
    if not target:
        raise CliError(f"{file} names no repo: pass --repo")
    given = settings.config or Config()
    if not is_postgres(settings.store) and not await anyio.Path(settings.store).exists():
        check_sources(parsed, given)  # before a new store is made: its repo's config
    async with open_memory(settings, writes=True, works=True) as mem:
        report = await ingest_file(mem, target, parsed, given, threads=threads, quiet=as_json)
    summary = {"repo": target, "format": parsed.shape, "sources": report,
               "created": sum(s["created"] for s in report),
               "nodes": sum(s["nodes"] for s in report)}
    if as_json:
        print_json(summary)
        return
    console = stdout_console()
    console.print(table(
        f"Ingested into {escape(target)} ({parsed.shape})",
        ("source~", "new>~", "nodes>~", "steps>~", "messages saved>~"),
        [(Text(s["source_id"]), "yes" if s["created"] else "no", str(s["nodes"]),
          str(s["steps"]), str(s["messages_saved"])) for s in report]))
    console.print(
        f"{len(report)} sources, {summary['created']} new, {summary['nodes']} nodes")


@app.command()
@model_options(extraction=False)
async def recall(
    repo: Annotated[str, typer.Argument(help="The repo to search.")],
    query: Annotated[str, typer.Argument(help="What to recall.")],
    k: Annotated[int, typer.Option("-k", "--k", min=1, help="How many memories.")] = 10,
    types: Annotated[str | None, typer.Option(
        help="Comma-separated node types, e.g. semantic,episodic (default: all).")] = None,
    reinforce: Annotated[bool, typer.Option(
        "--reinforce", help="Count the memories recalled as accesses, as an "
                            "agent's own recall does (a look counts none).")] = False,
    where: Where = None,
    *,
    settings: Settings,
    as_json: Json = False,
) -> None:
    """Recall a repo's memories for a query: score, short id (for `mnemo show`), type, phase,
    hop and text."""
    wanted = None if types is None else node_types(
        t.strip().lower() for t in types.split(",") if t.strip())
    if wanted == []:
        raise CliError("--types names no node type")
    scope = parse_where(where or ())
    async with open_memory(settings) as mem:
        await check_repo(mem, repo)
        await mem.open_repo(repo)  # checks the embedder makes the repo's dimension
        result = await mem.recall(repo, query, k=k, types=wanted, reinforce=reinforce,
                                  where=scope)
    emit(as_json, recall_json(result), recall_table(result, query))


@app.command()
@store_options
async def sessions(
    every: Annotated[
        bool, typer.Option("--all", help="Also the idle sessions, between episodes (with the "
                                         "goal of their last one).")
    ] = False,
    *,
    settings: Settings,
    as_json: Json = False,
) -> None:
    """List the sessions at work (collecting, extracting, ready or failed) of every process
    on the store: id, repo, state, goal, steps, and who holds its extraction until when."""
    async with open_memory(settings) as mem:
        found = await mem.list_sessions()
    live = [s for s in found if every or s.state is not State.IDLE]
    title = "Live sessions" if every else "Sessions at work"
    idle = len(found) - len(live)
    hidden = f", {idle} idle not shown: --all" if idle else ""
    # An id is shown short, never cut: `mnemo session ...` takes any unique prefix.
    ids = short_ids([s.id for s in live])
    holders = short_ids({s.holder for s in live if s.holder})
    emit(as_json, [session_json(s) for s in live], table(
        f"{title} ({len(live)}{hidden})",
        ("session!", "repo~", "state!", "goal", "steps>!", "holder!", "lease until!"),
        [(ids[s.id], Text(s.repo), label(s.state), Text(shorten(s.goal or "-", 60)),
          str(s.steps), Text(holders[s.holder] if s.holder else "-"),
          "-" if s.lease_until is None else s.lease_until.strftime("%H:%M:%S"))
         for s in live],
        empty=(3, "(no live sessions)" if every else "(no session at work)")))


@app.command()
@store_options
async def graph(
    repo: Annotated[str, typer.Argument(help="The repo whose graph to show.")],
    export: Annotated[ExportFormat | None, typer.Option(
        help="Export every node and link (to stdout, or to --out).")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Write the export here (format from --export or the suffix); an existing file "
             "is replaced once you agree, never the store or what is kept beside it.",
        dir_okay=False)] = None,
    yes: Yes = False,
    *,
    settings: Settings,
    as_json: Json = False,
) -> None:
    """Count a repo's nodes and links by type, or export the graph as JSON or GraphML."""
    fmt = export if export is not None or out is None else {
        ".json": ExportFormat.JSON, ".graphml": ExportFormat.GRAPHML}.get(out.suffix.lower())
    if out is not None and fmt is None:
        raise CliError(f"cannot tell the export format of {out}: pass --export json|graphml")
    from mnemo import disk
    from mnemo.cli import graph as graph_export

    if out is not None and graph_export.is_kept_beside(out, settings.store):
        raise CliError(f"--out {out} is the store or a file mnemo keeps beside it: write the "
                       "export elsewhere")
    async with open_memory(settings) as mem:
        await check_repo(mem, repo)
        if out is not None and out.is_file():
            await confirm(f"{out} exists: replace it with the export?", given=yes,
                          as_json=as_json)
        dumped = graph_export.GraphDump(
            repo, await mem.get_nodes_by_type(repo, list(NodeType)), await mem.links(repo))
    counts = dumped.counts()
    if fmt is not None:
        text = (
            graph_export.to_graphml(dumped) if fmt is ExportFormat.GRAPHML
            else json_text(graph_export.to_json(dumped)))
        if out is None:
            typer.echo(text, nl=False)
            return
        if out.exists() and not out.is_file():  # a device or a pipe: written into
            out.write_text(text, encoding="utf-8")
        else:
            disk.replace_file(out, lambda file: file.write(text.encode("utf-8")))
        stderr_console().print(
            f"wrote {len(dumped.nodes)} nodes and {len(dumped.links)} links to "
            f"{escape(str(out))}")
    shown = table(f"Graph of {escape(repo)}", ("kind", "type", "count>"))
    for kind in ("nodes", "links"):
        for name, n in counts[kind].items():
            shown.add_row(kind[:-1], name, str(n))
        shown.add_row(f"[bold]{kind}", "[bold]total", f"[bold]{sum(counts[kind].values())}")
        shown.add_section()
    emit(as_json, {"repo": repo, **counts, **({"out": str(out)} if out else {})}, shown)


@app.command()
@store_options
async def search(
    query: Annotated[str, typer.Argument(help="Words to find in stored messages.")],
    thread: Annotated[str | None, typer.Option("--thread", "-t", help="Only this thread.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=100, help="How many hits.")] = 5,
    where: Where = None,
    *,
    settings: Settings,
    as_json: Json = False,
) -> None:
    """Search the conversation threads' messages (full text, best first)."""
    scope = parse_where(where or ())
    async with open_memory(settings) as mem:
        hits = await mem.search_messages(query, thread_id=thread, limit=limit, where=scope)
    # The message id shown short, whole: `mnemo view` takes any unique prefix.
    ids = short_ids([h.message_id for h in hits])
    emit(as_json, [hit_json(h) for h in hits], table(
        f"Messages matching: {escape(query)}",
        ("rank~", "thread~", "seq~", "role~", "snippet~", "message~!"),
        [(f"{h.rank:.3g}", Text(h.thread_id), str(h.seq), Text(h.role),
          Text(shorten(h.snippet, 200)), ids[h.message_id]) for h in hits],
        empty=(4, "(no message matches)")))


@app.command()
@store_options
async def purge(
    thread: Annotated[str, typer.Argument(help="The thread to erase.")],
    yes: Yes = False,
    repo: Annotated[str | None, typer.Option(
        help="Also forget the graph source of the same id in this repo "
             "(what `mnemo ingest` made from the session).")] = None,
    *,
    settings: Settings,
    as_json: Json = False,
) -> None:
    """Erase a conversation thread for good: messages, summaries, snapshots, search entries."""
    async with open_memory(settings) as mem:
        conversation = mem.conversation()
        messages = await conversation.count(thread)
        if repo is not None:
            await check_repo(mem, repo)
        elif not messages:
            raise CliError(f"no thread {thread!r} in {settings.store}")
        also = f" and its source in repo {repo!r}" if repo else ""
        await confirm(f"Erase thread {thread!r} ({messages} messages){also} for good?",
                      given=yes, as_json=as_json)
        await conversation.purge(thread)
        forgotten = await mem.forget(repo, thread) if repo is not None else 0
    if repo is not None and not messages and not forgotten:
        raise CliError(f"no thread {thread!r} and no source {thread!r} in repo {repo!r}")
    also = f", {forgotten} nodes forgotten in {repo!r}" if repo is not None else ""
    emit(as_json, {"thread_id": thread, "messages": messages, "nodes_forgotten": forgotten},
         Text(f"purged thread {thread!r}: {messages} messages{also}"))


@app.command()
@model_options(only=("store", "embedder", "config"))
async def forget(
    repo: Annotated[str, typer.Argument(help="The repo to erase from.")],
    source: Annotated[
        str | None, typer.Argument(help="An ingest's source id, or a session's id.")
    ] = None,
    where: Where = None,
    yes: Yes = False,
    *,
    settings: Settings,
    as_json: Json = False,
) -> None:
    """Erase for good what a source committed (`forget`), or everything in a scope
    (`--where user_id=alice`: `forget_where`)."""
    scope = parse_where(where or ())
    if (source is None) == (scope is None):
        raise CliError("give a source id or --where, one of them")
    async with open_memory(settings) as mem:
        await check_repo(mem, repo)
        await mem.open_repo(repo)
        what = f"source {source!r}" if scope is None else f"the scope {scope}"
        await confirm(f"Erase {what} from repo {repo!r} for good?", given=yes, as_json=as_json)
        gone = (await mem.forget(repo, source) if source is not None
                else await mem.forget_where(repo, scope or {}))
    emit(as_json, {"repo": repo, "source": source, "where": scope, "nodes": gone},
         Text(f"erased {what} from {repo!r}: {gone} nodes"))
