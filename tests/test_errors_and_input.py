"""Bad input is refused before anything is stored; the error tree and the public names."""

from __future__ import annotations

import ast
import enum
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import mnemo
from mnemo import State
from tests.conftest import REPO, Enter
from tests.fakes import maybe_await

BLANK = ["", "   ", "\n\t "]
NOT_STRINGS = [None, 3, b"walk north", ["walk north"]]

CORE_NAMES = [
    "Memory",
    "Config",
    "State",
    "NodeType",
    "LinkType",
    "Node",
    "Event",
    "StepInfo",
    "CommitReceipt",
    "OpResult",
    "SessionContext",
    "RecallResult",
    "Recalled",
    "LLMRequest",
    "LLMResponse",
    "ToolCall",
    "Usage",
    "LLM",
    "Embedder",
    "MnemoError",
    "SessionError",
    "NotFoundError",
    "ConflictError",
    "PipelineError",
    "LLMError",
    "EmbeddingError",
    "InvalidInputError",
]

# Named as `mnemo.X` elsewhere in the API contract: ingest, memory files, adapters, conversation
# memory.
OTHER_API_NAMES = [
    "Anthropic", "EvictionResult", "IngestReceipt", "MemoryFile", "MemoryFiles", "MemoryUpdate",
    "Message", "MessageView", "OpenAICompatible", "OpenAIEmbedder", "Recent", "SearchHit",
    "Semantic", "Step", "Summary", "ToolOutputPruner", "Trajectory", "Viewport",
]


@pytest.mark.parametrize("goal", BLANK)
async def test_start_session_blank_goal(mem: mnemo.Memory, goal: str) -> None:
    """start_session with a blank goal raises InvalidInputError, which is a ValueError."""
    with pytest.raises(mnemo.InvalidInputError) as caught:
        await mem.start_session(goal, repo=REPO)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("goal", BLANK)
async def test_start_episode_blank_goal(mem: mnemo.Memory, enter: Enter, goal: str) -> None:
    """start_episode with a blank goal raises InvalidInputError and the session stays idle."""
    sid = await enter(State.IDLE)
    with pytest.raises(mnemo.InvalidInputError):
        await mem.start_episode(sid, goal)
    assert await maybe_await(mem.session_state(sid)) == State.IDLE


@pytest.mark.parametrize("bad", NOT_STRINGS)
@pytest.mark.parametrize("field", ["observation", "action"])
async def test_append_non_string(mem: mnemo.Memory, enter: Enter, field: str, bad: object) -> None:
    """append with a non-string observation or action raises InvalidInputError, stores no step."""
    sid = await enter(State.COLLECTING)
    args: dict[str, Any] = {"observation": "walk north", "action": "go north", field: bad}
    with pytest.raises(mnemo.InvalidInputError):
        await mem.append(sid, args["observation"], args["action"])
    assert await maybe_await(mem.session_state(sid)) == State.COLLECTING
    info = await mem.append(sid, "walk north", "go north")
    assert info.index == 0


@pytest.mark.parametrize("bad", ["walk\x00north", "walk \ud800 north"])
async def test_text_no_store_can_keep_is_refused(mem: mnemo.Memory, enter: Enter, bad: str) -> None:
    """A NUL (PostgreSQL's text cannot hold it) or a lone surrogate (not Unicode) in an
    observation, a step's metadata or a message is InvalidInputError on every backend, and
    nothing is stored; a query may hold a NUL (it is not stored)."""
    sid = await enter(State.COLLECTING)
    with pytest.raises(mnemo.InvalidInputError):
        await mem.append(sid, bad, "go north")
    with pytest.raises(mnemo.InvalidInputError):
        await mem.append(sid, "walk north", "go north", metadata={"note": bad})
    with pytest.raises(mnemo.InvalidInputError):
        await mem.conversation().save("t", [{"role": "user", "content": bad}])
    assert (await mem.append(sid, "walk north", "go north")).index == 0
    assert await mem.conversation().raw("t") == []
    await mem.recall(REPO, "walk\x00north")


