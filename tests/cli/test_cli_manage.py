"""`mnemo repos`, `view`, `session close|commit|discard|end` and `--version`."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner, Result

import mnemo
from mnemo.cli import app
from tests.backends import sql
from tests.fakes import FakeLLM, leave_extracting

ROOT = Path(__file__).resolve().parents[2]

runner = CliRunner()
REPO = "ops"


def invoke(*args: str, input: str | None = None) -> Result:
    return runner.invoke(app, list(args), input=input, env={"MNEMO_STORE": "", "MNEMO_DB": ""})


def ok_json(*args: str) -> Any:
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture
def db(store: str) -> str:
    """A store (each backend in turn) with two repos."""
    path = store

    async def make() -> None:
        async with mnemo.Memory(path, embedder=mnemo.HashEmbedder()) as mem:
            await mem.open_repo(REPO)
            await mem.open_repo("a-repo-with-a-rather-long-name-that-must-never-be-cut-short")

    anyio.run(make)
    return path


async def open_session(db: str, steps: int = 1) -> str:
    async with mnemo.Memory(db) as mem:
        sid = await mem.start_session("Rotate the TLS certificate", repo=REPO)
        for i in range(steps):
            await mem.append(sid, f"certbot says the certificate expires in {i} days.", "Renew.")
        return sid


def test_version_prints_the_package_version() -> None:
    """--version prints `mnemo X.Y.Z` and exits 0."""
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"mnemo {mnemo_version()}"


def mnemo_version() -> str:
    from importlib.metadata import version

    from mnemo.version import DISTRIBUTION

    return version(DISTRIBUTION)


def test_repos_lists_each_repo_with_its_live_sessions(db: str) -> None:
    """Every repo is listed, with how many live sessions it has; names are never cut."""
    anyio.run(open_session, db)
    assert ok_json("repos", "--db", str(db)) == [
        {"repo": REPO, "live_sessions": 1},
        {"repo": "a-repo-with-a-rather-long-name-that-must-never-be-cut-short",
         "live_sessions": 0},
    ]
    table = runner.invoke(app, ["repos", "--db", str(db)], terminal_width=40)
    assert table.exit_code == 0
    assert "…" not in table.stdout
    assert "never-be-cut-short" in table.stdout.replace("\n", "").replace("│", "").replace(" ", "")


def test_sessions_table_shows_short_ids_that_commands_take(db: str) -> None:
    """At 80 columns a session's id is shown as its first 8 digits, whole on one line (as
    git shows a commit), and `mnemo session` takes that prefix, with or without its kind.
    Before, the 40-character id was folded over several lines and only taken whole."""
    sid = anyio.run(open_session, db)
    table = runner.invoke(app, ["sessions", "--db", str(db)], terminal_width=80)
    assert table.exit_code == 0
    short = sid.removeprefix("session_")[:8]
    [row] = [line for line in table.stdout.splitlines() if short in line]
    assert row.split("│")[1].strip() == short
    assert max(len(line) for line in table.stdout.splitlines()) <= 80
    assert ok_json("session", "close", short, "--db", str(db))["session_id"] == sid
    discarded = ok_json("session", "discard", f"session_{short}", "--yes", "--db", str(db))
    assert discarded["state"] == "idle"


def test_an_ambiguous_prefix_is_refused_naming_the_candidates(db: str) -> None:
    """A prefix two live sessions share is one error line naming both, short; a prefix no
    session has names none."""
    first = anyio.run(open_session, db)
    second = anyio.run(open_session, db)
    refused = invoke("session", "end", "session_", "--db", str(db))
    assert refused.exit_code == 2
    assert "ambiguous" in refused.stderr
    for sid in (first, second):
        assert sid.removeprefix("session_")[:8] in refused.stderr
    assert ok_json("sessions", "--db", str(db))[0]["id"] in (first, second)


def test_session_close_then_commit_then_end(db: str) -> None:
    """close waits for the extraction (ready), commit applies it (idle, node ids), end ends
    it: `mnemo sessions` no longer lists it."""
    sid = anyio.run(open_session, db, 2)
    closed = ok_json("session", "close", sid, "--db", str(db))
    assert closed["state"] == "ready"
    committed = ok_json("session", "commit", sid, "--db", str(db))
    assert committed["state"] == "idle"
    assert committed["node_ids"]
    ended = ok_json("session", "end", sid, "--db", str(db))
    assert ended["state"] == "ended"
    assert ok_json("sessions", "--db", str(db)) == []

    async def nodes() -> set[str]:
        async with mnemo.Memory(db) as mem:
            return {n.id for n in await mem.get_nodes_by_type(REPO, list(mnemo.NodeType))}

    assert set(committed["node_ids"]) <= anyio.run(nodes)


def test_session_discard_and_errors(db: str) -> None:
    """discard drops a ready changeset (idle); an unknown id or a call the state refuses is
    one line on stderr with exit 2."""
    sid = anyio.run(open_session, db)
    ok_json("session", "close", sid, "--db", str(db))
    assert ok_json("session", "discard", sid, "-y", "--db", str(db))["state"] == "idle"
    refused = invoke("session", "commit", sid, "--db", str(db))
    assert refused.exit_code == 2
    assert "not_ready" in refused.stderr
    unknown = invoke("session", "end", "session_nope", "--db", str(db))
    assert unknown.exit_code == 2
    assert "no live session 'session_nope'" in unknown.stderr


def test_session_end_and_discard_ask_before_work_is_dropped(db: str) -> None:
    """Ending a collecting session, or discarding a ready one, asks first: a no, or --json
    without --yes, leaves the session as it was; --yes goes on."""
    sid = anyio.run(open_session, db, 2)
    declined = invoke("session", "end", sid, "--db", str(db), input="n\n")
    assert declined.exit_code == 1
    assert "2 steps" in declined.stdout
    refused = invoke("session", "end", sid, "--db", str(db), "--json")
    assert refused.exit_code == 2
    assert "--yes" in refused.stderr
    [live] = ok_json("sessions", "--db", str(db))
    assert (live["id"], live["state"], live["steps"]) == (sid, "collecting", 2)

    assert ok_json("session", "close", sid, "--db", str(db))["state"] == "ready"
    kept = invoke("session", "discard", sid, "--db", str(db), input="n\n")
    assert kept.exit_code == 1
    assert "changeset is dropped" in kept.stdout
    assert ok_json("sessions", "--db", str(db))[0]["state"] == "ready"
    assert ok_json("session", "discard", sid, "--yes", "--db", str(db))["state"] == "idle"

    other = anyio.run(open_session, db)
    assert ok_json("session", "end", other, "--yes", "--db", str(db))["state"] == "ended"


async def leave_idle(db: str, goal: str) -> str:
    """A session committed and left idle, its last change two hours ago (past the default
    idle timeout of an hour)."""
    async with mnemo.Memory(db) as mem:
        sid = await mem.start_session(goal, repo=REPO)
        await mem.append(sid, "nginx returns 502.", "Start gunicorn.")
        await mem.close_and_commit(sid)
        long_ago = (datetime.now(UTC) - timedelta(hours=2)).isoformat()
        await sql(mem, "UPDATE sessions SET updated_at = ? WHERE id = ?", long_ago, sid)
        return sid


def test_sessions_shows_work_in_progress_and_all_shows_idle_ones(db: str) -> None:
    """`mnemo sessions` lists the sessions at work and says how many idle ones it leaves out;
    `--all` lists those too, with their last episode's goal. Neither, nor `repos` nor
    `doctor`, ends an idle session past its timeout (looking never writes); the next command
    that works (`session close`) does."""
    working = anyio.run(open_session, db)
    idle = anyio.run(leave_idle, db, "Deploy the blog")
    assert [s["id"] for s in ok_json("sessions", "--db", db)] == [working]
    table = invoke("sessions", "--db", db)
    assert table.exit_code == 0
    assert "1 idle not shown" in table.stdout
    for command in (["sessions", "--all"], ["repos"], ["doctor", "--quick"], ["sessions"]):
        assert invoke(*command, "--db", db).exit_code == 0, command
    listed = {s["id"]: s for s in ok_json("sessions", "--all", "--db", db)}
    assert listed.keys() == {working, idle}
    assert (listed[idle]["state"], listed[idle]["goal"], listed[idle]["steps"]) == (
        "idle", "Deploy the blog", 0)
    assert ok_json("session", "close", working, "--db", db)["state"] == "ready"
    assert [s["id"] for s in ok_json("sessions", "--all", "--db", db)] == [working]


def test_view_shows_a_message_whole_with_its_neighbours(db: str) -> None:
    """view prints the target message's whole content and its neighbours; --json the view;
    an unknown id is one line."""
    long_text = "The deploy log says: " + "gunicorn restarted. " * 40

    async def save() -> str:
        async with mnemo.Memory(db) as mem:
            conversation = mem.conversation()
            await conversation.save("t1", [
                {"role": "user", "content": "Why is the blog down?"},
                {"role": "assistant", "content": long_text},
                {"role": "user", "content": "Thanks."},
            ])
            return (await conversation.raw("t1"))[1].id

    message_id = anyio.run(save)
    view = ok_json("view", message_id, "--db", str(db), "--radius", "1")
    assert view["target"]["content"] == long_text
    assert [m["seq"] for m in view["messages"]] == [0, 1, 2]
    table = runner.invoke(app, ["view", message_id, "--db", str(db)], terminal_width=200)
    assert table.exit_code == 0
    whole = table.stdout.split(f"message {message_id} (seq 1, assistant):")[1]
    assert "".join(whole.split()) == "".join(long_text.split())
    unknown = invoke("view", "msg_nope", "--db", str(db))
    assert unknown.exit_code == 2
    assert unknown.stderr.startswith("error: ")
    short = message_id.removeprefix("msg_")[:8]
    assert ok_json("view", short, "--db", str(db))["target"]["id"] == message_id
    narrow = runner.invoke(app, ["view", short, "--db", str(db)], terminal_width=80)
    assert narrow.exit_code == 0
    rows = [line for line in narrow.stdout.splitlines() if "│" in line]
    assert any(row.split("│")[4].strip() == short for row in rows)


@pytest.mark.slow
async def test_sessions_shows_the_holder_of_a_running_extraction(db: str) -> None:
    """`mnemo sessions`, run beside a live app on the same store, lists the app's sessions
    and, for one extracting, the holder that runs it and its lease."""
    llm = FakeLLM()
    async with mnemo.Memory(db, llm=llm, embedder=mnemo.HashEmbedder()) as mem:
        sid = await mem.start_session("Rotate the TLS certificate", repo=REPO)
        await mem.append(sid, "certbot says the certificate expires in 3 days.", "Renew it.")
        held = llm.hold("semantic")
        await mem.close(sid)
        with anyio.fail_after(10):
            await held.started.wait()
        done = await anyio.run_process(
            [sys.executable, "-m", "mnemo", "sessions", "--json", "--db", db],
            cwd=str(ROOT), check=False,
        )
        held.release()
    assert done.returncode == 0, done.stderr.decode()
    [listed] = [s for s in json.loads(done.stdout) if s["id"] == sid]
    assert listed["state"] == "extracting"
    assert listed["holder"].startswith("holder_")
    until = datetime.fromisoformat(listed["lease_until"])
    assert until > datetime.now(UTC)


class CompanyLLM(FakeLLM):
    """An LLM of the caller's own: no URI builds it."""

    name = "my-company-llm"


