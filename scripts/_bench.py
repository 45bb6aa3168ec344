"""Helpers shared by the bench scripts: latency summaries, machine facts, and tables.

Everything here is about reporting; what a bench measures lives in its own script. Latencies
are collected as integer nanoseconds (`time.perf_counter_ns`) and shown in microseconds.
"""

from __future__ import annotations

import json
import os
import platform
import sqlite3
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil  # type: ignore[import-untyped]  # no stubs in the dev group
from rich.table import Table

from mnemo.config import Config

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class Latency:
    """Percentiles of a sample of durations, in microseconds."""

    count: int
    p50_us: float
    p90_us: float
    p99_us: float
    max_us: float
    mean_us: float

    @classmethod
    def of(cls, samples_ns: Sequence[int]) -> Latency:
        """Summarises durations in nanoseconds (linear interpolation between ranks)."""
        if not samples_ns:
            raise ValueError("no samples")
        us = np.asarray(samples_ns, dtype=np.float64) / 1_000.0
        p50, p90, p99 = np.percentile(us, [50, 90, 99])
        return cls(len(us), float(p50), float(p90), float(p99), float(us.max()), float(us.mean()))


def git_head(root: Path = REPO_ROOT) -> str | None:
    """The short commit of the checkout, marked when `mnemo/` differs from it; None outside
    git. Only read-only plumbing runs (`rev-parse`, `diff-index`): the index is never written,
    so a file whose timestamps changed may show as changed."""
    try:
        head = _git(root, "rev-parse", "--short", "HEAD").stdout.strip()
        dirty = _git(root, "diff-index", "--quiet", "HEAD", "--", "mnemo", check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if not head:
        return None
    return head if dirty.returncode == 0 else f"{head} + uncommitted changes in mnemo/"


def _git(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, check=check, timeout=5
    )


def machine_facts() -> dict[str, str]:
    """What a reader needs to compare runs: CPUs, memory, Python, SQLite, numpy, commit."""
    physical = psutil.cpu_count(logical=False)
    return {
        "cpus": f"{os.cpu_count()} logical / {physical or '?'} physical",
        "cpu model": _cpu_model() or platform.processor() or platform.machine(),
        "memory": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "os": platform.platform(terse=True),
        "python": f"{platform.python_version()} ({platform.python_implementation()})",
        "sqlite": sqlite3.sqlite_version,
        "numpy": np.__version__,
        "mnemo commit": git_head() or "unknown",
        "load average": "{:.2f} {:.2f} {:.2f} (1, 5, 15 min; other work skews results)".format(
            *os.getloadavg()
        ),
        "argv": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def facts_table(facts: dict[str, str], title: str = "Machine") -> Table:
    table = Table(title=title, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for key, value in facts.items():
        table.add_row(key, value)
    return table


def rss_bytes() -> int:
    """This process's resident set size."""
    return int(psutil.Process().memory_info().rss)


def us(value: float) -> str:
    """Microseconds, with precision that fits their size."""
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def ms(seconds: float) -> str:
    return f"{seconds * 1_000:,.1f}"


def ratio(value: float) -> str:
    return f"{value:,.2f}x"


def verdict(ok: bool) -> str:
    """A goal's outcome for a rich cell."""
    return "[green]met[/]" if ok else "[red]missed[/]"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table; cells have rich markup stripped."""

    def clean(cell: str) -> str:
        for tag in ("[green]", "[red]", "[yellow]", "[/]", "[bold]"):
            cell = cell.replace(tag, "")
        return cell.replace("|", "\\|")

    lines = [
        "| " + " | ".join(clean(h) for h in headers) + " |",
        "| " + " | ".join("---" for _ in headers) + " |",
    ]
    lines += ["| " + " | ".join(clean(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def show_table(console: Any, title: str, headers: Sequence[str],
               rows: Sequence[Sequence[str]]) -> None:
    """Prints `rows` as a rich table (the first column left, the others right), then as
    Markdown for BENCHMARKS.md."""
    table = Table(title=title)
    for n, header in enumerate(headers):
        table.add_column(header, justify="left" if n == 0 else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    print(markdown_table(headers, rows))


def config_of(settings: Sequence[str]) -> Config:
    """A Config with each `FIELD=VALUE` of `settings` applied (VALUE as JSON, else a string)."""
    overrides: dict[str, Any] = {}
    for setting in settings:
        name, _, raw = setting.partition("=")
        try:
            overrides[name.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            overrides[name.strip()] = raw
    return Config(**overrides)
