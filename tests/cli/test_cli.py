"""The `mnemo` command line, through typer's CliRunner, on small databases made here.

No `__init__.py` in this folder (as for `tests/mcp`): test module names are unique instead.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import anyio
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from typer.testing import CliRunner, Result

import mnemo
from mnemo.cli import app
from mnemo.storage.ports import is_postgres
from tests.backends import BACKENDS
from tests.fakes import js
from tests.pg import PgServer

REPO = "ops"
CONVERSATION = {
    "repo": REPO,
    "sessions": [
        {
            "goal": "Fix the blog deploy",
            "steps": [
                {
                    "observation": "nginx returns 502: gunicorn listens on port 8001.",
                    "action": "Bind gunicorn to 127.0.0.1:8000 and reload nginx.",
                },
                {"observation": "The blog answers 200 again.", "action": "Close the ticket."},
            ],
        },
        {
            "goal": "Tune postgres",
            "steps": [
                {
                    "observation": "Postgres runs out of connections at 100 clients.",
                    "action": "Put pgbouncer in front of it with a pool of 20.",
                }
            ],
        },
    ],
}
LOCOMO = [
    {
        "sample_id": "conv-x",
        "conversation": {
            "speaker_a": "Ann",
            "speaker_b": "Bo",
            "session_1_date_time": "1:00 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a beagle named Rex."},
                {"speaker": "Bo", "dia_id": "D1:2", "text": "Rex is a lovely name!"},
            ],
            "session_2_date_time": "2:00 pm on 9 May, 2023",
            "session_2": [
                {
                    "speaker": "Ann",
                    "dia_id": "D2:1",
                    "text": "Rex chewed my violin.",
                    "blip_caption": "a dog next to a broken violin",
                },
            ],
        },
        "qa": [],
    }
]

runner = CliRunner()


def invoke(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
    return runner.invoke(app, list(args), input=input, env=env)


def ok_json(*args: str) -> Any:
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def assert_clear_error(result: Result, *words: str) -> None:
    """Exit 2 and one line on stderr naming the problem, no traceback."""
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for word in words:
        assert word in lines[0]
    assert "Traceback" not in result.output


@pytest.fixture(scope="module", params=BACKENDS)
def filled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store (a SQLite file, a PostgreSQL database) with the two-session conversation
    ingested into repo "ops"."""
    folder = tmp_path_factory.mktemp("filled")
    source = folder / "week.json"
    source.write_text(json.dumps(CONVERSATION))
    if request.param == "sqlite":
        db = str(folder / "memory.db")
    else:
        server: PgServer = request.getfixturevalue("pg_server")
        name = f"cli_{uuid.uuid4().hex[:12]}"
        server.admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        db = server.url(name)
    result = invoke("ingest", str(source), "--db", db)
    assert result.exit_code == 0, result.output
    return db


