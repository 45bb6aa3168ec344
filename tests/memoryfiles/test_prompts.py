"""The memory-file tasks: request shape, strict parsers, and the offline heuristics."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, strategies as st

from mnemo.adapters.offline import OfflineLLM
from mnemo.calls.schema import bounded, reply_schema
from mnemo.calls.tasks import task_inputs
from mnemo.memoryfiles.prompts import (
    MEMORY_UPDATE_SCHEMA,
    Filed,
    PersistReply,
    TopicChange,
    memory_condense_request,
    memory_persist_request,
    memory_update_request,
    parse_condense,
    parse_persist,
    parse_update,
    statement_entry,
)
from mnemo.ports import LLMResponse

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


async def offline_update(
    conversation: list[dict[str, str]], files: list[dict[str, str]] | None = None
) -> list[TopicChange]:
    request = memory_update_request(conversation=conversation, files=files or [])
    return parse_update(await OfflineLLM().generate(request))


def said(*texts: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text} for text in texts]


def test_update_request_carries_inputs_and_schema() -> None:
    """The request's inputs are exactly its arguments, and it carries the schema."""
    conversation = said("We decided to use Go.")
    files = [{"topic": "db", "description": "", "content": "- x\n"}]
    request = memory_update_request(conversation=conversation, files=files)
    assert request.task == "memory_update"
    assert request.schema is MEMORY_UPDATE_SCHEMA
    assert task_inputs(request) == {"conversation": conversation, "files": files}


def test_persist_request_carries_inputs_and_schema() -> None:
    """The persist request's inputs are the statement and the files."""
    request = memory_persist_request(statement="s", files=[])
    assert request.task == "memory_persist"
    assert request.schema == bounded(reply_schema(PersistReply), "entry", 41, most=None)[0]
    assert task_inputs(request) == {"statement": "s", "files": []}


def test_parse_update_cleans_fields() -> None:
    """Topics become one line, null description is "", repeated signals collapse."""
    reply = LLMResponse(
        data={
            "files": [
                {
                    "topic": " Data\nbase ",
                    "description": None,
                    "signals": ["decision", "decision", "correction"],
                    "content": "- x",
                }
            ]
        }
    )
    assert parse_update(reply) == [TopicChange("Data base", "", ("decision", "correction"), "- x")]


def test_parse_update_reads_json_text() -> None:
    """A reply whose JSON came back as text is read too."""
    assert parse_update(LLMResponse(text='{"files": []}')) == []


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (None, "JSON object"),
        ({}, "files must be a list"),
        ({"files": ["x"]}, "files[0] must be an object"),
        ({"files": [{"topic": "t", "signals": []}]}, "files[0].content"),
        ({"files": [{"topic": "", "content": ""}]}, "files[0].topic"),
        ({"files": [{"topic": "t", "content": "", "description": 3}]}, "description"),
        ({"files": [{"topic": "t", "content": "", "signals": "decision"}]}, "signals must"),
        ({"files": [{"topic": "t", "content": "", "signals": ["gossip"]}]}, "signals[0]"),
    ],
)
def test_parse_update_names_the_bad_field(data: Any, problem: str) -> None:
    """A malformed reply raises ValueError naming the first offending field."""
    with pytest.raises(ValueError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        parse_update(LLMResponse(data=data))


@given(JSON)
def test_parse_update_only_raises_value_error(data: Any) -> None:
    """Whatever the reply, parse_update returns changes or raises ValueError."""
    try:
        parse_update(LLMResponse(data=data))
    except ValueError:
        pass


def test_parse_persist() -> None:
    """The entry becomes one line; a blank entry is refused."""
    reply = LLMResponse(data={"topic": "vpn", "description": "d", "entry": " a\n b "})
    assert parse_persist(reply) == Filed("vpn", "d", "a b")
    with pytest.raises(ValueError, match="entry"):
        parse_persist(LLMResponse(data={"topic": "vpn", "entry": " "}))


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("We decided to deploy the billing service on Fridays.", "decision"),
        ("Let's go with Redis for the session cache.", "decision"),
        ("We'll use Terraform for the staging infrastructure.", "decision"),
        ("I prefer short answers with code examples.", "preference"),
        ("Always run the linter before committing.", "preference"),
        ("Never push directly to the main branch.", "preference"),
        ("Please don't reformat unrelated files.", "preference"),
        ("Actually, the staging database lives on db2.acme.io.", "correction"),
        ("No, the release branch is called stable.", "correction"),
        ("That's wrong: the API key expires after 30 days.", "correction"),
        ("Correction: the nightly job starts at 03:00 UTC.", "correction"),
        ("My name is Ana.", "context"),
        ("We use Kubernetes on Google Cloud.", "context"),
        ("Our monorepo lives on GitLab.", "context"),
        ("The project targets Python 3.11 and newer.", "context"),
    ],
)
async def test_offline_files_each_signal(text: str, kind: str) -> None:
    """Each kind of signal is filed by the offline heuristic, labelled with its kind."""
    (change,) = await offline_update(said(text))
    assert change.signals == (kind,)
    assert change.content.startswith(f"- {kind.capitalize()}: ")


@pytest.mark.parametrize(
    "text",
    [
        "Hi! How are you doing today?",
        "Thanks a lot, that was helpful.",
        "No problem.",
        "The weather is lovely this morning.",
        "Should we use Postgres or MySQL?",
        "Let me check the logs first.",
        "It never works on the first try, haha.",
    ],
)
async def test_offline_skips_chitchat(text: str) -> None:
    """Greetings, thanks, questions and remarks without a signal are not filed."""
    assert await offline_update(said(text)) == []


