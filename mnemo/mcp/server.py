"""The tools of `mnemo mcp` (`MemoryTools`) over a store, and the Memories they run on
(`open_tools`). Every tool returns bounded JSON text; a `MnemoError` becomes a tool error.
Memory files live under one root, and a tool's `directory` must lie inside it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import KW_ONLY, dataclass, field
from functools import partial, wraps
from pathlib import Path, PurePath
from typing import Annotated, Any

import anyio
from pydantic import Field

from mnemo.config import Config
from mnemo.errors import InvalidInputError, MnemoError, NotFoundError, StorageError, check_id
from mnemo.jsonable import label, session_json, step_json
from mnemo.mcp import _output
from mnemo.mcp._output import dumps, fit
from mnemo.memory import Memory
from mnemo.memoryfiles import MemoryFiles
from mnemo.ports import LLM, Embedder
from mnemo.tools import ERROR_CHARS, PAGE_CHARS, SNIPPET_CHARS, clip

INSTRUCTIONS = """\
mnemo is long-term memory. Before a task, `recall` what the repo knows about it (snippets;
`get_node` reads one memory whole). While working,
`start_session` with the task's goal, `append` each step (what you observed, what you did), and
`close_and_commit` at the end: the steps become facts and procedures that later `recall` calls
find (`discard_session` drops a failed extraction, `end_session` ends a session). `remember`
stores one fact as given, `correct` replaces a wrong fact (the old one is kept, retired),
`forget` erases memories for good.
`save_messages` stores a conversation (`append_messages` its new messages alone, and
`purge_thread` erases one), and
`search_messages` and `view_messages` search stored conversations; `list_repos` and
`list_sessions` show what there is; `persist_memory` files a statement to remember under a
topic, and `recall_memory` reads those topic files back."""

TOOL_NAMES = ("recall", "get_node", "search_messages", "view_messages", "save_messages",
              "append_messages", "purge_thread", "list_repos", "list_sessions", "start_session",
              "append", "close_and_commit", "discard_session", "end_session", "forget", "correct",
              "remember", "persist_memory", "recall_memory")
# A scope: metadata key -> a value, or a list of values any of which matches.
Where = Annotated[
    dict[str, str | int | float | bool | list[str | int | float | bool]] | None,
    Field(description="Only the memories of this scope: metadata key -> value (or a list of "
                      "values), e.g. {\"user_id\": \"alice\"}; every key must match.")]
# Who what a call stores belongs to.
Owner = Annotated[dict[str, str | int | float | bool] | None, Field(
    description="Who it belongs to, e.g. {\"user_id\": \"alice\"}: what it stores carries it "
                "(what `where` selects).")]
SessionId = Annotated[str, Field(description="From start_session.")]
ThreadId = Annotated[str, Field(description="The conversation thread's id.")]
Directory = Annotated[
    str | None, Field(description="A sub-folder of the memory directory (default: its root).")]
Offset = Annotated[int, Field(description="Where to start (next_offset).", ge=0)]


@dataclass(eq=False)
class MemoryTools:
    """The server's tools over `mem`; the session tools go to `worker()` (None: `mem`). `reinforce`:
    a recall counts accesses, a recall of memory files stamps them used; `llm` files
    `persist_memory`'s statements."""

    mem: Memory
    memory_dir: Path
    _: KW_ONLY
    memory_updates: bool = True
    worker: Callable[[], Awaitable[Memory]] | None = None
    reinforce: bool = False
    llm: LLM | None = None
    _checked: set[str] = field(default_factory=set, init=False, repr=False)

    async def recall(
        self,
        repo: Annotated[str, Field(description="The repo (knowledge graph) to search.")],
        query: Annotated[str, Field(description="What you want to know, in words.")],
        k: Annotated[int, Field(description="How many memories to return.", ge=1, le=50)] = 10,
        where: Where = None,
    ) -> str:
        """Recalls the repo's memories (facts, procedures, steps) most relevant to the query,
        best first, each with its score, the phase that found it, its hop, and its node: id,
        type and a snippet of its text (`chars` is the whole length; `get_node` reads it
        all). Errors: an unknown repo, a blank query, a malformed where."""
        await self._check(repo)
        result = await self.mem.recall(repo, query, k=k, reinforce=self.reinforce, where=where)
        return fit(partial(_output.recall_output, result), SNIPPET_CHARS)

    async def get_node(
        self,
        repo: Annotated[str, Field(description="The repo the node is in.")],
        node_id: Annotated[str, Field(description="A node id from recall.")],
        offset: Offset = 0,
    ) -> str:
        """One memory whole: its text a page of PAGE_CHARS characters at a time (pass the
        `next_offset` it returns to read on; null on the last page), and its data. Errors: an
        unknown repo or node."""
        node = await self.mem.get_node(repo, node_id)
        if node is None:
            raise NotFoundError("node", clip(node_id, 100))
        return fit(partial(_output.node_output, node, offset), PAGE_CHARS)

    async def forget(
        self,
        repo: Annotated[str, Field(description="The repo to erase memories from.")],
        node_ids: Annotated[
            list[str] | None, Field(description="Nodes to erase (ids from recall or get_node).")
        ] = None,
        source_id: Annotated[
            str | None, Field(description="An ingested source: every node it produced.")
        ] = None,
        where: Where = None,
    ) -> str:
        """Erases memories for good: the nodes named, everything an ingested source
        produced, or everything in a scope (`where`), with their links, vectors and search
        entries (the history keeps no trace of their text). Give one of node_ids, source_id
        and where. Returns how many nodes went; to replace a wrong fact and keep its trail,
        use `correct`; stored messages belong to no repo (`purge_thread` erases a thread).
        Errors: an unknown repo, a malformed where."""
        if [node_ids, source_id, where].count(None) != 2:
            raise InvalidInputError("forget takes node_ids or source_id or where, one of them")
        await self._check(repo)
        if where is not None:
            count = await self.mem.forget_where(repo, where)
        elif source_id is not None:
            count = await self.mem.forget(repo, source_id)
        else:
            count = await self.mem.delete_nodes(repo, node_ids or [])
        return dumps({"forgotten": count})

    async def correct(
        self,
        repo: Annotated[str, Field(description="The repo the fact is in.")],
        node_id: Annotated[str, Field(description="The wrong fact's id (from recall).")],
        text: Annotated[str, Field(description="The fact as it should read, self-contained.")],
    ) -> str:
        """Corrects a fact: stores the text as a new fact and retires the old one, which
        stays, marked retired and superseded by the new one (recall ranks it below). The
        correction is a commit of the repo's history. Returns the new fact's id and the
        commit's. Errors: an unknown repo or node, a node that is not a live fact (semantic
        or procedural, not retired)."""
        await self._check(repo)
        receipt = await self.mem.correct(repo, node_id, text)
        return dumps({"node_id": receipt.node_ids[0], "commit_id": receipt.changeset_id})

    async def remember(
        self,
        repo: Annotated[str, Field(description="The repo to store the fact in.")],
        text: Annotated[str, Field(description="The fact, self-contained, as it should read.")],
        metadata: Owner = None,
        source_id: Annotated[str | None, Field(
            description="An id to forget it by (default: one made of the text and metadata).")
        ] = None,
    ) -> str:
        """Stores one fact as it is, no model reading it; the same fact again stores nothing.
        Returns the fact's id (a live fact of the same words in the scope, if there is one),
        the commit's and the source id that `forget` erases it by. Errors: an unknown repo, a
        blank or too long text, a source id already taken by another fact."""
        await self._check(repo)
        if source_id is None:
            made = json.dumps([text, metadata], sort_keys=True, ensure_ascii=False)
            source_id = "mcp-" + hashlib.sha256(made.encode("utf-8", "replace")).hexdigest()[:32]
        receipt = await self.mem.remember(repo, text, source_id=source_id, metadata=metadata)
        return dumps({"node_id": receipt.node_ids[0] if receipt.node_ids else None,
                      "commit_id": receipt.changeset_id, "source_id": source_id})

    async def _working(self) -> Memory:
        return self.mem if self.worker is None else await self.worker()

    async def _check(self, repo: str) -> None:
        if repo not in self._checked and repo in await self.mem.list_repos():
            # Checks that the embedder makes the repo's dimension (see `mnemo recall`).
            await self.mem.open_repo(repo)
            self._checked.add(repo)

    async def search_messages(
        self,
        query: Annotated[str, Field(description="Words to look for in stored messages.")],
        thread_id: Annotated[
            str | None, Field(description="Only this conversation thread (default: all).")
        ] = None,
        limit: Annotated[int, Field(description="How many hits.", ge=1, le=100)] = 5,
        where: Where = None,
    ) -> str:
        """Full-text search over stored conversation messages (every thread, or one), best
        first: each hit has its message_id (for `view_messages`), thread, seq and a snippet."""
        hits = await self.mem.search_messages(query, thread_id=thread_id, limit=limit, where=where)
        return fit(partial(_output.hits_output, hits), SNIPPET_CHARS)

    async def view_messages(
        self,
        message_id: Annotated[str, Field(description="A message_id from search_messages.")],
        radius: Annotated[
            int, Field(description="Messages to show on each side.", ge=0, le=100)
        ] = 10,
        offset: Offset = 0,
    ) -> str:
        """The message (a page of its content from `offset`; `next_offset` reads on), the
        snapshots around it, and as many of its neighbours as fit, nearest first, each cut
        to a snippet (`messages_left_out` counts the others). Errors: an unknown message
        id."""
        view = await self.mem.view_messages(message_id, radius=radius)
        return fit(partial(_output.view_output, view, offset), PAGE_CHARS)

    async def save_messages(
        self,
        thread_id: ThreadId,
        messages: Annotated[
            list[dict[str, Any]],
            Field(description="The thread's whole history so far: dicts with role and content "
                              "(only those past the stored length are added).")],
        metadata: Owner = None,
    ) -> str:
        """Stores a conversation thread's messages (for `search_messages` and
        `view_messages`): pass the whole history each time, and only the new messages are
        appended. A history that does not begin with the stored messages (a window of the
        latest ones) is an error that stores nothing: `append_messages` takes new messages
        only. Returns how many were added and the thread's length."""
        return await self._stored(thread_id, await self.mem.conversation().save(
            thread_id, messages, metadata=metadata))

    async def append_messages(
        self,
        thread_id: ThreadId,
        messages: Annotated[
            list[dict[str, Any]],
            Field(description="New messages only: dicts with role and content.")],
        metadata: Owner = None,
    ) -> str:
        """Adds messages after a conversation thread's stored ones, all of them (for a client
        that keeps a window of its history: pass only what is new). Returns how many were
        added and the thread's length."""
        return await self._stored(thread_id, await self.mem.conversation().append(
            thread_id, messages, metadata=metadata))

    async def purge_thread(self, thread_id: ThreadId) -> str:
        """Erases a conversation thread for good: its messages, summaries, snapshots, pins,
        search entries and vectors (threads belong to no repo: `forget` leaves them). Returns
        how many messages went; a thread of that id starts again at seq 0."""
        return dumps({"thread_id": thread_id,
                      "purged": await self.mem.conversation().purge(thread_id)})

    async def _stored(self, thread_id: str, added: Sequence[object]) -> str:
        total = await self.mem.conversation().count(thread_id)
        return dumps({"thread_id": thread_id, "added": len(added), "messages": total})

    async def list_repos(self, offset: Offset = 0) -> str:
        """The repos (knowledge graphs) in this memory, oldest first, a page at a time
        (`next_offset` reads on; null on the last page)."""
        names = await self.mem.list_repos()
        return fit(partial(_output.page_output, "repos", names, offset, clip), SNIPPET_CHARS)

    async def list_sessions(
        self,
        repo: Annotated[str | None, Field(description="Only this repo's (default: all).")] = None,
        offset: Offset = 0,
    ) -> str:
        """The live sessions (not ended), oldest first, a page at a time: id, repo, state,
        the open episode's goal (a snippet) and its number of steps. Errors: an unknown repo."""
        if repo is not None and check_id(repo, "repo") not in await self.mem.list_repos():
            raise NotFoundError("repo", repo)
        live = [s for s in await self.mem.list_sessions() if repo is None or s.repo == repo]
        return fit(partial(_output.page_output, "sessions", live, offset, lambda s, limit: {
            **session_json(s), "repo": clip(s.repo, limit),
            "goal": s.goal and clip(s.goal, limit)}), SNIPPET_CHARS)

    async def discard_session(self, session_id: SessionId) -> str:
        """Drops a session's ready changeset or failed extraction (then `end_session`, or
        keep it). Errors: a session that is neither ready nor failed."""
        mem = await self._working()
        await mem.discard(session_id)
        state = await mem.session_state(session_id)
        return dumps({"session_id": session_id, "state": label(state)})

    async def end_session(self, session_id: SessionId) -> str:
        """Ends a session for good (what it committed stays); its id is then unknown."""
        await (await self._working()).end_session(session_id)
        return dumps({"session_id": session_id, "ended": True})

    async def start_session(
        self,
        goal: Annotated[str, Field(description="What this piece of work is trying to do.")],
        repo: Annotated[str, Field(description="The repo to commit into (created if new).")],
        metadata: Owner = None,
    ) -> str:
        """Starts a session collecting steps towards the goal; returns its session_id for
        `append` and `close_and_commit`. An unknown repo is created."""
        mem = await self._working()
        if repo not in await mem.list_repos():
            await mem.open_repo(repo)
        session_id = await mem.start_session(goal, repo=repo, metadata=metadata)
        return dumps({"session_id": session_id, "repo": repo})

    async def append(
        self,
        session_id: SessionId,
        observation: Annotated[str, Field(description="What you saw: output, error, reply.")],
        action: Annotated[str, Field(description="What you did about it.")],
    ) -> str:
        """Records one step of the session (once stored, it survives a restart); returns its
        index, trajectory and whether it began a new trajectory (a change of subgoal)."""
        mem = await self._working()
        return dumps(step_json(await mem.append(session_id, observation, action)))

    async def close_and_commit(self, session_id: SessionId) -> str:
        """Ends the session: extracts facts and procedures from its steps, commits them to the
        repo's graph (then `recall` finds them) and returns the committed node ids."""
        mem = await self._working()
        receipt = await mem.close_and_commit(session_id)
        # No tool can start a new episode in an idle session, so it is ended.
        await mem.end_session(session_id)
        return dumps({"session_id": session_id, "node_ids": receipt.node_ids[:_output.MAX_LISTED],
                      "node_count": len(receipt.node_ids)})

    async def persist_memory(
        self,
        what: Annotated[str, Field(description="The statement to remember, self-contained.")],
        directory: Directory = None,
    ) -> str:
        """Files a statement in the long-term topic memory files (one Markdown file per
        topic); returns the file it went to, and what keeping it within its size cost: the
        entries `dropped` (merged by condensing, or the oldest left out), whether it was
        `condensed`, whether an entry was cut (`entry_truncated`); `skipped` is "disabled"
        when the server's memory updates are off."""
        filed = await self._files_in(directory).persist(what, llm=self.llm)
        return fit(partial(_output.memory_file_output, filed), PAGE_CHARS)

    async def recall_memory(
        self,
        query: Annotated[str, Field(description="Words describing the topic.")],
        directory: Directory = None,
        limit: Annotated[int, Field(description="How many files.", ge=1, le=50)] = 5,
    ) -> str:
        """The topic memory files matching the query (topic, description, content), most
        recently used first."""
        found = await self._files_in(directory).recall(
            query, limit=limit, reinforce=self.reinforce)
        return fit(lambda limit: [_output.memory_file_output(f, limit) for f in found], PAGE_CHARS)

    def _files_in(self, directory: str | None) -> MemoryFiles:
        path = self.memory_dir
        if directory:
            relative = PurePath(directory)
            if relative.is_absolute() or ".." in relative.parts:
                raise InvalidInputError(
                    f"directory must be a relative folder inside the memory directory, "
                    f"got {clip(directory, 100)!r}")
            path = path / relative
        # `root`: no folder from the memory directory down may be a link. Writes to one folder
        # are serialised by its OS locks, whichever MemoryFiles takes them.
        return MemoryFiles(path, enabled=self.memory_updates, root=self.memory_dir)