@pytest.fixture
def db(filled: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A private copy of `filled`, for tests that change it."""
    if not is_postgres(filled):
        copy = tmp_path / "copy.db"
        for suffix in ("", "-wal"):
            if Path(f"{filled}{suffix}").exists():
                shutil.copy(f"{filled}{suffix}", f"{copy}{suffix}")
        return str(copy)
    server: PgServer = request.getfixturevalue("pg_server")
    name = f"cli_{uuid.uuid4().hex[:12]}"
    source = conninfo_to_dict(filled)["dbname"]
    server.admin(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
        sql.Identifier(name), sql.Identifier(str(source))))
    return server.url(name)


# ---- ingest ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_ingest_reports_each_session_and_is_idempotent(filled: str, tmp_path: Path) -> None:
    """Each session is one source named after the file; ingesting again creates nothing."""
    source = tmp_path / "week.json"
    source.write_text(json.dumps(CONVERSATION))
    report = ok_json("ingest", str(source), "--db", str(filled))
    assert report["repo"] == REPO
    assert report["format"] == "conversation"
    assert [s["source_id"] for s in report["sources"]] == ["week/1", "week/2"]
    assert report["created"] == 0
    assert all(s["nodes"] > 0 and s["messages_saved"] == 0 for s in report["sources"])


def test_ingest_checks_a_file_by_the_config_of_its_repo(tmp_path: Path) -> None:
    """Into a repo opened with room for 500 steps a session of 150 goes in (the defaults take
    100); a file refused into a new repo of an existing store leaves no repo behind."""
    db, source = tmp_path / "m.db", tmp_path / "week.json"

    async def make() -> None:
        async with mnemo.Memory(db, embedder=mnemo.HashEmbedder(64)) as mem:
            await mem.open_repo("w", config=mnemo.Config(max_steps_per_ingest=500))

    anyio.run(make)
    long = [{"observation": f"turn {i} of the talk", "action": "ok"} for i in range(150)]
    source.write_text(json.dumps({"repo": "w", "sessions": [{"goal": "Talk", "steps": long}]}))
    assert ok_json("ingest", str(source), "--db", str(db))["created"] == 1
    assert_clear_error(invoke("ingest", str(source), "--repo", "fresh", "--db", str(db),
                              "--json"), "week/1", "max_steps_per_ingest")
    assert [r["repo"] for r in ok_json("repos", "--db", str(db))] == ["w"]


def test_a_changed_session_ingested_again_is_refused_whole_until_purged(tmp_path: Path) -> None:
    """A session edited after its ingest is refused (its thread and its source hold the old
    one), naming the purge that replaces it; nothing of the new session goes in meanwhile,
    not even after `mnemo forget` (which leaves the thread); once purged it goes in."""
    db, source = tmp_path / "m.db", tmp_path / "notes.json"

    def write(city: str) -> None:
        source.write_text(json.dumps({"repo": "w", "sessions": [
            {"goal": "Eve", "steps": [{"observation": f"Eve lives in {city}.", "action": "ok"}]}]}))

    def cities() -> set[str]:
        found = ok_json("recall", "w", "where does Eve live?", "-k", "10", "--db", str(db))
        return {c for c in ("Rome", "Milan") for m in found["memories"] if c in m["node"]["text"]}

    write("Rome")
    ok_json("ingest", str(source), "--db", str(db), "--embedder", "hash:64")
    write("Milan")
    for held in ({"Rome"}, set()):  # before `mnemo forget`, then after it
        assert_clear_error(invoke("ingest", str(source), "--db", str(db), "--embedder",
                                  "hash:64", "--json"), "notes/1", "mnemo purge notes/1 --repo w")
        assert cities() == held
        ok_json("forget", "w", "notes/1", "--yes", "--db", str(db))
    ok_json("purge", "notes/1", "--repo", "w", "--yes", "--db", str(db))
    assert ok_json("ingest", str(source), "--db", str(db), "--embedder", "hash:64")["created"] == 1
    assert cities() == {"Milan"}


def test_a_session_extended_after_its_ingest_leaves_its_thread_as_it_was(tmp_path: Path) -> None:
    """A step added to an ingested session extends its thread, but the source refuses the new
    payload: the command fails before the thread takes the new messages."""
    db, source = tmp_path / "m.db", tmp_path / "notes.json"
    steps = [{"observation": "Eve lives in Rome.", "action": "ok"}]
    source.write_text(json.dumps({"repo": "w", "sessions": [{"goal": "Eve", "steps": steps}]}))
    ok_json("ingest", str(source), "--db", str(db), "--embedder", "hash:64")
    steps.append({"observation": "The migration 0042 failed with a lock timeout.", "action": "ok"})
    source.write_text(json.dumps({"repo": "w", "sessions": [{"goal": "Eve", "steps": steps}]}))
    result = invoke("ingest", str(source), "--db", str(db), "--embedder", "hash:64", "--json")
    assert_clear_error(result, "notes/1", "mnemo purge notes/1 --repo w")
    assert "'notes/1': source 'notes/1'" not in result.stderr
    assert ok_json("search", "lock timeout", "--db", str(db)) == []


def test_a_thread_another_writer_changed_during_the_ingest_is_named_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer appends to the session's thread while its source is ingested: the source
    is stored, and the error says so, naming the purge."""
    from mnemo.cli._database import CliError
    from mnemo.cli.ingest import ingest_file, load_file

    source = tmp_path / "notes.json"
    source.write_text(json.dumps({"repo": "w", "sessions": [
        {"goal": "Eve", "steps": [{"observation": "Eve lives in Rome.", "action": "ok"}]}]}))

    async def run() -> str:
        async with mnemo.Memory(tmp_path / "m.db", embedder=mnemo.HashEmbedder(64)) as mem:
            ingest = mem.ingest

            async def meanwhile(*args: Any, **kwargs: Any) -> mnemo.IngestReceipt:
                await mem.conversation().append("notes/1", [
                    {"role": "user", "content": "hi from the agent"}])
                return await ingest(*args, **kwargs)

            monkeypatch.setattr(mem, "ingest", meanwhile)
            with pytest.raises(CliError) as refused:
                await ingest_file(mem, "w", load_file(source), mnemo.Config(), threads=True,
                                  quiet=True)
            assert [n.text for n in await mem.get_nodes_by_type(
                "w", [mnemo.NodeType.EPISODIC])] == ["Eve lives in Rome. -> ok"]
            return str(refused.value)

    said = anyio.run(run)
    assert "'notes/1' was ingested, but its thread refused the messages" in said
    assert "mnemo purge notes/1 --repo w" in said


def test_ingest_reads_a_locomo_file_one_source_per_session(tmp_path: Path) -> None:
    """A LoCoMo-style file: one source per session, turns kept with their dia_id."""
    source = tmp_path / "locomo.json"
    source.write_text(json.dumps(LOCOMO))
    db = tmp_path / "l.db"
    result = invoke("ingest", str(source), "--repo", "talk", "--db", str(db))
    assert result.exit_code == 0, result.output
    assert "conv-x/1" in result.stdout
    assert "conv-x/2" in result.stdout
    hits = ok_json("search", "violin", "--db", str(db))
    assert [h["thread_id"] for h in hits] == ["conv-x/2"]

    async def dia_ids() -> set[str]:
        async with mnemo.Memory(db) as mem:
            nodes = await mem.get_nodes_by_type("talk", [mnemo.NodeType.EPISODIC])
        return {js(n.data)["metadata"]["dia_id"] for n in nodes}

    assert anyio.run(dia_ids) == {"D1:1", "D1:2", "D2:1"}


def test_ingest_rejects_bad_input(tmp_path: Path) -> None:
    """A missing file, a non-JSON file, an unknown shape, a missing field, no repo: clear
    errors, and no database is created."""
    db = tmp_path / "never.db"
    assert_clear_error(invoke("ingest", str(tmp_path / "none.json"), "--db", str(db)), "no file")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert_clear_error(invoke("ingest", str(bad), "--repo", "r", "--db", str(db)), "not a JSON")
    bad.write_text(json.dumps({"hello": 1}))
    assert_clear_error(invoke("ingest", str(bad), "--repo", "r", "--db", str(db)), "neither")
    bad.write_text(json.dumps({"sessions": [{"goal": "g", "steps": [{"action": "a"}]}]}))
    assert_clear_error(
        invoke("ingest", str(bad), "--repo", "r", "--db", str(db)), "sessions[0].steps[0]"
    )
    bad.write_text(json.dumps({"sessions": CONVERSATION["sessions"]}))
    assert_clear_error(invoke("ingest", str(bad), "--db", str(db)), "--repo")
    assert not db.exists()


def test_ingest_of_a_file_no_parser_can_read_is_one_line(tmp_path: Path) -> None:
    """JSON nested 100,000 deep and an integer of 5,000 digits are each one `error:` line,
    not a traceback (RecursionError, an integer out of range), and store nothing."""
    db = tmp_path / "never.db"
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    assert_clear_error(invoke("ingest", str(deep), "--repo", "r", "--db", str(db)), "deep.json")
    huge = tmp_path / "huge.json"
    step = '{"observation": "o", "action": "a", "metadata": {"n": ' + "9" * 5_000 + "}}"
    huge.write_text('{"sessions": [{"goal": "g", "steps": [' + step + "]}]}")
    assert_clear_error(invoke("ingest", str(huge), "--repo", "r", "--db", str(db)), "huge.json")
    assert not db.exists()


def test_ingest_checks_every_source_before_storing_any(tmp_path: Path) -> None:
    """A file whose second session has more steps than Config.max_steps_per_ingest (100), or
    holds a NUL, is a clear error naming that source, and nothing is stored: not the first
    session, nor the store or the repo (they were made before the sources were checked)."""
    db = tmp_path / "memory.db"
    long = [{"observation": f"turn {i} of the talk", "action": "ok"} for i in range(101)]
    source = tmp_path / "week.json"
    source.write_text(json.dumps({"repo": REPO, "sessions": [
        CONVERSATION["sessions"][0], {"goal": "Talk at length", "steps": long},
    ]}))
    assert_clear_error(
        invoke("ingest", str(source), "--db", str(db), "--embedder", "hash:64"),
        "week/2", "101 steps", "max_steps_per_ingest",
    )
    assert not db.exists()
    source.write_text(json.dumps({"repo": REPO, "sessions": [
        {"goal": "Talk", "steps": [{"observation": "a\u0000b", "action": "ok"}]}]}))
    assert_clear_error(invoke("ingest", str(source), "--db", str(db)), "week/1", "NUL")
    assert not db.exists()


# ---- recall ---------------------------------------------------------------------------------


def test_recall_prints_a_table_and_json(filled: str) -> None:
    """Recall shows score, type, phase, hop and text; --json has the same memories."""
    result = invoke("recall", REPO, "which port does gunicorn use?", "--db", str(filled))
    assert result.exit_code == 0, result.output
    for column in ("score", "type", "phase", "hop", "text"):
        assert column in result.stdout
    assert "gunicorn" in result.stdout
    found = ok_json("recall", REPO, "which port does gunicorn use?", "-k", "3", "--db", str(filled))
    assert 0 < len(found["memories"]) <= 3
    first = found["memories"][0]
    assert {"score", "phase", "hop", "node"} <= first.keys()
    assert any("gunicorn" in m["node"]["text"] for m in found["memories"])
    markup = invoke("recall", REPO, "gunicorn [/bold] [red]", "--db", str(filled))
    assert markup.exit_code == 0, markup.output  # user text is never read as rich markup
    assert "[/bold] [red]" in markup.stdout


def test_recall_types_restricts_node_types(filled: str) -> None:
    """--types semantic,episodic returns only those types; an unknown type is an error."""
    found = ok_json("recall", REPO, "gunicorn", "--types", "semantic,episodic", "--db", str(filled))
    assert found["memories"]
    assert {m["node"]["type"] for m in found["memories"]} <= {"semantic", "episodic"}
    assert_clear_error(
        invoke("recall", REPO, "gunicorn", "--types", "semantic,fact", "--db", str(filled)),
        "'fact'",
    )


def test_recall_errors_are_one_line(filled: str) -> None:
    """An unknown repo names the known ones; a blank query is rejected."""
    assert_clear_error(invoke("recall", "nope", "x", "--db", str(filled)), "'nope'", REPO)
    assert_clear_error(invoke("recall", REPO, "   ", "--db", str(filled)), "query")


def test_recall_uses_the_repos_embedder_and_names_a_dimension_mismatch(tmp_path: Path) -> None:
    """A repo written with the hashed embedder (512) is recalled with it without flags; an
    --embedder of another dimension (384) is refused in one line, not a shape error."""
    db = tmp_path / "hashed.db"

    async def fill() -> None:
        async with mnemo.Memory(db, embedder=mnemo.HashEmbedder()) as mem:
            await mem.open_repo("r")
            await mem.ingest("r", mnemo.Trajectory("g", [mnemo.Step("nginx on 80", "ok")]),
                             source_id="s")

    anyio.run(fill)
    found = ok_json("recall", "r", "nginx", "--db", str(db))
    assert any("nginx" in m["node"]["text"] for m in found["memories"])
    assert_clear_error(
        invoke("recall", "r", "nginx", "--db", str(db), "--embedder", "hash:384"), "dimension"
    )


# ---- sessions -------------------------------------------------------------------------------


def test_sessions_lists_live_sessions(db: str) -> None:
    """Sessions left open show with their repo, state, goal and steps; none at first."""
    assert ok_json("sessions", "--db", str(db)) == []

    async def leave_one_open() -> str:
        async with mnemo.Memory(db) as mem:
            sid = await mem.start_session("Rotate the TLS certificate", repo=REPO)
            await mem.append(sid, "certbot says the certificate expires in 3 days.", "Renew it.")
            return sid

    sid = anyio.run(leave_one_open)
    assert ok_json("sessions", "--db", str(db)) == [
        {
            "id": sid,
            "repo": REPO,
            "state": "collecting",
            "goal": "Rotate the TLS certificate",
            "steps": 1,
            "holder": None,
            "lease_until": None,
        }
    ]
    table = invoke("sessions", "--db", str(db))
    assert table.exit_code == 0
    assert "collecting" in table.stdout
    assert REPO in table.stdout


# ---- graph ----------------------------------------------------------------------------------


def test_graph_counts_by_node_and_link_type(filled: str) -> None:
    """Counts cover every node and link type; the table shows the same totals."""
    counts = ok_json("graph", REPO, "--db", str(filled))
    assert set(counts["nodes"]) == {t.value for t in mnemo.NodeType}
    assert set(counts["links"]) == {t.value for t in mnemo.LinkType}
    assert counts["nodes"]["episodic"] == 3
    assert counts["nodes"]["source"] == 2
    assert sum(counts["links"].values()) > 0
    table = invoke("graph", REPO, "--db", str(filled))
    assert table.exit_code == 0
    assert str(sum(counts["nodes"].values())) in table.stdout


def test_graph_exports_json_and_graphml(filled: str, tmp_path: Path) -> None:
    """--export json and graphml carry every node and link; --out writes a file."""
    counts = ok_json("graph", REPO, "--db", str(filled))
    n_nodes, n_links = sum(counts["nodes"].values()), sum(counts["links"].values())

    exported = invoke("graph", REPO, "--export", "json", "--db", str(filled))
    assert exported.exit_code == 0, exported.output
    dump = json.loads(exported.stdout)
    assert len(dump["nodes"]) == n_nodes
    assert len(dump["links"]) == n_links
    ids = {n["id"] for n in dump["nodes"]}
    assert all(link["src"] in ids and link["dst"] in ids for link in dump["links"])

    graphml = invoke("graph", REPO, "--export", "graphml", "--db", str(filled))
    assert graphml.exit_code == 0, graphml.output
    root = ET.fromstring(graphml.stdout.encode())
    ns = {"g": "http://graphml.graphdrawing.org/xmlns"}
    assert len(root.findall("g:graph/g:node", ns)) == n_nodes
    assert len(root.findall("g:graph/g:edge", ns)) == n_links

    out = tmp_path / "graph.graphml"
    written = invoke("graph", REPO, "--out", str(out), "--db", str(filled))
    assert written.exit_code == 0, written.output
    assert len(ET.parse(out).getroot().findall("g:graph/g:node", ns)) == n_nodes
    assert_clear_error(
        invoke("graph", REPO, "--out", str(tmp_path / "graph.txt"), "--db", str(filled)),
        "--export",
    )


def test_graph_export_into_a_missing_folder_is_one_line(filled: str) -> None:
    """--out in a folder that does not exist names the path in one line."""
    assert_clear_error(invoke("graph", REPO, "--export", "json", "--out",
                              "/nonexistent/x.json", "--db", str(filled)), "/nonexistent/x.json")


def test_graph_out_never_replaces_the_store_and_asks_before_replacing_a_file(
    db: str, tmp_path: Path
) -> None:
    """--out refuses in one line (status 2), --yes or not, the store and what mnemo keeps
    beside it (its -wal and -shm, its .lexical folder), however named, and the store stays
    whole; another file is replaced only once the user agrees (no answer or "n" keeps it,
    --json needs --yes), all or nothing, keeping its permission bits."""
    if not is_postgres(db):
        repos = ok_json("repos", "--db", db)
        link = tmp_path / "link.json"
        link.symlink_to(db)
        beside = [f"{db}-wal", f"{db}-shm", f"{db}.lexical/x.json", str(link),
                  str(Path(db).parent / "sub" / ".." / Path(db).name)]
        for named in (db, *beside):
            assert_clear_error(invoke("graph", REPO, "--export", "json", "--out", named,
                                      "--db", db, "--yes"), "keeps beside it")
        assert ok_json("repos", "--db", db) == repos
    folder = tmp_path / "exports"
    folder.mkdir()
    out = folder / "graph.json"
    out.write_text("mine\n")
    out.chmod(0o640)
    for answer in (None, "n\n"):
        kept = invoke("graph", REPO, "--out", str(out), "--db", db, input=answer)
        assert kept.exit_code == 1, kept.output
        assert out.read_text() == "mine\n"
    assert_clear_error(invoke("graph", REPO, "--out", str(out), "--db", db, "--json"), "--yes")
    assert out.read_text() == "mine\n"
    agreed = invoke("graph", REPO, "--out", str(out), "--db", db, input="y\n")
    assert agreed.exit_code == 0, agreed.output
    assert json.loads(out.read_text())["repo"] == REPO
    out.write_text("mine\n")
    assert ok_json("graph", REPO, "--out", str(out), "--db", db, "--yes")["out"] == str(out)
    assert json.loads(out.read_text())["repo"] == REPO
    assert out.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in folder.iterdir()] == ["graph.json"]  # no temporary file left


