"""MemoryFiles: when updates run, what they file, bounds, atomic writes, failures, recall."""

from __future__ import annotations

import os
import re
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import mnemo
from mnemo.calls.tasks import task_inputs
from mnemo.memoryfiles import _format
from mnemo.memoryfiles.files import LOCK_FILE, WRITER_LOCK_FILE
from tests.fakes import js
from tests.memoryfiles.fakes import (
    USAGE,
    Clock,
    RecordingLLM,
    SlowOffline,
    snapshot,
    stamps,
    user,
    write,
)
from tests.strategies import texts as stored_texts

SIGNALS = [
    "We decided to use PostgreSQL 16 for the main database.",
    "I prefer tabs over spaces in Python code.",
    "Our API gateway runs on port 8080.",
    "My name is Ana and I work at Acme Corp.",
]
CHITCHAT = [
    "Hi there! How are you today?",
    "Thanks, that was really helpful.",
    "The weather is lovely this morning.",
    "Can you check the logs for me?",
]


def texts(files: mnemo.MemoryFiles) -> str:
    return "\n".join(f.content for f in files.list())


def change(topic: str, content: str, *signals: str, description: str = "") -> dict[str, Any]:
    return {
        "topic": topic,
        "description": description,
        "signals": list(signals or ["decision"]),
        "content": content,
    }


# ---- when an update runs ------------------------------------------------------------------


async def test_below_min_iterations_asks_nothing(
    files: mnemo.MemoryFiles, llm: RecordingLLM, directory: Path
) -> None:
    """Below min_iterations an update writes nothing and does not call the LLM."""
    result = await files.update(user(*SIGNALS), llm=llm, iterations=9)
    assert result == mnemo.MemoryUpdate(written=[], usage=None, error=None)
    assert llm.calls == []
    assert snapshot(directory) == {}


async def test_subagent_asks_nothing(
    files: mnemo.MemoryFiles, llm: RecordingLLM, directory: Path
) -> None:
    """A sub-agent's update writes nothing and does not call the LLM, however long it ran."""
    result = await files.update(user(*SIGNALS), llm=llm, iterations=500, is_subagent=True)
    assert result == mnemo.MemoryUpdate()
    assert llm.calls == []
    assert snapshot(directory) == {}


async def test_min_iterations_is_configurable(directory: Path, llm: RecordingLLM) -> None:
    """An update runs from exactly min_iterations on, with the memory_update task."""
    files = mnemo.MemoryFiles(directory, min_iterations=3)
    assert (await files.update(user(SIGNALS[0]), llm=llm, iterations=2)).written == []
    result = await files.update(user(SIGNALS[0]), llm=llm, iterations=3)
    assert [r.task for r in llm.calls] == ["memory_update"]
    assert result.written
    assert result.error is None


# ---- what an update files -----------------------------------------------------------------


async def test_four_signals_are_filed_and_chitchat_is_not(files: mnemo.MemoryFiles) -> None:
    """A decision, a preference, lasting context and a correction are filed; chit-chat is not."""
    history = user(*CHITCHAT[:2], *SIGNALS, CHITCHAT[2])
    history.append({"role": "user", "content": "Actually, our API gateway runs on port 8443."})
    history.append({"role": "user", "content": CHITCHAT[3]})
    result = await files.update(history, llm=None, iterations=10)
    assert result.error is None
    stored = texts(files)
    for statement in [*SIGNALS[:2], SIGNALS[3], "Our API gateway runs on port 8443."]:
        assert statement in stored
    # The correction replaced the entry it corrects.
    assert "port 8080" not in stored
    for line in CHITCHAT:
        assert line not in stored
    assert sorted(result.written) == sorted(f.topic for f in files.list())
    assert "Decision: We decided" in stored
    assert "Preference: I prefer" in stored


