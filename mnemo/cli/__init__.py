"""The `mnemo` command line (typer + rich): `demo`, `ingest`, `recall`, `repos`, `sessions`,
`session`, `view`, `graph`, `search`, `purge`, `doctor`, `migrate`, `history`, `revert` and
`mcp`. `main` is the console script; `app` the typer application (each command module
registers its commands on it)."""

from mnemo.cli import app as _app
from mnemo.cli import doctor as _doctor
from mnemo.cli import history as _history
from mnemo.cli import manage as _manage
from mnemo.cli import migrate as _migrate
from mnemo.cli._common import app

__all__ = ["app", "main"]


def main() -> None:
    """The console script's entry point."""
    app(prog_name="mnemo")


del _app, _doctor, _history, _manage, _migrate
