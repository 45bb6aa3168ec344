"""`MnemoSession` under the real OpenAI Agents SDK: its runner, its Session protocol, items kept
exactly, pop and clear as erasure, concurrent writers, the viewport; on both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest

import mnemo
from tests.adapters.provider_server import Answer, ProviderServer
from tests.conversation._support import count_log_reads

# The real framework runs: an integration, beside the suite's unit tests (scripts/check).
pytestmark = pytest.mark.slow

# The SDK (and mnemo.integrations.openai_agents, which imports it) is imported inside the tests:
# its import takes 2 s of CPU, which every pytest worker would pay to collect this module.

# One item of each kind a run may store: a user message, an output message with its parts,
# a function call and its output, a reasoning item, a hosted tool's call and an item without
# a type's role mapping.
ITEMS: list[Any] = [
    {"role": "user", "content": "Where is my parcel 7781?"},
    {"type": "reasoning", "id": "rs_1", "summary": [
        {"type": "summary_text", "text": "The user asks about a parcel."}]},
    {"type": "function_call", "call_id": "call_1", "name": "track_parcel",
     "arguments": '{"parcel": "7781"}', "id": "fc_1", "status": "completed"},
    {"type": "function_call_output", "call_id": "call_1", "output": "in Rotterdam depot"},
    {"type": "web_search_call", "id": "ws_1", "status": "completed",
     "action": {"type": "search", "query": "Rotterdam depot hours"}},
    {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "It waits in Rotterdam.", "annotations": []}]},
    {"type": "item_reference", "id": "msg_0"},
]


@pytest.fixture(autouse=True)
def no_tracing() -> None:
    """The SDK's traces would go to OpenAI's servers: off for every test here."""
    from agents import set_tracing_disabled

    set_tracing_disabled(True)


@pytest.fixture
async def mem(store: str) -> AsyncIterator[mnemo.Memory]:
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder()) as m:
        yield m


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as fake:
        yield fake


async def test_a_runner_keeps_two_turns_then_pops_and_clears(
    mem: mnemo.Memory, server: ProviderServer
) -> None:
    """Under `Runner.run`, the second turn's request holds the first turn (its user message,
    tool call, tool output and answer); pop_item takes the last answer out of the session and
    of search; clear_session leaves nothing of the thread."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool
    from openai import AsyncOpenAI

    from mnemo.integrations.openai_agents import MnemoSession

    @function_tool
    def track_parcel(parcel: str) -> str:
        """Where a parcel is now."""
        return f"parcel {parcel} is in the Rotterdam depot"

    client = AsyncOpenAI(base_url=server.openai_url, api_key="x")
    agent = Agent(
        name="Support", instructions="Answer briefly.", tools=[track_parcel],
        model=OpenAIChatCompletionsModel(model="fake-model", openai_client=client),
    )
    session = MnemoSession(mem, "user-42")
    server.script(
        Answer(text="", tool_calls=(("track_parcel", {"parcel": "7781"}),)),
        Answer(text="Your parcel waits in Rotterdam."),
        Answer(text="It was parcel 7781, now swallowed by a quokka."),
    )
    try:
        first = await Runner.run(agent, "Where is my parcel 7781?", session=session)
        second = await Runner.run(agent, "Which parcel was it?", session=session)
    finally:
        await client.close()

    assert first.final_output == "Your parcel waits in Rotterdam."
    assert second.final_output == "It was parcel 7781, now swallowed by a quokka."
    sent = server.requests[-1].messages
    assert [m["role"] for m in sent] == [
        "system", "user", "assistant", "tool", "assistant", "user"]
    assert sent[1]["content"] == "Where is my parcel 7781?"
    assert sent[2]["tool_calls"][0]["function"]["name"] == "track_parcel"
    assert sent[3]["content"] == "parcel 7781 is in the Rotterdam depot"
    assert sent[4]["content"] == "Your parcel waits in Rotterdam."
    items = await session.get_items()
    assert [i.get("role", i.get("type")) for i in items] == [
        "user", "function_call", "function_call_output", "assistant", "user", "assistant"]

    popped = await session.pop_item()

    assert popped == items[-1]
    assert await session.get_items() == items[:-1]
    assert await mem.search_messages("quokka") == []
    assert await mem.search_messages("Rotterdam")

    await session.clear_session()

    assert await session.get_items() == []
    assert await mem.conversation().raw("user-42") == []
    assert await mem.search_messages("Rotterdam") == []
    assert "user-42" not in [t.id for t in await mem.list_threads()]


