"""The `mnemo` command line (typer + rich): `demo`, `ingest`, `recall`, `sessions`, `graph`,
`search`, `purge` and `mcp`. `main` is the console script; `app` the typer application."""

from mnemo.cli.app import app, main

__all__ = ["app", "main"]
