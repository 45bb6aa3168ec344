"""`mnemo ui`: a small local web app over a memory (Starlette, Jinja2, vendored htmx), pages
rendered on the server from a `MemorySource`, behind a `Gate` (`mnemo.ui.guard`); with
`allow_writes`, two POSTs write."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.datastructures import ImmutableMultiDict
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from mnemo.errors import (
    MAX_TOKEN_BUDGET,
    ConflictError,
    InvalidInputError,
    MnemoError,
    NotFoundError,
)
from mnemo.graph.history import CommitDiff, goals as commit_goals
from mnemo.graph.model import Link, LinkType, Node, NodeType, steps_of
from mnemo.graph.reads import node_types
from mnemo.graph.scope import parse_where
from mnemo.jsonable import label
from mnemo.ports import JSONObject
from mnemo.tools import clip
from mnemo.ui.drawing import NARROW, WIDE, neighbourhood, picture, shape
from mnemo.ui.guard import Access, Gate
from mnemo.ui.source import LinkedNode, MemorySource

HERE = Path(__file__).parent
# A form the app's pages post is a few short fields: more is not one of them.
MAX_FORM_BYTES = 16_384
MAX_FORM_FIELDS = 32
FORM_TYPE = "application/x-www-form-urlencoded"
# The history page lists at most this many commits.
MAX_COMMITS = 1000
# A commit's page lists at most this many links (an ingest of a long document adds thousands).
MAX_LINKS_SHOWN = 300
# The graph page lists this many of the newest nodes of a type; the thread page, of messages.
LIST_LIMIT = 100
# The graph page's picture: the newest facts and procedures and the nodes two links away.
PICTURE_SEEDS = 24
PICTURE_NODES = 160
PICTURE_HOPS = 2
# The thread page's default budget: a typical agent's context share for its history.
DEFAULT_BUDGET = 8000

_STATUS = ((NotFoundError, 404), (InvalidInputError, 400), (ConflictError, 409))
ViewFactory = Callable[[], AbstractAsyncContextManager[MemorySource]]

Params = ImmutableMultiDict[str, str]


def href(path: str, **params: object) -> str:
    """`path` with the non-None params as its query string."""
    query = urlencode({k: str(v) for k, v in params.items() if v is not None})
    return f"{path}?{query}" if query else path


def short_id(value: str, keep: int = 8, prefix: bool = True) -> str:
    """An id cut after `keep` characters of its hex part (`changeset_c244a5fd…`)."""
    head, sep, rest = value.rpartition("_")
    if not prefix:
        head = sep = ""
    if len(rest) <= keep + 1:
        return head + sep + rest
    return f"{head}{sep}{rest[:keep]}…"


_env = Environment(loader=FileSystemLoader(HERE / "templates"),
                   autoescape=select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True)
_env.globals.update(href=href, shape=shape)
_env.filters.update(label=label, short_id=short_id, short=clip)
TEMPLATES = Jinja2Templates(env=_env)


def view_of(request: Request) -> MemorySource:
    view: MemorySource = request.app.state.view
    return view


def page(request: Request, name: str, context: Mapping[str, object],
         status_code: int = 200) -> Response:
    """The template `name` rendered with `context` (and whether writes are allowed)."""
    return TEMPLATES.TemplateResponse(
        request, name, {"allow_writes": request.app.state.allow_writes, **context},
        status_code=status_code)


async def form(request: Request) -> Params:
    """The fields of a POSTed URL-encoded form, within `MAX_FORM_BYTES` and `MAX_FORM_FIELDS`
    (InvalidInputError)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != FORM_TYPE:
        raise InvalidInputError(f"a form must be sent as {FORM_TYPE}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise InvalidInputError(f"a form holds at most {MAX_FORM_BYTES} bytes")
    try:
        fields = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True,
                           max_num_fields=MAX_FORM_FIELDS)
    except ValueError:
        raise InvalidInputError(f"a form holds at most {MAX_FORM_FIELDS} fields") from None
    return ImmutableMultiDict(fields)


def required(params: Params, name: str) -> str:
    """The parameter `name`, which must not be blank (InvalidInputError)."""
    value = params.get(name, "")
    if not value.strip():
        raise InvalidInputError(f"the parameter {name!r} is required")
    return value


def whole(params: Params, name: str, default: int, *, low: int, high: int) -> int:
    """The parameter `name` as a whole number in [low, high], `default` when absent."""
    raw = params.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInputError(f"{name} must be a whole number, got {raw[:40]!r}") from None
    if not low <= value <= high:
        raise InvalidInputError(f"{name} must be between {low} and {high}, got {value}")
    return value


async def known_repo(view: MemorySource, params: Params) -> str:
    """The `repo` parameter, a repo of the memory (InvalidInputError, NotFoundError)."""
    repo = required(params, "repo")
    if repo not in await view.memory.list_repos():
        raise NotFoundError("repo", repo)
    return repo