@pytest.mark.parametrize("bad", ["t\x00id", "t\ud800id", "t" * 1001, "é" * 501])
async def test_an_id_no_store_can_keep_is_refused(mem: mnemo.Memory, bad: str) -> None:
    """A NUL or a lone surrogate in an id (thread, goal, message, role, source, repo, commit,
    session, episode, node), or an id past 1,000 bytes of UTF-8, is InvalidInputError on every
    backend, before anything is stored (a raw UnicodeEncodeError escaped, or PostgreSQL's
    StorageError, or SQLite stored it; a long source id failed on PostgreSQL only at the
    commit, after the whole extraction, as StorageError("unavailable"))."""
    conversation = mem.conversation()
    trajectory = mnemo.Trajectory("explore", [mnemo.Step("walk north", "go north")])
    calls: list[Any] = [
        lambda: conversation.save(bad, [{"role": "user", "content": "hello"}]),
        lambda: conversation.save("t", [{"role": bad, "content": "hello"}]),
        lambda: conversation.load(bad),
        lambda: conversation.raw(bad),
        lambda: conversation.purge(bad),
        lambda: mem.viewport(bad, token_budget=1000),
        lambda: mem.add_goal(bad, "a goal"),
        lambda: mem.complete_goal(bad),
        lambda: mem.view_messages(bad),
        lambda: mem.search_messages("hello", thread_id=bad),
        lambda: mem.search_messages("hello", exclude_viewport_of=bad),
        lambda: mem.ingest(REPO, trajectory, source_id=bad),
        lambda: mem.forget(REPO, bad),
        lambda: mem.open_repo(bad),
        lambda: mem.commit_diff(REPO, bad),
        # Lookups by an id no store can hold (they raised UnicodeEncodeError or, on
        # PostgreSQL, StorageError("unavailable")).
        lambda: mem.session_state(bad),
        lambda: mem.append(bad, "walk north", "go north"),
        lambda: mem.end_session(bad),
        lambda: mem.episodes(bad),
        lambda: mem.episode(bad),
        lambda: mem.get_node(REPO, bad),
        lambda: mem.get_linked_nodes(REPO, [bad]),
        lambda: mem.delete_nodes(REPO, [bad]),
    ]
    for call in calls:
        with pytest.raises(mnemo.InvalidInputError):
            await maybe_await(call())
    assert await conversation.raw("t") == []
    assert await mem.list_repos() == [REPO]
    assert await mem.get_nodes_by_type(REPO, list(mnemo.NodeType)) == []


@pytest.mark.parametrize("number", [float("nan"), float("inf"), -float("inf")])
async def test_metadata_that_is_not_json_is_refused(
    mem: mnemo.Memory, enter: Enter, number: float
) -> None:
    """NaN and infinities are not JSON: metadata holding one is InvalidInputError on every
    backend before anything is stored (SQLite kept it; PostgreSQL's jsonb failed the write,
    an ingest only after its whole extraction)."""
    sid = await enter(State.COLLECTING)
    with pytest.raises(mnemo.InvalidInputError):
        await mem.append(sid, "walk north", "go north", metadata={"x": number})
    step = mnemo.Step("walk north", "go north", metadata={"x": number})
    with pytest.raises(mnemo.InvalidInputError):
        await mem.ingest(REPO, mnemo.Trajectory("explore", [step]), source_id="s1")
    with pytest.raises(mnemo.InvalidInputError):
        await mem.ingest(REPO, mnemo.Trajectory("explore", [], metadata={"x": number}),
                         source_id="s1")
    assert (await mem.append(sid, "walk north", "go north")).index == 0
    assert await mem.get_nodes_by_type(REPO, list(mnemo.NodeType)) == []


