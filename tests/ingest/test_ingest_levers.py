"""Ingest-side levers: relative dates resolved against the trajectory's day, and
speakers and names as TAG nodes their steps belong to."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

import mnemo
from mnemo.extraction.dates import named_date
from mnemo.extraction.entities import embedding_text, entity_names
from mnemo.ingest.service import reference_date, resolve_dates
from tests.conftest import REPO
from tests.fakes import FakeEmbedder, FakeLLM, RecordingEmbedder, js

N = mnemo.NodeType
MONDAY = date(2023, 5, 8)
GOAL = "Conversation session 3 on 1:56 pm on 8 May, 2023"


@pytest.mark.parametrize(
    ("said", "meant"),
    [
        ("I went there yesterday.", "I went there yesterday (7 May 2023)."),
        ("Last night was fun", "Last night (7 May 2023) was fun"),
        ("two days ago", "two days ago (6 May 2023)"),
        ("3 weeks ago", "3 weeks ago (the week of 17 April 2023)"),
        ("a couple of months ago", "a couple of months ago (March 2023)"),
        ("last week", "last week (the week of 1 May 2023)"),
        ("last weekend", "last weekend (the weekend of 6 May 2023)"),
        ("next weekend", "next weekend (the weekend of 20 May 2023)"),
        ("last month and next month", "last month (April 2023) and next month (June 2023)"),
        ("Last year", "Last year (2022)"),
        ("last Friday", "last Friday (5 May 2023)"),
        ("last Monday", "last Monday (1 May 2023)"),
        ("next Monday", "next Monday (15 May 2023)"),
    ],
)
def test_relative_dates_are_followed_by_the_date_they_mean(said: str, meant: str) -> None:
    """Each relative date is resolved against the day it was said (a Monday here)."""
    assert resolve_dates(said, MONDAY) == meant


def test_vague_or_already_dated_expressions_are_left_alone() -> None:
    """"a few days ago" has no single answer, and a date already written stays single."""
    text = "a few days ago, recently, and yesterday (7 May 2023)"
    assert resolve_dates(text, MONDAY) == text
    assert resolve_dates(resolve_dates("yesterday", MONDAY), MONDAY) == "yesterday (7 May 2023)"


def test_reference_date_prefers_the_metadata_then_the_goal() -> None:
    """The trajectory's day: metadata "date" when it parses, else the first date in the goal."""
    assert reference_date(GOAL, None) == MONDAY
    assert reference_date(GOAL, {"date": "2024-01-02"}) == date(2024, 1, 2)
    assert reference_date(GOAL, {"date": "soon"}) == MONDAY
    assert reference_date("no date here", None) is None
    assert reference_date("on May 8th, 2023", None) == MONDAY
    assert reference_date("31 February 2023, then 1 March 2023", None) == date(2023, 3, 1)


async def ingest_turns(store: str, config: mnemo.Config, *turns: str) -> mnemo.Memory:
    mem = mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder())
    await mem.__aenter__()
    await mem.open_repo(REPO, config=config)
    steps = [mnemo.Step(t, "reply", metadata={"turn": i}) for i, t in enumerate(turns)]
    await mem.ingest(REPO, mnemo.Trajectory(GOAL, steps), source_id="session-3")
    return mem


@pytest.mark.parametrize("on", [False, True])
async def test_ingest_resolves_dates_only_when_asked(store: str, on: bool) -> None:
    """With `ingest_resolve_dates`, the stored step says which day "yesterday" was, and a
    lexical search for that day finds it; without, the text is stored as given."""
    mem = await ingest_turns(store, mnemo.Config(ingest_resolve_dates=on),
                             "Caroline: I went to the support group yesterday.")
    try:
        (step,) = await mem.get_nodes_by_type(REPO, [N.EPISODIC])
        resolved = "yesterday (7 May 2023)." in step.text
        assert resolved is on
        assert ("7 May 2023" in js(step.data)["observation"]) is on
        found = await mem.recall(REPO, "7 May 2023", types=[N.EPISODIC])
        assert (step.id in [m.node.id for m in found.memories]) is on
    finally:
        await mem.__aexit__(None, None, None)