async def test_only_chitchat_writes_nothing(files: mnemo.MemoryFiles, directory: Path) -> None:
    """A conversation without any of the four signals writes no file (the directory holds only
    the writer lock the update took to ask)."""
    result = await files.update(user(*CHITCHAT), llm=None, iterations=10)
    assert result == mnemo.MemoryUpdate(written=[], usage=mnemo.Usage(0, 0, 0.0), error=None)
    assert files.list() == []
    assert set(snapshot(directory)) <= {WRITER_LOCK_FILE}


async def test_assistant_confirmation_is_filed(files: mnemo.MemoryFiles) -> None:
    """An assistant message that confirms a decision counts; other assistant talk does not."""
    history = [
        {"role": "user", "content": "Which queue should we pick, Kafka or RabbitMQ?"},
        {"role": "assistant", "content": "Got it, we'll use RabbitMQ for the job queue."},
        {"role": "assistant", "content": "We use a lot of queues in general, I think."},
    ]
    result = await files.update(history, llm=None, iterations=10)
    assert result.error is None
    stored = texts(files)
    assert "We'll use RabbitMQ for the job queue." in stored
    assert "lot of queues" not in stored


async def test_system_and_tool_messages_are_not_sent(
    files: mnemo.MemoryFiles, llm: RecordingLLM
) -> None:
    """Only user and assistant text reaches the LLM (a system prompt holds the files); a
    message with any other role, of any type, is left out as a system message is."""
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "Memory: we decided to use MySQL."},
        {"role": "user", "content": [{"type": "text", "text": SIGNALS[0]}]},
        {"role": "tool", "content": "we decided to use Oracle", "tool_call_id": "1"},
        {"role": ["user"], "content": "we decided to use DB2"},
        {"role": None, "content": "we decided to use Sybase"},
        {"role": "assistant", "content": ""},
    ]
    written = await files.update(history, llm=llm, iterations=10)
    assert written.error is None
    inputs = task_inputs(llm.calls[0])
    assert inputs["conversation"] == [{"role": "user", "content": SIGNALS[0]}]
    for left_out in ("MySQL", "Oracle", "DB2", "Sybase"):
        assert left_out not in texts(files)


async def test_update_request_shows_files(files: mnemo.MemoryFiles, llm: RecordingLLM) -> None:
    """The request names the four signals, carries a schema, and shows the existing files."""
    await files.persist("Our staging server is staging2.acme.io.", llm=None)
    await files.update(user(SIGNALS[0]), llm=llm, iterations=10)
    request = llm.calls[0]
    assert request.schema is not None
    assert request.schema["required"] == ["files"]
    prompt = str(request.messages[0]["content"])
    for kind in ("decision", "context", "correction", "preference"):
        assert f"- {kind}:" in prompt
    (shown,) = js(task_inputs(request))["files"]
    assert shown["content"] == "- Our staging server is staging2.acme.io.\n"
    assert shown["topic"] == "staging server staging2.acme.io"


async def test_same_topic_twice_is_one_merged_file(files: mnemo.MemoryFiles) -> None:
    """Two updates touching one topic write one file, merged, without duplicate lines."""
    first = await files.update(user(SIGNALS[0]), llm=None, iterations=10)
    second = await files.update(
        user(SIGNALS[0], "Our database backups run nightly at 02:00 UTC."), llm=None, iterations=10
    )
    assert first.written == second.written
    (only,) = files.list()
    lines = only.content.splitlines()
    assert len(lines) == len(set(lines)) == 2
    assert "PostgreSQL 16" in lines[0]
    assert "backups" in lines[1]
    again = await files.update(user(SIGNALS[0]), llm=None, iterations=10)
    assert again.written == []
    assert again.error is None