async def test_offline_bare_correction_marks_next_sentence() -> None:
    """After "That's wrong." the next statement is the correction."""
    (change,) = await offline_update(said("That's wrong. The build server runs Debian 12."))
    assert change.signals == ("correction",)
    assert change.content == "- Correction: The build server runs Debian 12."


async def test_offline_correction_replaces_the_shown_entry() -> None:
    """A correction removes the shown line it mostly repeats, keeps the others, and adds
    itself."""
    files = [
        {
            "topic": "api gateway",
            "description": "Where the API gateway runs",
            "content": "- Context: Our API gateway runs on port 8080.\n- Context: It uses TLS.",
        }
    ]
    (change,) = await offline_update(said("Actually, our API gateway runs on port 8443."), files)
    assert change.topic == "api gateway"
    assert change.content.splitlines() == ["- Correction: Our API gateway runs on port 8443."]
    assert change.remove == ("- Context: Our API gateway runs on port 8080.",)


async def test_offline_routes_to_existing_topics_and_skips_repeats() -> None:
    """A statement sharing a topic's words joins it; one adding nothing new is skipped."""
    files = [{"topic": "Database", "description": "db", "content": "- We use PostgreSQL 16."}]
    history = said(
        "Our database backups run nightly.", "We use PostgreSQL 16.", "Our database is huge."
    )
    (change,) = await offline_update(history, files)
    assert change.topic == "Database"
    assert change.content.splitlines() == [
        "- Context: Our database backups run nightly.",
        "- Context: Our database is huge.",
    ]


async def test_offline_about_the_user_goes_to_user_topic() -> None:
    """What users say about themselves is filed under "user"."""
    (change,) = await offline_update(said("My name is Ana.", "I work at Acme Corp on payments."))
    assert change.topic == "user"
    assert change.content.count("\n") == 1


async def test_offline_assistant_confirmation_counts() -> None:
    """An assistant message opening with a confirmation is read; "I'll remember" restates."""
    conversation = [
        {"role": "assistant", "content": "Noted: we'll use pnpm for the frontend."},
        {"role": "assistant", "content": "I'll remember that the deploy window is Tuesday."},
        {"role": "assistant", "content": "We use Jenkins, I believe."},
        {"role": "system", "content": "We decided to use Bazel."},
    ]
    changes = await offline_update(conversation)
    contents = "\n".join(c.content for c in changes)
    assert "- Decision: We'll use pnpm for the frontend." in contents
    assert "- Context: The deploy window is Tuesday." in contents
    assert "Jenkins" not in contents
    assert "Bazel" not in contents


async def test_offline_persist_names_topic_from_key_phrase() -> None:
    """Offline persist files the statement itself, under its key phrase or a matching topic."""
    llm = OfflineLLM()
    fresh = parse_persist(
        await llm.generate(memory_persist_request(statement="Ask Bob for VPN tokens.", files=[]))
    )
    assert fresh == Filed("VPN tokens", "Ask Bob for VPN tokens.", "Ask Bob for VPN tokens.")
    files = [{"topic": "vpn access", "description": "How to get on the VPN"}]
    joined = parse_persist(
        await llm.generate(memory_persist_request(statement="Ask Bob for VPN tokens.", files=files))
    )
    assert joined == Filed("vpn access", "How to get on the VPN", "Ask Bob for VPN tokens.")


def test_condense_request_and_parser() -> None:
    """memory_condense carries the entries and the limit; its parser refuses an empty or an
    oversized file and cleans what it keeps."""
    request = memory_condense_request(
        topic="db", description="The database", entries=["- a", "- b"], max_chars=50
    )
    assert request.task == "memory_condense"
    assert task_inputs(request) == {
        "topic": "db",
        "description": "The database",
        "entries": ["- a", "- b"],
        "max_chars": 50,
    }
    ok = parse_condense(
        LLMResponse(data={"description": " The\ndb ", "content": "* one\n\n- one\ntwo"}),
        max_chars=50,
    )
    assert (ok.description, ok.lines) == ("The db", ["- one", "- two"])
    for data, problem in (
        ({"description": "d", "content": ""}, "at least one entry"),
        ({"description": "d", "content": "- " + "x" * 60}, "more than max_chars"),
        ({"description": "d"}, "content must be a string"),
        ([], "JSON object"),
    ):
        with pytest.raises(ValueError, match=problem):
            parse_condense(LLMResponse(data=data), max_chars=50)


STATEMENT = "The blog runs on port 8000 behind nginx."


@pytest.mark.parametrize(
    ("entry", "kept"),
    [
        ("The blog runs on port 8000 behind nginx.", True),
        ("The blog is served on port 8000 behind the nginx proxy.", True),
        ("The blog runs on port 8080 behind nginx.", False),  # a number changed
        ("The database is PostgreSQL 16.", False),  # another statement
        ("The blog runs on port 8000 behind nginx; the user also likes cats, dogs, "
         "birds, fish and horses.", False),  # invented additions
    ],
)
def test_statement_entry_keeps_numbers_and_content(entry: str, kept: bool) -> None:
    """An entry must keep every number and nearly every content word of the statement and add
    little; otherwise the statement itself is filed."""
    assert statement_entry(entry, STATEMENT) == (entry if kept else STATEMENT)