def test_graph_out_writes_into_a_pipe_and_guards_a_linked_store(db: str, tmp_path: Path) -> None:
    """--out into a FIFO writes through it, unasked, leaving it a FIFO (it was renamed over);
    a file name of 245 bytes is written; a store opened through a link keeps the files named
    after the link (its .lexical folder, its locks) from --out too."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # the export fits the pipe's buffer
    try:
        assert invoke("graph", REPO, "--export", "json", "--out", str(fifo),
                      "--db", db).exit_code == 0
        assert stat.S_ISFIFO(fifo.stat().st_mode)
        assert json.loads(os.read(reader, 1 << 20))["repo"] == REPO
    finally:
        os.close(reader)
    wide = tmp_path / ("图" * 80 + ".json")
    assert invoke("graph", REPO, "--out", str(wide), "--db", db).exit_code == 0
    assert json.loads(wide.read_text())["repo"] == REPO
    if not is_postgres(db):
        link = tmp_path / "link.db"
        link.symlink_to(db)
        for named in (f"{link}.lexical/x.json", f"{link}-graph-abc.lock"):
            assert_clear_error(invoke("graph", REPO, "--export", "json", "--out", named,
                                      "--db", str(link), "--yes"), "keeps beside it")


# ---- search and purge -----------------------------------------------------------------------


def test_search_finds_ingested_messages(filled: str) -> None:
    """Ingested sessions are threads: search finds their messages, by thread too."""
    hits = ok_json("search", "gunicorn", "--db", str(filled))
    assert hits
    assert {h["thread_id"] for h in hits} == {"week/1"}
    assert {"message_id", "thread_id", "seq", "role", "snippet", "rank"} <= hits[0].keys()
    assert ok_json("search", "gunicorn", "--thread", "week/2", "--db", str(filled)) == []
    assert len(ok_json("search", "gunicorn", "--limit", "1", "--db", str(filled))) == 1
    table = invoke("search", "pgbouncer", "--db", str(filled))
    assert table.exit_code == 0
    assert "week/2" in table.stdout


def test_search_shows_a_small_rank_to_three_digits(tmp_path: Path) -> None:
    """A rank is shown to three significant digits, however small it is (a few messages' BM25
    is about 1e-6)."""
    path = str(tmp_path / "few.db")

    async def save() -> None:
        async with mnemo.Memory(path) as mem:
            await mem.conversation().save("t", [
                {"role": "user", "content": "The staging database is orders_stage."},
                {"role": "assistant", "content": "Noted the staging database."},
                {"role": "user", "content": "thanks"}])

    anyio.run(save)
    ranks = [f"{h['rank']:.3g}" for h in ok_json("search", "staging", "--db", path)]
    table = invoke("search", "staging", "--db", path).stdout
    assert len(ranks) == 2
    assert all(rank in table and rank != "0" for rank in ranks)


def test_purge_asks_then_erases_the_thread(db: str) -> None:
    """Without --yes it asks (no keeps everything); with --yes the thread is gone from search,
    and --repo also forgets the session's graph source."""
    declined = invoke("purge", "week/1", "--db", str(db), input="n\n")
    assert declined.exit_code == 1
    assert ok_json("search", "gunicorn", "--db", str(db))

    done = ok_json("purge", "week/1", "--yes", "--repo", REPO, "--db", str(db))
    assert done["messages"] == 4
    assert done["nodes_forgotten"] > 0
    assert ok_json("search", "gunicorn", "--db", str(db)) == []
    counts = ok_json("graph", REPO, "--db", str(db))
    assert counts["nodes"]["source"] == 1

    assert_clear_error(invoke("purge", "week/1", "--yes", "--db", str(db)), "no thread")
    assert_clear_error(invoke("purge", "week/2", "--json", "--db", str(db)), "--yes")