async def test_topic_identity_is_normalised(files: mnemo.MemoryFiles, llm: RecordingLLM) -> None:
    """Topics differing only in case, plural or word order share one file."""
    replies = iter(
        [
            {"files": [change("Database Backups", "- Backups run nightly.")]},
            {"files": [change("backup of the database", "- Backups are kept 30 days.")]},
            {
                "files": [
                    change("DATABASE backup", "- Backups go to S3."),
                    change("database  backups", "- Restores are tested monthly."),
                ]
            },
        ]
    )
    llm.reply = lambda _request: next(replies)
    for _ in range(3):
        result = await files.update(user(SIGNALS[0]), llm=llm, iterations=10)
        assert result.error is None
    (only,) = files.list()
    assert only.topic == "Database Backups"
    assert only.path.name == "database-backups.md"
    assert only.content.count("\n") == 4


async def test_topics_differing_in_punctuation_keep_their_own_files(
    directory: Path, llm: RecordingLLM, clock: Clock
) -> None:
    """"C++", "C#" and "C" are three topics: three files, each with its own entries; a file
    written before (its topic in its front matter) still takes its topic's entries."""
    files = mnemo.MemoryFiles(directory, max_chars=120, clock=clock)
    write(directory / "c.md", '---\ntopic: "C++"\n---\n- Use RAII for every C++ resource.\n')
    llm.reply = lambda _request: {"files": [
        change("C++", "- Prefer std::span over raw pointers in C++."),
        change("C#", "- Use async/await in every C# service."),
        change("C", "- Check every malloc in C."),
    ]}
    result = await files.update(user(SIGNALS[0]), llm=llm, iterations=10)
    assert result.error is None
    assert sorted(result.written) == ["C", "C#", "C++"]
    by_topic = {f.topic: f for f in files.list()}
    assert by_topic["C++"].path.name == "c.md"
    assert by_topic["C++"].content.count("C++") == 2
    assert "C#" not in by_topic["C++"].content
    assert by_topic["C#"].content == "- Use async/await in every C# service.\n"
    assert by_topic["C"].content == "- Check every malloc in C.\n"
    assert all(re.fullmatch(r"[a-z0-9-]+\.md", f.path.name) for f in by_topic.values())


async def test_entries_are_removed_only_by_a_correction(
    files: mnemo.MemoryFiles, llm: RecordingLLM
) -> None:
    """A change adds its entries (one the file has is not repeated); the entries it names in
    `remove` go only when the change is a correction."""
    await files.persist("The deploy window is Tuesday.", llm=None)
    topic = files.list()[0].topic
    tuesday = "- The deploy window is Tuesday."
    llm.reply = lambda _request: {"files": [
        change(topic, f"{tuesday}\n- Deploys need a review.") | {"remove": [tuesday]}
    ]}
    await files.update(user(SIGNALS[0]), llm=llm, iterations=10)
    assert files.list()[0].content == f"{tuesday}\n- Deploys need a review.\n"
    llm.reply = lambda _request: {"files": [
        change(topic, "- The deploy window is Thursday.", "correction")
        | {"remove": ["the deploy window is tuesday"]}
    ]}
    await files.update(user(SIGNALS[0]), llm=llm, iterations=10)
    assert files.list()[0].content == (
        "- Deploys need a review.\n- The deploy window is Thursday.\n"
    )


async def test_a_correction_that_takes_back_every_entry_removes_the_file(
    files: mnemo.MemoryFiles, llm: RecordingLLM
) -> None:
    """A correction that removes a topic's last entry removes its file (it was kept, the wrong
    statement still listed and recalled): the update names it, with no content left."""
    await files.persist("The database is MySQL.", llm=None)
    [stored] = files.list()
    llm.reply = lambda _request: {"files": [
        change(stored.topic, "", "correction") | {"remove": ["- The database is MySQL."]}
    ]}
    result = await files.update(user(SIGNALS[0]), llm=llm, iterations=10)
    assert result.error is None
    assert result.written == [stored.topic]
    [gone] = result.files
    assert (gone.content, gone.dropped) == ("", ("- The database is MySQL.",))
    assert files.list() == []
    assert not stored.path.exists()
    assert await files.recall("which database do we use?") == []


