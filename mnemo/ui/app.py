"""`mnemo ui`: a small local web app over a memory (Starlette, Jinja2 templates, htmx).

Every route is a GET that reads through a `MemoryView`; pages are rendered on the server and
work without JavaScript. htmx (vendored under `static/`, no CDN) only swaps the results of the
search and recall forms in place. Identifiers travel as query parameters, never as path
segments: thread ids such as "week/1" hold slashes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from mnemo.errors import InvalidInputError, MnemoError, NotFoundError
from mnemo.graph.model import LinkType, Node, NodeType
from mnemo.ui.source import LinkedNode, MemoryView

HERE = Path(__file__).parent
# The graph page lists this many of the newest nodes of a type; search and recall cap too.
LIST_LIMIT = 100
SEARCH_LIMIT = 50
MAX_K = 50
# The thread page's default budget: a typical agent's context share for its history.
DEFAULT_BUDGET = 8000
# A budget no thread reaches: the viewport at it lists every snapshot and pin.
ALL_TOKENS = 10**12
MEMORY_TYPES = (NodeType.SEMANTIC, NodeType.PROCEDURAL, NodeType.EPISODIC)

ViewFactory = Callable[[], AbstractAsyncContextManager[MemoryView]]


def href(path: str, **params: object) -> str:
    """`path` with the non-None params as its query string."""
    query = urlencode({k: str(v) for k, v in params.items() if v is not None})
    return f"{path}?{query}" if query else path


def _templates() -> Jinja2Templates:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals["href"] = href
    env.filters["label"] = lambda value: getattr(value, "value", value)
    env.filters["short"] = lambda text, n=160: text if len(text) <= n else text[: n - 1] + "…"
    return Jinja2Templates(env=env)


TEMPLATES = _templates()


def create_app(
    view: MemoryView | None = None,
    *,
    open_view: ViewFactory | None = None,
    allow_writes: bool = False,
) -> Starlette:
    """The web app over `view`, or over the view `open_view` opens for the app's life
    (entered at startup, left at shutdown): exactly one of the two.

    No route writes. `allow_writes` is shown in the header; what it allows is up to the view
    (the `MemorySource` of `mnemo ui --allow-writes` lets recalls count as accesses).

    Raises:
        InvalidInputError: neither or both of `view` and `open_view`.
    """
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
            Route("/", index, name="index"),
            Route("/graph", graph, name="graph"),
            Route("/node", node_page, name="node"),
            Route("/recall", recall, name="recall"),
            Route("/sessions", sessions, name="sessions"),
            Route("/session", session_page, name="session"),
            Route("/threads", threads, name="threads"),
            Route("/thread", thread_page, name="thread"),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ],
        exception_handlers={MnemoError: _mnemo_error},
        lifespan=lifespan,
    )
    app.state.allow_writes = allow_writes
    # Set now, so that a client running no lifespan (httpx's ASGITransport) has it.
    app.state.view = view
    return app


def _view(request: Request) -> MemoryView:
    view: MemoryView = request.app.state.view
    return view


def _page(
    request: Request, name: str, context: Mapping[str, Any], status_code: int = 200
) -> Response:
    return TEMPLATES.TemplateResponse(
        request,
        name,
        {"allow_writes": request.app.state.allow_writes, **context},
        status_code=status_code,
    )


async def _mnemo_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, NotFoundError):
        status = 404
    elif isinstance(exc, InvalidInputError):
        status = 400
    else:
        status = 500
    return _page(request, "error.html", {"error": exc, "status": status}, status)


def _required(request: Request, name: str) -> str:
    value = request.query_params.get(name, "")
    if not value.strip():
        raise InvalidInputError(f"the query parameter {name!r} is required")
    return value


def _int(request: Request, name: str, default: int, *, low: int, high: int) -> int:
    raw = request.query_params.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInputError(f"{name} must be a whole number, got {raw!r}") from None
    if not low <= value <= high:
        raise InvalidInputError(f"{name} must be between {low} and {high}, got {value}")
    return value


async def _repo(request: Request) -> str:
    repo = _required(request, "repo")
    if repo not in await _view(request).repos():
        raise NotFoundError("repo", repo)
    return repo


def _types(values: Iterable[str]) -> list[NodeType]:
    chosen: list[NodeType] = []
    for value in values:
        try:
            chosen.append(NodeType(value))
        except ValueError:
            raise InvalidInputError(f"unknown node type {value!r}") from None
    return chosen


# ---- pages ---------------------------------------------------------------------------------


async def index(request: Request) -> Response:
    view = _view(request)
    return _page(
        request,
        "index.html",
        {
            "repos": await view.repos(),
            "sessions": await view.sessions(),
            "threads": await view.threads(),
        },
    )


async def graph(request: Request) -> Response:
    """A repo's graph: a search box, the newest nodes of one type, its tags and intents."""
    view = _view(request)
    repo = await _repo(request)
    shown = _types([request.query_params.get("type", NodeType.SEMANTIC.value)])[0]
    query = request.query_params.get("q", "").strip()
    found = await view.search_nodes(repo, query, SEARCH_LIMIT) if query else None
    return _page(
        request,
        "graph.html",
        {
            "repo": repo,
            "query": query,
            "found": found,
            "shown": shown,
            "types": list(NodeType),
            "nodes": await view.latest(repo, [shown], LIST_LIMIT),
            "tags": await view.nodes_of_type(repo, NodeType.TAG),
            "intents": await view.nodes_of_type(repo, NodeType.INTENT),
        },
    )