# ---- the database file ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["recall", REPO, "x"],
        ["sessions"],
        ["graph", REPO],
        ["search", "x"],
        ["purge", "t", "--yes"],
    ],
)
def test_read_commands_need_a_mnemo_database(command: list[str], tmp_path: Path) -> None:
    """A missing file (never created), a non-SQLite file and a foreign SQLite file are clear
    errors."""
    missing = tmp_path / "missing.db"
    assert_clear_error(invoke(*command, "--db", str(missing)), "no database")
    assert not missing.exists()

    text = tmp_path / "notes.txt"
    text.write_text("not a database at all")
    assert_clear_error(invoke(*command, "--db", str(text)), "not a SQLite database")

    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE things (x)")
    conn.close()
    assert_clear_error(invoke(*command, "--db", str(foreign)), "not a mnemo one")

    # A URL of another database (it was taken for a path: "no database at mysql:/x/y").
    assert_clear_error(invoke(*command, "--db", "mysql://x/y"), "a store mnemo does not know")
    # An empty one (it was ./memory.db without a word) or a blank one.
    for blank in ("", " "):
        assert_clear_error(invoke(*command, "--db", blank), "blank")


def test_writers_refuse_a_foreign_file_and_leave_it_alone(tmp_path: Path) -> None:
    """ingest and demo never write into a SQLite file that is not mnemo's."""
    foreign = tmp_path / "app.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE things (x)")
    conn.close()
    before = foreign.read_bytes()
    source = tmp_path / "week.json"
    source.write_text(json.dumps(CONVERSATION))
    assert_clear_error(invoke("ingest", str(source), "--db", str(foreign)), "not a mnemo one")
    assert_clear_error(invoke("demo", "--db", str(foreign)), "not a mnemo one")
    assert foreign.read_bytes() == before


