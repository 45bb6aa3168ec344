"""The memory-file tasks for the LLM (`memory_update`, `memory_persist`, `memory_condense`) and
their parsers: strict about shape (`ValueError` naming the first offending field, and `ask`
asks again), and topics and descriptions become one printable line."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

from mnemo import text as _text
from mnemo.calls.schema import Reply, bounded, items, most_tokens, reply_schema, text
from mnemo.calls.tasks import preview, read_reply, task_request
from mnemo.memoryfiles import _format
from mnemo.memoryfiles._format import MAX_DESCRIPTION_CHARS, MAX_TOPIC_CHARS, one_line
from mnemo.ports import LLMRequest, LLMResponse

Signal = Literal["decision", "context", "correction", "preference"]


@dataclass(frozen=True, slots=True)
class TopicChange:
    """One file the LLM wants changed: its topic, description, why, the entries to add
    (`content`) and those a correction removes (`remove`)."""

    topic: str
    description: str
    signals: tuple[str, ...]
    content: str
    remove: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Condensed:
    """A file rewritten by the LLM to fit `max_chars`: its new description and entries."""

    description: str
    lines: list[str]


@dataclass(frozen=True, slots=True)
class Filed:
    """Where the LLM files one statement to remember."""

    topic: str
    description: str
    entry: str


# The reply holds edits (each topic's new entries and those a correction makes wrong), so its
# length is bounded whatever the files' size: the most files one reply changes, and the new
# text of one file.
MAX_UPDATE_FILES = 4
MAX_NEW_CHARS = 480
_DESCRIPTION_BOUND = 160


class FileReply(Reply, frozen=True, kw_only=True):
    topic: Annotated[str, text(MAX_TOPIC_CHARS)]
    description: Annotated[str, text(_DESCRIPTION_BOUND)] | None = None
    signals: Annotated[list[Signal], items(4)] | None = None
    content: Annotated[str, text(MAX_NEW_CHARS)]
    remove: Annotated[list[Annotated[str, text(200)]], items(2)] | None = None


class UpdateReply(Reply, frozen=True):
    files: Annotated[list[FileReply], items(MAX_UPDATE_FILES)]


MEMORY_UPDATE_SCHEMA = reply_schema(UpdateReply)
MEMORY_UPDATE_SYSTEM = (
    "You maintain an agent's long-term memory: Markdown files, one per topic, that the agent "
    "reads before future work. You update them from a conversation, keeping only what will "
    "still matter in later conversations.")
MEMORY_UPDATE_INSTRUCTIONS = f"""\
Read the conversation, decide which memory topics it touched, and give the new entries of \
each topic's file.

Only four kinds of signal qualify:
- decision: an explicit decision ("we decided to ...", "let's go with ...", "we'll use ...").
- context: new lasting context about the user, the project or its environment (names, roles,
  the stack, conventions, constraints, deadlines) that stays true after this conversation.
- correction: the user corrects something (a fact, an earlier decision, or something the
  assistant or a memory file got wrong).
- preference: a stated preference about how to work or answer ("I prefer ...", "always ...",
  "never ...", "please don't ...").
Signals come from the user's messages; an assistant message counts only where it confirms what
the user said or decided. Ignore everything else: greetings, thanks, small talk, questions, the
intermediate steps of the task, tool output, guesses, and whatever is true only for this
conversation. If nothing qualifies, reply {{"files": []}}.

Rules for the files:
- `files` lists existing memory files by topic and description; some also show their content.
- A topic lives in exactly one file. When a signal belongs to an existing topic, reuse that
  topic's name exactly. Create a new topic only when none fits: name it with a short noun
  phrase (1 to 4 words, e.g. "database", "deployment", "code style") and describe in one line
  what the file holds.
- `content`: only the new entries, one per line as a Markdown bullet ("- ..."), each a
  self-contained statement: name the things it is about instead of writing "it", "this" or
  "they". Never repeat an entry the file already has. No headings.
- `remove`: for a correction, the file's entries it makes wrong, copied exactly; otherwise [].
  Entries are only ever removed for a correction.