async def test_items_come_back_exactly_as_added(
    mem: mnemo.Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every kind of item comes back equal to what was added, a limit gives the newest ones
    in order, and an item without a role is a message whose role and text mnemo reads."""
    from mnemo.integrations.openai_agents import ITEM_KEY, MnemoSession

    session = MnemoSession(mem, "s")
    await session.add_items(ITEMS[:4])
    await session.add_items([])
    await session.add_items(ITEMS[4:])

    assert await session.get_items() == ITEMS
    read = count_log_reads(monkeypatch)
    assert await session.get_items(limit=2) == ITEMS[-2:]
    assert read == [2]  # the newest two, not the whole log
    assert await session.get_items(limit=100) == ITEMS
    assert await session.get_items(limit=0) == []
    assert await session.get_items(limit=-1) == ITEMS  # as the SDK's SQLiteSession reads it
    assert await session.get_items(limit=2**70) == ITEMS
    own = {"role": "user", "content": "hi", ITEM_KEY: {"note": "the app's own field"}}
    await MnemoSession(mem, "own").add_items([own])  # type: ignore[list-item]
    assert await MnemoSession(mem, "own").get_items() == [own]
    # A pydantic item's `model_dump()` gives its unset fields as None.
    dumped = {"role": "user", "content": "hello", "name": None, "tool_call_id": None}
    await MnemoSession(mem, "dumped").add_items([dumped])  # type: ignore[list-item]
    assert await MnemoSession(mem, "dumped").get_items() == [dumped]
    stored = await mem.conversation().raw("s")
    assert [m.role for m in stored] == [
        "user", "assistant", "assistant", "tool", "assistant", "assistant", "assistant"]
    assert [m.content for m in stored[1:4]] == [
        "The user asks about a parcel.", 'track_parcel({"parcel": "7781"})',
        "in Rotterdam depot"]
    assert stored[2].data[ITEM_KEY] == ITEMS[2]
    assert [h.seq for h in await mem.search_messages("track_parcel")] == [2]


async def test_a_tool_output_past_the_text_bound_is_kept_whole_under_the_runner(
    mem: mnemo.Memory, server: ProviderServer
) -> None:
    """A tool that returns 150,000 characters (past `Config.max_text_chars`, and past its
    ceiling) does not fail `Runner.run`: the next turn's request carries the whole output,
    `get_items` gives it back whole, search finds its opening words (it reads the bound's worth)
    and its tokens count the whole. So is an answer past the bound kept whole; an
    item past `MAX_ITEM_CHARS` is refused, storing nothing."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool
    from openai import AsyncOpenAI

    from mnemo.conversation.drafts import count_tokens
    from mnemo.conversation.model import MAX_ITEM_CHARS
    from mnemo.integrations.openai_agents import ITEM_KEY, MnemoSession

    page = "zebrafinch " + "lorem ipsum dolor " * 8_333  # 150,005 characters

    @function_tool
    def fetch_page(url: str) -> str:
        """The page at `url`."""
        return page

    client = AsyncOpenAI(base_url=server.openai_url, api_key="x")
    agent = Agent(name="Reader", instructions="Answer briefly.", tools=[fetch_page],
                  model=OpenAIChatCompletionsModel(model="fake-model", openai_client=client))
    session = MnemoSession(mem, "reader")
    long_answer = "kingfisher " + "x" * 40_000
    server.script(Answer(text="", tool_calls=(("fetch_page", {"url": "https://a.example"}),)),
                  Answer(text=long_answer), Answer(text="Done."))
    try:
        await Runner.run(agent, "Read the page.", session=session)
        await Runner.run(agent, "Again?", session=session)
    finally:
        await client.close()

    assert [m["content"] for m in server.requests[-1].messages if m["role"] == "tool"] == [page]
    items: list[Any] = await session.get_items()
    assert [i["output"] for i in items if i.get("type") == "function_call_output"] == [page]
    assert items[3]["content"][0]["text"] == long_answer
    stored = await mem.conversation().raw("reader")
    output = next(m for m in stored if m.role == "tool")
    assert output.content == page
    assert output.data[ITEM_KEY] == items[2]
    assert output.tokens > count_tokens(page)  # the whole page's cost, not the cut's
    assert stored[3].content == long_answer
    assert [h.seq for h in await mem.search_messages("zebrafinch")] == [output.seq]
    assert [h.seq for h in await mem.search_messages("kingfisher")] == [3]
    huge = {"type": "function_call_output", "call_id": "c", "output": "y" * MAX_ITEM_CHARS}
    with pytest.raises(mnemo.InvalidInputError, match="MAX_ITEM_CHARS"):
        await session.add_items([huge])  # type: ignore[list-item]
    assert await session.get_items() == items


async def test_an_item_holding_a_nul_or_a_lone_surrogate_is_kept_whole(
    mem: mnemo.Memory
) -> None:
    """A tool output read from a binary file (a NUL, a lone surrogate) is kept and given back
    equal, as the SDK's SQLiteSession keeps it; search reads its text with those characters
    replaced. Storing it refused the add, and so failed the whole `Runner.run`."""
    from mnemo.conversation.viewport import answered_at
    from mnemo.integrations.openai_agents import ITEM_KEY, MnemoSession

    odd = [{"type": "function_call_output", "call_id": "c1", "output": "header\x00binary\ud800"},
           {"role": "user", "content": "the zebra\x00file 漢字"},
           {"role": "user", "content": "a pair left apart \ud83d\ude00"}]
    session = MnemoSession(mem, "bin")
    await session.add_items(odd)  # type: ignore[arg-type]
    assert await session.get_items() == odd
    assert [h.seq for h in await mem.search_messages("binary")] == [0]
    assert [h.seq for h in await mem.search_messages("zebra")] == [1]
    stored = await mem.conversation().raw("bin")
    assert "漢字" in str(stored[1].data[ITEM_KEY])  # escaped where it must be, no more
    assert await session.pop_item() == odd[2]  # two lone surrogates, not the one character
    assert await session.pop_item() == odd[1]
    # Kept as escaped JSON, the output still answers its call: no viewport shows it alone.
    call = {"type": "function_call", "call_id": "c2", "name": "read", "arguments": "{}"}
    await session.add_items([call, {"type": "function_call_output", "call_id": "c2",  # type: ignore[list-item]
                                    "output": "\x00"}])
    stored = await mem.conversation().raw("bin")
    assert answered_at(stored)[-2:] == [1, 1]


async def test_bad_input_is_refused_before_anything_is_stored(mem: mnemo.Memory) -> None:
    """A session id that is no thread name, a budget or limit out of range, an item that is
    no dict: InvalidInputError, and the session stays as it was."""
    from mnemo.integrations.openai_agents import MnemoSession

    for bad in ("", "a\x00b", 7):
        with pytest.raises(mnemo.InvalidInputError):
            MnemoSession(mem, bad)  # type: ignore[arg-type]
    with pytest.raises(mnemo.InvalidInputError):
        MnemoSession(mem, "s", token_budget=0)
    session = MnemoSession(mem, "s")
    await session.add_items(ITEMS[:1])
    with pytest.raises(mnemo.InvalidInputError):
        await session.add_items([ITEMS[1], "not an item"])  # type: ignore[list-item]
    with pytest.raises(mnemo.InvalidInputError):
        await session.get_items(limit="1")  # type: ignore[arg-type]
    assert await session.get_items() == ITEMS[:1]


async def test_it_is_the_sdks_session(mem: mnemo.Memory) -> None:
    """The SDK's runtime-checkable `Session` protocol recognises it, and a `SessionSettings`
    limit applies when get_items has none."""
    from agents.memory import Session, SessionSettings

    from mnemo.integrations.openai_agents import MnemoSession

    session: Session = MnemoSession(mem, "s", session_settings=SessionSettings(limit=1))
    assert isinstance(session, Session)
    await session.add_items(ITEMS[:3])
    assert await session.get_items() == ITEMS[2:3]
    assert await session.get_items(limit=2) == ITEMS[1:3]


async def test_concurrent_adds_of_two_memories_are_all_kept(
    store: str, mem: mnemo.Memory
) -> None:
    """Sessions of one thread in two Memory objects adding at once keep every item, each
    call's items together and in order."""
    from mnemo.integrations.openai_agents import MnemoSession

    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder()) as other:
        batches = [[{"role": "user", "content": f"{who} {i}"} for i in range(5)]
                   for who in ("ann", "bob", "cy", "dee")]

        async def add(m: mnemo.Memory, batch: list[Any]) -> None:
            await MnemoSession(m, "shared").add_items(batch)

        async with anyio.create_task_group() as tg:
            for i, batch in enumerate(batches):
                tg.start_soon(add, (mem, other)[i % 2], batch)

        items: list[Any] = await MnemoSession(mem, "shared").get_items()
    assert len(items) == 20
    runs = [items[i:i + 5] for i in range(0, 20, 5)]
    assert sorted(runs, key=lambda run: run[0]["content"]) == batches


@pytest.mark.parametrize("own_manager", [False, True])
async def test_a_token_budget_gives_the_viewport(mem: mnemo.Memory, own_manager: bool) -> None:
    """With a token budget, adds evict old history into snapshots: get_items() starts with
    one system item holding them and ends with the newest items, while a limit still reads
    the log's newest items; so too through a manager of one's own that has no budget of its
    own (its adds evicted nothing, and get_items() left the older items out unseen)."""
    from mnemo.integrations.openai_agents import MnemoSession

    manager = mem.conversation(ttl=3600) if own_manager else None
    session = MnemoSession(mem, "long", token_budget=200, conversation=manager)
    added: list[Any] = [{"role": "user" if i % 2 == 0 else "assistant",
              "content": f"note {i}: the deployment of service {i} went to the staging cluster"}
             for i in range(30)]
    for i in range(0, 30, 2):
        await session.add_items(added[i:i + 2])

    items: list[Any] = await session.get_items()

    view = await mem.viewport("long", token_budget=200)
    assert view.snapshots
    assert items == view.to_messages()
    assert items[0]["role"] == "system"
    assert "Summary of messages" in str(items[0]["content"])
    shown = items[1:]
    assert 0 < len(shown) < 30
    assert shown == added[-len(shown):]
    assert await session.get_items(limit=30) == added


async def test_an_approved_tools_output_never_reaches_the_model_without_its_call(
    mem: mnemo.Memory, server: ProviderServer
) -> None:
    """A tool that needs approval: the Runner stores its call, then (approved) its output in a
    later add_items. With a token budget whose eviction would fall between them, no request
    holds a tool output without its call (OpenAI refuses one with HTTP 400), the viewport
    items hold none either, and the output is shown or in a snapshot."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool
    from openai import AsyncOpenAI

    from mnemo.integrations.openai_agents import MnemoSession

    @function_tool(needs_approval=True)
    def track_parcel(parcel: str) -> str:
        """Where a parcel is now."""
        return f"parcel {parcel} is in the depot " + "depot " * 550

    client = AsyncOpenAI(base_url=server.openai_url, api_key="x")
    agent = Agent(
        name="Support", instructions="Answer briefly.", tools=[track_parcel],
        model=OpenAIChatCompletionsModel(model="fake-model", openai_client=client),
    )
    # The output fits the budget, but not with the question and the call before it.
    session = MnemoSession(mem, "user-42", token_budget=1000)
    server.script(
        Answer(text="", tool_calls=(("track_parcel", {"parcel": "7781"}),)),
        Answer(text="Your parcel waits in the depot."),
        Answer(text="It was parcel 7781."),
    )
    try:
        asked = await Runner.run(agent, "Where is my parcel 7781? " + "context " * 120,
                                 session=session)
        state = asked.to_state()
        for approval in asked.interruptions:
            state.approve(approval)
        await Runner.run(agent, state, session=session)
        await Runner.run(agent, "Which parcel was it?", session=session)
    finally:
        await client.close()

    assert len(server.requests) == 3
    for request in server.requests:
        called: set[str] = set()
        for sent in request.messages:
            if sent["role"] == "tool":
                assert sent["tool_call_id"] in called, request.messages
            called |= {call["id"] for call in sent.get("tool_calls") or []}
    items: list[Any] = await session.get_items()
    called = {i["call_id"] for i in items if i.get("type") == "function_call"}
    assert all(i["call_id"] in called for i in items if i.get("type") == "function_call_output")
    view = await mem.viewport("user-42", token_budget=1000)
    assert view.boundary_seq > 0
    output = next(m for m in await mem.conversation().raw("user-42") if m.role == "tool")
    assert output in view.messages or any(
        s.start_seq <= output.seq <= s.end_seq for s in view.snapshots)


async def test_a_session_scoped_to_a_user_recalls_only_that_users_messages(
    mem: mnemo.Memory,
) -> None:
    """Two users' sessions with `metadata`: with a goal open, bob's viewport items carry none
    of alice's messages, her garage code among them, while alice's own session recalls them;
    `search_messages(where=)` finds each user's session items; a metadata that is no flat
    dict is refused at once."""
    from mnemo.integrations.openai_agents import MnemoSession

    await mem.conversation().save("alice-chat", [
        {"role": "user", "content": "My garage door code is 7391."}], {"user_id": "alice"})
    contents: dict[str, str] = {}
    for user in ("bob", "alice"):
        session = MnemoSession(mem, f"{user}-agent", token_budget=2000,
                               metadata={"user_id": user})
        await session.add_items([{"role": "user", "content": "What is the garage door code?"}])
        await mem.add_goal(f"{user}-agent", "find the garage door code")
        contents[user] = " ".join(str(i.get("content")) for i in await session.get_items())
        hits = await mem.search_messages("garage door", where={"user_id": user})
        assert f"{user}-agent" in {h.thread_id for h in hits}
    assert "7391" not in contents["bob"]
    assert "7391" in contents["alice"]
    with pytest.raises(mnemo.InvalidInputError):
        MnemoSession(mem, "carol-agent", metadata={"user": {"id": "carol"}})
