"""What every command shares: the typer application, running a command's coroutine with the
one-line error rule, and opening the `Memory` its settings choose."""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import anyio
import anyio.to_thread
import typer
from typer.core import TyperGroup

from mnemo.adapters.uri import embedder_from_uri, llm_from_uri
from mnemo.cli._database import CliError, check_database
from mnemo.cli._settings import MODEL_OPTIONS, Settings, resolve
from mnemo.errors import InvalidInputError, MnemoError, check_store as name_store
from mnemo.memory import Memory
from mnemo.ports import LLM, Embedder, EventCallback
from mnemo.storage.ports import has_postgres_driver, is_postgres
from mnemo.version import installed_version

_verbose = False


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"mnemo {installed_version()}")
        raise typer.Exit()


class _Commands(TyperGroup):
    """mnemo's commands, each of whose failures ends in one line on stderr, `error: ...`."""

    def make_context(self, info_name: Any, args: Any, parent: Any = None,
                     **extra: Any) -> Any:
        with one_line():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: Any) -> Any:
        with one_line():
            return super().invoke(ctx)


# Click's errors, as the typer installed raises them (typer 0.29 carries its own click).
def _click_error(name: str) -> type[Exception]:
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == name)


_CLICK_ERROR, _USAGE_ERROR = _click_error("ClickException"), _click_error("UsageError")


@contextmanager
def one_line() -> Iterator[None]:
    """Turns what the block raises into one `error:` line and an exit status: 2 for what the user
    can fix (a refused parameter, `CliError`, `MnemoError`, `OSError`), 1 for a bug."""
    try:
        yield
    except (typer.Exit, typer.Abort):
        raise
    except _CLICK_ERROR as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            raise  # the help, shown for no arguments
        ctx = getattr(exc, "ctx", None)
        where = f" (see `{ctx.command_path} --help`)" if isinstance(
            exc, _USAGE_ERROR) and ctx is not None else ""
        _fail(f"{getattr(exc, 'format_message', exc.__str__)()}{where}", 2)
    except (CliError, MnemoError) as exc:
        _fail(str(exc) or type(exc).__name__, 2)
    except OSError as exc:
        named = f"{exc.filename}: " if exc.filename is not None else ""
        _fail(f"{named}{exc.strerror or exc}", 2)
    except Exception as exc:
        if _verbose:
            traceback.print_exc()
        _fail(f"{type(exc).__name__}: {exc} (a bug in mnemo; --verbose shows where)", 1)


def _fail(message: str, status: int) -> NoReturn:
    typer.echo(f"error: {' '.join(message.split())}", err=True)
    raise typer.Exit(status)


app = typer.Typer(name="mnemo", cls=_Commands, no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_show_version, is_eager=True, help="Print the version and exit."),
    ] = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Log what mnemo and its drivers do (INFO) on "
                                "stderr.")] = False,
) -> None:
    """mnemo: memory for LLM agents. Look inside a memory, fill it, serve it."""
    global _verbose
    _verbose = verbose