- `signals`: the kinds of signal (decision, context, correction, preference) behind the change.
At most {MAX_UPDATE_FILES} files, only those that change, the most important first.
Reply with JSON: {{"files": [{{"topic", "description", "signals", "content", "remove"}}, ...]}}."""


def memory_update_request(*, conversation: list[dict[str, str]],
                          files: list[dict[str, str]]) -> LLMRequest:
    """The "memory_update" task over the `conversation` and the existing `files`; read the reply
    with `parse_update`."""
    return task_request(
        "memory_update", system=MEMORY_UPDATE_SYSTEM, instructions=MEMORY_UPDATE_INSTRUCTIONS,
        inputs={"files": files, "conversation": conversation}, schema=MEMORY_UPDATE_SCHEMA,
        max_tokens=most_tokens(MEMORY_UPDATE_SCHEMA))


def parse_update(resp: LLMResponse) -> list[TopicChange]:
    """The file changes of a "memory_update" reply, in order; raises ValueError naming the first
    field that does not match."""
    reply = read_reply(resp, UpdateReply, "memory_update")
    return [TopicChange(_topic(item.topic, f"files[{i}]"),
                        one_line(item.description or "", MAX_DESCRIPTION_CHARS),
                        tuple(dict.fromkeys(item.signals or ())), item.content,
                        tuple(item.remove or ())) for i, item in enumerate(reply.files)]


class PersistReply(Reply, frozen=True, kw_only=True):
    topic: Annotated[str, text(MAX_TOPIC_CHARS)]
    description: Annotated[str, text(_DESCRIPTION_BOUND)] | None = None
    entry: str  # bounded by each request (`memory_persist_request`)


MEMORY_PERSIST_SYSTEM = (
    "You file statements into an agent's long-term memory: Markdown files, one per topic, "
    "that the agent reads before future work.")
MEMORY_PERSIST_INSTRUCTIONS = """\
The user explicitly asked to remember `statement`. File it under one topic.
- `files` lists the existing memory files by topic and description. A topic lives in exactly
  one file: when the statement belongs to an existing topic, reuse that topic's name exactly.
- Otherwise name a new topic with a short noun phrase (1 to 4 words, e.g. "database",
  "deployment", "code style") and describe in one line what the file will hold.
- `entry`: the statement as one self-contained line, keeping every detail: name the things it
  is about instead of writing "it", "this" or "they". No bullet, no line breaks.
- `description`: for an existing topic, its description (improved only if the statement
  widens what the file holds).
Reply with JSON: {"topic", "description", "entry"}."""


def memory_persist_request(*, statement: str, files: list[dict[str, str]]) -> LLMRequest:
    """The "memory_persist" task: which topic `statement` belongs to, and its entry (read with
    `parse_persist`), at most half again the statement's length (the words `statement_entry`
    lets a rewording add)."""
    schema, max_tokens = bounded(
        reply_schema(PersistReply), "entry", len(statement) * 3 // 2 + 40, most=None, cap=None)
    return task_request(
        "memory_persist", system=MEMORY_PERSIST_SYSTEM, instructions=MEMORY_PERSIST_INSTRUCTIONS,
        inputs={"statement": statement, "files": files}, schema=schema, max_tokens=max_tokens)


def parse_persist(resp: LLMResponse) -> Filed:
    """Where a "memory_persist" reply files the statement; raises ValueError naming the first field
    that does not match."""
    reply = read_reply(resp, PersistReply, "memory_persist")
    # An entry of only bullets and punctuation would be dropped as empty when written.
    if not _format.entry_key(reply.entry):
        raise ValueError(f"entry must be a non-empty string, got {preview(reply.entry)}")
    return Filed(topic=_topic(reply.topic, "reply"),
                 description=one_line(reply.description or "", MAX_DESCRIPTION_CHARS),
                 entry=" ".join(reply.entry.split()))


def statement_entry(entry: str, statement: str) -> str:
    """The entry to file for `statement`: the model's `entry` when it rewords the statement
    without losing its numbers or most of its content words, else the statement itself."""
    if not set(_NUMBER.findall(statement)) <= set(_NUMBER.findall(entry)):
        return statement
    said, wrote = _words(statement), _words(entry)
    if not said:
        return statement
    missing = [w for w in said if not any(_same_word(w, other) for other in wrote)]
    added = [w for w in wrote if not any(_same_word(other, w) for other in said)]
    if len(missing) > max(1, len(said) // 5) or len(added) > 1 + len(said) // 3:
        return statement
    return entry


_NUMBER = re.compile(r"\d+")


def _words(text: str) -> set[str]:
    """The stems of `text`'s words that are neither function words nor hold a digit."""
    return {
        _text.stem(word) for word in _text.tokens(text)
        if not _text.is_stopword(word) and not any(c.isdigit() for c in word)}