def test_db_defaults_to_the_mnemo_db_variable(filled: str) -> None:
    """Without --db, MNEMO_DB names the database."""
    result = invoke("graph", REPO, "--json", env={"MNEMO_DB": str(filled)})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["nodes"]["episodic"] == 3


# ---- demo and python -m ---------------------------------------------------------------------


@pytest.mark.slow
def test_demo_replays_a_conversation_and_recalls(tmp_path: Path) -> None:
    """`mnemo demo --data` runs the demo's sessions and questions on a fresh database."""
    data = tmp_path / "demo.json"
    data.write_text(json.dumps({**CONVERSATION, "queries": ["Which port does gunicorn use?"]}))
    db = tmp_path / "demo.db"
    db.write_bytes(b"")  # an empty file is a fresh start, not an error
    result = invoke("demo", "--db", str(db), "--data", str(data))
    assert result.exit_code == 0, result.output
    for expected in ("Sessions", "What was committed", "Recall: Which port", "events:"):
        assert expected in result.stdout
    assert ok_json("graph", REPO, "--db", str(db))["nodes"]["source"] == 2
    again = invoke("demo", "--db", str(db), "--data", str(data), input="y\n")
    assert again.exit_code == 0, again.output
    assert "holds a memory" in again.stdout
    summary = ok_json("demo", "--db", str(db), "--data", str(data), "--force")
    assert [s["steps"] for s in summary["sessions"]] == [2, 1]
    assert summary["committed"]["source"] == 2
    assert summary["recalls"][0]["memories"]