async def test_malformed_types_and_steps_are_refused(mem: mnemo.Memory) -> None:
    """An unknown node type in `types`, an unknown link type, steps that are not a list of
    Step and a `top_k` below 1 are InvalidInputError (a bare ValueError and a TypeError
    escaped; `latest` returned [])."""
    # Input the annotations refuse: a caller's mistake, seen at run time.
    bogus: Any = ["bogus"]
    three: Any = [3]
    no_steps: Any = None
    texts: Any = ["walk north"]
    calls: list[Any] = [
        lambda: mem.recall(REPO, "walk north", types=bogus),
        lambda: mem.recall(REPO, "walk north", types=three),
        lambda: mem.get_nodes_by_type(REPO, bogus),
        lambda: mem.get_linked_nodes(REPO, ["n1"], "bogus"),  # type: ignore[arg-type]
        lambda: mem.latest(REPO, top_k=0),
        lambda: mem.latest(REPO, top_k=-1),
        lambda: mem.ingest(REPO, mnemo.Trajectory("explore", no_steps), source_id="s1"),
        lambda: mem.ingest(REPO, mnemo.Trajectory("explore", texts), source_id="s1"),
    ]
    for call in calls:
        with pytest.raises(mnemo.InvalidInputError):
            await call()
    assert await mem.get_nodes_by_type(REPO, list(mnemo.NodeType)) == []


@pytest.mark.parametrize("bad", ["openai:gpt-4o-mini", 42, object()], ids=["uri", "int", "object"])
async def test_a_model_that_is_not_one_is_refused_before_anything_is_stored(
    store: str, bad: object
) -> None:
    """An llm or embedder that is not an object of the port (a model's name as a string,
    say) is refused, as Memory's argument, open_repo's and start_session's, and nothing is
    stored. It used to be taken: a session was stored and its first append failed
    (LLMError caused by AttributeError), or open_repo raised a raw AttributeError."""
    for name in ("llm", "embedder"):
        with pytest.raises(mnemo.InvalidInputError):
            mnemo.Memory(store, **{name: bad})  # type: ignore[arg-type]
    async with mnemo.Memory(store) as mem:
        for name in ("llm", "embedder"):
            with pytest.raises(mnemo.InvalidInputError):
                await mem.open_repo(REPO, **{name: bad})  # type: ignore[arg-type]
        assert await mem.list_repos() == []
        await mem.open_repo(REPO)
        for name in ("llm", "embedder"):
            with pytest.raises(mnemo.InvalidInputError):
                await mem.start_session("explore", repo=REPO, **{name: bad})  # type: ignore[arg-type]
        assert await mem.list_sessions() == []


@pytest.mark.parametrize("query", BLANK)
async def test_recall_blank_query(mem: mnemo.Memory, query: str) -> None:
    """recall with a blank query raises InvalidInputError."""
    with pytest.raises(mnemo.InvalidInputError):
        await maybe_await(mem.recall(REPO, query))


@pytest.mark.parametrize("query", ["\x00", "\u200b", "\u200b\ufeff", " \x00\u200d\n"])
async def test_a_query_of_nothing_but_controls_and_formats_is_blank(
    mem: mnemo.Memory, query: str
) -> None:
    """A query of nothing but whitespace, control (NUL) and format (zero-width, BOM) characters
    is blank, InvalidInputError for recall, search_nodes and search_messages; one with real
    characters (around a NUL, an emoji, CJK) is searched."""
    searches = (partial(mem.recall, REPO), partial(mem.search_nodes, REPO), mem.search_messages)
    for search in searches:
        with pytest.raises(mnemo.InvalidInputError, match="query must not be blank"):
            await search(query)
        for real in (f"walk{query}north", "\U0001f680", "\u5317\u4eac"):
            await search(real)