def _same_word(said: str, wrote: str) -> bool:
    """Whether `wrote` keeps the stem `said`: the same, one a prefix of the other (at least
    three letters), or `said` (up to four letters) an abbreviation of it ("pw", "password")."""
    if said == wrote:
        return True
    short, long = sorted((said, wrote), key=len)
    if len(short) >= 3 and long.startswith(short):
        return True
    if len(said) > 4 or len(said) >= len(wrote) or said[0] != wrote[0]:
        return False
    rest = iter(wrote)
    return all(letter in rest for letter in said)


# Asked when a write would take a file past `max_chars`; dropping the oldest is the fallback.

class CondenseReply(Reply, frozen=True, kw_only=True):
    description: Annotated[str, text(_DESCRIPTION_BOUND)] | None = None
    content: str  # bounded by each request (`memory_condense_request`)


MEMORY_CONDENSE_SYSTEM = (
    "You maintain an agent's long-term memory: Markdown files, one per topic, that the agent "
    "reads before future work. Each file has a size limit.")
MEMORY_CONDENSE_INSTRUCTIONS = """\
The memory file on `topic` would grow past its limit of `max_chars` characters. `entries` holds
all of its entries, oldest (least important) first; the last ones were just added. Rewrite the
file so that it fits, deciding what matters:
- Merge entries about the same thing into one entry, and shorten wordy entries, keeping their
  facts (names, numbers, versions, dates).
- Drop only what no longer matters: entries superseded by a later one, repeated, or trivial.
  Keep every decision, preference and correction that still holds, and what the newest entries
  say.
- `content`: the whole new file, one entry per line as a Markdown bullet ("- ..."), each a
  self-contained statement, least important first, at most `max_chars` characters in total
  (each line counts its newline). No headings.
- `description`: one line saying what the file now holds.
Reply with JSON: {"description", "content"}."""


def memory_condense_request(*, topic: str, description: str, entries: list[str],
                            max_chars: int) -> LLMRequest:
    """The "memory_condense" task: `entries` rewritten to fit in `max_chars` (`parse_condense`);
    the content's bound leaves room for the bullet and newline a line written without them
    takes in the file."""
    schema, max_tokens = bounded(
        reply_schema(CondenseReply), "content", max_chars - 3, most=None, cap=None)
    return task_request(
        "memory_condense",
        system=MEMORY_CONDENSE_SYSTEM,
        instructions=MEMORY_CONDENSE_INSTRUCTIONS,
        inputs={
            "topic": topic, "description": description, "entries": entries, "max_chars": max_chars},
        schema=schema,
        max_tokens=max_tokens)


def parse_condense(resp: LLMResponse, *, max_chars: int) -> Condensed:
    """The condensed file of a "memory_condense" reply as entry lines; raises ValueError for a
    mismatch, no entry, or one still longer than `max_chars`."""
    reply = read_reply(resp, CondenseReply, "memory_condense")
    content = reply.content
    lines = _format.dedupe(_format.entries(content))
    if not lines:
        raise ValueError(f"content must hold at least one entry, got {preview(content)}")
    size = len(_format.body(lines))
    if size > max_chars:
        raise ValueError(f"content has {size} characters, more than max_chars ({max_chars})")
    description = one_line(reply.description or "", MAX_DESCRIPTION_CHARS)
    return Condensed(description=description, lines=lines)


def _topic(value: str, where: str) -> str:
    topic = one_line(value, MAX_TOPIC_CHARS)
    if not topic:
        raise ValueError(f"{where}.topic must be a non-empty string, got {preview(value)}")
    return topic
