"""`mnemo history REPO`, `mnemo diff COMMIT` and `mnemo revert REPO COMMIT`."""

from __future__ import annotations

from functools import partial
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from mnemo.cli._common import (
    Json,
    SearchedRepo,
    Yes,
    app,
    check_repo,
    confirm,
    open_memory,
    searched_repos,
    store_options,
)
from mnemo.cli._ids import resolve_in_repos, short_ids
from mnemo.cli._output import emit, print_json, stdout_console, table
from mnemo.cli._settings import Settings
from mnemo.errors import InvalidInputError
from mnemo.graph.history import CommitDiff, CommitRecord, goals as commit_goals
from mnemo.graph.model import Node, NodeType
from mnemo.jsonable import commit_json, diff_json, link_json, node_json
from mnemo.memory import Memory
from mnemo.text import shorten

Repo = Annotated[str, typer.Argument(help="The repo.")]
Commit = Annotated[str, typer.Argument(
    help="The commit's id, or a unique prefix of it (see `mnemo history`).")]
# How many of a repo's newest commits a prefix given to `revert` is looked for among.
RESOLVED = 1_000


@app.command()
@store_options
async def history(
        repo: Repo,
        limit: Annotated[int, typer.Option(min=1, help="How many commits, newest first.")] = 20,
        *, settings: Settings, as_json: Json = False) -> None:
    """List a repo's commits, newest first: id, time, session or source and the goal it
    served, what each added."""
    async with open_memory(settings) as mem:
        await check_repo(mem, repo)
        commits = await mem.history(repo, limit=limit)
        goals = await commit_goals(partial(mem.get_node, repo), commits)
    # Ids shown short and whole (`mnemo diff` and `revert` take any unique prefix).
    short = short_ids([c.id for c in commits])
    sessions = short_ids({c.session_id for c in commits if c.session_id})
    emit(as_json, [commit_json(c, goals.get(c.id)) for c in commits], table(
        f"Commits of {escape(repo)} ({len(commits)})",
        ("seq>", "commit!", "time!", "from~", "nodes>", "links>", "retired>"),
        [(str(c.seq), short[c.id], c.committed_at.strftime("%m-%d %H:%M"),
          Text(shorten(origin(c, sessions, goals.get(c.id)), 120)), str(c.node_count),
          str(c.link_count), str(c.retired_count)) for c in commits],
        empty=(1, "(no commits)")))


def origin(commit: CommitRecord, sessions: dict[str, str], goal: str | None) -> str:
    """Where a commit came from, its session (short) or source, the commit it reverts, the
    maintenance it was or the node it corrects, the goal it served, and whether it was
    reverted."""
    origin = (f"session {sessions.get(commit.session_id, commit.session_id)}"
              if commit.session_id else f"source {commit.source_id}" if commit.source_id
              else f"revert of {commit.reverts.removeprefix('changeset_')[:8]}"
              if commit.reverts else f"{commit.maintenance}, {len(commit.removed)} removed"
              if commit.maintenance else f"correction of {commit.corrects}"
              if commit.corrects else "")
    origin = ": ".join(part for part in (origin, goal) if part)
    return f"{origin} (reverted)" if commit.reverted_by else origin


async def _commit_id(mem: Memory, repo: str | None, given: str) -> tuple[str, str]:
    """The repo and commit `given` names: a whole id, or a unique prefix of one of the `RESOLVED`
    newest commits of `repo` (of each repo when None)."""
    whole = given.startswith("changeset_") and len(given) == len("changeset_") + 32
    found: dict[str, list[str]] = {}
    for name in await searched_repos(mem, repo):
        if whole:
            try:
                found[name] = [(await mem.commit_diff(name, given)).commit.id]
            except InvalidInputError:
                found[name] = []
        else:
            found[name] = [c.id for c in await mem.history(name, limit=RESOLVED)]
    return resolve_in_repos(given, found, "commit")


