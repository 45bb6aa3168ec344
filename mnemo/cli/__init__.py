"""The `mnemo` command line (typer + rich). `main`, the console script, imports only the module
of the command asked for (`COMMANDS`); `app` is built when first asked for."""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer

    app: typer.Typer

__all__ = ["app", "main"]

# The module of mnemo.cli that registers each command, in the order `mnemo --help` lists them.
COMMANDS: dict[str, str] = {
    **dict.fromkeys(("demo", "ingest", "recall", "sessions", "graph", "search", "purge",
                     "forget"), "commands"),
    "mcp": "serve", "ui": "serve", "doctor": "doctor",
    **dict.fromkeys(("history", "diff", "revert"), "history"), "show": "node",
    **dict.fromkeys(("repos", "reembed", "view", "session"), "manage"), "migrate": "migrate"}


def main() -> None:
    args = sys.argv[1:]
    if args == ["--version"]:
        from mnemo.version import installed_version

        print(f"mnemo {installed_version()}")
        return
    # What start-up allocates lives as long as the command: no need to collect it.
    gc.disable()
    try:
        app = application(command_of(args))
    finally:
        gc.freeze()
        gc.enable()
    app(prog_name="mnemo")


def command_of(args: Sequence[str]) -> str | None:
    """The command a command line names: its first word that is not an option (the root
    options, `--version`, `--verbose` and `--help`, take no value)."""
    return next((arg for arg in args if not arg.startswith("-")), None)


def application(command: str | None = None) -> typer.Typer:
    """The typer application with `command` registered (and the commands of its module), or
    with every command when `command` is None or not one of `COMMANDS`."""
    module = COMMANDS.get(command) if command is not None else None
    modules = [module] if module is not None else list(dict.fromkeys(COMMANDS.values()))
    for name in modules:
        importlib.import_module(f"mnemo.cli.{name}")
    from mnemo.cli._common import app

    if module is None:
        globals()["app"] = app
    return app


def __getattr__(name: str) -> object:
    if name == "app":
        return application()
    raise AttributeError(f"module 'mnemo.cli' has no attribute {name!r}")