async def test_a_description_that_said_an_entry_taken_back_follows_the_entries_left(
    files: mnemo.MemoryFiles, llm: RecordingLLM
) -> None:
    """A correction that takes back the entry the topic's description restates leaves a
    description of an entry still there (the wrong statement stayed in it, listed and
    recalled)."""
    await files.persist("The vault password hint is zanzibar.", llm=None)
    await files.persist("The vault is in Frankfurt.", llm=None)
    [stored] = files.list()
    assert "zanzibar" in stored.description
    llm.reply = lambda _request: {"files": [
        change(stored.topic, "", "correction")
        | {"remove": ["- The vault password hint is zanzibar."]}
    ]}
    result = await files.update(user(SIGNALS[0]), llm=llm, iterations=10)
    assert result.error is None
    [kept] = files.list()
    assert kept.content == "- The vault is in Frankfurt.\n"
    assert kept.description == "The vault is in Frankfurt."
    assert "zanzibar" not in stored.path.read_text().split("---")[-1]


async def test_change_without_signal_is_written(
    files: mnemo.MemoryFiles, llm: RecordingLLM
) -> None:
    """A change the LLM gives no signal for adds its entries (signals only allow removal)."""
    llm.reply = lambda _request: {
        "files": [{"topic": "misc", "description": "", "signals": [], "content": "- Sunny."}]
    }
    result = await files.update(user(SIGNALS[0]), llm=llm, iterations=10)
    assert result.written == ["misc"]
    assert result.error is None
    assert [f.content for f in files.list()] == ["- Sunny.\n"]


# ---- bounds -------------------------------------------------------------------------------


async def test_full_file_drops_oldest_entries(directory: Path, clock: Clock) -> None:
    """A file stays within max_chars by dropping its oldest entries; the newest stay."""
    files = mnemo.MemoryFiles(directory, max_chars=120, clock=clock)
    statements = [f"The build server number {n} runs Debian release {n}." for n in range(6)]
    for statement in statements:
        await files.persist(statement, llm=None)
    (only,) = files.list()
    assert len(only.content) <= 120
    assert statements[-1] in only.content
    assert statements[0] not in only.content
    kept = [line.removeprefix("- ") for line in only.content.splitlines()]
    assert kept == statements[-len(kept) :]


async def test_long_statement_is_truncated(directory: Path, clock: Clock) -> None:
    """A single statement longer than max_chars is shortened, not dropped, and the result says
    it was truncated (not condensed, nothing dropped)."""
    files = mnemo.MemoryFiles(directory, max_chars=100, clock=clock)
    statement = "The release checklist says " + "verify the staging canary " * 20
    stored = await files.persist(statement, llm=None)
    assert len(stored.content) <= 100
    assert stored.content.startswith("- The release checklist says verify")
    assert stored.content.endswith("\u2026\n")
    assert (stored.truncated, stored.condensed, stored.dropped) == (True, False, ())


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    statements=st.lists(stored_texts(min_size=1, max_size=300), min_size=1, max_size=6),
    max_chars=st.integers(min_value=20, max_value=400),
)
def test_any_statements_keep_files_bounded_and_parseable(
    statements: list[str], max_chars: int
) -> None:
    """Whatever is persisted, every file is within max_chars and its front matter parses."""

    async def main(directory: Path) -> None:
        files = mnemo.MemoryFiles(directory, max_chars=max_chars)
        for statement in statements:
            if _format.entry_key(statement):
                await files.persist(statement, llm=None)
            else:
                with pytest.raises(mnemo.InvalidInputError):
                    await files.persist(statement, llm=None)
        listed = files.list()
        assert len(listed) == len({_format.topic_key(f.topic) for f in listed})
        for name, text in snapshot(directory).items():
            if name in {LOCK_FILE, WRITER_LOCK_FILE}:
                continue
            assert name.endswith(".md")
            assert not name.startswith(".")
            parsed = _format.parse(text)
            assert parsed.topic
            assert parsed.updated is not None
            assert len(parsed.body) <= max_chars

    with tempfile.TemporaryDirectory() as tmp:
        anyio.run(main, Path(tmp) / "memory")


