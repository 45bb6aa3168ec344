"""The date a fact names: absolute forms, and relative ones against an anchor."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

import mnemo
from mnemo.extraction.dates import metadata_date, named_date

ANCHOR = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("moved on 2024-03-01", datetime(2024, 3, 1, tzinfo=UTC)),
        ("Caroline (1:56 pm on 8 May, 2023): hi", datetime(2023, 5, 8, 13, 56, tzinfo=UTC)),
        ("since the 3rd of June 2022", datetime(2022, 6, 3, tzinfo=UTC)),
        ("on March 5, 2021 she left", datetime(2021, 3, 5, tzinfo=UTC)),
        ("back in Sept 2019", datetime(2019, 9, 1, tzinfo=UTC)),
        ("I went to a support group yesterday", datetime(2023, 5, 7, 13, 56, tzinfo=UTC)),
        ("Dana (8 May, 2023): I moved to Porto last week",
         datetime(2023, 5, 1, 13, 56, tzinfo=UTC)),
        ("three days ago the build broke", datetime(2023, 5, 5, 13, 56, tzinfo=UTC)),
        ("the tests pass", None),
        ("on 31 February 2023", datetime(2023, 2, 1, tzinfo=UTC)),  # no such day: the month
    ],
)
def test_named_dates(text: str, expected: datetime | None) -> None:
    """Each form resolves to its date (relative ones against the anchor), or to None."""
    assert named_date(text, ANCHOR) == expected


def test_relative_dates_need_an_anchor_and_metadata_gives_a_time() -> None:
    """Without an anchor "yesterday" names nothing; metadata's ISO or named date counts."""
    assert named_date("yesterday") is None
    assert metadata_date({"date": "2023-05-08T10:00:00"}) == datetime(2023, 5, 8, 10,
                                                                      tzinfo=UTC)
    assert metadata_date({"when": "8 May 2023"}) == datetime(2023, 5, 8, tzinfo=UTC)
    assert metadata_date({"dia_id": "D1:3"}) is None


async def test_a_fact_holds_from_the_date_it_names(mem: mnemo.Memory) -> None:
    """An ingested fact's valid_from is the date its text names, resolved against the
    session's date (the goal's); recorded_at is when it was committed."""
    trajectory = mnemo.Trajectory("Chat on 8 May, 2023", [
        mnemo.Step("Dana moved to Porto last week.", "Note it."),
    ])
    await mem.ingest("r", trajectory, source_id="chat")
    facts = await mem.get_nodes_by_type("r", [mnemo.NodeType.SEMANTIC])
    assert facts
    for fact in facts:
        assert fact.valid_from == datetime(2023, 5, 1, tzinfo=UTC)
        assert fact.recorded_at is not None
        assert fact.recorded_at > fact.valid_from
        assert (fact.valid_to, fact.retired_at) == (None, None)
    (episodic,) = await mem.get_nodes_by_type("r", [mnemo.NodeType.EPISODIC])
    assert (episodic.valid_from, episodic.recorded_at) == (None, None)
