"""`mnemo migrate --from SRC --to DST`: copy a memory to another store, skipping rows the target
holds, and verify the copy; exit 0 when verified, 2 when refused, 1 when it does not verify."""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import TaskID, TextColumn

from mnemo.cli._common import Json, app, check_store, runs
from mnemo.cli._database import CliError
from mnemo.cli._output import print_json, progress, stderr_console, stdout_console, table
from mnemo.errors import StorageError
from mnemo.storage.ports import is_postgres
from mnemo.storage.transfer import open_dump, same_store, transfer

SourceOpt = Annotated[
    str,
    typer.Option("--from", help="The memory to copy: a SQLite file or a postgresql:// URL.",
                 show_default=False)]
TargetOpt = Annotated[
    str,
    typer.Option("--to", help="Where to copy it: a SQLite file (created if missing) or a "
                 "postgresql:// URL (its schema is created if missing).", show_default=False)]


def display(store: str) -> str:
    """`store` as it may be printed: a URL's password hidden."""
    return re.sub(r"^([a-z]+://[^:/@]*):[^@]*@", r"\1:***@", store)


def check_stores(source: str, target: str) -> None:
    """Refuses what `migrate` must not start on (CliError)."""
    if not is_postgres(source) and not Path(source).exists():
        raise CliError(f"no database at {source}")
    check_store(source, writes=False)
    check_store(target, writes=True)
    if same_store(source, target):
        raise CliError(f"--from and --to name the same store ({display(source)})")


@app.command()
@runs
async def migrate(source: SourceOpt, target: TargetOpt, as_json: Json = False) -> None:
    """Copy a memory to another store (SQLite <-> PostgreSQL), verified by counts and a
    checksum; running it again copies nothing."""
    check_stores(source, target)
    bars = progress(stderr_console())
    bars.columns = (TextColumn("{task.description:<20}"), *bars.columns[1:])
    tasks: dict[str, TaskID] = {}  # a bar per table, made when its copy starts

    def advance(table: str, done: int, total: int) -> None:
        task = tasks.get(table)
        if task is None:
            task = tasks[table] = bars.add_task(table, total=total)
        bars.update(task, completed=done, total=total)

    try:
        async with open_dump(source, must_exist=True) as src, \
                open_dump(target, must_exist=False) as dst:
            with bars:
                report = await transfer(src, dst, progress=advance)
    except StorageError as exc:
        if exc.reason != "mismatch":
            raise
        typer.echo(f"error: {str(exc).removeprefix('mismatch: ')}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        print_json({"from": display(source), "to": display(target), "copied": report.copied,
                    "checksum": report.checksum, "tables": [asdict(t) for t in report.tables]})
        return
    console = stdout_console()
    console.print(table(f"{display(source)} -> {display(target)}",
                        ("table", "source>", "copied>", "target>"),
                        [(t.table, str(t.source), str(t.copied), str(t.target))
                         for t in report.tables]))
    console.print(f"node checksum (sha256 of ids and texts), equal on both: {report.checksum}")
    console.print(f"Copied {report.copied} rows; verified." if report.copied
                  else "Nothing to copy: the target already holds every row; verified.")
