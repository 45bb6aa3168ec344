"""Relative dates in a step's text, resolved against the day the trajectory happened: "...
yesterday", said on 8 May 2023, is stored as "... yesterday (7 May 2023)", so a search naming
the day finds it. English only, and only expressions with one clear answer ("recently" stays)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import date, timedelta

from mnemo.extraction.dates import MONTHS, NUMBERS, WEEKDAYS, whole_dates

_COUNT = r"(?P<count>\d{1,3}|an?|one|two|three|four|five|six|seven|eight|nine|ten|a couple of)"
_RELATIVE = re.compile(
    r"\b(?:(?P<day_word>yesterday|today|tonight|tomorrow|last night|this morning"
    r"|this afternoon|this evening)"
    rf"|{_COUNT}\s+(?P<unit>day|week|month|year)s?\s+ago"
    r"|(?P<which>last|this|next)\s+(?P<span>week(?:end)?|month|year)"
    rf"|(?P<which_day>last|next)\s+(?P<weekday>{'|'.join(WEEKDAYS)}))\b",
    re.IGNORECASE)
# Already followed by a date in brackets (written by hand, or resolved before): left alone.
_RESOLVED = re.compile(r"\s*\((?:the )?(?:week(?:end)? of )?[^()]*\d{4}\)")


def parse_date(text: str) -> date | None:
    """The first whole date (its day, month and year) written in `text`, or None: a month
    alone names no day to resolve "yesterday" against."""
    return next((moment.date() for moment in whole_dates(text)), None)


def reference_date(goal: str, metadata: Mapping[str, object] | None) -> date | None:
    """The day a trajectory happened: its metadata's "date" when that parses, else the first
    date written in its goal ("Conversation session 3 on 1:56 pm on 8 May, 2023")."""
    given = (metadata or {}).get("date")
    if isinstance(given, str):
        found = parse_date(given)
        if found is not None:
            return found
    return parse_date(goal)


def resolve_dates(text: str, on: date) -> str:
    """`text` with each relative date it names followed by that date, "(7 May 2023)"."""
    out: list[str] = []
    end = 0
    for match in _RELATIVE.finditer(text):
        resolved = _resolve(match, on)
        if resolved is None or _RESOLVED.match(text, match.end()):
            continue
        out += [text[end : match.end()], f" ({resolved})"]
        end = match.end()
    out.append(text[end:])
    return "".join(out)


def _resolve(match: re.Match[str], on: date) -> str | None:
    groups = match.groupdict()
    if groups["day_word"]:
        word = groups["day_word"].lower()
        shift = {"yesterday": -1, "last night": -1, "tomorrow": 1}.get(word, 0)
        return _day(on + timedelta(days=shift))
    if groups["unit"]:
        count = _count(groups["count"])
        return None if count is None else _ago(on, count, groups["unit"].lower())
    if groups["span"]:
        return _span(on, groups["which"].lower(), groups["span"].lower())
    weekday = WEEKDAYS.index(groups["weekday"].lower())
    if groups["which_day"].lower() == "last":
        return _day(on - timedelta(days=(on.weekday() - weekday - 1) % 7 + 1))
    return _day(on + timedelta(days=(weekday - on.weekday() - 1) % 7 + 1))


def _count(word: str) -> int | None:
    word = " ".join(word.lower().split())
    return int(word) if word.isdigit() else NUMBERS.get(word)


def _ago(on: date, count: int, unit: str) -> str:
    if unit == "day":
        return _day(on - timedelta(days=count))
    if unit == "week":
        return f"the week of {_day(_monday(on - timedelta(weeks=count)))}"
    if unit == "month":
        months = on.year * 12 + on.month - 1 - count  # since January of year 0
        return f"{MONTHS[months % 12].capitalize()} {months // 12}"
    return str(on.year - count)


def _span(on: date, which: str, span: str) -> str:
    step = {"last": -1, "this": 0, "next": 1}[which]
    if span != "weekend":
        return _ago(on, -step, span)
    # The Saturday of this week, a week earlier for "last" (said on a Monday: the two days
    # before) and a week later for "next".
    return f"the weekend of {_day(_monday(on) + timedelta(days=5, weeks=step))}"


def _monday(day: date) -> date:
    return day - timedelta(days=day.weekday())


def _day(day: date) -> str:
    return f"{day.day} {MONTHS[day.month - 1].capitalize()} {day.year}"

