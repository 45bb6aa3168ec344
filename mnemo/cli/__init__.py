"""The `mnemo` command line (typer + rich): `demo`, `ingest`, `recall`, `repos`, `sessions`,
`session`, `view`, `graph`, `search`, `purge`, `doctor`, `migrate`, `history`, `revert`, `mcp`
and `ui`. `main` is the console script; `app` the typer application (each command module
registers its commands on it), built when first asked for: `mnemo --version` imports none
of it."""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer

    app: typer.Typer

__all__ = ["app", "main"]


def main() -> None:
    """The console script's entry point."""
    if sys.argv[1:] == ["--version"]:
        from mnemo.version import installed_version

        print(f"mnemo {installed_version()}")
        return
    application()(prog_name="mnemo")


def application() -> typer.Typer:
    """The typer application with every command registered."""
    for module in ("commands", "doctor", "history", "manage", "migrate"):
        importlib.import_module(f"mnemo.cli.{module}")
    from mnemo.cli._common import app

    globals()["app"] = app
    return app


def __getattr__(name: str) -> object:
    if name == "app":
        return application()
    raise AttributeError(f"module 'mnemo.cli' has no attribute {name!r}")