def create_app(view: MemorySource | None = None, *, open_view: ViewFactory | None = None,
               allow_writes: bool = False, access: Access | None = None) -> Starlette:
    """The web app over `view`, or over the view `open_view` opens for the app's life (exactly one,
    else InvalidInputError); `allow_writes` adds the POSTs, `access` the hosts and token."""
    if (view is None) == (open_view is None):
        raise InvalidInputError("create_app takes exactly one of view and open_view")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if open_view is None:
            yield
            return
        async with open_view() as opened:
            app.state.view = opened
            yield

    app = Starlette(
        routes=[
            Route("/", index, name="index"), Route("/graph", graph, name="graph"),
            Route("/node", node_page, name="node"),
            Route("/recall", recall, name="recall", methods=["GET", "POST"]),
            Route("/history", history, name="history"),
            Route("/commit", commit, name="commit"),
            Route("/revert", revert, name="revert", methods=["POST"]),
            Route("/sessions", sessions, name="sessions"),
            Route("/session", session_page, name="session"),
            Route("/threads", threads, name="threads"),
            Route("/thread", thread_page, name="thread"),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static")],
        middleware=[Middleware(Gate, access=access or Access())],
        exception_handlers={MnemoError: _mnemo_error},
        lifespan=lifespan)
    app.state.allow_writes = allow_writes
    # Set now, so that a client running no lifespan (httpx's ASGITransport) has it.
    app.state.view = view
    return app


async def _mnemo_error(request: Request, exc: Exception) -> Response:
    status = next((code for kind, code in _STATUS if isinstance(exc, kind)), 500)
    return page(request, "error.html", {"error": exc, "status": status}, status)


async def index(request: Request) -> Response:
    mem = view_of(request).memory
    return page(request, "index.html", {"repos": await mem.list_repos(),
                                        "sessions": await mem.list_sessions(),
                                        "threads": await mem.list_threads()})


async def graph(request: Request) -> Response:
    """A repo's graph: a picture of its newest facts and procedures (or around `focus`), a search
    box, the newest nodes of one type, its tags and intents."""
    view = view_of(request)
    mem, params = view.memory, request.query_params
    repo = await known_repo(view, params)
    shown = node_types([params.get("type", NodeType.SEMANTIC.value)])[0]
    query, where = params.get("q", "").strip(), params.get("where", "")
    found = (await mem.search_nodes(repo, query, limit=50, where=scope_of(where))
             if query else None)
    focus = None
    if params.get("focus", "").strip():
        focus = await mem.get_node(repo, params["focus"])
        if focus is None:
            raise NotFoundError("node", params["focus"])
    seeds = [focus] if focus else await mem.latest(
        repo, types=[NodeType.SEMANTIC, NodeType.PROCEDURAL], top_k=PICTURE_SEEDS)
    nodes, links = await subgraph(view, repo, seeds, hops=PICTURE_HOPS, limit=PICTURE_NODES)
    return page(request, "graph.html", {
        "repo": repo, "query": query, "where": where, "found": found, "shown": shown,
        "types": list(NodeType), "focus": focus,
        "picture": picture(nodes, links, focus.id if focus else None),
        "nodes": await mem.latest(repo, types=[shown], top_k=LIST_LIMIT),
        "tags": await mem.get_nodes_by_type(repo, [NodeType.TAG]),
        "intents": await mem.get_nodes_by_type(repo, [NodeType.INTENT])})


async def subgraph(view: MemorySource, repo: str, seeds: list[Node], *, hops: int,
                   limit: int) -> tuple[list[Node], list[tuple[str, str, LinkType]]]:
    """The seeds and the nodes up to `hops` links away (nearest first, at most `limit` in
    all), and every link among them, each once (its ends in sorted order)."""
    nodes = {node.id: node for node in seeds[:limit]}
    links: set[tuple[str, str, LinkType]] = set()
    frontier = list(nodes)
    for hop in range(hops + 1):
        reached = []
        for node_id in frontier:
            for linked in await view.links(repo, node_id):
                other = linked.node.id
                # The last round reads the links of the nodes reached last: among them only.
                if other not in nodes and len(nodes) < limit and hop < hops:
                    nodes[other] = linked.node
                    reached.append(other)
                if other in nodes:
                    low, high = sorted((node_id, other))
                    links.add((low, high, linked.link_type))
        frontier = reached
    return list(nodes.values()), sorted(links)


async def node_page(request: Request) -> Response:
    """One node: its text, data, neighbourhood drawing, links by type and provenance."""
    view = view_of(request)
    repo = await known_repo(view, request.query_params)
    node_id = required(request.query_params, "id")
    node = await view.memory.get_node(repo, node_id)
    if node is None:
        raise NotFoundError("node", node_id)
    links = await view.links(repo, node_id)
    by_type: dict[LinkType, list[LinkedNode]] = {}
    for linked in links:
        by_type.setdefault(linked.link_type, []).append(linked)
    steps = steps_of(node, [linked.node for linked in by_type.get(LinkType.PROVENANCE, [])])
    return page(request, "node.html", {
        "repo": repo, "node": node, "links": by_type, "steps": steps,
        "step_sessions": await _sessions_of(view, steps), "members": _members(node, by_type),
        "drawings": {"wide": neighbourhood(node, links, layout=WIDE),
                     "narrow": neighbourhood(node, links, layout=NARROW)}})


async def _sessions_of(view: MemorySource, steps: list[Node]) -> dict[str, str]:
    """Episode id -> the session that stored it, for the episodes of these steps (an
    ingest's episodes have none)."""
    ids = {str(s.data.get("episode_id", "")) for s in steps} - {""}
    found = {episode_id: await view.memory.episode(episode_id) for episode_id in ids}
    return {episode_id: e.session_id for episode_id, e in found.items() if e is not None}


def _members(node: Node, links: dict[LinkType, list[LinkedNode]]) -> list[Node]:
    """The facts of a tag, the procedures of an intent: what the routing node leads to."""
    if node.type is NodeType.TAG:
        wanted, kind = LinkType.MEMBERSHIP, NodeType.SEMANTIC
    elif node.type is NodeType.INTENT:
        wanted, kind = LinkType.HIERARCHICAL, NodeType.PROCEDURAL
    else:
        return []
    return [linked.node for linked in links.get(wanted, []) if linked.node.type is kind]


async def recall(request: Request) -> Response:
    """The recall playground; a POST (with `allow_writes` only) counts its results as accesses."""
    view = view_of(request)
    writing = request.method == "POST"
    if writing and not request.app.state.allow_writes:
        refused = "this web app is read-only: start it with --allow-writes to count accesses"
        return page(request, "error.html", {"error": refused, "status": 403}, 403)
    params: Params = await form(request) if writing else request.query_params
    repo = await known_repo(view, params)
    query, where = params.get("q", "").strip(), params.get("where", "")
    k = whole(params, "k", 10, low=1, high=50)
    types = node_types(params.getlist("types"))
    result = (await view.recall(repo, query, k, types or None, reinforce=writing,
                                where=scope_of(where)) if query else None)
    return page(request, "recall.html", {
        "repo": repo, "query": query, "where": where, "k": k, "types": list(NodeType),
        "chosen": types, "result": result, "counted": writing})


async def sessions(request: Request) -> Response:
    return page(request, "sessions.html",
                {"sessions": await view_of(request).memory.list_sessions()})


async def session_page(request: Request) -> Response:
    """A session: its state (live or ended), and each stored episode's trajectories and
    steps."""
    mem = view_of(request).memory
    session_id = required(request.query_params, "id")
    live = {s.id: s for s in await mem.list_sessions()}
    episodes = await mem.episodes(session_id)
    if not episodes and session_id not in live:
        raise NotFoundError("session", session_id)
    return page(request, "session.html",
                {"session_id": session_id, "info": live.get(session_id), "episodes": episodes})


async def threads(request: Request) -> Response:
    return page(request, "threads.html", {"threads": await view_of(request).memory.list_threads()})


async def thread_page(request: Request) -> Response:
    """A thread: what the agent sees within a budget (boundary, snapshots, pins, messages),
    and `LIST_LIMIT` stored messages from seq `start` (the newest by default), each marked by
    where it stands, with links to the pages before and after."""
    mem, params = view_of(request).memory, request.query_params
    thread_id = required(params, "id")
    budget = whole(params, "budget", DEFAULT_BUDGET, low=1, high=MAX_TOKEN_BUDGET)
    known = {t.id: t for t in await mem.list_threads()}
    if (thread := known.get(thread_id)) is None:
        raise NotFoundError("thread", thread_id)
    conversation = mem.conversation()
    oldest = await conversation.raw(thread_id, limit=1)
    # Pages end at the next seq, LIST_LIMIT seqs apart, and start at `floor` (the oldest kept).
    floor, newest = oldest[0].seq if oldest else thread.next_seq, thread.next_seq
    start = whole(params, "start", max(floor, newest - LIST_LIMIT), low=0, high=newest)
    end = newest - (newest - start - 1) // LIST_LIMIT * LIST_LIMIT
    messages = [m for m in await conversation.raw(thread_id, from_seq=start, limit=end - start)
                if m.seq < end]
    seen = await mem.viewport(thread_id, token_budget=budget)
    # At the largest budget the viewport lists every snapshot and pin of a thread below it.
    everything = await mem.viewport(thread_id, token_budget=MAX_TOKEN_BUDGET)
    return page(request, "thread.html", {
        "thread": thread, "budget": budget, "viewport": seen, "messages": messages,
        "snapshots": everything.snapshots, "pinned": everything.pinned,
        "earlier": max(floor, end - 2 * LIST_LIMIT) if floor < start else None,
        "later": end if end < newest else None,
        "shown": {m.id for m in seen.messages}, "pinned_ids": {m.id for m in everything.pinned}})


def scope_of(text: str) -> JSONObject | None:
    """The `where` of a form's field: "KEY=VALUE" pairs (KEY:=JSON for a number or
    true/false) separated by commas (`mnemo.graph.scope.parse_where`)."""
    return parse_where(p for p in text.split(",") if p.strip())


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
    return page(request, "history.html", {
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
    reworded = [n for i in diff.commit.reworded if (n := await view.memory.get_node(repo, i))]
    goal = (await commit_goals(partial(view.memory.get_node, repo), [diff.commit])).get(
        diff.commit.id)
    return page(request, "commit.html", {
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
