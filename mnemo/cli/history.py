"""`mnemo history REPO` and `mnemo revert REPO COMMIT`: a repo's commits, newest first, and
undoing one (issue 14). Both act through the `Memory` facade, so they read any store."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from mnemo.cli._common import Json, app, check_repo, open_memory, run
from mnemo.cli._output import print_json, shorten, stdout_console
from mnemo.cli._settings import ConfigOpt, StoreOpt, resolve
from mnemo.jsonable import commit_json, diff_json

Repo = Annotated[str, typer.Argument(help="The repo.")]


@app.command()
def history(
    repo: Repo,
    limit: Annotated[int, typer.Option(min=1, help="How many commits, newest first.")] = 20,
    store: StoreOpt = None,
    config: ConfigOpt = None,
    as_json: Json = False,
) -> None:
    """List a repo's commits, newest first: id, time, session or source, what each added."""

    async def work() -> None:
        async with open_memory(resolve(store=store, config=config)) as mem:
            await check_repo(mem, repo)
            commits = await mem.history(repo, limit=limit)
        if as_json:
            print_json([commit_json(c) for c in commits])
            return
        table = Table(title=f"Commits of {escape(repo)} ({len(commits)})", title_justify="left")
        table.add_column("seq", justify="right")
        for column in ("commit", "time", "from"):
            table.add_column(column, overflow="fold")
        for column in ("nodes", "links", "retired"):
            table.add_column(column, justify="right")
        for c in commits:
            origin = (f"session {c.session_id}" if c.session_id
                      else f"source {c.source_id}" if c.source_id else "")
            table.add_row(
                str(c.seq), c.id, c.committed_at.isoformat(timespec="seconds"),
                Text(shorten(origin, 60)), str(c.node_count), str(c.link_count),
                str(c.retired_count),
            )
        if not commits:
            table.add_row("", Text("(no commits)", style="dim"), "", "", "", "", "")
        stdout_console().print(table)

    run(work)


@app.command()
def revert(
    repo: Repo,
    commit: Annotated[str, typer.Argument(help="The commit's id (see `mnemo history`).")],
    store: StoreOpt = None,
    config: ConfigOpt = None,
    as_json: Json = False,
) -> None:
    """Undo one commit: its nodes and links go, the facts it retired hold again. Refused when
    a later commit built on it."""

    async def work() -> None:
        async with open_memory(resolve(store=store, config=config)) as mem:
            await check_repo(mem, repo)
            undone = await mem.revert(repo, commit)
        if as_json:
            print_json(diff_json(undone))
            return
        stdout_console().print(Text(
            f"reverted {undone.commit.id}: {undone.commit.node_count} nodes and "
            f"{undone.commit.link_count} links removed, {undone.commit.retired_count} facts "
            "restored"
        ))

    run(work)