def test_config_unknown_field() -> None:
    """Config refuses a field it does not know with a TypeError."""
    with pytest.raises(TypeError):
        mnemo.Config(unknown=1)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("SessionError", None),
        ("NotFoundError", LookupError),
        ("ConflictError", None),
        ("PipelineError", None),
        ("LLMError", None),
        ("EmbeddingError", None),
        ("InvalidInputError", ValueError),
    ],
)
def test_error_tree(name: str, builtin: type[Exception] | None) -> None:
    """Every mnemo error is a MnemoError, and a leaf refining a builtin also is one."""
    error = getattr(mnemo, name)
    assert issubclass(error, mnemo.MnemoError)
    if builtin is not None:
        assert issubclass(error, builtin)


def test_type_checkers_see_what_is_imported_lazily() -> None:
    """The names mnemo re-exports for type checkers (`X as X` under TYPE_CHECKING) are the
    names it imports when first used, each from the same module."""
    tree = ast.parse(Path(mnemo.__file__).read_text(encoding="utf-8"))
    guarded = next(node for node in tree.body if isinstance(node, ast.If))
    seen = {alias.name: node.module for node in guarded.body
            if isinstance(node, ast.ImportFrom) for alias in node.names
            if alias.asname == alias.name}
    assert seen == mnemo._WHERE
    assert list(mnemo.__all__) == sorted(seen)


def test_all_names_import() -> None:
    """Every name in mnemo.__all__ can be imported from mnemo."""
    missing = [name for name in mnemo.__all__ if not hasattr(mnemo, name)]
    assert missing == []


@pytest.mark.parametrize("name", CORE_NAMES)
def test_core_api_name_exported(name: str) -> None:
    """Each core name of the API contract is exported by mnemo and listed in __all__."""
    assert hasattr(mnemo, name)
    assert name in mnemo.__all__


@pytest.mark.parametrize("name", OTHER_API_NAMES)
def test_other_api_name_exported(name: str) -> None:
    """Each other `mnemo.X` of the API contract (ingest, files, adapters, threads) is exported."""
    assert hasattr(mnemo, name)
    assert name in mnemo.__all__


def test_state_values() -> None:
    """State is a StrEnum of the five session states."""
    assert issubclass(State, enum.StrEnum)
    assert {s.value for s in State} == {"idle", "collecting", "extracting", "ready", "failed"}


def test_node_and_link_types() -> None:
    """NodeType and LinkType have the members the API contract names."""
    node_types = {"EPISODIC", "SEMANTIC", "PROCEDURAL", "SUBGOAL", "SOURCE", "TAG", "INTENT"}
    assert node_types <= set(mnemo.NodeType.__members__)
    link_types = {"MEMBERSHIP", "HIERARCHICAL", "PROVENANCE", "SIBLING"}
    assert link_types <= set(mnemo.LinkType.__members__)


async def test_a_closed_memory_answers_storage_error_closed_on_both_backends(store: str) -> None:
    """After the Memory closed, each call that reaches the store raises StorageError with
    reason "closed", on both backends alike (SQLite raised a bare RuntimeError, PostgreSQL
    StorageError("unavailable"))."""
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(8)) as mem:
        await mem.open_repo(REPO)
        conv = mem.conversation()
        await conv.save("t", [{"role": "user", "content": "hello"}])
        session = await mem.start_session("greet", repo=REPO)
    more = [{"role": "user", "content": "hello"}, {"role": "user", "content": "again"}]
    calls: dict[str, Any] = {
        "save": lambda: conv.save("t", more),
        "load": lambda: conv.load("t"),
        "search_messages": lambda: mem.search_messages("hello"),
        "viewport": lambda: mem.viewport("t", token_budget=100),
        "recall": lambda: mem.recall(REPO, "hello"),
        "list_repos": mem.list_repos,
        "get_node": lambda: mem.get_node(REPO, "node_x"),
        "session_state": lambda: mem.session_state(session),
        "append": lambda: mem.append(session, "look", "wave"),
        "ingest": lambda: mem.ingest(
            REPO, mnemo.Trajectory("g", [mnemo.Step("o", "a")]), source_id="s"),
    }
    for name, call in calls.items():
        with pytest.raises(mnemo.StorageError) as caught:
            await call()
        assert caught.value.reason == "closed", name
