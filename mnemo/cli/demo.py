"""`mnemo demo`: an assistant's working week (`data/demo_conversation.json`) remembered and
recalled through the public API, offline, each session also saved as thread `demo/N`."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import msgspec
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn
from rich.text import Text

from mnemo.cli._database import CliError, check_database
from mnemo.cli._output import progress, recall_table, table
from mnemo.cli.ingest import Conversation, Session, messages, read_json
from mnemo.graph.model import NodeType
from mnemo.jsonable import label, recall_json
from mnemo.memory import Memory
from mnemo.ports import Event
from mnemo.storage.files import StoreFile, store_file
from mnemo.text import shorten

DEFAULT_REPO = "assistant"


def default_data() -> Path:
    return Path(str(resources.files("mnemo.cli").joinpath("data", "demo_conversation.json")))


@dataclass(frozen=True, slots=True)
class SessionOutcome:
    goal: str
    steps: int
    trajectories: int
    boundaries: int
    committed: int
    seconds: float


def load_conversation(path: Path) -> Conversation:
    """Reads a demo conversation file (CliError when unreadable or of another shape)."""
    try:
        return msgspec.convert(read_json(path), Conversation)
    except msgspec.ValidationError as exc:
        raise CliError(f"{path} is not a demo conversation: {exc}") from exc


def holds_memory(db: Path) -> bool:
    """Whether `db` is a mnemo database with tables (CliError when it is not mnemo's)."""
    check_database(db, must_exist=False)
    return store_file(db) is StoreFile.MNEMO


def reset_database(db: Path) -> None:
    """Deletes the database and its WAL side files (CliError for a file that is not mnemo's)."""
    check_database(db, must_exist=False)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


async def run_session(mem: Memory, repo: str, script: Session, number: int,
                      bars: Progress) -> SessionOutcome:
    started = time.perf_counter()
    title = f"session {number}: {escape(shorten(script.goal, 40))}"
    task = bars.add_task(title, total=len(script.steps))
    session_id = await mem.start_session(script.goal, repo=repo)
    trajectories: set[str] = set()
    boundaries = 0
    for step in script.steps:
        info = await mem.append(session_id, step.observation, step.action)
        trajectories.add(str(info.trajectory_id))
        if info.boundary_detected:
            boundaries += 1
            bars.console.print(f"  [cyan]↳ new trajectory[/] at step {info.index}: ",
                               Text(shorten(step.observation, 70), style="dim"), sep="")
        bars.advance(task)
    bars.update(task, description=f"{title} [yellow](extracting…)")
    receipt = await mem.close_and_commit(session_id)
    await mem.end_session(session_id)
    await mem.conversation().save(f"demo/{number}", messages(script))
    bars.update(task, description=f"{title} [green](committed)")
    return SessionOutcome(script.goal, len(script.steps), len(trajectories), boundaries,
                          len(receipt.node_ids), time.perf_counter() - started)


async def run_demo(db: Path, data: Path | None, *, console: Console) -> dict[str, object]:
    """Replays the conversation into a fresh `db`, prints what was committed and recalled, and
    returns it as JSON-ready values (CliError as `load_conversation` and `reset_database`)."""
    started = time.perf_counter()
    conversation = load_conversation(data or default_data())
    repo = conversation.repo or DEFAULT_REPO
    reset_database(db)
    events: Counter[str] = Counter()
    n_steps = sum(len(s.steps) for s in conversation.sessions)
    console.rule("[bold]mnemo demo")
    console.print(
        f"{len(conversation.sessions)} sessions, {n_steps} steps into repo "
        f"[bold]{escape(repo)}[/] at {escape(str(db))} (offline LLM, embedded embedder)")
    recalls: list[dict[str, object]] = []

    def tally(event: Event) -> None:
        events[event.kind] += 1

    async with Memory(str(db), llm=None, embedder=None, on_event=tally) as mem:
        await mem.open_repo(repo)
        with progress(console) as bars:
            bars.columns = (SpinnerColumn(), *bars.columns)
            outcomes = [await run_session(mem, repo, script, number, bars)
                        for number, script in enumerate(conversation.sessions, start=1)]
        console.print(table("Sessions", ("goal", "steps>", "trajectories>", "boundaries>",
                                         "nodes committed>", "seconds>"),
                            [(Text(o.goal), str(o.steps), str(o.trajectories), str(o.boundaries),
                              str(o.committed), f"{o.seconds:.2f}") for o in outcomes],
                            title_justify="center"))
        counts = {label(kind): len(await mem.get_nodes_by_type(repo, [kind]))
                  for kind in NodeType}
        committed = table("What was committed", ("node type", "count>"),
                          [(name, str(count)) for name, count in counts.items()],
                          title_justify="center")
        committed.add_section()
        committed.add_row("[bold]total", f"[bold]{sum(counts.values())}")
        console.print(committed)
        for query in conversation.queries:
            result = await mem.recall(repo, query, k=5)
            console.print(recall_table(result, query))
            recalls.append({**recall_json(result), "query": query})
    seconds = time.perf_counter() - started
    console.print("events: " + (", ".join(f"{n} {kind}" for kind, n in events.most_common())
                                or "none"))
    console.print(f"wall time: {seconds:.2f}s")
    return {
        "db": str(db), "repo": repo, "sessions": [asdict(o) for o in outcomes], "committed": counts,
        "recalls": recalls, "events": dict(events), "seconds": seconds}
