"""Odd input is InvalidInputError at every entry, never a raw error, and nothing is stored:
JSON nested past the bound, blank observations, names that spoof a listing (bidi, control,
format, invisible characters), and ids of the wrong type."""

from __future__ import annotations

from typing import Any

import pytest

import mnemo
from mnemo import State
from mnemo.errors import MAX_JSON_DEPTH, check_name
from tests.conftest import REPO, Enter
from tests.fakes import maybe_await


def nested(depth: int) -> dict[str, Any]:
    """A dict of `depth` dicts in all (the outermost counts)."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


# ---- nesting ------------------------------------------------------------------------------


async def test_json_nested_past_the_bound_is_refused_everywhere(
    mem: mnemo.Memory, enter: Enter
) -> None:
    """Metadata or a message nested 5,000 deep (which raised RecursionError) is
    InvalidInputError in append, ingest (a step's metadata, the trajectory's) and save (tool
    calls, content parts, other keys), storing nothing; MAX_JSON_DEPTH deep is stored (a
    message counts as the outermost level of what it holds)."""
    sid = await enter(State.COLLECTING)
    deep = nested(5_000)
    trajectory = mnemo.Trajectory("explore", [mnemo.Step("walk", "go", deep)])
    calls: list[Any] = [
        lambda: mem.append(sid, "walk north", "go north", metadata=deep),
        lambda: mem.ingest(REPO, trajectory, source_id="deep"),
        lambda: mem.ingest(REPO, mnemo.Trajectory("explore", [mnemo.Step("walk", "go")], deep),
                           source_id="deep"),
        lambda: mem.conversation().save("t", [{
            "role": "assistant", "content": None,
            "tool_calls": [{"id": "c", "type": "function",
                            "function": {"name": "f", "arguments": deep}}],
        }]),
        lambda: mem.conversation().save("t", [{
            "role": "user", "content": [{"type": "tool_result", "content": [deep]}],
        }]),
        lambda: mem.conversation().save("t", [{"role": "user", "content": "x", "extra": deep}]),
    ]
    for call in calls:
        with pytest.raises(mnemo.InvalidInputError, match="nests more than 64"):
            await call()
    assert await mem.conversation().raw("t") == []
    assert await mem.history(REPO) == []
    deepest = nested(MAX_JSON_DEPTH)
    assert (await mem.append(sid, "walk north", "go north", metadata=deepest)).index == 0
    with pytest.raises(mnemo.InvalidInputError):
        await mem.append(sid, "walk north", "go north", metadata=nested(MAX_JSON_DEPTH + 1))
    inner = nested(MAX_JSON_DEPTH - 1)
    await mem.conversation().save("t", [{"role": "user", "content": "x", "extra": inner}])


# ---- blank observations -------------------------------------------------------------------


@pytest.mark.parametrize("blank", ["", "   ", "\n\t "])
async def test_a_blank_observation_is_no_step(
    mem: mnemo.Memory, enter: Enter, blank: str
) -> None:
    """A blank observation is InvalidInputError in append, append_async and ingest, and no
    step is stored; a blank action is still a step."""
    sid = await enter(State.COLLECTING)
    with pytest.raises(mnemo.InvalidInputError, match="observation must not be blank"):
        await mem.append(sid, blank, "go north")
    with pytest.raises(mnemo.InvalidInputError, match="observation must not be blank"):
        await mem.append_async(sid, blank, "go north")
    with pytest.raises(mnemo.InvalidInputError, match=r"steps\[1\].observation"):
        await mem.ingest(REPO, mnemo.Trajectory("g", [mnemo.Step("walk", "go"),
                                                      mnemo.Step(blank, "go")]),
                         source_id="blank")
    assert await mem.history(REPO) == []
    assert (await mem.append(sid, "walk north", blank)).index == 0
    context = await mem.session_context(sid)
    assert context is not None
    assert len(context.recent_steps) == 1


# ---- names --------------------------------------------------------------------------------

SPOOFS = [
    "evil\u202eoper",  # a right-to-left override reorders what follows
    "a\u2066b",  # a left-to-right isolate
    "a\u200bb",  # a zero-width space
    "a\u200db",  # a zero-width joiner
    "a\ufeffb",  # a byte-order mark
    "a\u00adb",  # a soft hyphen
    "r\u3164",  # a Hangul filler: blank, not a space
    "a\x07b",  # a control character (BEL)
    "a\tb",
    "a\ue000b",  # private use
    " r",
    "r ",
    "my  repo",
    "my\u00a0repo",  # a no-break space prints as a space
    "\uff52\uff45\uff50\uff4f",  # fullwidth letters print as "repo"
    "cafe\u0301",  # decomposed: "café" twice
]
NAMES = ["r2", "my repo", "conv-26/3", "D1:3", "日本語", "café", "🚀 launch", "مرحبا", "ʀepo"]


@pytest.mark.parametrize("name", SPOOFS)
async def test_a_name_that_spoofs_a_listing_is_refused(mem: mnemo.Memory, name: str) -> None:
    """A repo, source, thread or role name holding a bidi, control, format, invisible,
    private-use character, a stray space or a form that prints as another name is
    InvalidInputError, and nothing is created."""
    trajectory = mnemo.Trajectory("explore", [mnemo.Step("walk north", "go north")])
    calls: list[Any] = [
        lambda: mem.open_repo(name),
        lambda: mem.ingest(REPO, trajectory, source_id=name),
        lambda: mem.conversation().save(name, [{"role": "user", "content": "hello"}]),
        lambda: mem.conversation().save("t", [{"role": name, "content": "hello"}]),
        lambda: mem.add_goal(name, "deploy the proxy"),
    ]
    for call in calls:
        with pytest.raises(mnemo.InvalidInputError):
            await call()
    assert await mem.list_repos() == [REPO]
    assert await mem.history(REPO) == []
    assert await mem.list_threads() == []


@pytest.mark.parametrize("name", NAMES)
def test_a_plain_name_of_any_script_is_a_name(name: str) -> None:
    """Names in any script, with single inner spaces, symbols and emoji, pass the rule."""
    assert check_name(name, "repo name") == name


async def test_names_of_any_script_create_repos_sources_and_threads(mem: mnemo.Memory) -> None:
    """A repo, a source and a thread named in several scripts are created and listed as
    given."""
    await mem.open_repo("日本語 notes")
    receipt = await mem.ingest(
        "日本語 notes", mnemo.Trajectory("explore", [mnemo.Step("walk", "go")]),
        source_id="café/1",
    )
    assert receipt.source_id == "café/1"
    await mem.conversation().save("🚀 launch", [{"role": "user", "content": "hello"}])
    assert await mem.list_repos() == [REPO, "日本語 notes"]
    assert [t.id for t in await mem.list_threads()] == ["🚀 launch"]


# ---- ids of the wrong type ----------------------------------------------------------------


@pytest.mark.parametrize("bad", [123, None, 1.5, b"session_x", ["session_x"]])
async def test_an_id_of_the_wrong_type_is_invalid_input_not_an_unknown_one(
    mem: mnemo.Memory, bad: Any
) -> None:
    """Every call taking a session, repo, episode, node or goal id answers an id that is not
    a string with InvalidInputError (session_state(123) answered NotFoundError)."""
    calls: list[Any] = [
        lambda: mem.session_state(bad),
        lambda: mem.session_context(bad),
        lambda: mem.append(bad, "walk", "go"),
        lambda: mem.append_async(bad, "walk", "go"),
        lambda: mem.close(bad),
        lambda: mem.close_async(bad),
        lambda: mem.commit(bad),
        lambda: mem.commit_async(bad),
        lambda: mem.discard(bad),
        lambda: mem.discard_async(bad),
        lambda: mem.start_episode(bad, "explore"),
        lambda: mem.start_episode_async(bad, "explore"),
        lambda: mem.close_and_commit(bad),
        lambda: mem.end_session(bad),
        lambda: mem.episodes(bad),
        lambda: mem.episode(bad),
        lambda: mem.recall_in_context(REPO, bad, "walk"),
        lambda: mem.start_session("explore", repo=bad),
        lambda: mem.recall(bad, "walk"),
        lambda: mem.ingest(bad, mnemo.Trajectory("g", [mnemo.Step("walk", "go")]),
                           source_id="s"),
        lambda: mem.forget(bad, "s"),
        lambda: mem.history(bad),
        lambda: mem.latest(bad),
        lambda: mem.get_node(bad, "n"),
        lambda: mem.get_node(REPO, bad),
        lambda: mem.repo_config(bad),
        lambda: mem.complete_goal(bad),
        lambda: mem.view_messages(bad),
    ]
    if bad is not None:  # usage() without ids is everything's
        calls += [lambda: mem.usage(bad), lambda: mem.usage(repo=bad)]
    for call in calls:
        with pytest.raises(mnemo.InvalidInputError):
            await maybe_await(call())


async def test_a_repo_stored_before_the_name_rule_still_opens_and_reads(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repo whose name breaks the rule but was stored before it opens again, is listed,
    recalled and forgotten from, through a new Memory: lookups stay lenient."""
    old_name = "ops\u200b"
    trajectory = mnemo.Trajectory("explore", [mnemo.Step("nginx listens on 8080", "note")])
    with monkeypatch.context() as before:
        before.setattr("mnemo.memory.repos.check_name", lambda name, what: name)
        before.setattr("mnemo.ingest.service.check_name", lambda name, what: name)
        async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(64)) as mem:
            await mem.open_repo(old_name)
            await mem.ingest(old_name, trajectory, source_id="s\u200b")
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(64)) as mem:
        assert await mem.list_repos() == [old_name]
        await mem.open_repo(old_name)
        assert (await mem.recall(old_name, "nginx")).memories
        assert await mem.forget(old_name, "s\u200b") > 0
        with pytest.raises(mnemo.InvalidInputError):
            await mem.open_repo("new\u200b")
