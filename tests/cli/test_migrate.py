"""`mnemo migrate --from SRC --to DST`: SQLite to PostgreSQL and back, with
a progress bar, counts and a checksum; idempotent; refusals exit 2, a failed check exits 1."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import anyio
import psycopg
import pytest
from typer.testing import CliRunner, Result

import mnemo
from mnemo.cli import app
from mnemo.cli.migrate import display
from mnemo.storage.transfer import TABLES
from tests.conversation._support import user
from tests.fakes import FakeEmbedder
from tests.storage.filled import THREAD, fill, sqlite_rows

runner = CliRunner()


def migrate(source: str | Path, target: str | Path, *extra: str) -> Result:
    return runner.invoke(app, ["migrate", "--from", str(source), "--to", str(target), *extra])


@pytest.fixture
async def source(tmp_path: Path) -> Path:
    """A SQLite memory with rows in every copied table."""
    path = tmp_path / "memory.db"
    await fill(path)
    return path


def total(path: Path) -> int:
    return sum(len(sqlite_rows(path, t)) for t in TABLES)


def test_to_postgres_and_back(source: Path, pg_url: str, tmp_path: Path) -> None:
    """The memory goes to PostgreSQL and back to a new file equal to the original, each run
    printing counts per table and the node checksum."""
    there = migrate(source, pg_url, "--json")
    assert there.exit_code == 0, there.stderr
    report = json.loads(there.stdout)
    assert report["copied"] == total(source)
    assert {t["table"]: t["target"] for t in report["tables"]} == {
        t.name: len(sqlite_rows(source, t)) for t in TABLES}
    for name in ("check node ids", "nodes", "messages", "build indexes", "verify"):
        assert name in there.stderr  # the progress bars, one per table
    back = migrate(pg_url, tmp_path / "back.db")
    assert back.exit_code == 0, back.stderr
    assert report["checksum"] in back.stdout.replace("\n", "")
    assert f"Copied {total(source)} rows; verified." in back.stdout
    for table in TABLES:
        assert sqlite_rows(tmp_path / "back.db", table, raw=True) == sqlite_rows(
            source, table, raw=True), table.name


def test_a_time_on_a_whole_second_comes_back_as_it_was_written(
    source: Path, pg_url: str, tmp_path: Path
) -> None:
    """A stored time whose fraction is zero (SQLite's clock stamps milliseconds, so one
    stamp in a thousand) comes back from PostgreSQL as the same text, fraction included."""
    whole = "2026-11-27T11:04:22.000000+00:00"
    with sqlite3.connect(source) as conn:
        conn.execute("UPDATE sessions SET updated_at = ?", (whole,))
    conn.close()
    assert migrate(source, pg_url).exit_code == 0
    back = migrate(pg_url, tmp_path / "back.db")
    assert back.exit_code == 0, back.stderr
    with sqlite3.connect(tmp_path / "back.db") as conn:
        stamps = {row[0] for row in conn.execute("SELECT updated_at FROM sessions")}
    conn.close()
    assert stamps == {whole}


def test_second_run_says_nothing_to_copy(source: Path, pg_url: str, tmp_path: Path) -> None:
    """Run twice, the command copies nothing the second time and says so, each way (every
    row the target holds is compared with the source's: vectors, times and JSON alike)."""
    back = tmp_path / "back.db"
    assert migrate(source, pg_url).exit_code == 0
    assert migrate(pg_url, back).exit_code == 0
    again = migrate(pg_url, back)
    assert again.exit_code == 0, again.stderr
    assert "Nothing to copy" in again.stdout
    again = migrate(source, pg_url)
    assert again.exit_code == 0, again.stderr
    assert "Nothing to copy" in again.stdout
    report = json.loads(migrate(source, pg_url, "--json").stdout)
    assert report["copied"] == 0
    assert all(t["copied"] == 0 for t in report["tables"])


@pytest.mark.parametrize("case", ["missing", "same", "same-by-another-path", "not-mnemo"])
def test_refusals_exit_2(source: Path, tmp_path: Path, case: str) -> None:
    """A missing source, the same store twice or a target that is not a mnemo file are
    refused with one line, exit 2, nothing created."""
    target = tmp_path / "copy.db"
    if case == "missing":
        result, expected = migrate(tmp_path / "absent.db", target), "no database at"
    elif case == "same":
        result, expected = migrate(source, source), "the same store"
    elif case == "same-by-another-path":
        other = tmp_path / "sub" / ".." / source.name
        (tmp_path / "sub").mkdir()
        result, expected = migrate(source, other), "the same store"
    else:
        with sqlite3.connect(target) as conn:
            conn.execute("CREATE TABLE mine (x)")
        conn.close()
        result, expected = migrate(source, target), "not a mnemo one"
    assert result.exit_code == 2, result.output
    assert expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "absent.db").exists()
    if case != "not-mnemo":
        assert not target.exists()


