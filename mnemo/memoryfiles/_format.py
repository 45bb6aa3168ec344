"""The on-disk shape of a topic file (a front matter of `topic`, `description`, `updated` and
`used` between `---` lines, then one entry per line, oldest first), and the pure rules for its
lines."""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from mnemo import text as _text
from mnemo.cpu import dumps
from mnemo.storage.sql import utc

MAX_TOPIC_CHARS = 80
MAX_DESCRIPTION_CHARS = 200
_ELLIPSIS = "\u2026"
# Names Windows refuses as file stems, whatever the extension.
_RESERVED = frozenset(
    ["con", "prn", "aux", "nul"] + [f"com{i}" for i in range(10)] + [f"lpt{i}" for i in range(10)])
_BULLET = re.compile(r"^(?:[-*+\u2022]|\d+[.)])\s+|^[-*+\u2022]$")
_FRONT_LINE = re.compile(r"^([A-Za-z_][\w-]*)\s*:\s?(.*)$")
_MARKS = re.compile(r"(?<=\w)[#&+]+|[#&+]+(?=\w)")


@dataclass(frozen=True, slots=True)
class Parsed:
    """A topic file read back: front matter fields (None when absent or unreadable) and body."""

    topic: str | None
    description: str
    updated: datetime | None
    used: datetime | None
    body: str


def one_line(text: str, max_chars: int) -> str:
    """`text` as one printable line (the front matter stays one line per key, readable as
    YAML): whitespace collapsed, control and format characters dropped, clipped."""
    printable = "".join(" " if unicodedata.category(ch)[0] == "C" else ch for ch in text)
    return " ".join(printable.split())[:max_chars].rstrip()


def topic_key(topic: str) -> str:
    """The identity of a topic: its content words' stems, sorted and deduplicated (else all its
    words, else its case-folded text), then its runs of "#", "&" or "+" next to a word, sorted
    ("C++" is not "C#"; other punctuation and Markdown fold: "**Go!**" is "Go")."""
    toks = _text.tokens(topic)
    content = [t for t in toks if not _text.is_stopword(t)] or toks
    if not content:
        return " ".join(topic.casefold().split())
    marks = _MARKS.findall(_text.normalise(topic))
    return " ".join(sorted({_text.stem(t) for t in content}) + sorted(marks))


def slug(topic: str) -> str:
    """A safe file stem for `topic`: lower-case ASCII letters, digits and single dashes, at most 60
    characters, never empty, never a name Windows reserves."""
    ascii_text = unicodedata.normalize("NFKD", topic).encode("ascii", "ignore").decode("ascii")
    stem = re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")[:60].rstrip("-")
    if not stem:
        digest = hashlib.sha1(topic_key(topic).encode("utf-8")).hexdigest()[:10]
        stem = f"topic-{digest}"
    if stem in _RESERVED:
        stem = f"{stem}-topic"
    return stem


def render(*, topic: str, description: str, updated: datetime, used: datetime | None,
           content: str) -> str:
    """The full text of a topic file: the front matter, then `content` as it is."""
    head = [
        "---", f"topic: {dumps(topic)}", f"description: {dumps(description)}",
        f"updated: {updated.astimezone(UTC).isoformat()}"]
    if used is not None:
        head.append(f"used: {used.astimezone(UTC).isoformat()}")
    head.append("---")
    return "\n".join(head) + "\n" + content


def parse(text: str) -> Parsed:
    """Reads a topic file, leniently (people edit them by hand): no front matter, all body;
    unknown keys ignored; a value bare or quoted; an unreadable time None."""
    text = text.replace("\r\n", "\n")
    fields: dict[str, str] = {}
    rest = text
    if text.startswith("---\n"):
        end = text.find("\n---\n", 3)
        if end == -1 and text.endswith("\n---"):
            end = len(text) - 4
        if end != -1:
            for line in text[4:end].splitlines():
                match = _FRONT_LINE.match(line.strip())
                if match:
                    fields[match.group(1).lower()] = _unquote(match.group(2).strip())
            rest = text[end + 5 :]
    topic = one_line(fields.get("topic", ""), MAX_TOPIC_CHARS) or None
    return Parsed(
        topic=topic, description=one_line(fields.get("description", ""), MAX_DESCRIPTION_CHARS),
        updated=_time(fields.get("updated")), used=_time(fields.get("used")), body=rest)


def entries(text: str) -> list[str]:
    """The entry lines of a body: blank lines dropped, every non-heading line a "- " bullet."""
    out: list[str] = []
    for raw in text.replace("\r\n", "\n").split("\n"):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            out.append(line)
            continue
        content = _BULLET.sub("", line, count=1).strip()
        if content:
            out.append(f"- {content}")
    return out


