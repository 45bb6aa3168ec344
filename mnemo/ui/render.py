"""What every page of the web app shares: the templates, the view of the request, and the
reading of its parameters (the query string of a GET, the bounded form of a POST)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.datastructures import ImmutableMultiDict
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from mnemo.errors import InvalidInputError, NotFoundError
from mnemo.jsonable import label
from mnemo.tools import clip
from mnemo.ui.drawing import shape
from mnemo.ui.source import MemorySource

HERE = Path(__file__).parent
# A form the app's pages post is a few short fields: more is not one of them.
MAX_FORM_BYTES = 16_384
MAX_FORM_FIELDS = 32
FORM_TYPE = "application/x-www-form-urlencoded"

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