def test_a_refused_session_close_leaves_the_repos_own_llm_recorded(db: str) -> None:
    """`mnemo session close` (no --llm) of a session extracting on the repo's own LLM is
    refused, and leaves the repo's record as it was and the session extracting: the CLI has
    only a stand-in of that LLM, which takes no work over. Before, the refused close recorded
    the offline LLM for the repo."""
    sid = anyio.run(lambda: leave_extracting(db, CompanyLLM(), repo=REPO,
                                             embedder=mnemo.HashEmbedder()))

    async def records() -> list[tuple[Any, ...]]:
        async with mnemo.Memory(db, embedder=mnemo.HashEmbedder(), inspect=True) as mem:
            return await sql(mem, "SELECT name, embedder, llm FROM repos ORDER BY name")

    before = anyio.run(records)
    assert (REPO, "hash2", "my-company-llm") in before
    refused = invoke("session", "close", sid, "--db", db)
    assert refused.exit_code == 2
    assert "extraction_in_progress" in refused.stderr
    assert anyio.run(records) == before
    [listed] = ok_json("sessions", "--db", db)
    assert (listed["id"], listed["state"]) == (sid, "extracting")


def _earlier_hash() -> mnemo.HashEmbedder:
    """The hashed embedder recorded under its earlier features' name (`hash`)."""
    embedder = mnemo.HashEmbedder()
    embedder.name = "hash"
    return embedder