def test_demo_never_deletes_a_memory_unasked(tmp_path: Path) -> None:
    """`mnemo demo --store` on a file that holds a memory asks first: a no, or `--json`
    without `--force`, leaves its repos and its live session as they were."""
    db = tmp_path / "memory.db"

    async def fill() -> str:
        async with mnemo.Memory(db, embedder=mnemo.HashEmbedder()) as mem:
            await mem.open_repo("mine")
            sid = await mem.start_session("keep me", repo="mine")
            await mem.append(sid, "An observation worth keeping.", "Keep it.")
            return sid

    sid = anyio.run(fill)
    declined = invoke("demo", "--db", str(db), input="n\n")
    assert declined.exit_code == 1
    assert "holds a memory" in declined.stdout
    assert_clear_error(invoke("demo", "--db", str(db), "--json"), "--force")
    assert [r["repo"] for r in ok_json("repos", "--db", str(db))] == ["mine"]
    [live] = ok_json("sessions", "--db", str(db))
    assert (live["id"], live["steps"]) == (sid, 1)


@pytest.mark.slow
def test_python_dash_m_mnemo_runs_the_cli() -> None:
    """`python -m mnemo` is the same command line."""
    done = subprocess.run(
        [sys.executable, "-m", "mnemo", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    for command in ("demo", "ingest", "recall", "sessions", "graph", "search", "purge", "mcp"):
        assert command in done.stdout