def test_conflicting_node_exits_2(source: Path, pg_url: str) -> None:
    """A node id the target holds with another text is refused (exit 2), nothing copied."""
    assert migrate(source, pg_url).exit_code == 0
    with psycopg.connect(pg_url) as pg:
        pg.execute("UPDATE nodes SET text = 'changed' WHERE rowid = 1")
        pg.execute("DELETE FROM ingests")
    result = migrate(source, pg_url)
    assert result.exit_code == 2, result.output
    assert "1 node id(s) of the source hold another text" in result.stderr
    with psycopg.connect(pg_url) as pg:
        assert pg.execute("SELECT count(*) FROM ingests").fetchone() == (0,)


def test_a_target_holding_rows_the_source_lacks_exits_1(source: Path, pg_url: str) -> None:
    """A target with rows the source lacks is refused before anything is copied: exit 1, the
    table named."""
    with psycopg.connect(pg_url) as pg:
        pg.execute("INSERT INTO goals VALUES ('g-other', 't', 'other', 'open', now(), NULL)")
    result = migrate(source, pg_url)
    assert result.exit_code == 1, result.output
    assert "table goals" in result.stderr
    assert "nothing was copied" in result.stderr
    with psycopg.connect(pg_url) as pg:
        assert pg.execute("SELECT count(*) FROM nodes").fetchall() == [(0,)]


def test_json_numbers_jsonb_writes_otherwise_are_the_same_row(
    tmp_path: Path, pg_url: str
) -> None:
    """A step's metadata holding 1e16, 1e23, 2.0**60 and -0.0 (jsonb gives them back as the
    ints of their written digits, and 0): a second run of an unchanged source copies nothing
    (it was refused as changed)."""
    path = tmp_path / "numbers.db"

    async def step_with_numbers() -> None:
        async with mnemo.Memory(path, embedder=FakeEmbedder()) as mem:
            await mem.open_repo("r")
            sid = await mem.start_session("count", repo="r")
            await mem.append(sid, "big numbers", "note them", metadata={
                "big": 1e16, "bigger": 1e23, "power": 2.0**60, "neg": -0.0, "half": 0.5})

    anyio.run(step_with_numbers)
    assert migrate(path, pg_url).exit_code == 0
    again = migrate(path, pg_url)
    assert again.exit_code == 0, again.stderr
    assert "Nothing to copy" in again.stdout


def test_a_second_run_after_the_source_changed_copies_nothing_and_exits_1(
    source: Path, pg_url: str
) -> None:
    """Migrated, then a message saved to the thread in the source: a second run refuses
    before copying anything (exit 1, the table named). It copied the new message and kept
    the thread's old counter, exited 0 "verified", and every later save there failed."""
    assert migrate(source, pg_url).exit_code == 0

    async def one_more_message() -> None:
        async with mnemo.Memory(source, embedder=FakeEmbedder()) as mem:
            await mem.conversation().append(THREAD, [user("and one more step")])

    anyio.run(one_more_message)
    with psycopg.connect(pg_url) as pg:
        [(messages,)] = pg.execute("SELECT count(*) FROM messages").fetchall()
    result = migrate(source, pg_url)
    assert result.exit_code == 1, result.output
    assert "table threads" in result.stderr
    assert "nothing was copied" in result.stderr
    with psycopg.connect(pg_url) as pg:
        assert pg.execute("SELECT count(*) FROM messages").fetchall() == [(messages,)]

    async def save_there() -> None:
        async with mnemo.Memory(pg_url, embedder=FakeEmbedder()) as mem:
            await mem.conversation().append(THREAD, [user("a step on PostgreSQL")])

    anyio.run(save_there)


def test_a_copy_cut_short_is_completed(source: Path, pg_url: str) -> None:
    """A target holding part of the source, each row as the source holds it (a copy cut
    short), is completed by a second run, verified."""
    assert migrate(source, pg_url).exit_code == 0
    with psycopg.connect(pg_url) as pg:
        pg.execute("DELETE FROM goals")
    again = migrate(source, pg_url, "--json")
    assert again.exit_code == 0, again.stderr
    copied = {t["table"]: t["copied"] for t in json.loads(again.stdout)["tables"]}
    assert {name: n for name, n in copied.items() if n} == {"goals": 1, "pins": 1}  # cascaded


def test_a_password_is_never_printed() -> None:
    """A URL's password is hidden where the command prints the store."""
    hidden = display("postgresql://me:s3cret@db.example/mnemo")
    assert hidden == "postgresql://me:***@db.example/mnemo"
    assert display("postgresql://me@db/mnemo") == "postgresql://me@db/mnemo"
    assert display("memory.db") == "memory.db"
