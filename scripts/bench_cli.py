"""How long a cold `mnemo` command takes: a fresh process per run, bytecode caches warm.

Each command of the table runs once to warm the caches, then `--runs` times; the table gives
the median wall time and the median CPU time (user + system) of each, for every `--mnemo`
console script given (several compare installs, e.g. a branch's and main's), the runs of the
installs interleaved so that a change in the machine's load falls on all of them. The store is
the demo's (`mnemo demo`, made in `--store` when missing); recall embeds its query with
MiniLM, so its time includes loading the model.

Run: `.venv/bin/python scripts/bench_cli.py [--runs 5] [--store /tmp/cli-bench/demo.db]
[--mnemo .venv/bin/mnemo ...]`.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import time
from pathlib import Path
from statistics import median

from _bench import REPO_ROOT, markdown_table

COMMANDS: list[tuple[str, list[str]]] = [
    ("--version", ["--version"]),
    ("repos", ["repos"]),
    ("recall", ["recall", "assistant", "why was the blog down?"]),
    ("search", ["search", "gunicorn"]),
    ("history", ["history", "assistant"]),
    ("sessions", ["sessions"]),
    ("graph", ["graph", "assistant"]),
]


def once(mnemo: str, args: list[str], store: Path, env: dict[str, str]) -> tuple[float, float]:
    """One cold run: its wall and CPU seconds."""
    extra = [] if args == ["--version"] else ["--store", str(store)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([mnemo, *args, *extra], cwd=store.parent, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(runs: int, store: Path, installs: list[str]) -> str:
    # Cached bytecode, as an installed package has (this environment may turn it off).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env = {k: v for k, v in env.items() if not k.startswith("MNEMO_")}
    if not store.exists():
        store.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([installs[0], "demo", "--store", str(store), "--json"], env=env,
                       check=True, stdout=subprocess.DEVNULL, cwd=store.parent)
    load = os.getloadavg()
    rows: list[list[str]] = []
    for name, args in COMMANDS:
        times: dict[str, list[tuple[float, float]]] = {mnemo: [] for mnemo in installs}
        for mnemo in installs:
            once(mnemo, args, store, env)
        for _ in range(runs):
            for mnemo in installs:
                times[mnemo].append(once(mnemo, args, store, env))
        row = [f"`mnemo {name}`"]
        for mnemo in installs:
            row.append(f"{median(w for w, _ in times[mnemo]):.2f}")
            row.append(f"{median(c for _, c in times[mnemo]):.2f}")
        rows.append(row)
    headers = ["command"]
    for mnemo in installs:
        headers += [f"{mnemo} wall s", f"{mnemo} CPU s"]
    after = os.getloadavg()
    return (f"load average {load[0]:.1f} before, {after[0]:.1f} after; median of {runs}\n\n"
            + markdown_table(headers, rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--store", type=Path, default=Path("/tmp/cli-bench/demo.db"))
    parser.add_argument("--mnemo", action="append", dest="installs",
                        help="a mnemo console script (repeat to compare installs)")
    options = parser.parse_args()
    installs = options.installs or [str(REPO_ROOT / ".venv" / "bin" / "mnemo")]
    print(main(options.runs, options.store.resolve(), installs))
