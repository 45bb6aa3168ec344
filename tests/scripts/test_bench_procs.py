"""`scripts/bench_sessions.py --processes` (scripts/_procs.py): the harness
counts what real worker processes did on one store, and reads the store back to check it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The scripts import their helpers by bare name (they run as `python scripts/x.py`). Last on
# the path, so no script shadows a module other tests import; spawned workers inherit it.
sys.path.append(str(Path(__file__).resolve().parents[2] / "scripts"))

import _procs
import bench_sessions
from _stores import SQLITE, open_stores

SIZES = _procs.ProcSizes(seconds=0.5, commit_steps=2, warmup=2)


def test_processes_argument_takes_a_list_of_counts() -> None:
    """`--processes 1,2,4` means three runs; a count below one is refused."""
    assert _procs.parse_processes("1,2,4") == (1, 2, 4)
    with pytest.raises(ValueError, match="positive counts"):
        _procs.parse_processes("2,0")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["shared", "commit"])
async def test_two_workers_are_counted_and_the_store_agrees(case: str) -> None:
    """Two worker processes run a case on one SQLite store: every timed operation is
    counted, none is refused, and the store holds exactly the steps they saw accepted."""
    async with open_stores(None, "mnemo-test-procs-") as stores:
        row = await _procs.run_case(stores, SQLITE, case, 2, SIZES, bench_sessions.FastLLM,
                                    bench_sessions.FastEmbedder)
    assert row.check == "ok"
    assert row.refused == 0
    assert row.latency is not None
    assert row.latency.count == row.appends > 0
    assert row.wall_s >= SIZES.seconds
    if case == "commit":
        assert row.commits > 0
        assert row.nodes >= row.commits
