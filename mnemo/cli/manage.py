"""`mnemo repos`, `mnemo reembed REPO`, `mnemo view MESSAGE_ID` and
`mnemo session close|commit|discard|end ID`."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import anyio
import typer
from rich.markup import escape
from rich.text import Text

from mnemo.cli._common import (
    Json,
    app,
    check_repo,
    confirm,
    model_options,
    open_memory,
    store_options,
)
from mnemo.cli._ids import resolve_id, short_ids
from mnemo.cli._output import emit, print_json, progress, stderr_console, stdout_console, table
from mnemo.cli._settings import Settings
from mnemo.conversation.model import Snapshot
from mnemo.jsonable import label, view_json
from mnemo.memory import Memory
from mnemo.ports import Event, JSONObject
from mnemo.session.machine import State
from mnemo.text import shorten

if TYPE_CHECKING:
    from mnemo.graph.reembed import ReembedProgress

session_app = typer.Typer(
    name="session", help="Act on one live session: close, commit, discard or end it.",
    no_args_is_help=True)
app.add_typer(session_app, name="session")

SessionId = Annotated[
    str, typer.Argument(help="The session's id, or a unique prefix of it (see `mnemo sessions`).")]
# A close's extraction ends in one of these.
_SETTLED = {State.READY, State.FAILED, State.IDLE, State.COLLECTING}


@app.command()
@store_options
async def repos(*, settings: Settings, as_json: Json = False) -> None:
    """List the repos: name and live sessions."""
    async with open_memory(settings) as mem:
        names = await mem.list_repos()
        live = await mem.list_sessions()
    rows = [(name, sum(s.repo == name for s in live)) for name in names]
    emit(as_json, [{"repo": name, "live_sessions": n} for name, n in rows],
         table(f"Repos ({len(rows)})", ("repo~", "live sessions>"),
               [(Text(name), str(n)) for name, n in rows], empty=(0, "(no repos)")))


@app.command()
@model_options(only=("store", "embedder", "config"))
async def reembed(
    repo: Annotated[str, typer.Argument(help="The repo whose vectors to make again.")],
    *,
    settings: Settings,
    batch_size: Annotated[
        int, typer.Option(min=1, max=10_000, help="Nodes embedded in one call.")
    ] = 256,
    as_json: Json = False,
) -> None:
    """Make every vector of a repo again with an embedder, and record it as the repo's.

    Without --embedder (or MNEMO_EMBEDDER), the repo's own embedder as this mnemo builds it:
    a repo of the hashed embedder's retired features gets today's (hash2). The repo is read
    and written as usual meanwhile; interrupted, it keeps its old vectors, and running the
    command again carries on."""
    done: JSONObject = {}

    def switched(event: Event) -> None:
        if event.kind == "repo_reembedded" and event.repo == repo:
            done.update(event.data)

    # A writing command: a working Memory (an inspecting one records no model).
    async with open_memory(settings, works=True, on_event=switched) as mem:
        await check_repo(mem, repo)
        with progress(stderr_console(), disable=as_json) as bar:
            task = bar.add_task(f"reembed {repo}", total=None)

            def advance(update: ReembedProgress) -> None:
                bar.update(task, completed=update.done, total=update.total,
                           description=f"reembed {repo} ({update.stage})")

            nodes = await mem.reembed(repo, batch_size=batch_size, progress=advance)
    out = {"repo": repo, "nodes": nodes, "embedder": done.get("embedder"),
           "dim": done.get("dim"), "resumed": done.get("resumed")}
    carried = " (carried on from an earlier run)" if out["resumed"] else ""
    emit(as_json, out, Text(
        f"re-embedded {nodes} nodes of {repo} with {out['embedder']} "
        f"({out['dim']} dimensions){carried}"))


@app.command()
@store_options
async def view(
    message_id: Annotated[
        str, typer.Argument(help="A message id from `mnemo search`, or a unique prefix of it.")],
    radius: Annotated[
        int, typer.Option(min=0, max=100, help="Messages to show on each side.")
    ] = 10,
    *,
    settings: Settings,
    as_json: Json = False,
) -> None:
    """Show a stored message whole, with the messages and snapshots around it."""
    async with open_memory(settings) as mem:
        found = await mem.message_ids(message_id.strip() or "?", limit=2)
        if not found and "_" not in message_id:
            found = await mem.message_ids(f"msg_{message_id.strip()}", limit=2)
        shown = await mem.view_messages(resolve_id(message_id, found, "message"), radius=radius)
    if as_json:
        print_json(view_json(shown))
        return
    console = stdout_console()

    def snapshots(found: Sequence[Snapshot]) -> None:
        for snapshot in found:
            console.print(Text(f"[snapshot {snapshot.start_seq}..{snapshot.end_seq}] "
                               f"{shorten(snapshot.text, 300)}", style="dim"))

    snapshots(shown.snapshots_before)
    short = short_ids([m.id for m in shown.messages])
    console.print(table(
        f"Thread {escape(shown.target.thread_id)}", ("seq>", "role", "content~", "message!"),
        [(str(m.seq), Text(m.role), Text(shorten(m.content, 200),
                                         style="bold" if m.id == shown.target.id else ""),
          short[m.id]) for m in shown.messages]))
    # The target whole, below the table: its content is what the command is for.
    whole = shown.target
    console.print(Text(f"message {whole.id} (seq {whole.seq}, {whole.role}):", style="bold"))
    console.print(Text(whole.content), soft_wrap=True)
    snapshots(shown.snapshots_after)


class _Transitions:
    """Wakes a waiter at each of one session's state changes."""

    def __init__(self) -> None:
        self.session_id: str | None = None
        self._changed = anyio.Event()

    def __call__(self, event: Event) -> None:
        if event.kind == "transition" and event.session_id == self.session_id:
            self._changed.set()

    async def wait(self, mem: Memory, session_id: str, seconds: float) -> State:
        """The session's state once it is no longer `extracting` (or after `seconds`)."""
        with anyio.move_on_after(seconds):
            while True:
                # A new event before reading the state: a change in between still wakes us.
                changed = self._changed = anyio.Event()
                state = await mem.session_state(session_id)
                if state in _SETTLED:
                    return state
                await changed.wait()
        return await mem.session_state(session_id)