# ---- atomic writes ------------------------------------------------------------------------


async def test_writes_leave_no_temporary_files(files: mnemo.MemoryFiles, directory: Path) -> None:
    """After updates, persists and recalls the directory holds only the topic files (and the
    lock files that writers of every process take)."""
    await files.update(user(*SIGNALS), llm=None, iterations=10)
    await files.persist("Our wiki lives at wiki.acme.io.", llm=None)
    await files.recall("wiki database")
    names = sorted(set(snapshot(directory)) - {LOCK_FILE, WRITER_LOCK_FILE})
    assert names == sorted(f.path.name for f in files.list())
    assert all(name.endswith(".md") and not name.startswith(".") for name in names)


async def test_failed_rename_leaves_old_file_intact(
    files: mnemo.MemoryFiles, directory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails before its rename leaves the old file and no temporary file."""
    await files.persist("Our wiki lives at wiki.acme.io.", llm=None)
    before = snapshot(directory)

    def broken_replace(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        await files.persist("Our wiki search uses Elasticsearch.", llm=None)
    history = user("Our wiki pages are reviewed weekly.")
    result = await files.update(history, llm=None, iterations=10)
    assert result.written == []
    assert result.error is not None
    assert "disk full" in result.error
    assert snapshot(directory) == before


# ---- failures -----------------------------------------------------------------------------


async def test_llm_failure_is_reported_not_raised(
    files: mnemo.MemoryFiles, llm: RecordingLLM, directory: Path
) -> None:
    """An LLM that raises makes update report an error and the call it made; nothing raises,
    no file changes."""
    await files.persist("Our wiki lives at wiki.acme.io.", llm=None)
    before = snapshot(directory)
    llm.fail = True
    result = await files.update(user(*SIGNALS), llm=llm, iterations=10)
    assert result.written == []
    assert result.usage == mnemo.Usage()
    assert result.usage.calls == 1
    assert result.error is not None
    assert "provider down" in result.error
    assert snapshot(directory) == before


async def test_garbage_reply_is_reported_with_its_cost(
    files: mnemo.MemoryFiles, llm: RecordingLLM
) -> None:
    """A reply that never matches the schema is asked again once, then reported with its usage."""
    llm.garbage = True
    result = await files.update(user(*SIGNALS), llm=llm, iterations=10)
    assert result.written == []
    assert result.error is not None
    assert "unusable" in result.error
    assert len(llm.calls) == 2
    assert result.usage == USAGE + USAGE
    assert files.list() == []


async def test_invalid_reply_fields_are_reported(
    files: mnemo.MemoryFiles, llm: RecordingLLM
) -> None:
    """A reply with a blank topic or an unknown signal is unusable."""
    llm.reply = lambda _request: {"files": [change("  ", "- x")]}
    blank = await files.update(user(SIGNALS[0]), llm=llm, iterations=10)
    assert blank.error is not None
    assert "topic" in blank.error
    llm.reply = lambda _request: {"files": [change("db", "- x", "rumour")]}
    unknown = await files.update(user(SIGNALS[0]), llm=llm, iterations=10)
    assert unknown.error is not None
    assert "signals" in unknown.error


async def test_usage_is_reported(files: mnemo.MemoryFiles, llm: RecordingLLM) -> None:
    """A successful update reports what its LLM call cost, and that it made one call."""
    result = await files.update(user(SIGNALS[0]), llm=llm, iterations=10)
    assert result.error is None
    assert result.usage == USAGE
    assert result.usage.calls == 1


@pytest.mark.parametrize("history", [None, "We decided to use Go.", 42])
async def test_malformed_history_is_reported(files: mnemo.MemoryFiles, history: Any) -> None:
    """A history that is not a list of messages is reported in error, not raised."""
    result = await files.update(history, llm=None, iterations=10)
    assert result.written == []
    assert result.error is not None
    assert "InvalidInputError" in result.error


# ---- persist ------------------------------------------------------------------------------


async def test_persist_offline_files_under_key_phrase(files: mnemo.MemoryFiles) -> None:
    """Offline, persist files the statement itself under a topic named from its key phrase
    (an acronym as written)."""
    stored = await files.persist("  The VPN password rotates every 90 days.  ", llm=None)
    assert stored.topic == "VPN password 90"
    assert stored.content == "- The VPN password rotates every 90 days.\n"
    assert stored.path.name == "vpn-password-90.md"
    assert stored.updated.tzinfo is not None
    assert files.list() == [stored]


async def test_persist_joins_an_existing_topic(files: mnemo.MemoryFiles) -> None:
    """A statement sharing words with an existing topic joins its file; a repeat is not added."""
    first = await files.persist("The VPN password rotates every 90 days.", llm=None)
    second = await files.persist("Ask Bob for a new VPN token.", llm=None)
    again = await files.persist("The VPN password rotates every 90 days", llm=None)
    assert first.path == second.path == again.path
    assert again.content == (
        "- The VPN password rotates every 90 days.\n- Ask Bob for a new VPN token.\n"
    )


async def test_persist_uses_the_given_llm(files: mnemo.MemoryFiles, llm: RecordingLLM) -> None:
    """With an LLM, persist files the entry under the topic and description it picks."""
    llm.reply = lambda _request: {
        "topic": "Networking",
        "description": "VPN and DNS settings",
        "entry": "The VPN\npassword rotates every 90 days.",
    }
    stored = await files.persist("remember: vpn pw rotates 90d", llm=llm)
    assert [r.task for r in llm.calls] == ["memory_persist"]
    assert (stored.topic, stored.description) == ("Networking", "VPN and DNS settings")
    assert stored.content == "- The VPN password rotates every 90 days.\n"


@pytest.mark.parametrize("what", ["", "  \n", None, 7])
async def test_persist_refuses_blank_input(files: mnemo.MemoryFiles, what: Any) -> None:
    """persist of a blank or non-string statement raises InvalidInputError."""
    with pytest.raises(mnemo.InvalidInputError):
        await files.persist(what, llm=None)


async def test_persist_llm_failure_raises(files: mnemo.MemoryFiles, llm: RecordingLLM) -> None:
    """The explicit path raises LLMError when the LLM fails."""
    llm.fail = True
    with pytest.raises(mnemo.LLMError):
        await files.persist("Our wiki lives at wiki.acme.io.", llm=llm)


# ---- list ---------------------------------------------------------------------------------


async def test_list_is_newest_first(files: mnemo.MemoryFiles, directory: Path) -> None:
    """list returns every file, the most recently updated first; [] before any write."""
    assert files.list() == []
    await files.persist("The VPN password rotates every 90 days.", llm=None)
    await files.persist("Our wiki lives at wiki.acme.io.", llm=None)
    await files.persist("Ask Bob for a new VPN token.", llm=None)
    listed = files.list()
    assert [f.topic for f in listed] == ["VPN password 90", "wiki lives wiki.acme.io"]
    assert listed[0].updated > listed[1].updated


async def test_hand_written_file_is_listed(files: mnemo.MemoryFiles, directory: Path) -> None:
    """A Markdown file without front matter is listed under its file name."""
    write(directory / "release-process.md", "- Tag releases on main.\n")
    write(directory / ".hidden.md", "- secret\n")
    (listed,) = files.list()
    assert (listed.topic, listed.content) == ("release process", "- Tag releases on main.\n")


# ---- recall -------------------------------------------------------------------------------


async def test_recall_ranks_topic_description_content(
    files: mnemo.MemoryFiles, llm: RecordingLLM
) -> None:
    """A query word in the topic outranks one in the description, which outranks content."""
    llm.reply = lambda _request: {
        "files": [
            change("kafka", "- Brokers: three.", description="Message broker setup"),
            change("queues", "- Jobs use RabbitMQ.", description="Which kafka topics exist"),
            change("services", "- The billing service reads kafka events."),
            change("style", "- Tabs, not spaces."),
        ]
    }
    await files.update(user(SIGNALS[0]), llm=llm, iterations=10)
    found = await files.recall("Kafka?")
    assert [f.topic for f in found] == ["kafka", "queues", "services"]
    assert [f.topic for f in await files.recall("kafka", limit=1)] == ["kafka"]
    assert await files.recall("the and of") == []
    assert await files.recall("zookeeper") == []


@pytest.mark.parametrize("query", ["", "   ", "\n\t"])
async def test_recall_refuses_blank_query(files: mnemo.MemoryFiles, query: str) -> None:
    """recall of a blank query raises InvalidInputError, which is a ValueError."""
    with pytest.raises(mnemo.InvalidInputError) as caught:
        await files.recall(query)
    assert isinstance(caught.value, ValueError)


async def test_a_query_past_the_bound_names_the_files_own_setting(directory: Path) -> None:
    """A query past `MemoryFiles(max_text_chars=)` is refused naming that setting, not
    `Config`'s, which does not govern memory files."""
    files = mnemo.MemoryFiles(directory, max_text_chars=10)
    with pytest.raises(mnemo.InvalidInputError) as refused:
        await files.recall("a query of more than ten characters")
    assert "MemoryFiles(max_text_chars=)" in str(refused.value)


async def test_recall_touches_what_it_returns(
    files: mnemo.MemoryFiles, llm: RecordingLLM, directory: Path
) -> None:
    """Equal matches come most recently used first, and a recall counts as a use."""
    llm.reply = lambda _request: {
        "files": [
            change("vpn", "- The office VPN uses WireGuard."),
            change("wiki", "- The office wiki lives at wiki.acme.io."),
        ]
    }
    await files.update(user(SIGNALS[0]), llm=llm, iterations=10)
    wiki, vpn = files.list()
    assert [f.topic for f in await files.recall("office")] == ["wiki", "vpn"]
    await files.recall("wireguard")
    assert [f.topic for f in await files.recall("office")] == ["vpn", "wiki"]
    # The use is recorded in the front matter; the content and `updated` stay as they were.
    text = snapshot(directory)[vpn.path.name]
    assert "\nused: " in text
    assert _format.parse(text).updated == vpn.updated
    assert [f.content for f in files.list()] == [wiki.content, vpn.content]


async def test_recall_without_reinforce_writes_nothing(
    files: mnemo.MemoryFiles, directory: Path
) -> None:
    """recall(reinforce=False) finds the same files and leaves the directory as it was (no
    `used`, no lock file, no file rewritten)."""
    await files.persist("Our wiki lives at wiki.acme.io.", llm=None)
    before = stamps(directory)
    found = await files.recall("wiki", reinforce=False)
    assert [f.content for f in found] == [f.content for f in files.list()]
    assert stamps(directory) == before


# ---- concurrency --------------------------------------------------------------------------


async def test_concurrent_updates_lose_nothing(files: mnemo.MemoryFiles) -> None:
    """Concurrent updates keep every entry, in one file."""
    await files.persist("Our database runs on db1.acme.io.", llm=None)
    decisions = [f"We decided the database keeps {n} replicas in zone {n}." for n in range(5)]
    llm = SlowOffline()
    results: list[mnemo.MemoryUpdate] = []

    async def run(statement: str) -> None:
        results.append(await files.update(user(statement), llm=llm, iterations=10))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for statement in decisions:
                tg.start_soon(run, statement)
    assert [r.error for r in results] == [None] * 5
    (only,) = files.list()
    for statement in decisions:
        assert statement in only.content
    assert "db1.acme.io" in only.content
    assert len(only.content.splitlines()) == 6


async def test_concurrent_persists_lose_nothing(
    files: mnemo.MemoryFiles, llm: RecordingLLM
) -> None:
    """Persists racing to create one new topic make one file holding every statement."""
    llm.reply = lambda request: {
        "topic": "VPN gateways",
        "description": "Where the VPN gateways are",
        "entry": task_inputs(request)["statement"],
    }
    statements = [f"The VPN gateway {n} sits in rack {n}." for n in range(8)]
    async with anyio.create_task_group() as tg:
        for statement in statements:
            tg.start_soon(partial(files.persist, statement, llm=llm))
    (only,) = files.list()
    assert sorted(only.content.splitlines()) == sorted(f"- {s}" for s in statements)


# ---- construction -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs"),
    [{"max_chars": 19}, {"max_chars": True}, {"min_iterations": -1}, {"min_iterations": 1.5}],
)
def test_bad_settings_are_refused(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    """A max_chars below 20 or a negative min_iterations raises InvalidInputError."""
    with pytest.raises(mnemo.InvalidInputError):
        mnemo.MemoryFiles(tmp_path, **kwargs)


@pytest.mark.parametrize("directory", ["", "   ", "\t"])
def test_a_blank_directory_is_refused(directory: str) -> None:
    """A blank str is no folder (Path("") is the working one): InvalidInputError."""
    with pytest.raises(mnemo.InvalidInputError, match="blank"):
        mnemo.MemoryFiles(directory)


def test_directory_may_be_a_string(tmp_path: Path) -> None:
    """The directory may be given as a str; nothing is created until the first write."""
    files = mnemo.MemoryFiles(str(tmp_path / "m"))
    assert files.directory == tmp_path / "m"
    assert files.list() == []
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("what", [".", "- ", "!!!", "* ."])
async def test_persist_of_only_punctuation_is_refused(tmp_path: Path, what: str) -> None:
    """A statement of only bullets and punctuation has nothing to file: InvalidInputError, and
    no file is written (it used to surface as a FileNotFoundError)."""
    files = mnemo.MemoryFiles(tmp_path / "memory")
    with pytest.raises(mnemo.InvalidInputError):
        await files.persist(what, llm=None)
    assert files.list() == []


async def test_an_llm_that_is_not_one_is_refused(
    files: mnemo.MemoryFiles, directory: Path
) -> None:
    """A model's name given as `llm` (or anything without an async generate): `persist`
    raises InvalidInputError and `update` reports it in `error`, each before asking or writing
    anything. It ended as an LLMError caused by an AttributeError."""
    with pytest.raises(mnemo.InvalidInputError):
        await files.persist("The deploy needs the VPN", llm="openai:gpt-4o-mini")  # type: ignore[arg-type]
    history = user(*[f"note {i}: the deploy needs the VPN" for i in range(12)])
    update = await files.update(history, llm="openai:gpt-4o-mini", iterations=12)  # type: ignore[arg-type]
    assert update.error is not None
    assert update.error.startswith("InvalidInputError")
    assert files.list() == []


async def test_a_model_that_timed_out_is_reported_in_its_own_words() -> None:
    """A model call that gave up on time (the adapter's LLMTimeout) is raised as it is, not as
    the memory files' own deadline having passed."""
    from mnemo.memoryfiles.files import ask

    class TimedOut:
        name = "timed-out"

        async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
            raise mnemo.LLMTimeout("no reply within 1 s, after 3 attempts")

    request = mnemo.LLMRequest(task="memory_update", system="",
                               messages=[{"role": "user", "content": "x"}])
    with pytest.raises(mnemo.LLMTimeout, match="no reply within 1 s") as caught:
        await ask(TimedOut(), request, lambda response: response)
    assert "120" not in str(caught.value)