Json = Annotated[bool, typer.Option("--json", help="Print one JSON document (for scripts).")]
Where = Annotated[
    list[str] | None,
    typer.Option("--where", help="Only the scope whose metadata has KEY=VALUE (a string; "
                                 "KEY:=JSON for a number or true/false); repeat it for more "
                                 "keys, or a key for any of its values.")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
SearchedRepo = Annotated[str | None, typer.Option(
    "--repo", "-r", help="The repo to look in (default: every repo is searched).")]


Command = Callable[..., Awaitable[None]]


class _Stderr(logging.Handler):
    """Writes to the current `sys.stderr` (a test's runner swaps it per command)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(f"{record.levelname.lower()}: {record.name}: {record.getMessage()}\n")
        except Exception:
            self.handleError(record)


@contextmanager
def command_logging(*, verbose: bool = False) -> Iterator[None]:
    """Routes log records while the block runs, then restores them: warnings on stderr, one
    line each, the PostgreSQL driver's only from ERROR up; with `verbose`, mnemo's INFO too."""
    root = logging.getLogger()
    handler = _Stderr(logging.INFO if verbose else logging.WARNING)
    drivers = [logging.getLogger(name) for name in ("psycopg", "psycopg.pool")]
    saved = {logger: logger.level for logger in (root, *drivers)}
    root.addHandler(handler)
    if verbose:
        root.setLevel(min(root.level, logging.INFO))
    for driver in drivers:
        driver.setLevel(logging.WARNING if verbose else logging.ERROR)
    try:
        yield
    finally:
        root.removeHandler(handler)
        for logger, level in saved.items():
            logger.setLevel(level)


def model_options(*, extraction: bool = True, only: Collection[str] = tuple(MODEL_OPTIONS)
                  ) -> Callable[[Command], Callable[..., None]]:
    """Makes an async command one typer runs, with the command's logging and exit status 130 on
    ^C, and with the `MODEL_OPTIONS` that `only` names in place of its keyword-only parameter
    `settings`, which receives them `resolve`d."""
    names = [name for name in MODEL_OPTIONS
             if name in only and (extraction or name != "extraction_timeout")]
    options = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                 annotation=MODEL_OPTIONS[name]) for name in names]

    def wrap(command: Command) -> Callable[..., None]:
        given = inspect.signature(command, eval_str=True).parameters.values()
        params = [o for p in given for o in (options if p.name == "settings" else [p])]

        @functools.wraps(command)
        def resolved(*args: Any, **kwargs: Any) -> None:
            if names:
                kwargs["settings"] = resolve(**{name: kwargs.pop(name) for name in names})
            try:
                with command_logging(verbose=_verbose):
                    anyio.run(lambda: command(*args, **kwargs))
            except KeyboardInterrupt:
                # Stores are transactional and ingests idempotent: running it again carries on.
                typer.echo("interrupted", err=True)
                raise typer.Exit(130) from None

        resolved.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        resolved.__annotations__ = {p.name: p.annotation for p in params}
        return resolved

    return wrap


# The options of a command that opens no model: the store and the config file.
store_options = model_options(only=("store", "config"))
# A command that takes its stores by options of its own.
runs = model_options(only=())


async def close(model: object) -> None:
    """Closes a model this command built (one may own an HTTP client)."""
    aclose = getattr(model, "aclose", None)
    if aclose is not None:
        with anyio.move_on_after(2, shield=True):
            await aclose()


@asynccontextmanager
async def models(settings: Settings) -> AsyncIterator[tuple[LLM | None, Embedder | None]]:
    """The LLM and embedder the settings name (None: each repo's own), closed after the block;
    ModelURIError, or CliError for a temperature or timeout flag without an LLM."""
    llm: LLM | None = None
    embedder: Embedder | None = None
    try:
        uri = settings.llm_uri
        llm = llm_from_uri(uri) if uri is not None else None
        embedder = embedder_from_uri(settings.embedder) if settings.embedder else None
        yield llm, embedder
    finally:
        for model in (llm, embedder):
            await close(model)


def check_store(store: str, *, writes: bool) -> None:
    """Checks the store before `Memory` touches it (a read command needs it to exist), and that
    this installation can open a PostgreSQL one (CliError)."""
    try:
        name_store(store)  # a URL of another database is no path
    except InvalidInputError as exc:
        raise CliError(str(exc)) from exc
    if not is_postgres(store):
        check_database(Path(store), must_exist=not writes)
    elif not has_postgres_driver():
        raise CliError("this mnemo has no PostgreSQL driver, so it cannot open a postgresql:// "
                       "store: pip install 'pymnemo[postgres]', or use a SQLite file")


@asynccontextmanager
async def open_memory(settings: Settings, *, writes: bool = False, works: bool = False,
                      on_event: EventCallback | None = None) -> AsyncIterator[Memory]:
    """The Memory the settings choose, after checking the store; `writes` lets it be created,
    `works` opens it to do work, else for inspection."""
    # The models first: a mistyped --llm is reported before anything about the store.
    async with models(settings) as (llm, embedder):
        check_store(settings.store, writes=writes)
        async with Memory(settings.store, llm=llm, embedder=embedder, on_event=on_event,
                          config=settings.config, inspect=not works) as mem:
            yield mem


async def confirm(question: str, *, given: bool, flag: str = "--yes", as_json: bool) -> None:
    """Asks `question` before a command destroys data, unless `flag` was `given`; a no aborts
    with status 1 (CliError under `--json`, which cannot ask)."""
    if given:
        return
    if as_json:
        raise CliError(f"--json cannot ask for confirmation: pass {flag}")
    await anyio.to_thread.run_sync(lambda: typer.confirm(question, abort=True))


async def searched_repos(mem: Memory, repo: str | None) -> list[str]:
    """The repos an id is looked for in: `repo` (once checked), or every repo when None."""
    if repo is None:
        return await mem.list_repos()
    await check_repo(mem, repo)
    return [repo]


async def check_repo(mem: Memory, repo: str) -> None:
    """Raises CliError naming the known repos when `repo` is not one of them."""
    repos = await mem.list_repos()
    if repo not in repos:
        known = ", ".join(repos) if repos else "none"
        raise CliError(f"unknown repo {repo!r} (repos in this database: {known})")
