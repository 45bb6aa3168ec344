"""The offline LLM's heuristics for the memory files' tasks (`memory_update`, `memory_persist`,
`memory_condense`) and conversation memory's (`summary`, `eviction`, `snapshot_fold`), by task
in `HANDLERS` (see `mnemo.adapters.offline`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from mnemo import text as _text
from mnemo.adapters._offline_common import (
    _GREETING,
    _QUESTION_OPENERS,
    Answer,
    Entry,
    Inputs,
    _capitalised,
    _is_fact,
    _sentence_score,
    _strip_filler,
)
from mnemo.ports import JSONObject, ToolCall

# The four kinds of signal a memory file keeps (see the module doc). A pattern's match is the
# marker; for a decision or a preference, what is left without it names the topic.
_MEMORY_DECISION = re.compile(
    r"\b(?:we(?:'ve| have)? (?:decided|agreed|settled on|chosen|chose|picked)|"
    r"i(?:'ve| have)? decided|decided to|the decision is|"
    r"let'?s (?:go with|stick with|settle on|standardi[sz]e on)|"
    r"we(?:'ll| will| are going to|'re going to) (?:use|go with|stick with|switch to|adopt|"
    r"keep using|standardi[sz]e on)|going forward,? we)\b",
    re.IGNORECASE,
)

_MEMORY_PREFERENCE = re.compile(
    r"^(?:always|never)\b|"
    r"\b(?:i (?:really |strongly |much )?(?:prefer|(?:would|'d) (?:rather|prefer|like you to))|"
    r"i (?:always|never|don'?t like|do not like|hate|like it when|want you to)|"
    r"please (?:don'?t|do not|never|always|avoid|stop)|(?:don'?t|do not) ever|"
    r"my preference is)\b",
    re.IGNORECASE,
)

_MEMORY_CONTEXT = re.compile(
    r"\b(?:my name(?:'s| is)|call me|i work (?:at|on|for|as|with)|i'?m (?:based|located) in|"
    r"i live in|my (?:role|job|title|team|company|timezone|time zone|email|username) is|"
    r"we(?:'re| are)? (?:use|using|run|running|deploy|host|target|support)|"
    r"our (?:[\w.\-]+ ){0,2}(?:is|are|runs?|uses?|lives?|has|have|needs?|must|deploys?|"
    r"targets?|supports?)|(?:the|this) (?:project|repo|repository|codebase|app|service|team|"
    r"company) (?:is|uses|runs|has|needs|must|targets|supports|lives|deploys)|"
    r"the deadline is)\b",
    re.IGNORECASE,
)

_MEMORY_CORRECTION = re.compile(
    r"^(?:actually|no|nope|correction|wait,? (?:no|actually)|i meant|to clarify|not quite)\b"
    r"|\b(?:that'?s|that is|this is|it'?s|it is) (?:wrong|not right|incorrect|not correct|"
    r"not true|outdated)\b",
    re.IGNORECASE,
)

# An assistant message counts only when it opens by confirming what the user said.
_MEMORY_CONFIRMATION = re.compile(
    r"^(?:noted|got it|understood|will do|okay|ok|sure|confirmed|"
    r"(?P<remember>i'll remember|i will remember|i've noted|i have noted|remembered))"
    r"(?: that)?\b[\s,:;.!\u2014\-]*",
    re.IGNORECASE,
)

_MEMORY_ABOUT_USER = re.compile(r"(?:my|i|i'm|call me)\b", re.IGNORECASE)

# An entry's bullet and kind label, ignored when entries are compared.
_MEMORY_ENTRY_PREFIX = re.compile(
    r"^\s*(?:[-*+]\s+)?(?:(?:decision|context|correction|preference):\s*)?", re.IGNORECASE
)

_MEMORY_BULLET = re.compile(r"^\s*[-*+]\s+")

_MEMORY_TOPIC_WORDS = 3

_MEMORY_DESCRIPTION_WORDS = 12


def _memory_statement(text: str) -> str:
    text = " ".join(text.split()).strip(" ,;:-\u2014")
    if not text:
        return ""
    text = _capitalised(text)
    return text if text[-1] in ".!" else f"{text}."


def _memory_signal(sentence: str) -> tuple[str | None, str, str]:
    """The kind of signal `sentence` carries, the statement to keep, and the words naming its
    topic; ("pending", "", "") for a bare correction marker ("That's wrong.")."""
    if sentence.endswith("?") or _QUESTION_OPENERS.match(sentence):
        return None, "", ""
    corrected = False
    # Markers can stack ("No, that's wrong: ..."), so strip them all.
    while correction := _MEMORY_CORRECTION.search(sentence):
        sentence = (sentence[: correction.start()] + " " + sentence[correction.end() :]).strip(
            " ,;:.!-\u2014"
        )
        corrected = True
    if corrected:
        if not _text.words(sentence):
            return "pending", "", ""
        if _is_fact(sentence):
            return "correction", _memory_statement(sentence), sentence
        # Otherwise the rest may still be a signal ("No, we use MySQL"): a correction too.
    sentence = _strip_filler(sentence)
    for kind, pattern in (
        ("decision", _MEMORY_DECISION),
        ("preference", _MEMORY_PREFERENCE),
        ("context", _MEMORY_CONTEXT),
    ):
        match = pattern.search(sentence)
        if not match:
            continue
        topic_words = sentence[: match.start()] + " " + sentence[match.end() :]
        # What is left must be about something: an informative word or a capitalised name.
        if not any(_text.is_informative(w) or (w[:1].isupper() and not _text.is_stopword(w))
                   for w in _text.words(topic_words)):
            continue
        if kind == "context":
            # A context marker holds the subject ("Our database is ..."), so the whole
            # sentence names the topic, except what users say about themselves.
            topic_words = "user" if _MEMORY_ABOUT_USER.match(match.group(0)) else sentence
        return ("correction" if corrected else kind), _memory_statement(sentence), topic_words
    return None, "", ""


def _memory_signals(conversation: list[Entry]) -> list[tuple[str, str, str]]:
    """(kind, statement, topic words) for every qualifying sentence, in conversation order."""
    found: list[tuple[str, str, str]] = []
    for message in conversation:
        role, content = message.role.strip(), message.content.strip()
        remember = False
        if role == "assistant":
            confirmation = _MEMORY_CONFIRMATION.match(content)
            if not confirmation:
                continue
            remember = confirmation.group("remember") is not None
            content = content[confirmation.end() :]
        elif role != "user":
            continue
        pending = False
        for sentence in _text.sentences(content):
            kind, statement, topic_words = _memory_signal(sentence)
            if kind is None and (pending or remember) and _is_fact(sentence):
                # The sentence after "That's wrong." is the correction; after "I'll remember
                # that" the assistant restates something to keep.
                kind = "correction" if pending else "context"
                statement = _memory_statement(_strip_filler(sentence))
                topic_words = sentence
            pending = kind == "pending"
            if kind is not None and kind != "pending":
                found.append((kind, statement, topic_words))
    return found


def _topic_stems(text: str) -> set[str]:
    """The stems of the words that can name a topic, read case-insensitively (as topics are)."""
    return {
        _text.stem(t)
        for t in _text.tokens(text)
        if not _text.is_stopword(t) and (len(t) >= 3 or any(c.isdigit() for c in t))
    }


def _entry_stems(line: str) -> set[str]:
    return _text.content_stems(_MEMORY_ENTRY_PREFIX.sub("", line, count=1))


def _corrected(stems: set[str], line: str) -> bool:
    """Whether a correction with these content stems replaces `line`: same subject, most
    words shared ("The API runs on port 8080" by "... port 8443")."""
    shared = stems & (other := _entry_stems(line))
    return len(shared) >= 2 and len(shared) >= 0.5 * len(stems | other)


@dataclass(slots=True)
class _MemoryTopic:
    topic: str
    description: str
    stems: set[str]
    lines: list[str]
    signals: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def _memory_update(inputs: Inputs) -> Answer:
    topics = [
        _MemoryTopic(
            topic=item.topic.strip(),
            description=item.description.strip(),
            stems=_topic_stems(item.topic),
            # A file's shown entries: what it already says, what a correction replaces.
            lines=[line.strip() for line in item.content.splitlines() if line.strip()],
        )
        for item in inputs.files
        if item.topic.strip()
    ]
    for kind, statement, topic_words in _memory_signals(inputs.conversation):
        stems = _text.content_stems(statement)
        # A statement that says nothing an entry does not is no news.
        if stems and any(stems <= _entry_stems(line) for t in topics for line in t.lines):
            continue
        about = _topic_stems(topic_words)
        target = max(topics, key=lambda t: len(about & t.stems), default=None)
        if target is None or not about & target.stems:
            name = _text.key_phrase(topic_words, max_words=_MEMORY_TOPIC_WORDS) or "notes"
            target = _MemoryTopic(
                topic=name,
                description=_text.clip_words(statement, _MEMORY_DESCRIPTION_WORDS),
                stems=_topic_stems(name) or {name},
                lines=[],
            )
            topics.append(target)
        if kind == "correction":
            wrong = [line for line in target.lines if _corrected(stems, line)]
            target.lines = [line for line in target.lines if line not in wrong]
            target.removed += [line for line in wrong if line not in target.added]
            target.added = [line for line in target.added if line not in wrong]
        entry = f"- {kind.capitalize()}: {statement}"
        target.lines.append(entry)
        target.added.append(entry)
        if kind not in target.signals:
            target.signals.append(kind)
    return {"files": [
        {"topic": t.topic, "description": t.description, "signals": t.signals,
         "content": "\n".join(t.added), "remove": t.removed}
        for t in topics if t.added]}


def _memory_persist(inputs: Inputs) -> Answer:
    statement = " ".join(inputs.statement.split())
    stems = _topic_stems(statement)
    # The file whose topic shares the most words with the statement (the first of equals).
    best = max(inputs.files, key=lambda f: len(stems & _topic_stems(f.topic)), default=None)
    if best is not None and stems & _topic_stems(best.topic):
        topic, description = best.topic.strip(), best.description.strip()
    else:
        topic = _text.key_phrase(statement, max_words=_MEMORY_TOPIC_WORDS) or "notes"
        description = _text.clip_words(statement, _MEMORY_DESCRIPTION_WORDS)
    return {"topic": topic, "description": description, "entry": statement}


def _memory_condense(inputs: Inputs) -> Answer:
    texts = [t for e in inputs.entries if (t := _MEMORY_BULLET.sub("", e).strip())]
    stems = [_entry_stems(t) for t in texts]
    # Merging: an entry that says nothing a later entry does not say goes.
    merged = [
        t
        for i, t in enumerate(texts)
        if not (stems[i] and any(stems[i] <= stems[j] for j in range(i + 1, len(texts))))
    ]
    kept: list[str] = []
    room = inputs.max_chars
    for text in reversed(merged):
        if len(text) + 3 > room:
            # Only the newest entry is shortened (to its leading sentences); older ones go.
            text = _shortened(text, room - 3) if not kept else ""
        if text:
            kept.append(text if text.startswith("#") else f"- {text}")
            room -= len(text) + 3
    kept.reverse()
    description = inputs.description.strip()
    said = set().union(*(_entry_stems(line) for line in kept))
    if kept and not _text.content_stems(description) & said:
        description = _text.clip_words(kept[0][2:], _MEMORY_DESCRIPTION_WORDS)
    return {"description": description, "content": "\n".join(kept)}


def _shortened(text: str, room: int) -> str:
    """The leading sentences of `text` within `room` characters, else its leading words."""
    out = ""
    for sentence in _text.sentences(text):
        longer = f"{out} {sentence}".strip()
        if len(longer) > room:
            break
        out = longer
    if out:
        return out
    words: list[str] = []
    for word in text.split():
        if len(" ".join([*words, word])) + 3 > room:
            break
        words.append(word)
    return " ".join(words) + "\u2026" if words else ""


# A user (or system) sentence that gives an instruction or corrects the assistant: eviction
# pins such messages word for word, since a summary would blur them.
_CONVERSATION_INSTRUCTION = re.compile(
    r"\b(?:always|never|make sure|be sure to|remember (?:to|that)|from now on|going forward|"
    r"(?:don'?t|do not) (?:ever )?\w+|must(?: not)?|instead of|rather than|i prefer|"
    r"i want you to|you (?:should|must|need to|have to)|please (?:use|keep|avoid|stop|"
    r"always|never|don'?t|do not|make sure)|avoid|stick (?:to|with)|only use|use only)\b|"
    r"^(?:no|nope|wrong|actually|correction|not quite|wait,? no)\b|"
    r"\b(?:that'?s (?:wrong|incorrect|not (?:right|correct|what i))|"
    r"you (?:misunderstood|got it wrong|were wrong)|i meant|not \w+(?: \w+)?,? but)\b",
    re.IGNORECASE,
)

# A zone's message line ("message N: role: text"); a collapsed run of tool calls ("message N-M:
# [K tools called]") carries no sentence.
_ZONE_LINE = re.compile(r"^message (\d+): ([\w-]+): (.*)$")

_SPEAKERS = {
    "user": "User",
    "assistant": "Assistant",
    "system": "System",
    "developer": "System",
    "summary": "Summary",
}


def _states_instruction(text: str) -> bool:
    return any(_CONVERSATION_INSTRUCTION.search(s) for s in _text.sentences(text))


def _extractive_summary(items: list[tuple[str, str]], max_words: int, previous: str = "") -> str:
    """The most informative sentences of `items` ((speaker, text) pairs) and of a previous summary,
    in order, within `max_words` words; earlier summaries fill up to half of it first."""
    earlier: list[tuple[float, int, str]] = []
    candidates: list[tuple[float, int, str]] = []
    order = 0
    for speaker, text in [("Summary", previous), *items]:
        if speaker == "Summary":
            for sentence in _text.sentences(text):
                earlier.append((_sentence_score(sentence) + 0.5, order, sentence))
                order += 1
            continue
        for raw in _text.sentences(text):
            sentence = _text.clip_words(_strip_filler(raw), 40)
            if len(_text.words(sentence)) < 3 or _GREETING.match(sentence):
                continue
            score = _sentence_score(sentence)
            if speaker in {"User", "System"} and _states_instruction(sentence):
                score *= 2
            if speaker == "Tool":
                score /= 2
            candidates.append((score, order, f"{speaker}: {sentence}" if speaker else sentence))
            order += 1
    picked: dict[int, str] = {}
    used = 0
    for pool, budget in ((earlier, max_words // 2), (earlier + candidates, max_words)):
        for score, position, sentence in sorted(pool, key=lambda c: (-c[0], c[1])):
            size = len(sentence.split())
            if score > 0 and position not in picked and used + size <= budget:
                picked[position] = sentence
                used += size
    return " ".join(s if s[-1:] in ".!?" else s + "." for _, s in sorted(picked.items()))


def _summary_task(inputs: Inputs) -> Answer:
    items = [(_SPEAKERS.get(m.role.strip(), "Tool"), m.text.strip()) for m in inputs.messages]
    max_words = max(16, inputs.max_words or 200)
    # With nothing informative said, the summary says so rather than invent content.
    return {"summary": _extractive_summary(items, max_words, inputs.previous_summary.strip())
            or f"{len(items)} earlier messages held no informative statement."}


def _snapshot_fold(inputs: Inputs) -> Answer:
    texts = [s.text.strip() for s in inputs.snapshots]
    max_words = max(16, inputs.max_words or 200)
    return {"summary": _extractive_summary([("", text) for text in texts], max_words)
            or _text.clip_words(" ".join(texts), max_words)
            or f"{len(texts)} earlier snapshots held no informative statement."}


def _eviction(inputs: Inputs) -> Answer:
    if inputs.done:
        # The tools already ran in an earlier round: finish.
        return [ToolCall("everything_ok", {}, "call_0")]
    messages = [(int(said.group(1)), said.group(2), said.group(3))
                for line in inputs.zone.splitlines() if (said := _ZONE_LINE.match(line.strip()))]
    max_words = max(16, 100 if inputs.max_words is None else inputs.max_words)
    calls: list[tuple[str, JSONObject]] = []
    spoken = [(_SPEAKERS.get(role, "Tool"), text) for _, role, text in messages]
    if snapshot := _extractive_summary(spoken, max_words) or _text.clip_words(
            " ".join(f"{who}: {text}" for who, text in spoken) or inputs.zone, max_words):
        calls.append(("save_snapshot", {"text": snapshot}))
    for seq, role, text in messages:
        if role in {"user", "system", "developer"} and _states_instruction(text) and (
                goal_ids := _goals_for(text, inputs.goals)):
            calls.append(("attach_messages_to_goals", {"message_ids": [seq], "goal_ids": goal_ids}))
    calls.append(("everything_ok", {}))
    return [ToolCall(name, arguments, f"call_{n}") for n, (name, arguments) in enumerate(calls)]


def _goals_for(text: str, goals: list[Entry]) -> list[str]:
    """The goals sharing a content word with `text`, else the newest goal (the current one)."""
    stems = _text.content_stems(text)
    ids = [g.id.strip() for g in goals if stems & _text.content_stems(g.description)]
    if not ids and goals:
        ids = [goals[-1].id.strip()]
    return [gid for gid in ids if gid]


HANDLERS: dict[str, Callable[[Inputs], Answer]] = {
    "memory_update": _memory_update,
    "memory_persist": _memory_persist,
    "memory_condense": _memory_condense,
    "summary": _summary_task,
    "eviction": _eviction,
    "snapshot_fold": _snapshot_fold,
}
