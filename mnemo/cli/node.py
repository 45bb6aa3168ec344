"""`mnemo show ID`: one node whole, where it came from (steps, episode, session or source), the
nodes linked to it by link type, and the commits that touched it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Annotated

import typer
from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from mnemo.cli._common import Json, SearchedRepo, app, open_memory, searched_repos, store_options
from mnemo.cli._database import CliError
from mnemo.cli._ids import resolve_in_repos, short_ids
from mnemo.cli._output import emit, table
from mnemo.cli._settings import Settings
from mnemo.cli.history import RESOLVED, origin
from mnemo.graph.history import CommitRecord, goals as commit_goals
from mnemo.graph.model import LinkType, Node, NodeType, steps_of
from mnemo.jsonable import commit_json, fields, node_json
from mnemo.memory import Memory
from mnemo.text import shorten

# Linked nodes the table lists for each link type (the JSON lists them all), and steps.
MAX_LISTED = 10
# The newest commits read first for a node's history; older ones only when it is older.
RECENT = 50


@dataclass(frozen=True, slots=True)
class NodeReport:
    """What `mnemo show` prints: the node, its provenance, its links and the commits that touched
    it (`complete` is False when older commits were not read)."""

    repo: str
    node: Node
    steps: list[Node]
    sources: list[Node]
    linked: dict[LinkType, list[Node]]
    history: list[tuple[CommitRecord, list[str]]]
    goals: dict[str, str]
    complete: bool

    @property
    def superseded_by(self) -> list[Node]:
        """The facts that retired this one (SUPERSEDES links to later facts)."""
        return [n for n in self.linked.get(LinkType.SUPERSEDES, [])
                if n.created_at > self.node.created_at]

    @property
    def supersedes(self) -> list[Node]:
        return [n for n in self.linked.get(LinkType.SUPERSEDES, [])
                if n.created_at <= self.node.created_at]


async def node_report(mem: Memory, repo: str, node: Node) -> NodeReport:
    linked = {kind: await mem.get_linked_nodes(repo, [node.id], kind) for kind in LinkType}
    steps = steps_of(node, linked[LinkType.PROVENANCE])
    if node.type is NodeType.SOURCE:
        sources = [node]
    else:
        ends = await mem.get_linked_nodes(repo, [s.id for s in steps], LinkType.PROVENANCE) \
            if steps else []
        sources = [n for n in ends if n.type is NodeType.SOURCE]
    commits, complete = await _commits(mem, repo, node)
    history = [(c, changes) for c in reversed(commits) if (changes := _changes(c, node.id))]
    goals = await commit_goals(partial(mem.get_node, repo), [c for c, _ in history])
    return NodeReport(repo, node, steps, sources, linked, history, goals, complete)


async def _commits(mem: Memory, repo: str, node: Node) -> tuple[list[CommitRecord], bool]:
    """The newest commits back to the one that added `node` (no earlier one touches it),
    at most `RESOLVED`, and whether they reach it."""
    for limit in (RECENT, RESOLVED):
        commits = await mem.history(repo, limit=limit)
        reached = len(commits) < limit or commits[-1].committed_at <= node.created_at
        if reached:
            break
    return commits, reached


def _changes(commit: CommitRecord, node_id: str) -> list[str]:
    """What `commit` did to the node: added, joined (said it again), retired, reworded it, or
    linked it."""
    changes = [what for what, ids in (("added", commit.node_ids), ("joined", commit.joined),
                                      ("retired", commit.retired),
                                      ("reworded", commit.reworded)) if node_id in ids]
    if not changes:
        linked = sum(node_id in (link.src, link.dst) for link in commit.links)
        if linked:
            changes.append(f"linked ({linked} link{'s' if linked > 1 else ''})")
    return changes


@app.command()
@store_options
async def show(
    node_id: Annotated[
        str, typer.Argument(metavar="ID", help="The node's id, or a unique prefix of it or "
                            "of its digits (the short id `mnemo recall` shows).")],
    repo: SearchedRepo = None,
    *,
    settings: Settings,
    as_json: Json = False,
) -> None:
    """Show one node: its text, data and validity, where it came from (steps, episode,
    session or source), the nodes linked to it, and the commits that added or changed it."""
    async with open_memory(settings) as mem:
        repos = await searched_repos(mem, repo)
        ids = {name: await mem.node_ids(name, node_id.strip(), limit=100)
               for name in repos} if node_id.strip() else {}
        name, found = resolve_in_repos(node_id, ids, "node")
        node = await mem.get_node(name, found)
        if node is None:  # erased since its id was read
            raise CliError(f"no node {node_id!r}")
        report = await node_report(mem, name, node)
    emit(as_json, report_json(report), report_text(report))


def report_json(report: NodeReport) -> dict[str, object]:
    node = report.node
    successor = max(report.superseded_by, key=lambda n: n.created_at, default=None)
    return {
        "repo": report.repo,
        "node": {
            **node_json(node), **fields(node, "valid_from valid_to recorded_at retired_at retired"),
            "superseded_by": None if successor is None else successor.id,
            "supersedes": [n.id for n in report.supersedes]},
        "provenance": {"steps": [node_json(s) for s in report.steps],
                       "sources": [node_json(s) for s in report.sources]},
        "links": {kind.value: [fields(n, "id type text") for n in nodes]
                  for kind, nodes in report.linked.items() if nodes},
        "history": [{**commit_json(c, report.goals.get(c.id)), "changes": changes}
                    for c, changes in report.history],
        "history_complete": report.complete}


def report_text(report: NodeReport) -> Group:
    """The report for a person: the node's fields, then Provenance, Links and History."""
    node = report.node
    listed = {kind: nodes[:MAX_LISTED] for kind, nodes in report.linked.items()}
    short = short_ids(
        [node.id, *(n.id for n in (*report.steps, *report.sources, *report.superseded_by,
                                    *report.supersedes)),
         *(n.id for nodes in listed.values() for n in nodes)])
    sessions = short_ids(
        {*(str(s.data["session_id"]) for s in report.sources if s.data.get("session_id")),
         *(c.session_id for c, _ in report.history if c.session_id)})
    commits = short_ids([c.id for c, _ in report.history])
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold", no_wrap=True)
    fields.add_column(overflow="fold")
    fields.add_row("id", node.id)
    fields.add_row("repo", Text(report.repo))
    fields.add_row("created", f"{node.created_at:%Y-%m-%d %H:%M:%S} UTC")
    if node.valid_from or node.valid_to:
        until = f"{node.valid_to:%Y-%m-%d %H:%M:%S}" if node.valid_to else "now"
        start = f"{node.valid_from:%Y-%m-%d %H:%M:%S}" if node.valid_from else "?"
        fields.add_row("valid", f"{start} to {until} (UTC)")
    if node.retired_at is not None:
        fields.add_row("retired", f"{node.retired_at:%Y-%m-%d %H:%M:%S} UTC")
    for title, nodes in (("superseded by", report.superseded_by),
                         ("supersedes", report.supersedes)):
        for other in nodes:
            fields.add_row(title, Text(f"{short[other.id]} {shorten(other.text, 80)}"))
    for key, value in sorted(node.data.items()):
        fields.add_row(Text(key, style="dim"), Text(shorten(str(value), 300)))
    parts: list[RenderableType] = [
        Text.assemble((f"{node.type.value} {short[node.id]}", "bold"),
                      (" (retired)" if node.retired else "", "red")),
        Text(node.text), fields]
    if report.sources or report.steps:
        table = _section("Provenance", 3)
        for source in report.sources:
            session = source.data.get("session_id")
            where = (f"session {sessions[str(session)]}" if session
                     else f"source {source.data.get('source_id', '?')}")
            table.add_row("source", short[source.id], Text(f"{where}: {source.text}"))
        for step in report.steps[:MAX_LISTED]:
            line = f"#{step.data.get('index', '?')} {step.text}"
            table.add_row("step", short[step.id], Text(shorten(line, 200)))
        _more(table, len(report.steps))
        parts.append(table)
    links = _section("Links", 4)
    for kind, nodes in report.linked.items():
        for number, other in enumerate(listed[kind]):
            links.add_row(f"{kind.value} ({len(nodes)})" if number == 0 else "",
                          short[other.id], other.type.value, Text(shorten(other.text, 70)))
        _more(links, len(nodes), 4)
    if not any(report.linked.values()):
        links.add_row("", "", "", Text("(no link)", style="dim"))
    parts.append(links)
    history = _section("History", 4)
    for commit, changes in report.history:
        history.add_row(commits[commit.id], f"{commit.committed_at:%Y-%m-%d %H:%M}",
                        ", ".join(changes),
                        Text(shorten(origin(commit, sessions, report.goals.get(commit.id)),
                                     120)))
    if not report.complete:
        history.add_row("", "", "", Text(f"(only the newest {RESOLVED:,} commits were read)",
                                         style="dim"))
    elif not report.history:
        history.add_row("", "", "", Text("(no commit names it)", style="dim"))
    parts.append(history)
    return Group(*parts)


def _section(title: str, columns: int) -> Table:
    return table(f"\n{escape(title)}", ("~!",) * (columns - 1) + ("~",), box=None,
                 show_header=False, title_style="bold")


def _more(table: Table, count: int, width: int = 3) -> None:
    if count > MAX_LISTED:
        table.add_row(*[""] * (width - 1), Text(f"and {count - MAX_LISTED} more (--json "
                                                "lists them all)", style="dim"))
