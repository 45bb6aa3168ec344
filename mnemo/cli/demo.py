"""`mnemo demo`: an assistant's working week, remembered and recalled, fully offline.

The demo replays a multi-day conversation (`data/demo_conversation.json` beside this module)
through mnemo's public API on the embedded defaults: the offline LLM and the embedded embedder,
so it needs no network and no API key. It shows:

- sessions living their whole life: `start_session`, one `append` per step, `close_and_commit`;
- trajectory segmentation: each topic shift inside a session ("Now let's ...") should open a new
  trajectory (`StepInfo.boundary_detected`);
- what extraction committed to the knowledge graph, counted by node type;
- recall: a few questions answered from the graph, with each memory's score, phase and hop;
- each session saved as conversation thread `demo/N` too, for `mnemo search` and the web app;
- the event stream, tallied by kind through `on_event`.

`scripts/demo` and `mnemo demo` both run `run_demo`.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
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

from mnemo.cli._database import CliError, check_database
from mnemo.cli._output import recall_table, shorten
from mnemo.events import Event
from mnemo.graph.model import NodeType
from mnemo.jsonable import label, recall_json
from mnemo.memory import Memory
from mnemo.ports import JSONObject
from mnemo.storage.files import StoreFile, store_file

DEFAULT_REPO = "assistant"


def thread_id(number: int) -> str:
    """The conversation thread the demo saves session `number` (from 1) as."""
    return f"demo/{number}"


def default_data() -> Path:
    """The demo conversation shipped in the package."""
    return Path(str(resources.files("mnemo.cli").joinpath("data", "demo_conversation.json")))


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

    def __call__(self, event: Event) -> None:
        self.counts[event.kind] += 1

    def summary(self) -> str:
        parts = [f"{n} {kind}" for kind, n in self.counts.most_common()]
        return "events: " + (", ".join(parts) if parts else "none")


def load_conversation(path: Path) -> Conversation:
    """Reads a demo conversation file.

    Raises:
        CliError: the file is unreadable or not in the demo's shape.
    """
    try:
        raw: Any = json.loads(path.read_text(encoding="utf-8"))
        sessions = [
            SessionScript(
                goal=s["goal"],
                steps=[(step["observation"], step["action"]) for step in s["steps"]],
            )
            for s in raw["sessions"]
        ]
        return Conversation(
            repo=raw.get("repo", DEFAULT_REPO),
            sessions=sessions,
            queries=list(raw.get("queries", [])),
        )
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise CliError(f"{path} is not a demo conversation: {exc!r}") from exc


def holds_memory(db: Path) -> bool:
    """Whether `db` is a mnemo database with tables (something `reset_database` would delete).

    Raises:
        CliError: `db` exists and is not a mnemo database.
    """
    check_database(db, must_exist=False)
    return store_file(db) is StoreFile.MNEMO


def reset_database(db: Path) -> None:
    """Deletes the database and its WAL side files so every run starts from nothing; refuses
    a file that is not a mnemo database, which cannot be the demo's.

    Raises:
        CliError: `db` exists and is not a mnemo database.
    """
    check_database(db, must_exist=False)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


async def run_session(
    mem: Memory, repo: str, script: SessionScript, number: int, progress: Progress
) -> SessionOutcome:
    """Runs one session through its whole life: start, append every step, close and commit."""
    started = time.perf_counter()
    title = f"session {number}: {escape(shorten(script.goal, 40))}"
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
    # The same session as a conversation thread (what `mnemo ingest` saves too), so that
    # `mnemo search` and the web app's threads have something to show.
    messages: list[JSONObject] = []
    for observation, action in script.steps:
        messages += [{"role": "user", "content": observation},
                     {"role": "assistant", "content": action}]
    await mem.conversation().save(thread_id(number), messages)
    progress.update(task, description=f"{title} [green](committed)")
    return SessionOutcome(
        goal=script.goal,
        steps=len(script.steps),
        trajectories=len(trajectories),
        boundaries=boundaries,
        committed=len(receipt.node_ids),
        seconds=time.perf_counter() - started,
    )


async def run_sessions(
    mem: Memory, conversation: Conversation, console: Console
) -> list[SessionOutcome]:
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


async def committed_counts(mem: Memory, repo: str) -> dict[str, int]:
    """How many nodes of each type the repo holds."""
    return {
        label(node_type): len(await mem.get_nodes_by_type(repo, [node_type]))
        for node_type in NodeType
    }


def committed_table(counts: dict[str, int]) -> Table:
    table = Table(title="What was committed")
    table.add_column("node type")
    table.add_column("count", justify="right")
    for name, count in counts.items():
        table.add_row(name, str(count))
    table.add_section()
    table.add_row("[bold]total", f"[bold]{sum(counts.values())}")
    return table


async def run_demo(
    db: Path, data: Path | None = None, *, console: Console | None = None
) -> dict[str, object]:
    """Replays the conversation into a fresh `db`, prints what was committed and recalled, and
    returns the same as JSON-ready values (sessions, committed counts, recalls, events).

    Raises:
        CliError: the data file is unreadable, or `db` holds something other than mnemo's.
    """
    console = console or Console()
    started = time.perf_counter()
    conversation = load_conversation(data or default_data())
    reset_database(db)
    tally = EventTally()
    n_steps = sum(len(s.steps) for s in conversation.sessions)
    console.rule("[bold]mnemo demo")
    console.print(
        f"{len(conversation.sessions)} sessions, {n_steps} steps into repo "
        f"[bold]{escape(conversation.repo)}[/] at {escape(str(db))} "
        "(offline LLM, embedded embedder)"
    )
    recalls: list[dict[str, object]] = []
    async with Memory(str(db), llm=None, embedder=None, on_event=tally) as mem:
        await mem.open_repo(conversation.repo)
        outcomes = await run_sessions(mem, conversation, console)
        console.print(sessions_table(outcomes))
        counts = await committed_counts(mem, conversation.repo)
        console.print(committed_table(counts))
        for query in conversation.queries:
            result = await mem.recall(conversation.repo, query, k=5)
            console.print(recall_table(result, query))
            recalls.append({**recall_json(result), "query": query})
    seconds = time.perf_counter() - started
    console.print(tally.summary())
    console.print(f"wall time: {seconds:.2f}s")
    return {
        "db": str(db),
        "repo": conversation.repo,
        "sessions": [asdict(o) for o in outcomes],
        "committed": counts,
        "recalls": recalls,
        "events": dict(tally.counts),
        "seconds": seconds,
    }