def test_entity_names_are_the_speaker_and_capitalised_names() -> None:
    """A transcript line's speaker, then capitalised non-initial words (a run is one name),
    without stopwords, months or weekdays."""
    line = "Melanie (8 May, 2023): Hey Caroline! I met John Smith in June. It was Friday."
    assert entity_names(line) == ["Melanie", "Caroline", "John Smith"]
    assert entity_names("no names at all. Really none") == []


def test_a_name_is_one_tag_with_or_without_its_clitic() -> None:
    """A possessive or a short verb after a name is no part of it: "McGee's" names McGee."""
    line = "James (8 May, 2023): We met at McGee\u2019s bar, and Samantha's cousin came."
    assert entity_names(line) == ["James", "McGee", "Samantha"]


@pytest.mark.parametrize("on", [False, True])
async def test_entity_tags_link_steps_to_one_tag_per_name(store: str, on: bool) -> None:
    """With `ingest_entity_tags`, every step joins a TAG per name (one node per name across
    steps and sources), and forgetting the source leaves no tag behind."""
    mem = await ingest_turns(store, mnemo.Config(ingest_entity_tags=on),
                             "Caroline (8 May, 2023): I painted a lake with Melanie.",
                             "Melanie (8 May, 2023): The lake is lovely, Caroline.")
    try:
        tags = {n.text.lower(): n for n in await mem.get_nodes_by_type(REPO, [N.TAG])}
        steps = {n.id for n in await mem.get_nodes_by_type(REPO, [N.EPISODIC])}
        for name in ("caroline", "melanie"):
            members = await mem.get_linked_nodes(REPO, [tags[name].id],
                                                 mnemo.LinkType.MEMBERSHIP) \
                if name in tags else []
            assert (steps <= {n.id for n in members}) is on
        await mem.forget(REPO, "session-3")
        assert await mem.get_nodes_by_type(REPO, [N.TAG, N.EPISODIC]) == []
    finally:
        await mem.__aexit__(None, None, None)


def test_a_transcript_line_is_embedded_without_the_time_of_its_opening() -> None:
    """Only the time between a speaker and the colon goes; other text is embedded as it is."""
    assert embedding_text("Caroline (1:56 pm on 8 May, 2023): I paint (mostly lakes): yes") == (
        "Caroline: I paint (mostly lakes): yes")
    for text in ("Caroline: I paint", "I paint (mostly lakes): yes", "no speaker (x): here"):
        assert embedding_text(text) == text


async def test_ingest_embeds_a_transcript_line_without_its_time_and_stores_it_whole(
    store: str,
) -> None:
    """The step's vector is made of "Caroline: ..." (the words channel still finds the time in
    the stored text), and so is that of a fact made from the line."""
    line = "Caroline (1:56 pm on 8 May, 2023): I painted a sunrise over the lake."
    embedder = RecordingEmbedder()
    async with mnemo.Memory(store, embedder=embedder) as mem:
        await mem.open_repo(REPO)
        await mem.ingest(REPO, mnemo.Trajectory(GOAL, [mnemo.Step(line, "")]),
                         source_id="session-3")
        (step,) = await mem.get_nodes_by_type(REPO, [N.EPISODIC])
        assert step.text.startswith(line)
        assert [t for t in embedder.texts if t.startswith("Caroline: I painted a sunrise")]
        assert not [t for t in embedder.texts if t.startswith("Caroline (")]
        found = await mem.recall(REPO, "1:56 pm", types=[N.EPISODIC], reinforce=False)
        assert [m.node.id for m in found.memories] == [step.id]


def test_a_month_alone_dates_a_fact_but_no_relative_date() -> None:
    """One parser reads absolute dates: "May 2023" dates a fact from 1 May, but gives no day
    for "yesterday" to resolve against; the first whole date written does."""
    assert named_date("moved in May 2023") == datetime(2023, 5, 1, tzinfo=UTC)
    assert reference_date("moved in May 2023", None) is None
    assert reference_date("Chat in May 2023", None) is None
    assert reference_date("in May 2023, on the 3rd of June 2023 at 2023-07-01", None) == (
        date(2023, 6, 3))
