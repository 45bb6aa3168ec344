"""`mnemo history REPO` and `mnemo revert REPO COMMIT`: a repo's commits, newest first, and
undoing one. Both act through the `Memory` facade, so they read any store."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from mnemo.cli._common import Json, app, check_repo, open_memory, run
from mnemo.cli._ids import resolve_id, short_ids
from mnemo.cli._output import print_json, shorten, stdout_console
from mnemo.cli._settings import ConfigOpt, StoreOpt, resolve
from mnemo.jsonable import commit_json, diff_json
from mnemo.memory import Memory

Repo = Annotated[str, typer.Argument(help="The repo.")]
# How many of a repo's newest commits a prefix given to `revert` is looked for among.
RESOLVED = 1_000


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
        # Ids shown short and whole (`mnemo revert` takes any unique prefix).
        table.add_column("commit", no_wrap=True)
        table.add_column("time", no_wrap=True)
        table.add_column("from", no_wrap=True)
        for column in ("nodes", "links", "retired"):
            table.add_column(column, justify="right")
        short = short_ids([c.id for c in commits], kind=False)
        sessions = short_ids({c.session_id for c in commits if c.session_id}, kind=False)
        for c in commits:
            origin = (f"session {sessions[c.session_id]}" if c.session_id
                      else f"source {c.source_id}" if c.source_id
                      else f"revert of {c.reverts.removeprefix('changeset_')[:8]}"
                      if c.reverts else "")
            origin += " (reverted)" if c.reverted_by else ""
            table.add_row(
                str(c.seq), short[c.id], c.committed_at.strftime("%m-%d %H:%M"),
                Text(shorten(origin, 60)), str(c.node_count), str(c.link_count),
                str(c.retired_count),
            )
        if not commits:
            table.add_row("", Text("(no commits)", style="dim"), "", "", "", "", "")
        stdout_console().print(table)

    run(work)


async def _commit_id(mem: Memory, repo: str, given: str) -> str:
    """The commit `given` names: its id, or a unique prefix of one of the repo's newest
    `RESOLVED` commits (an older one is named by its whole id)."""
    if given.startswith("changeset_") and len(given) == len("changeset_") + 32:
        return given
    newest = await mem.history(repo, limit=RESOLVED)
    return resolve_id(given, [c.id for c in newest], "commit")


@app.command()
def revert(
    repo: Repo,
    commit: Annotated[
        str, typer.Argument(help="The commit's id, or a unique prefix of it (see `mnemo "
                                 "history`).")
    ],
    store: StoreOpt = None,
    config: ConfigOpt = None,
    as_json: Json = False,
) -> None:
    """Undo one commit: its nodes and links go, the facts it retired hold again. Refused when
    a later commit built on it."""

    async def work() -> None:
        async with open_memory(resolve(store=store, config=config)) as mem:
            await check_repo(mem, repo)
            undone = await mem.revert(repo, await _commit_id(mem, repo, commit))
        if as_json:
            print_json(diff_json(undone))
            return
        stdout_console().print(Text(
            f"reverted {undone.commit.id}: {undone.commit.node_count} nodes and "
            f"{undone.commit.link_count} links removed, {undone.commit.retired_count} facts "
            "restored"
        ))

    run(work)