@pytest.fixture
def retired(store: str) -> str:
    """A store (each backend in turn) whose repo holds the hashed embedder's retired
    features."""

    async def make() -> None:
        async with mnemo.Memory(store, embedder=_earlier_hash()) as mem:
            await mem.open_repo(REPO)
            await mem.ingest(REPO, mnemo.Trajectory("serve", [mnemo.Step(
                "Nginx listens on port 8080 behind the proxy.", "edit nginx.conf")]),
                source_id="s")

    anyio.run(make)
    return store


def test_reembed_makes_a_retired_repo_recall_again(retired: str) -> None:
    """`mnemo recall` on a repo of the retired hashed features says to run `mnemo reembed`;
    `mnemo reembed REPO` makes its vectors with hash2 (of the same dimension) and records it,
    and `mnemo recall` then finds its facts; run again, it re-embeds with the record's."""
    refused = invoke("recall", REPO, "nginx port", "--db", retired)
    assert refused.exit_code == 2
    assert f"mnemo reembed {REPO}" in refused.stderr
    done = ok_json("reembed", REPO, "--db", retired)
    assert done["nodes"] > 0
    assert (done["embedder"], done["dim"], done["resumed"]) == ("hash2", 512, False)
    found = ok_json("recall", REPO, "which port does nginx listen on", "--db", retired)
    assert "Nginx listens on port 8080 behind the proxy." in json.dumps(found)
    again = invoke("reembed", REPO, "--db", retired)
    assert again.exit_code == 0, again.output
    assert f"re-embedded {done['nodes']} nodes of {REPO} with hash2 (512 dimensions)" in (
        " ".join(again.stdout.split()))


def test_reembed_takes_an_embedder_and_refuses_an_unknown_repo(retired: str) -> None:
    """--embedder chooses the new embedder (another dimension is fine); an unknown repo is
    one error line naming the known ones, and nothing is re-embedded."""
    done = ok_json("reembed", REPO, "--embedder", "hash:64", "--db", retired)
    assert (done["embedder"], done["dim"]) == ("hash2:64", 64)
    missing = invoke("reembed", "nowhere", "--db", retired)
    assert missing.exit_code == 2
    assert "unknown repo 'nowhere'" in missing.stderr
    assert REPO in missing.stderr
    found = ok_json("recall", REPO, "nginx port", "--db", retired)
    assert "Nginx listens on port 8080 behind the proxy." in json.dumps(found)
