"""The offline LLM's conversation tasks: extractive summaries, eviction tool calls, folds."""

from __future__ import annotations

import re
from typing import Any

import pytest

from mnemo.adapters.offline import OfflineLLM
from mnemo.calls.schema import most_tokens
from mnemo.conversation.prompts import (
    CHARS_PER_WORD,
    eviction_request,
    fold_request,
    parse_summary,
    summary_request,
)
from mnemo.ports import JSONObject
from tests.fakes import js

MESSAGES: list[dict[str, Any]] = [
    {"seq": 0, "role": "user", "text": "Hi there!"},
    {"seq": 1, "role": "user", "text": "Our API gateway runs Kong 3.4 on three nodes in "
     "eu-west-1. Please always keep the rate limit at 100 requests per second."},
    {"seq": 2, "role": "assistant", "text": "Understood. I raised the Kong rate limit plugin "
     "to 100 requests per second on all three nodes."},
    {"seq": 3, "role": "tool", "text": "HTTP 200 OK plugin updated"},
    {"seq": 4, "role": "user", "text": "Thanks."},
]


def _sentences(summary: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", summary) if s]


async def test_summary_is_extractive_and_bounded() -> None:
    """Every summary sentence is a sentence of the input; greetings are left out."""
    request = summary_request(previous_summary="", messages=MESSAGES, max_words=40)
    summary = parse_summary(await OfflineLLM().generate(request), max_words=40)
    assert len(summary.split()) <= 40
    inputs = " ".join(m["text"] for m in MESSAGES)
    for sentence in _sentences(summary):
        body = sentence.split(": ", 1)[1] if ": " in sentence else sentence
        assert body.rstrip(".") in inputs
    assert "rate limit at 100" in summary, "the user's instruction ranks first"
    assert "Hi there" not in summary
    assert "Thanks" not in summary


async def test_summary_rolls_previous_in() -> None:
    """The previous summary's sentences compete with the new ones."""
    request = summary_request(
        previous_summary="The database is PostgreSQL 16 on db2.internal.",
        messages=MESSAGES[:2],
        max_words=200,
    )
    summary = parse_summary(await OfflineLLM().generate(request), max_words=200)
    assert summary.startswith("The database is PostgreSQL 16 on db2.internal.")


async def test_summary_of_nothing_says_so() -> None:
    """With nothing informative, the summary says so instead of inventing content."""
    request = summary_request(
        previous_summary="", messages=[MESSAGES[0], MESSAGES[4]], max_words=50
    )
    summary = parse_summary(await OfflineLLM().generate(request), max_words=50)
    assert summary == "2 earlier messages held no informative statement."


def _zone(*lines: str) -> str:
    return "\n".join(lines)


async def test_eviction_pins_instructions_and_corrections() -> None:
    """The offline eviction saves a snapshot, pins instructions and corrections to the goals
    sharing a word with them (else the newest goal), then finishes."""
    request = eviction_request(
        zone=_zone(
            "message 10: user: Never deploy on Fridays.",
            "message 11: assistant: Sure, no Friday deploys for the billing service.",
            "message 12-14: [2 tools called]",
            "message 15: user: Actually, I meant the staging cluster, not production.",
            "message 16: user: The weather is nice today in Lisbon.",
        ),
        middle="",
        recent="",
        zone_start=10,
        zone_end=16,
        goals=[{"id": "g1", "description": "migrate the staging cluster"},
               {"id": "g2", "description": "ship the invoice feature"}],
        previous_snapshot="",
        max_words=60,
        done=[],
    )
    response = await OfflineLLM().generate(request)
    calls = [(c.name, c.arguments) for c in response.tool_calls]
    assert calls[0][0] == "save_snapshot"
    assert "Fridays" in js(calls[0][1])["text"]
    assert ("attach_messages_to_goals", {"message_ids": [10], "goal_ids": ["g2"]}) in calls
    assert ("attach_messages_to_goals", {"message_ids": [15], "goal_ids": ["g1"]}) in calls
    assert not any(c[0] == "attach_messages_to_goals" and c[1]["message_ids"] == [16]
                   for c in calls)
    assert calls[-1] == ("everything_ok", {})


async def test_eviction_of_chit_chat_saves_the_messages_clipped() -> None:
    """A zone with no informative sentence still gets a snapshot: its messages (else its
    lines, as of tool calls only), clipped to max_words."""
    chat = _zone("message 0: user: hello there zqxdrop", "message 1: assistant: hi",
                 f"message 2: user: {'la ' * 40}")
    for zone, start in [(chat, "User: hello there zqxdrop Assistant: hi User: la"),
                        ("message 0-1: [2 tools called]", "message 0-1: [2 tools called]")]:
        reply = await OfflineLLM().generate(
            eviction_request(zone=zone, middle="", recent="", zone_start=0, zone_end=2,
                             goals=[], previous_snapshot="", max_words=16, done=[]))
        [(name, arguments), finish] = [(c.name, c.arguments) for c in reply.tool_calls]
        assert (name, finish) == ("save_snapshot", ("everything_ok", {}))
        assert str(arguments["text"]).startswith(start)
        assert len(str(arguments["text"]).split()) <= 16


async def test_eviction_without_goals_pins_nothing_and_finishes_when_done() -> None:
    """No goals: nothing is pinned. A second round only calls everything_ok."""
    zone = _zone("message 0: user: Always answer in French.")
    first = await OfflineLLM().generate(
        eviction_request(zone=zone, middle="", recent="", zone_start=0, zone_end=0, goals=[],
                         previous_snapshot="", max_words=30, done=[])
    )
    assert [c.name for c in first.tool_calls] == ["save_snapshot", "everything_ok"]
    second = await OfflineLLM().generate(
        eviction_request(zone=zone, middle="", recent="", zone_start=0, zone_end=0, goals=[],
                         previous_snapshot="", max_words=30, done=["save_snapshot: ok"])
    )
    assert [c.name for c in second.tool_calls] == ["everything_ok"]


async def test_fold_is_bounded() -> None:
    """Folding keeps the snapshots' most informative sentences within max_words."""
    snapshots: list[JSONObject] = [
        {"start_seq": i * 10, "end_seq": i * 10 + 9,
         "text": f"User: Release {i} shipped the invoice export for customer{i}. Assistant: ok."}
        for i in range(5)
    ]
    summary = parse_summary(
        await OfflineLLM().generate(fold_request(snapshots=snapshots, max_words=30)), max_words=30
    )
    assert 0 < len(summary.split()) <= 30
    assert "invoice export" in summary


@pytest.mark.parametrize("as_data", [False, True])
def test_an_eviction_bounds_its_summary_for_a_grammar(as_data: bool) -> None:
    """The summary's schema (save_snapshot's parameters, or the reply's schema when asked as
    data) holds it to max_words words' worth of characters, and max_tokens has room for the
    longest summary it allows."""
    request = eviction_request(zone="z", middle="", recent="", zone_start=0, zone_end=1,
                               goals=[], previous_snapshot="", max_words=120, done=[],
                               as_data=as_data)
    tools = request.tools or []
    schema = request.schema if as_data else tools[0]["parameters"]
    assert isinstance(schema, dict)
    assert schema["properties"]["text"]["maxLength"] == 120 * CHARS_PER_WORD
    longest = most_tokens(schema)
    assert longest is not None
    assert request.max_tokens is not None
    assert longest <= request.max_tokens