def entry_key(line: str) -> str:
    """What makes two entries the same: case, spacing, bullets and final punctuation ignored."""
    content = _BULLET.sub("", line.strip(), count=1)
    return " ".join(content.casefold().split()).rstrip(" .!;")


def cut_short(short: str, line: str) -> bool:
    """Whether entry `short` is entry `line` cut: its leading words, with or without an ellipsis."""
    head, whole = entry_key(short.rstrip().removesuffix(_ELLIPSIS)), entry_key(line)
    return bool(head) and head != whole and whole.startswith(head)


def dedupe(lines: list[str]) -> list[str]:
    """`lines` without repeats (by `entry_key`) or empty entries, each kept at its first
    position."""
    first: dict[str, str] = {}
    for line in lines:
        first.setdefault(entry_key(line), line)
    first.pop("", None)
    return list(first.values())


@dataclass(frozen=True, slots=True)
class Fitted:
    """What `bound` kept, and what it gave up to stay within the limit."""

    lines: list[str]
    dropped: tuple[str, ...]
    truncated: bool


def bound(lines: list[str], max_chars: int) -> Fitted:
    """`lines` cut down so that `body(lines)` fits in `max_chars`, with what was dropped and whether
    a line was truncated; the newest line always stays."""
    limit = max_chars - 1  # each line carries its newline
    cut = [_truncate(line, limit) for line in lines]
    total = sum(len(line) + 1 for line in cut)
    newest = len(cut) - 1  # never dropped, a heading or an entry
    headings = [i for i, line in enumerate(cut) if line.startswith("#") and i != newest]
    order = [i for i in range(newest) if i not in set(headings)] + headings
    dropped: set[int] = set()
    for i in order:
        if total <= max_chars or len(dropped) == len(cut) - 1:
            break
        dropped.add(i)
        total -= len(cut[i]) + 1
    return Fitted(lines=[line for i, line in enumerate(cut) if i not in dropped],
                  dropped=tuple(line for i, line in enumerate(lines) if i in dropped),
                  truncated=any(cut[i] != lines[i] for i in range(len(cut)) if i not in dropped))


def follow(description: str, lines: list[str]) -> str:
    """`description`, or, when it names nothing the entries `lines` still say (the entries it
    described were dropped), their first entry as a description."""
    said = _text.content_stems(body(lines))
    if not lines or _text.content_stems(description) & said:
        return description
    return one_line(_BULLET.sub("", lines[0], count=1), MAX_DESCRIPTION_CHARS)


def restates(description: str, lines: Sequence[str]) -> bool:
    """Whether `description` says every content word of one of the entries `lines`."""
    said = _text.content_stems(description)
    return any((stems := _text.content_stems(line)) and stems <= said for line in lines)


def merge(current: list[str], proposed: list[str], base: list[str] | None, *, allow_removal: bool,
          removed: Sequence[str] = ()) -> list[str]:
    """The entries of a file after a change, merged three ways from `current`, `proposed` (the
    LLM's) and `base` (what it was shown): unchanged since, the file takes the LLM's order, else
    it appends the LLM's additions. Entries go only when `allow_removal`."""
    if allow_removal and removed:
        gone = {entry_key(line) for line in removed}
        current = [line for line in current if entry_key(line) not in gone]
        base = None if base is None else [line for line in base if entry_key(line) not in gone]
    proposed_keys = {entry_key(line) for line in proposed}
    current_keys = {entry_key(line) for line in current}
    if base is None:
        return current + [line for line in proposed if entry_key(line) not in current_keys]
    base_keys = {entry_key(line) for line in base}
    left_out = base_keys - proposed_keys if allow_removal else set()
    if [entry_key(line) for line in current] == [entry_key(line) for line in base]:
        replaced = proposed_keys | left_out
        return [line for line in current if entry_key(line) not in replaced] + proposed
    # A proposed line that was in `base` but is gone now was removed by the other writer.
    known = current_keys | base_keys
    added = [line for line in proposed if entry_key(line) not in known]
    return [line for line in current if entry_key(line) not in left_out] + added


def body(lines: list[str]) -> str:
    """The body text of `lines`: one per line, with a final newline ("" for none)."""
    return "".join(f"{line}\n" for line in lines)


def _truncate(line: str, limit: int) -> str:
    if len(line) <= limit:
        return line
    cut = line[: limit - 1]
    space = cut.rfind(" ")
    # Cut at a word boundary unless that would throw away much of the statement.
    if space > 0.8 * limit:
        cut = cut[:space]
    return cut.rstrip() + _ELLIPSIS


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == '"':
        try:
            loaded = json.loads(value)
        except json.JSONDecodeError:
            return value.strip('"')
        return loaded if isinstance(loaded, str) else value
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1].replace("''", "'")
    return value


def _time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return utc(datetime.fromisoformat(value))
    except ValueError:
        return None