def _tool(method: Callable[..., Awaitable[str]]) -> Callable[..., Awaitable[str]]:
    """`method`, mnemo's deliberate errors made tool errors whose message the agent sees."""

    @wraps(method)
    async def tool(*args: Any, **kwargs: Any) -> str:
        from mcp.server.mcpserver.exceptions import ToolError

        try:
            return await method(*args, **kwargs)
        except MnemoError as exc:
            # The message may quote the input: the agent gets its start.
            raise ToolError(clip(str(exc), ERROR_CHARS)) from exc

    return tool


for _name in TOOL_NAMES:
    setattr(MemoryTools, _name, _tool(getattr(MemoryTools, _name)))


@asynccontextmanager
async def open_tools(store: str | Path, *, llm: LLM | None = None, embedder: Embedder | None = None,
                     memory_dir: Path | None = None, memory_updates: bool = True,
                     reinforce: bool = False,
                     config: Config | None = None) -> AsyncIterator[MemoryTools]:
    """The server's tools over the store while the block runs: reads through a Memory opened for
    inspection, session tools through one that works, opened at the first of them (at once
    where no store is yet, or an older mnemo's: it makes or upgrades it, which a look does not)."""
    async with AsyncExitStack() as stack:
        opening = anyio.Lock()
        opened: list[Memory] = []

        async def worker() -> Memory:
            async with opening:
                if not opened:
                    opened.append(await stack.enter_async_context(
                        Memory(store, llm=llm, embedder=embedder, config=config)))
            return opened[0]

        def look() -> Memory:
            return Memory(store, llm=llm, embedder=embedder, config=config, inspect=True)

        try:
            reader = await stack.enter_async_context(look())
        except StorageError as exc:
            if exc.reason != "read_only":
                raise
            await worker()
            reader = await stack.enter_async_context(look())

        yield MemoryTools(
            reader, memory_dir or Path(f"{Path(store)}.memory"),  # beside the database
            memory_updates=memory_updates, worker=worker, reinforce=reinforce, llm=llm)