@app.command()
@store_options
async def diff(
    commit: Commit,
    repo: SearchedRepo = None,
    *,
    settings: Settings,
    as_json: Json = False,
) -> None:
    """Show what one commit changed: the nodes it added (by type, short id and text), the
    facts it retired, the intents it reworded and the links it added."""
    async with open_memory(settings) as mem:
        name, commit_id = await _commit_id(mem, repo, commit)
        changed = await mem.commit_diff(name, commit_id)
        goal = (await commit_goals(partial(mem.get_node, name), [changed.commit])).get(
            commit_id)
        reworded = [n for i in changed.commit.reworded
                    if (n := await mem.get_node(name, i)) is not None]
    if as_json:
        print_json({
            "repo": name, "commit": commit_json(changed.commit, goal),
            "added": [node_json(n) for n in changed.nodes],
            "retired": [node_json(n) for n in changed.retired],
            "reworded": [node_json(n) for n in reworded],
            "links": [link_json(link) for link in changed.links]})
        return
    print_diff(name, changed, goal, reworded)


def print_diff(repo: str, changed: CommitDiff, goal: str | None, reworded: list[Node]) -> None:
    """The commit's header, then its nodes and links as tables, each node by its short id."""
    record = changed.commit
    ends = {end for link in changed.links for end in (link.src, link.dst)}
    short = short_ids(
        [*(n.id for n in (*changed.nodes, *changed.retired, *reworded)), *sorted(ends)])
    console = stdout_console()
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column(overflow="fold")
    head.add_row("commit", f"{record.id} ({escape(repo)}, seq {record.seq})")
    head.add_row("date", f"{record.committed_at:%Y-%m-%d %H:%M:%S} UTC")
    head.add_row("from", Text(origin(record, {}, None) or "-"))
    head.add_row("goal", Text(goal or "-"))
    if record.reverts:
        head.add_row("reverts", record.reverts)
    if record.reverted_by:
        head.add_row("reverted", f"by {record.reverted_by}")
    console.print(head)
    gone = record.node_count - len(changed.nodes)
    if gone:
        console.print(Text(f"{gone} of the nodes it added are gone since (forgotten or "
                           "deleted)", style="dim"))
    sections = (("added", changed.nodes, "+"), ("retired", changed.retired, "-"),
                ("reworded", reworded, "~"))
    for title, nodes, mark in sections:
        if nodes:
            console.print(table(
                f"{title} ({len(nodes)})", ("~!", "id~!", "type~!", "text~"),
                [(mark, short[node.id], node.type.value, Text(shorten(node.text, 80)))
                 for node in sorted(nodes, key=lambda n: list(NodeType).index(n.type))],
                box=None))
    if changed.links:
        console.print(table(f"links added ({len(changed.links)})", ("from!", "link!", "to!"),
                            [(short[link.src], link.type.value, short[link.dst])
                             for link in changed.links], box=None))


@app.command()
@store_options
async def revert(
    repo: Repo,
    commit: Commit,
    yes: Yes = False,
    *,
    settings: Settings,
    as_json: Json = False,
) -> None:
    """Undo one commit: its nodes and links go, the facts it retired hold again. Refused when
    a later commit built on it."""
    async with open_memory(settings) as mem:
        _, commit_id = await _commit_id(mem, repo, commit)
        record = (await mem.commit_diff(repo, commit_id)).commit
        if not (record.reverts or record.reverted_by or record.maintenance):  # else refused
            await confirm(
                f"Revert commit {commit_id} of {repo!r}: remove its {record.node_count} "
                f"nodes and {record.link_count} links for good (those another commit "
                "shares stay)?", given=yes, as_json=as_json)
        undone = await mem.revert(repo, commit_id)
        kept = [n.id for n in undone.nodes if await mem.get_node(repo, n.id) is not None]
    emit(as_json, diff_json(undone), Text(
        f"reverted {undone.commit.id} (revert {undone.commit.reverted_by}): "
        f"{len(undone.nodes) - len(kept)} nodes removed, {len(kept)} shared with other "
        f"commits kept, {undone.commit.retired_count} facts restored"))