class Action(StrEnum):
    CLOSE = "close"
    COMMIT = "commit"
    DISCARD = "discard"
    END = "end"


# What ending or discarding a session in each state drops for good.
_DROPPED = {
    State.COLLECTING: "its episode's steps never reach the graph",
    State.EXTRACTING: "its extraction stops and its steps never reach the graph",
    State.READY: "its extracted changeset is dropped",
    State.FAILED: "its steps never reach the graph"}


async def _act(mem: Memory, transitions: _Transitions, action: Action, sid: str, wait: float,
               ask: Callable[[str], Awaitable[None]]) -> dict[str, object]:
    live = await mem.list_sessions()
    sid = resolve_id(sid, [s.id for s in live], "live session")
    info = next(s for s in live if s.id == sid)
    await check_repo(mem, info.repo)
    dropped = _DROPPED.get(info.state)
    if action in (Action.END, Action.DISCARD) and dropped is not None:
        await ask(f"{action.value.capitalize()} session {sid} ({label(info.state)}, "
                  f"{info.steps} steps): {dropped}. Go on?")
    # Opening the repo resumes a restored session's interrupted extraction.
    await mem.open_repo(info.repo)
    transitions.session_id = sid
    out: dict[str, object] = {"session_id": sid, "repo": info.repo, "action": action.value}
    if action is Action.END:
        await mem.end_session(sid)
        out["state"] = "ended"
        return out
    if action is Action.CLOSE:
        await mem.close(sid)
    elif action is Action.DISCARD:
        await mem.discard(sid)
    else:
        if await mem.session_state(sid) is State.EXTRACTING:
            await transitions.wait(mem, sid, wait)
        receipt = await mem.commit(sid)
        if receipt is not None:
            out["node_ids"] = list(receipt.node_ids)
    state = await transitions.wait(mem, sid, wait)
    out["state"] = label(state)
    if state is State.EXTRACTING:
        out["note"] = "the extraction is still running; the next command on this repo resumes it"
    return out


def _session_command(action: Action) -> None:
    @model_options()
    async def command(
        session_id: SessionId,
        *,
        settings: Settings,
        wait: Annotated[
            float, typer.Option(min=0, help="Seconds to wait for an extraction to end.")
        ] = 120.0,
        yes: Annotated[
            bool, typer.Option("--yes", "-y", help="Do not ask before work is dropped (end, "
                                                   "discard).")
        ] = False,
        as_json: Json = False,
    ) -> None:
        transitions = _Transitions()
        async with open_memory(settings, works=True, on_event=transitions) as mem:
            out = await _act(mem, transitions, action, session_id, wait,
                             functools.partial(confirm, given=yes, as_json=as_json))
        node_ids, note = out.get("node_ids"), out.get("note")
        emit(as_json, out, Text(
            f"{action.value}: session {out['session_id']} is now {out['state']}"
            + (f", {len(node_ids)} nodes committed" if isinstance(node_ids, list) else "")
            + (f" ({note})" if note else "")))

    command.__doc__ = {
        Action.CLOSE: "End the session's episode and extract it (waits until it is ready).",
        Action.COMMIT: "Commit a ready session's changeset (a failed one: extract again).",
        Action.DISCARD: "Drop a ready changeset or a failed extraction (back to idle).",
        Action.END: "Stop the session for good; its id is then unknown.",
    }[action]
    session_app.command(action.value)(command)


for _action in Action:
    _session_command(_action)
