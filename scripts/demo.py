"""mnemo demo: an assistant's working week, remembered and recalled, fully offline.

The demo replays a multi-day conversation (scripts/demo_conversation.json) through mnemo's
public API on the embedded defaults: the offline LLM and the embedded embedder, so it needs no
network and no API key. It shows:

- sessions living their whole life: `start_session`, one `append` per step, `close_and_commit`;
- trajectory segmentation: each topic shift inside a session ("Now let's ...") should open a new
  trajectory (`StepInfo.boundary_detected`);
- what extraction committed to the knowledge graph, counted by node type;
- recall: a few questions answered from the graph, with each memory's score, phase and hop;
- the event stream, tallied by kind through `on_event`.

Run it with `scripts/demo` (creates the venv) or `python scripts/demo.py --db demo.db`.
"""

from __future__ import annotations

import argparse
import enum
import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import anyio
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

import mnemo

DEFAULT_DATA = Path(__file__).with_name("demo_conversation.json")
DEFAULT_REPO = "assistant"
TEXT_WIDTH = 100

console = Console()


@dataclass(frozen=True, slots=True)
class SessionScript:
    """One session of the conversation: its goal and its (observation, action) steps."""

    goal: str
    steps: list[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Conversation:
    repo: str
    sessions: list[SessionScript]
    queries: list[str]


@dataclass(frozen=True, slots=True)
class SessionOutcome:
    """What running one session produced."""

    goal: str
    steps: int
    trajectories: int
    boundaries: int
    committed: int
    seconds: float


class EventTally:
    """An `on_event` callback that counts events by kind."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def __call__(self, event: mnemo.Event) -> None:
        self.counts[event.kind] += 1

    def summary(self) -> str:
        parts = [f"{n} {kind}" for kind, n in self.counts.most_common()]
        return "events: " + (", ".join(parts) if parts else "none")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--db",
        type=Path,
        default=Path("demo.db"),
        help="SQLite file to use; an existing one is deleted first (default: demo.db)",
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=DEFAULT_DATA,
        help=f"conversation JSON (default: {DEFAULT_DATA.name} next to this script)",
    )
    return parser.parse_args()


def load_conversation(path: Path) -> Conversation:
    raw = json.loads(path.read_text(encoding="utf-8"))
    sessions = [
        SessionScript(
            goal=s["goal"],
            steps=[(step["observation"], step["action"]) for step in s["steps"]],
        )
        for s in raw["sessions"]
    ]
    return Conversation(
        repo=raw.get("repo", DEFAULT_REPO), sessions=sessions, queries=list(raw["queries"])
    )


def reset_database(db: Path) -> None:
    """Deletes the database and its WAL side files so every run starts from nothing."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


def label(value: object) -> str:
    """An enum member's value (`episodic`), anything else as text."""
    return str(value.value) if isinstance(value, enum.Enum) else str(value)


def shorten(text: str, width: int = TEXT_WIDTH) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1].rstrip() + "…"


async def run_session(
    mem: mnemo.Memory, repo: str, script: SessionScript, number: int, progress: Progress
) -> SessionOutcome:
    """Runs one session through its whole life: start, append every step, close and commit."""
    started = time.perf_counter()
    title = f"session {number}: {shorten(script.goal, 40)}"
    task = progress.add_task(title, total=len(script.steps))
    session_id = await mem.start_session(script.goal, repo=repo)
    trajectories: set[str] = set()
    boundaries = 0
    for observation, action in script.steps:
        info = await mem.append(session_id, observation, action)
        trajectories.add(str(info.trajectory_id))
        if info.boundary_detected:
            boundaries += 1
            progress.console.print(
                f"  [cyan]↳ new trajectory[/] at step {info.index}: ",
                Text(shorten(observation, 70), style="dim"),
                sep="",
            )
        progress.advance(task)
    progress.update(task, description=f"{title} [yellow](extracting…)")
    receipt = await mem.close_and_commit(session_id)
    await mem.end_session(session_id)
    progress.update(task, description=f"{title} [green](committed)")
    return SessionOutcome(
        goal=script.goal,
        steps=len(script.steps),
        trajectories=len(trajectories),
        boundaries=boundaries,
        committed=len(receipt.node_ids),
        seconds=time.perf_counter() - started,
    )


async def run_sessions(mem: mnemo.Memory, conversation: Conversation) -> list[SessionOutcome]:
    columns = (
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    outcomes: list[SessionOutcome] = []
    with Progress(*columns, console=console) as progress:
        for number, script in enumerate(conversation.sessions, start=1):
            outcomes.append(await run_session(mem, conversation.repo, script, number, progress))
    return outcomes


def sessions_table(outcomes: list[SessionOutcome]) -> Table:
    table = Table(title="Sessions")
    table.add_column("goal")
    for name in ("steps", "trajectories", "boundaries", "nodes committed", "seconds"):
        table.add_column(name, justify="right")
    for o in outcomes:
        table.add_row(
            Text(o.goal),
            str(o.steps),
            str(o.trajectories),
            str(o.boundaries),
            str(o.committed),
            f"{o.seconds:.2f}",
        )
    return table


async def committed_table(mem: mnemo.Memory, repo: str) -> Table:
    table = Table(title="What was committed")
    table.add_column("node type")
    table.add_column("count", justify="right")
    total = 0
    for node_type in mnemo.NodeType:
        count = len(await mem.get_nodes_by_type(repo, [node_type]))
        total += count
        table.add_row(label(node_type), str(count))
    table.add_section()
    table.add_row("[bold]total", f"[bold]{total}")
    return table


async def recall_table(mem: mnemo.Memory, repo: str, query: str) -> Table:
    result = await mem.recall(repo, query, k=5)
    table = Table(title=f"Recall: {query}", title_justify="left")
    table.add_column("score", justify="right")
    table.add_column("type")
    table.add_column("phase")
    table.add_column("hop", justify="right")
    table.add_column("text", overflow="fold")
    for recalled in result.memories:
        table.add_row(
            f"{recalled.score:.3f}",
            label(recalled.node.type),
            label(recalled.phase),
            str(recalled.hop),
            Text(shorten(recalled.node.text)),
        )
    if not result.memories:
        table.add_row("", "", "", "", Text("(nothing recalled)", style="dim"))
    return table


async def main(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    conversation = load_conversation(args.data)
    reset_database(args.db)
    tally = EventTally()
    n_steps = sum(len(s.steps) for s in conversation.sessions)
    console.rule("[bold]mnemo demo")
    console.print(
        f"{len(conversation.sessions)} sessions, {n_steps} steps into repo "
        f"[bold]{conversation.repo}[/] at {args.db} (offline LLM, embedded embedder)"
    )
    async with mnemo.Memory(str(args.db), llm=None, embedder=None, on_event=tally) as mem:
        await mem.open_repo(conversation.repo)
        outcomes = await run_sessions(mem, conversation)
        console.print(sessions_table(outcomes))
        console.print(await committed_table(mem, conversation.repo))
        for query in conversation.queries:
            console.print(await recall_table(mem, conversation.repo, query))
    console.print(tally.summary())
    console.print(f"wall time: {time.perf_counter() - started:.2f}s")


if __name__ == "__main__":
    anyio.run(main, parse_args())
