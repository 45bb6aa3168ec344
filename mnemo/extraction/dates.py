"""The date a text names, for bi-temporal facts: absolute ("8 May, 2023", "May 2023") or, against
an anchor, relative ("yesterday", "three days ago"). No model."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta

MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
          "september", "october", "november", "december")
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
# A month's number by its name or its abbreviation.
_MONTHS = {name: n for n, month in enumerate(MONTHS, 1) for name in (month, month[:3])} | {
    "sept": 9}
_MONTH = r"(?P<month>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_TIME = r"(?:(?P<hour>\d{1,2})(?::(?P<minute>\d{2}))?\s*(?P<ampm>am|pm)\s+on\s+)?"
_ISO = re.compile(
    r"\b(?P<year>\d{4})-(?P<month>\d{2})-(?P<day>\d{2})(?:[T ](?P<hour>\d{2}):(?P<minute>\d{2}))?")
_DAY_MONTH_YEAR = re.compile(
    _TIME + r"\b(?P<day>\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?" + _MONTH
    + r",?\s+(?P<year>\d{4})\b", re.IGNORECASE)
_MONTH_DAY_YEAR = re.compile(
    _TIME + r"\b" + _MONTH + r"\s+(?P<day>\d{1,2})(?:st|nd|rd|th)?,?\s+(?P<year>\d{4})\b",
    re.IGNORECASE)
_MONTH_YEAR = re.compile(r"\b" + _MONTH + r",?\s+(?P<year>\d{4})\b", re.IGNORECASE)
NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
           "seven": 7, "eight": 8, "nine": 9, "ten": 10, "few": 3, "couple of": 2, "a couple of": 2}
_UNIT_DAYS = {"day": 1, "week": 7, "month": 30, "year": 365}
_AGO = re.compile(
    r"\b(?P<n>\d+|" + "|".join(NUMBERS) + r")\s+(?P<unit>day|week|month|year)s?\s+ago\b",
    re.IGNORECASE)
_RELATIVE = re.compile(
    r"\b(?P<word>yesterday|today|tomorrow|tonight|(?:last|next|this)\s+"
    r"(?:week|month|year|weekend))\b",
    re.IGNORECASE)
_SHIFT = {"yesterday": -1, "today": 0, "tonight": 0, "tomorrow": 1}
# Metadata keys that may carry a step's or trajectory's time.
TIME_KEYS = ("date", "datetime", "time", "timestamp", "date_time", "when")


def whole_dates(text: str) -> Iterator[datetime]:
    """The dates with a day `text` writes, in its order ("31 February 2023" is none)."""
    found = [m for p in (_ISO, _DAY_MONTH_YEAR, _MONTH_DAY_YEAR) for m in p.finditer(text)]
    return filter(None, map(_moment, sorted(found, key=lambda m: m.start())))


def _moment(found: re.Match[str]) -> datetime | None:
    parts = found.groupdict()
    month = parts["month"]
    month_number = int(month) if month.isdigit() else _MONTHS[month.lower().rstrip(".")]
    hour = int(parts.get("hour") or 0)
    if (parts.get("ampm") or "").lower() == "pm" and hour < 12:
        hour += 12
    elif (parts.get("ampm") or "").lower() == "am" and hour == 12:
        hour = 0
    try:
        return datetime(int(parts["year"]), month_number, int(parts.get("day") or 1), hour,
                        int(parts.get("minute") or 0), tzinfo=UTC)
    except ValueError:
        return None


def count_of(word: str) -> int:
    """A count as `_AGO` finds it: digits, or a word of `NUMBERS` ("three", "a couple of")."""
    word = word.lower()
    return int(word) if word.isdigit() else NUMBERS[word]


def _relative(text: str, anchor: datetime) -> datetime | None:
    found = _AGO.search(text)
    if found is not None:
        return anchor - timedelta(days=count_of(found["n"]) * _UNIT_DAYS[found["unit"].lower()])
    found = _RELATIVE.search(text)
    if found is None:
        return None
    word = " ".join(found["word"].lower().split())
    if word in _SHIFT:
        return anchor + timedelta(days=_SHIFT[word])
    which, unit = word.split()
    days = 2 if unit == "weekend" else _UNIT_DAYS[unit]
    return anchor + timedelta(days={"last": -1, "next": 1, "this": 0}[which] * days)


def named_date(text: str, anchor: datetime | None = None) -> datetime | None:
    """The date `text` names (UTC): an absolute one, else one relative to `anchor`."""
    found = (p.search(text) for p in (_ISO, _DAY_MONTH_YEAR, _MONTH_DAY_YEAR, _MONTH_YEAR))
    absolute = next(filter(None, (_moment(match) for match in found if match is not None)), None)
    if anchor is None or (absolute is not None and absolute.date() != anchor.date()):
        return absolute
    return _relative(text, anchor) or absolute


def metadata_date(metadata: Mapping[str, object] | None) -> datetime | None:
    """The time a step's or trajectory's metadata gives (ISO text or a named date)."""
    if not metadata:
        return None
    for key in TIME_KEYS:
        value = metadata.get(key)
        if isinstance(value, str) and value.strip():
            try:
                moment = datetime.fromisoformat(value.strip())
            except ValueError:
                found = named_date(value)
                if found is not None:
                    return found
                continue
            return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return None