async def node_page(request: Request) -> Response:
    """One node: its text and data, its links by type, and for a memory its provenance: the
    steps it came from, each with the stored episode (and session) it belongs to."""
    view = _view(request)
    repo = await _repo(request)
    node_id = _required(request, "id")
    node = await view.node(repo, node_id)
    if node is None:
        raise NotFoundError("node", node_id)
    links = await view.links(repo, node_id)
    by_type: dict[LinkType, list[LinkedNode]] = {}
    for linked in links:
        by_type.setdefault(linked.link_type, []).append(linked)
    steps = [
        linked.node
        for linked in links
        if linked.link_type is LinkType.PROVENANCE and linked.node.type is NodeType.EPISODIC
    ]
    if node.type is NodeType.EPISODIC:
        steps = [node]
    steps.sort(key=lambda n: (str(n.data.get("episode_id", "")), n.data.get("index", 0)))
    sessions = await _sessions_of(view, steps)
    return _page(
        request,
        "node.html",
        {
            "repo": repo,
            "node": node,
            "links": by_type,
            "steps": steps,
            "step_sessions": sessions,
            "members": _members(node, by_type),
        },
    )


async def _sessions_of(view: MemoryView, steps: list[Node]) -> dict[str, str]:
    """Episode id -> the session that stored it, for the episodes of these steps (an
    ingest's episodes have none)."""
    owners: dict[str, str] = {}
    for episode_id in dict.fromkeys(str(s.data.get("episode_id", "")) for s in steps):
        if episode_id:
            episode = await view.episode(episode_id)
            if episode is not None:
                owners[episode_id] = episode.session_id
    return owners


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
    """The recall playground: a query, k and node types in; each result's rank, score, phase
    and hop out."""
    view = _view(request)
    repo = await _repo(request)
    query = request.query_params.get("q", "").strip()
    k = _int(request, "k", 10, low=1, high=MAX_K)
    types = _types(request.query_params.getlist("types"))
    result = await view.recall(repo, query, k, types or None) if query else None
    return _page(
        request,
        "recall.html",
        {
            "repo": repo,
            "query": query,
            "k": k,
            "types": list(NodeType),
            "chosen": types,
            "result": result,
        },
    )


async def sessions(request: Request) -> Response:
    return _page(request, "sessions.html", {"sessions": await _view(request).sessions()})


async def session_page(request: Request) -> Response:
    """A session: its state (live or ended), and each stored episode's trajectories and
    steps."""
    view = _view(request)
    session_id = _required(request, "id")
    live = {s.id: s for s in await view.sessions()}
    episodes = await view.episodes(session_id)
    if not episodes and session_id not in live:
        raise NotFoundError("session", session_id)
    return _page(
        request,
        "session.html",
        {"session_id": session_id, "info": live.get(session_id), "episodes": episodes},
    )


async def threads(request: Request) -> Response:
    return _page(request, "threads.html", {"threads": await _view(request).threads()})


async def thread_page(request: Request) -> Response:
    """A thread: what the agent sees within a budget (boundary, snapshots, pins, messages),
    and every stored message marked by where it stands."""
    view = _view(request)
    thread_id = _required(request, "id")
    budget = _int(request, "budget", DEFAULT_BUDGET, low=1, high=10_000_000)
    known = {t.id: t for t in await view.threads()}
    if thread_id not in known:
        raise NotFoundError("thread", thread_id)
    seen = await view.viewport(thread_id, budget)
    everything = await view.viewport(thread_id, ALL_TOKENS)
    shown = {m.id for m in seen.messages}
    pinned = {m.id for m in everything.pinned}
    return _page(
        request,
        "thread.html",
        {
            "thread": known[thread_id],
            "budget": budget,
            "viewport": seen,
            "snapshots": everything.snapshots,
            "pinned": everything.pinned,
            "messages": await view.messages(thread_id),
            "shown": shown,
            "pinned_ids": pinned,
        },
    )
