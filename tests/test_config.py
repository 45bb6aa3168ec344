"""Config: each field's range sits in its annotation and is checked at construction."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

import mnemo
from mnemo.config import DURATION_CEILINGS, _checks


def configured(name: str, value: object) -> mnemo.Config:
    """A Config with one field set by name."""
    fields: dict[str, Any] = {name: value}
    return mnemo.Config(**fields)


NUMERIC = sorted(name for name, check in _checks().items()
                 if check.wanted.startswith(("a number", "an integer")))


def test_every_numeric_field_declares_its_range() -> None:
    """Every int or float field of Config carries a range check (its `Meta`)."""
    numeric = [f.name for f in dataclasses.fields(mnemo.Config)
               if isinstance(f.default, int | float) and not isinstance(f.default, bool)]
    assert numeric
    assert [name for name in numeric if name not in NUMERIC] == []


@pytest.mark.parametrize("name", NUMERIC)
@pytest.mark.parametrize("bad", [math.nan, True, "1", -1e9])
def test_a_value_out_of_range_names_its_field(name: str, bad: object) -> None:
    """NaN, a bool, a string or a number below a field's range is InvalidInputError naming
    the field and what it takes."""
    with pytest.raises(mnemo.InvalidInputError, match=rf"Config\.{name} (must be|is at most)"):
        configured(name, bad)


def test_every_field_has_a_check() -> None:
    """Every Config field, whatever its type, is checked at construction."""
    assert sorted(_checks()) == sorted(f.name for f in dataclasses.fields(mnemo.Config))


FLAGS = sorted(f.name for f in dataclasses.fields(mnemo.Config) if isinstance(f.default, bool))


@pytest.mark.parametrize("name", FLAGS)
@pytest.mark.parametrize("bad", ["false", "no", 0, 1, None])
def test_a_flag_takes_only_a_bool(name: str, bad: object) -> None:
    """A bool field refuses anything but True or False (the string "false" included) with
    InvalidInputError naming the field, and takes both bools."""
    assert FLAGS
    with pytest.raises(mnemo.InvalidInputError, match=rf"Config\.{name} must be True or False"):
        configured(name, bad)
    assert getattr(configured(name, False), name) is False
    assert getattr(configured(name, True), name) is True


@pytest.mark.parametrize("name", ["recall_planner", "lexical_dir", "ann_dir"])
def test_a_text_field_takes_only_a_string(name: str) -> None:
    """A text field refuses a number or a path object (not storable as JSON) by name."""
    for bad in (3, Path("/tmp")):
        with pytest.raises(mnemo.InvalidInputError, match=rf"Config\.{name} must be a string"):
            configured(name, bad)


def test_a_numpy_float_in_range_is_taken() -> None:
    """A number numpy computed (a float64, a float's subclass) sets a float field as the same
    float would."""
    numpy = pytest.importorskip("numpy")
    assert mnemo.Config(hop_decay=numpy.float64(0.5)).hop_decay == 0.5
    with pytest.raises(mnemo.InvalidInputError, match=r"Config\.hop_decay must be"):
        mnemo.Config(hop_decay=numpy.float64(7.0))


DURATIONS = {
    "append_timeout": "wait", "extraction_timeout": "wait", "busy_timeout": "wait",
    "lease_timeout": "wait", "flush_timeout": "inactivity", "session_timeout": "inactivity",
}


def test_a_lease_shorter_than_a_second_is_refused_and_one_stored_is_read_at_it() -> None:
    """A lease below a second would let another Memory take a live holder's work (its
    heartbeat, a third of the lease, slower than a store write): refused naming the range;
    one stored before the floor opens at it (it was accepted, and two Memories extracted)."""
    assert configured("lease_timeout", 1).lease_timeout == 1
    with pytest.raises(mnemo.InvalidInputError, match=r"lease_timeout must be a number "
                       r"within \[1, 86,400\], got 0.001"):
        configured("lease_timeout", 0.001)
    stored = json.dumps({**json.loads(mnemo.Config().to_json()), "lease_timeout": 0.001})
    assert mnemo.Config.from_json(stored).lease_timeout == 1


@pytest.mark.parametrize(("name", "kind"), DURATIONS.items())
def test_every_duration_has_a_ceiling(name: str, kind: str) -> None:
    """A duration takes up to its kind's ceiling (a day for a wait, a year of inactivity),
    refuses more and infinity naming the range, and one stored past it is read at it."""
    ceiling = DURATION_CEILINGS[kind]
    assert getattr(configured(name, ceiling), name) == ceiling
    for bad in (ceiling * 1.5, math.inf):
        with pytest.raises(mnemo.InvalidInputError, match=rf"Config\.{name} must be a number "
                           rf"within .[01], {ceiling:,.0f}\]"):
            configured(name, bad)
    stored = json.dumps({**json.loads(mnemo.Config().to_json()), name: ceiling * 10})
    assert getattr(mnemo.Config.from_json(stored), name) == ceiling


def test_the_recency_half_life_is_at_most_a_hundred_years() -> None:
    assert mnemo.Config(recency_half_life_days=36_500).recency_half_life_days == 36_500
    with pytest.raises(mnemo.InvalidInputError, match="recency_half_life_days"):
        mnemo.Config(recency_half_life_days=36_501)


def test_optional_fields_take_none() -> None:
    """The fields whose range allows None take it; the others refuse it."""
    config = mnemo.Config(flush_timeout=None, session_timeout=None, blas_threads=None)
    assert config.flush_timeout is None
    assert config.blas_threads is None
    with pytest.raises(mnemo.InvalidInputError,
                       match=r"Config\.rrf_k must be an integer from 1 to 10,000,"):
        configured("rrf_k", None)


def test_the_idle_session_timeout_is_bounded() -> None:
    """`idle_session_timeout` defaults to an hour and takes any number of seconds above 0 up
    to a week, never None (idle sessions always end) nor more; a config stored before the
    field existed reads the default."""
    assert mnemo.Config().idle_session_timeout == 3600.0
    week = 7 * 24 * 3600.0
    assert mnemo.Config.from_json(configured("idle_session_timeout", week).to_json()) == (
        configured("idle_session_timeout", week))
    for bad in (0, None, week + 1, math.inf):
        with pytest.raises(mnemo.InvalidInputError,
                           match=r"idle_session_timeout must be a number within \(0, 604,800\]"):
            configured("idle_session_timeout", bad)
    stored = mnemo.Config().to_json().replace('"idle_session_timeout": 3600.0, ', "")
    assert "idle_session_timeout" not in stored
    assert mnemo.Config.from_json(stored).idle_session_timeout == 3600.0


def test_every_count_has_a_ceiling() -> None:
    """Every whole-number field refuses a value past its ceiling and is read at it from a
    stored config: a count bounds the work of one call (a `recall_neighbour_width` of 2**63 ran
    a recall out of memory; a huge `contradiction_candidates` overflowed PostgreSQL's bigint)."""
    counts = {name: check.high for name, check in _checks().items() if "int" in str(check.hint)}
    assert {"max_pending_ops", "recall_neighbour_width", "contradiction_candidates"} <= set(counts)
    for name, high in counts.items():
        assert high is not None, name
        with pytest.raises(mnemo.InvalidInputError, match=rf"Config\.{name} must be"):
            mnemo.Config(**dict[str, Any]({name: int(high) + 1}))
        stored = json.dumps({**json.loads(mnemo.Config().to_json()), name: 2**63})
        assert getattr(mnemo.Config.from_json(stored), name) == high
    assert (counts["recall_neighbour_width"], counts["contradiction_candidates"],
            counts["max_pending_ops"]) == (100, 100, 10_000)


@pytest.mark.parametrize("name", ["lexical_dir", "ann_dir"])
@pytest.mark.parametrize("bad", ["a\x00b", "lexical\udcff"])
async def test_a_text_field_the_store_cannot_hold_is_refused(
    mem: mnemo.Memory, name: str, bad: str
) -> None:
    """A NUL or a lone surrogate in a text field is InvalidInputError on both backends, and no
    repo is stored: PostgreSQL refused the stored config (StorageError) where SQLite kept it."""
    with pytest.raises(mnemo.InvalidInputError, match=rf"Config\.{name}"):
        await mem.open_repo("r2", config=configured(name, bad))
    assert "r2" not in await mem.list_repos()
