"""The history pages: a repo's commits, what one changed, and (with `--allow-writes`) undoing
one by a POST from the commit's page."""

from __future__ import annotations

from functools import partial

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from mnemo.errors import InvalidInputError
from mnemo.graph.history import CommitDiff, goals as commit_goals
from mnemo.graph.model import Link, Node, NodeType
from mnemo.ui.render import form, href, known_repo, page, required, view_of, whole
from mnemo.ui.source import MemorySource

MAX_COMMITS = 1000
# A commit's page lists at most this many links (an ingest of a long document adds thousands).
MAX_LINKS_SHOWN = 300


async def history(request: Request) -> Response:
    """A repo's commits, newest first: each one's id (to its diff), time, origin (the session
    or source, and the goal it served) and counts."""
    view = view_of(request)
    params = request.query_params
    repo = await known_repo(view, params)
    limit = whole(params, "limit", 50, low=1, high=MAX_COMMITS)
    commits = await view.memory.history(repo, limit=limit)
    more = min(limit * 2, MAX_COMMITS) if len(commits) == limit < MAX_COMMITS else None
    goals = await commit_goals(partial(view.memory.get_node, repo), commits)
    return page(
        request,
        "history.html",
        {
            "repo": repo, "commits": commits, "goals": goals, "more": more,
            "reverted": params.get("reverted", "")})


async def commit(request: Request) -> Response:
    """One commit: the nodes and links it added, the facts it retired, the intents it reworded,
    and the revert form when writes are allowed."""
    view = view_of(request)
    params = request.query_params
    repo = await known_repo(view, params)
    diff = await view.commit_diff(repo, required(params, "id"))
    shown = diff.links[:MAX_LINKS_SHOWN]
    texts = await _texts(view, repo, diff, shown)
    reworded = [n for n in [await view.memory.get_node(repo, i) for i in diff.commit.reworded]
                if n]
    goal = (await commit_goals(partial(view.memory.get_node, repo), [diff.commit])).get(
        diff.commit.id)
    return page(
        request,
        "commit.html",
        {
            "repo": repo, "diff": diff, "record": diff.commit, "goal": goal,
            "nodes_by_type": [(t, nodes) for t in NodeType
                              if (nodes := [n for n in diff.nodes if n.type is t])],
            "links": [(link, texts.get(link.src), texts.get(link.dst)) for link in shown],
            "links_hidden": len(diff.links) - len(shown),
            "gone": diff.commit.node_count - len(diff.nodes), "reworded": reworded})


async def _texts(view: MemorySource, repo: str, diff: CommitDiff,
                 links: list[Link]) -> dict[str, Node | None]:
    known: dict[str, Node | None] = {n.id: n for n in (*diff.nodes, *diff.retired)}
    for end in (end for link in links for end in (link.src, link.dst)):
        if end not in known:
            known[end] = await view.memory.get_node(repo, end)
    return known


async def revert(request: Request) -> Response:
    """Undoes the commit a form names, then shows the history (403 without `--allow-writes`;
    InvalidInputError for a malformed form or an unticked box; ConflictError, 409, when later
    work built on the commit)."""
    if not request.app.state.allow_writes:
        refused = "this web app is read-only: start it with --allow-writes to revert a commit"
        return page(request, "error.html", {"error": refused, "status": 403}, 403)
    fields = await form(request)
    view = view_of(request)
    repo = await known_repo(view, fields)
    commit_id = required(fields, "id")
    if fields.get("confirm") != "yes":
        raise InvalidInputError("tick the box to confirm the revert")
    await view.revert(repo, commit_id)
    return RedirectResponse(href("/history", repo=repo, reverted=commit_id), status_code=303)
