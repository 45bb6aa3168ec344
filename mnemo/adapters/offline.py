"""`OfflineLLM`: the default LLM, answering mnemo's tasks with rule-based heuristics.

It makes no network call and uses no model: every answer is a deterministic function of the
request's inputs (read back with `task_inputs`), computed in well under a millisecond. The
heuristics are honest approximations of what a real model would say, good enough for
segmentation, extraction and recall to work offline, not a substitute for one:

- `state`: the observation's first sentence, then "Last action: <action>".
- `subgoal`: the observation's key phrase (its most informative words, in order). If a previous
  subgoal exists, the observation shares an informative word (stemmed) with it or with the
  last recent step (or has no informative word at all), and no topic-shift marker ("now let's",
  "moving on", ...) appears, the previous subgoal is repeated verbatim, so its embedding stays
  identical and no trajectory boundary is detected.
- `reward`: 0.9 when what happened next reads as success ("works", "fixed", "thanks"), 0.2 when
  it reads as failure ("error", "failed", "not found"), 0.6 otherwise, 0.5 with nothing to read.
- `semantic`: every informative declarative sentence of the observations and actions (4+ words,
  2+ content words, not a question or a greeting), with leading filler stripped; past
  `MAX_FACTS` (64) only the most informative of them, in order. A sentence that
  opens with "It/This/That/They" gets the subgoal's key phrase as its topic instead of the
  pronoun ("It listens on 8080" -> "Nginx reverse proxy: listens on 8080"): a crude stand-in for
  coreference resolution, which is what makes the fact readable on its own.
- `procedural`: one WHEN/DO/EXPECT instruction per step whose action does something (3+ words,
  opening with a verb-like word), expecting the next step's first observed sentence.
- `return`: 1 + 9 * reward of the step each instruction came from (5 when unknown).
- `merge_intent`: the existing intent's wording, kept so a node's text never drifts.
- `contradiction`: same subject and functional relation, different value (`_contradiction`).
- `memory_update`: the sentences of user messages (and of assistant messages that open by
  confirming, "Got it, ...") that carry one of the four signals: a decision ("we decided",
  "let's go with", "we'll use"), a preference ("I prefer", "always", "never", "please
  don't"), a correction ("actually", "no, ...", "that's wrong", "correction") or lasting
  context ("my name is", "we use", "our ... is", "the project is"); questions and anything
  else are skipped. Each is filed under the existing topic sharing the most words with it, or
  a new topic named from its key phrase ("user" for what users say about themselves), as a
  "- Kind: statement" line; a statement adding no word to a line already there is skipped, and
  a correction replaces the shown line it mostly repeats ("port 8080" -> "port 8443").
- `memory_persist`: the statement itself, under the existing topic sharing the most words with
  it, or else a new topic named from its key phrase.
- `memory_condense`: an entry that adds no word to a later one is merged into it; then, from
  the newest back, every entry that still fits is kept, the newest cut to its leading sentences
  when it alone is too long, and older ones that no longer fit go. The description is kept
  unless it names nothing left (then the first entry, clipped).
- `summary` / `snapshot_fold`: the most informative sentences of the messages (or snapshots)
  and of the previous summary, in order, within `max_words` ("User: ...", "Assistant: ...");
  a sentence scores its informative words, doubled for a user's instruction or correction,
  halved for tool output. Nothing is paraphrased or invented.
- `eviction`: `save_snapshot` with that summary of the zone, `attach_messages_to_goals` for
  each user or system message stating an instruction or a correction ("always ...", "don't
  ...", "actually, ...", "I meant ...") to the goals sharing a content word with it (else the
  newest goal), then `everything_ok`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread

from mnemo.adapters import _contradiction, _text
from mnemo.errors import LLMError
from mnemo.ports import LLMRequest, LLMResponse, ToolCall, Usage, task_inputs

_NO_USAGE = Usage(0, 0, 0.0)

_TOPIC_SHIFT = re.compile(
    r"\b(?:now,? let'?s|now let us|next,|moving on|move on to|switching to|switch to|"
    r"let'?s switch|another thing|another question|one more thing|different topic|"
    r"different question|different subject|new topic|new task|new question|"
    r"change of topic|changing topic|unrelated (?:question|topic|note)|on another note|"
    r"separate question|(?:ask|about|on to|talk about) something (?:else|different))(?!\w)",
    re.IGNORECASE,
)

# Phrases are matched before single words so that "not working" counts as failure and
# "no errors" as success; a matched phrase is blanked out before the word count.
_FAILURE_PHRASES = re.compile(
    r"\b(?:not (?:work\w*|fixed|resolved|solved|help\w*|right|correct)|"
    r"(?:doesn't|does not|didn't|did not|won't|will not|isn't|is not|can't|cannot) "
    r"(?:work\w*|help\w*|start\w*|run\w*|load\w*|compile\w*|connect\w*|find|open)|"
    r"no luck|still (?:fail\w*|broken|wrong|getting)|same (?:error|problem|issue))\b",
    re.IGNORECASE,
)
_SUCCESS_PHRASES = re.compile(
    r"\b(?:no (?:more )?(?:errors?|failures?|issues?|problems?|warnings?)|"
    r"without (?:any )?(?:errors?|issues?|problems?)|no longer (?:fail\w*|crash\w*|broken)|"
    r"0 (?:errors?|failures?|failed))\b",
    re.IGNORECASE,
)
_SUCCESS_WORDS = re.compile(
    r"\b(?:works?|worked|working|passe[sd]|passing|succe(?:ss|ssful|ssfully|eded|eds)|done|"
    r"complete[ds]?|finished|confirmed|correct|thanks|thank you|great|perfect|awesome|"
    r"excellent|solved|fixed|resolved|installed|deployed|looks good|all good|that did it)\b",
    re.IGNORECASE,
)
_STRONG_SUCCESS = re.compile(r"\b(?:fixed|resolved|solved|works now|working now)\b", re.IGNORECASE)
_FAILURE_WORDS = re.compile(
    r"\b(?:errors?|fail\w*|exceptions?|denied|not found|crash\w*|time[sd]? ?out|timeout|"
    r"wrong|broken|invalid|refused|unable|traceback|panic\w*|fatal|missing|incorrect|"
    r"404|500|segfault|bugs?|problems?|issues?)\b",
    re.IGNORECASE,
)

_QUESTION_OPENERS = re.compile(
    r"^(?:what|why|how|when|where|who|whom|whose|which|can you|could you|would you|will you|"
    r"do you|does anyone|is there|are there|should i|shall we|may i)\b",
    re.IGNORECASE,
)
_GREETING = re.compile(
    r"^(?:thanks|thank you|thx|cheers|hi|hello|hey|good (?:morning|afternoon|evening|night)|"
    r"bye|goodbye|welcome|you're welcome|no problem|sounds good|got it|of course)\b",
    re.IGNORECASE,
)
_LEADING_PRONOUN = re.compile(r"^(it|they|this|that|these|those)(?:'(s|re))?\b\s*", re.IGNORECASE)
# An opening word followed by a comma, "!" or ":" (group 2), or by plain space.
_OPENER = re.compile(r"([A-Za-z]+)\s*([,!:])?\s+")
# Interjections that open a sentence without content even with no comma after them.
_ALWAYS_FILLER = frozenset(
    "okay ok so well also actually basically anyway anyways alright hmm hm oh ah um uh yeah yep "
    "yes now hi hello hey".split()
)
# A "this"/"that" followed by one of these is a pronoun subject ("That is why..."), otherwise it
# is a determiner ("This server runs...").
_VERB_AFTER_DEMONSTRATIVE = frozenset(
    """is was are were will would can could should may might must has had have does did do
    means meant seems seemed works worked fails failed happens happened makes made gives gave
    shows showed explains sounds looks""".split()
)
# Lead-ins that come before the verb of an action ("Let me check the logs").
_ACTION_LEAD_IN = re.compile(
    r"^(?:(?:ok(?:ay)?|so|now|then|next|first|finally|alright|sure)[,:]?\s+)*"
    r"(?:i(?:'ll| will| am going to|'m going to| should| can)|let me|let's|let us|"
    r"we(?:'ll| will| should| can)|you (?:should|can|could|need to)|please|try to)?\s*",
    re.IGNORECASE,
)
_NOT_AN_ACTION = frozenset(
    """ok okay thanks thank yes no sure yeah yep nope hi hello hey great cool nice perfect fine
    what why how when where who which is are was were do does did can could would should i you
    we he she it they this that there the a an my your our""".split()
)
# Verbs an imperative or progressive action opens with (matched by stem, so "Checking" and
# "checked" count as "check").
_VERBS = frozenset(
    _text.stem(verb)
    for verb in """
    add adjust allow answer apply ask avoid back backup bake book browse build buy calculate call
    cancel cd change check choose clean clear click clone close commit compare compile compute
    configure confirm connect consider convert cook copy create curl debug decrease define delete
    deploy describe disable download draft drop edit email enable ensure enter examine execute
    explain export fetch fill filter find fix follow format generate get give go grant grep
    increase inspect install investigate kill launch limit list load locate log look lower make
    mark measure merge migrate modify mount move navigate note open order patch pay pick pin
    place plan point prepare press print pull push put raise read rebuild reboot recommend record
    refresh register reinstall reload remove rename reorder repeat replace reply reproduce
    request rerun reset resize respond restart restore retry return review revert rollback run
    save scroll search select send set setup share show sign start stop submit suggest summarise
    summarize switch sync take tell test track translate try turn type uninstall unzip update
    upgrade upload use validate verify view visit wait watch write
    """.split()
)
_MAX_ACTION_WORDS_IN_STATE = 40
_SUBGOAL_WORDS = 5


class OfflineLLM:
    """An `LLM` that answers mnemo's tasks with deterministic heuristics (see the module doc).

    Raises:
        LLMError: for a task it has no heuristic for.
    """

    # The URI that `mnemo.llm_from_uri` builds this from again (a repo records it).
    name = "offline"

    async def generate(self, request: LLMRequest) -> LLMResponse:
        """Answers `request` from its inputs, with zero usage.

        A long request is answered in a worker thread, so the event loop keeps running and a
        `fail_after` around the call can fire (the thread then finishes on its own).
        """
        handler = _HANDLERS.get(request.task)
        if handler is None:
            raise LLMError(f"the offline LLM has no heuristic for task {request.task!r}")
        if _request_chars(request) < OFF_LOOP_CHARS:
            return handler(task_inputs(request))
        return await anyio.to_thread.run_sync(_answer, handler, request, abandon_on_cancel=True)


# The heuristics cost about 0.4 µs per character of a request, a thread hop about 100 µs: past
# this size (about 1.5 ms of work) the hop is worth it. Issue 9: 25,000 sentences kept the
# loop blocked for minutes, so no `wait_for` could fire.
OFF_LOOP_CHARS = 4_000


def _request_chars(request: LLMRequest) -> int:
    return sum(
        len(content) for m in request.messages if isinstance(content := m.get("content"), str)
    )


def _answer(handler: Callable[[dict[str, Any]], LLMResponse], request: LLMRequest) -> LLMResponse:
    return handler(task_inputs(request))


# ---- typed access to the JSON inputs -------------------------------------------------------


def _str(inputs: dict[str, Any], key: str) -> str:
    value = inputs.get(key)
    return value.strip() if isinstance(value, str) else ""


def _str_list(inputs: dict[str, Any], key: str) -> list[str]:
    value = inputs.get(key)
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, str)]


def _dicts(inputs: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = inputs.get(key)
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, dict)]


def _int(item: dict[str, Any], key: str, default: int) -> int:
    value = item.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _field(item: dict[str, Any], key: str) -> str:
    value = item.get(key)
    return value.strip() if isinstance(value, str) else ""


def _reward(item: dict[str, Any]) -> float | None:
    value = item.get("reward")
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return min(1.0, max(0.0, float(value)))
    return None


# ---- state --------------------------------------------------------------------------------


def _state(inputs: dict[str, Any]) -> LLMResponse:
    observed = _text.first_sentence(_str(inputs, "observation"))
    if not observed:
        observed = _str(inputs, "previous_state") or "Nothing new was observed."
    if observed[-1] not in ".!?":
        observed += "."
    action = _text.clip_words(_str(inputs, "action"), _MAX_ACTION_WORDS_IN_STATE)
    text = f"{observed} Last action: {action}" if action else observed
    return LLMResponse(text=text, usage=_NO_USAGE)


# ---- subgoal ------------------------------------------------------------------------------


def _subgoal(inputs: dict[str, Any]) -> LLMResponse:
    observation = _str(inputs, "observation")
    previous = _str(inputs, "previous_subgoal")
    recent = _str_list(inputs, "recent_steps")
    fresh = (
        _text.key_phrase(observation, max_words=_SUBGOAL_WORDS)
        or _text.key_phrase(_str(inputs, "action"), max_words=_SUBGOAL_WORDS)
        or _text.key_phrase(_str(inputs, "goal"), max_words=_SUBGOAL_WORDS)
        or "continue the task"
    )
    if not previous:
        return _subgoal_reply("first subgoal: the key phrase of the observation", fresh)
    shift = _TOPIC_SHIFT.search(observation)
    if shift:
        # The new topic is named after the marker ("... Now let's set up backups").
        after = _text.key_phrase(observation[shift.end() :], max_words=_SUBGOAL_WORDS)
        return _subgoal_reply(
            f"topic shift: the observation says {shift.group(0)!r}; new key phrase",
            after or fresh,
        )
    stems = _text.content_stems(observation)
    if not stems:
        return _subgoal_reply(
            "continuity: the observation names no new topic, so the subgoal stays", previous
        )
    context = _text.content_stems(previous)
    if recent:
        context |= _text.content_stems(recent[-1])
    shared = sorted(stems & context)
    if shared:
        return _subgoal_reply(
            f"continuity: the observation shares {', '.join(shared[:3])} with the previous "
            "subgoal or the last step",
            previous,
        )
    return _subgoal_reply(
        "new topic: no informative word in common with the previous subgoal or the last step",
        fresh,
    )


def _subgoal_reply(reasoning: str, subgoal: str) -> LLMResponse:
    return LLMResponse(data={"reasoning": reasoning, "subgoal": subgoal}, usage=_NO_USAGE)


# ---- reward -------------------------------------------------------------------------------


def outcome_reward(text: str) -> float:
    """0.9 if `text` reads as success, 0.2 as failure, 0.6 if neither, 0.5 if blank."""
    if not text.strip():
        return 0.5
    failure = len(_FAILURE_PHRASES.findall(text))
    text = _FAILURE_PHRASES.sub(" ", text)
    success = len(_SUCCESS_PHRASES.findall(text))
    text = _SUCCESS_PHRASES.sub(" ", text)
    # A resolution word outweighs the problem it names: "fixed the error" is a success.
    success += len(_SUCCESS_WORDS.findall(text)) + len(_STRONG_SUCCESS.findall(text))
    failure += len(_FAILURE_WORDS.findall(text))
    if success > failure:
        return 0.9
    if failure > success:
        return 0.2
    return 0.6


def _reward_task(inputs: dict[str, Any]) -> LLMResponse:
    judged = _str(inputs, "next_observation") or _str(inputs, "observation")
    return LLMResponse(data={"reward": outcome_reward(judged)}, usage=_NO_USAGE)


# ---- semantic -----------------------------------------------------------------------------


def _strip_filler(sentence: str, *, capitalise: bool = True) -> str:
    """The sentence without leading interjections like "Okay, so" (capitalised again)."""
    rest = sentence
    while match := _OPENER.match(rest):
        word = match.group(1).lower()
        if word in _ALWAYS_FILLER:
            if word == "so" and re.match(r"so\s+(?:far|much|many|that)\b", rest, re.I):
                break
        elif not (word in _text.FILLER_OPENERS and match.group(2)):
            break
        rest = rest[match.end() :]
    return rest[:1].upper() + rest[1:] if capitalise else rest


def _is_fact(sentence: str) -> bool:
    if sentence.endswith("?") or _QUESTION_OPENERS.match(sentence):
        return False
    ws = _text.words(sentence)
    if len(ws) < 4:
        return False
    informative = sum(
        1
        for i, w in enumerate(ws)
        if _text.is_informative(w) or _text.is_name(w, sentence_initial=i == 0)
    )
    if informative < 2:
        return False
    return not (_GREETING.match(sentence) and informative < 3)


def _resolve_pronoun(sentence: str, topic: str) -> str:
    """Replaces an opening "It/They/This/That" with `topic` (a heuristic, see the module doc)."""
    match = _LEADING_PRONOUN.match(sentence)
    if not match or not topic:
        return sentence
    pronoun = match.group(1).lower()
    rest = sentence[match.end() :]
    if match.group(2):
        rest = ("is " if match.group(2).lower() == "s" else "are ") + rest
    if not rest:
        return sentence
    next_word = rest.split(maxsplit=1)[0].lower().strip(",.;:")
    if pronoun in {"this", "that", "these", "those"} and next_word not in (
        _VERB_AFTER_DEMONSTRATIVE
    ):
        rest = f"the {rest}"
    return f"{topic[:1].upper()}{topic[1:]}: {rest}"


def _confidence(sentence: str) -> float:
    ws = _text.words(sentence)
    informative = sum(1 for w in ws if _text.is_informative(w))
    specific = any(any(c.isdigit() for c in w) or _text.is_acronym(w) for w in ws)
    score = 0.6 + 0.05 * min(max(informative - 2, 0), 4) + (0.1 if specific else 0.0)
    return round(min(0.9, score), 2)


def _semantic(inputs: dict[str, Any]) -> LLMResponse:
    topic = _text.key_phrase(_str(inputs, "subgoal")) or _text.key_phrase(_str(inputs, "goal"))
    facts: list[dict[str, Any]] = []
    seen: set[str] = set()
    for position, step in enumerate(_dicts(inputs, "steps")):
        index = _int(step, "index", position)
        for part in (_field(step, "observation"), _field(step, "action")):
            for raw in _text.sentences(part):
                sentence = _strip_filler(raw)
                if not _is_fact(sentence):
                    continue
                proposition = _resolve_pronoun(sentence, topic)
                key = " ".join(proposition.lower().split())
                if key in seen:
                    continue
                seen.add(key)
                facts.append(
                    {
                        "proposition": proposition,
                        "concepts": _text.concepts(sentence) or [topic or "general"],
                        "confidence": _confidence(sentence),
                        "steps": [index],
                    }
                )
    if len(facts) > MAX_FACTS:
        # A trajectory's facts are linked pairwise (SIBLING): 489 facts from one 32,000-
        # character observation made 119,000 links and blocked the commit. Keep the most
        # informative, in their order.
        ranked = sorted(
            range(len(facts)), key=lambda i: (-_sentence_score(facts[i]["proposition"]), i)
        )
        facts = [facts[i] for i in sorted(ranked[:MAX_FACTS])]
    return LLMResponse(data={"facts": facts}, usage=_NO_USAGE)


# The most facts one "semantic" answer holds; a model asked for the facts worth remembering
# gives a handful per trajectory, not one per sentence of a long tool output.
MAX_FACTS = 64


# ---- procedural ---------------------------------------------------------------------------


def _is_action(action: str) -> bool:
    if len(_text.words(action)) < 3:
        return False
    # Judge the first sentence that says something ("Great. Restart nginx ..." -> "Restart").
    body = ""
    for sentence in _text.sentences(action):
        body = _ACTION_LEAD_IN.sub("", _strip_filler(sentence, capitalise=False), count=1).strip()
        if len(_text.words(body)) >= 2:
            break
    body_words = _text.words(body)
    if not body_words:
        return False
    first = body_words[0]
    # Tool-call shaped actions ("search[laptop]", "click(#buy)") are actions whatever the word.
    if re.match(r"[\w.\-]+\s*[\[(]", body):
        return True
    if _text.stem(first.lower()) in _VERBS:
        return True
    # A lower-case opening word that is not a function word reads as a command ("git status",
    # "kubectl get pods"); a capitalised one may just start a statement ("Paris is ...").
    return first.islower() and first not in _NOT_AN_ACTION and not _text.is_stopword(first)


def _procedural(inputs: dict[str, Any]) -> LLMResponse:
    subgoal = _str(inputs, "subgoal")
    steps = _dicts(inputs, "steps")
    instructions: list[dict[str, Any]] = []
    by_text: dict[str, dict[str, Any]] = {}
    for position, step in enumerate(steps):
        action = _field(step, "action")
        if not _is_action(action):
            continue
        index = _int(step, "index", position)
        key = " ".join(action.lower().split())
        if key in by_text:
            by_text[key]["steps"].append(index)
            continue
        situation = _text.key_phrase(_field(step, "observation"), max_words=5)
        later = _field(steps[position + 1], "observation") if position + 1 < len(steps) else ""
        item: dict[str, Any] = {
            "intent": subgoal or _text.key_phrase(action) or action,
            "condition": f"When {situation or subgoal or 'working on the task'}",
            "instruction": action,
            "expected_outcome": _text.first_sentence(later) or "the step succeeds",
            "steps": [index],
        }
        by_text[key] = item
        instructions.append(item)
    return LLMResponse(data={"instructions": instructions}, usage=_NO_USAGE)


# ---- return -------------------------------------------------------------------------------


def _return(inputs: dict[str, Any]) -> LLMResponse:
    steps = _dicts(inputs, "steps")
    scores: list[dict[str, int]] = []
    for position, item in enumerate(_dicts(inputs, "instructions")):
        index = _int(item, "index", position)
        reward = _matched_reward(_field(item, "instruction"), steps)
        score = 5 if reward is None else round(1 + 9 * reward)
        scores.append({"index": index, "return_score": score})
    return LLMResponse(data={"scores": scores}, usage=_NO_USAGE)


def _matched_reward(instruction: str, steps: list[dict[str, Any]]) -> float | None:
    """The mean reward of the steps whose action is the instruction (or, failing that, of the
    step whose action shares the most words with it, if at least half)."""
    wanted = " ".join(instruction.lower().split())
    if not wanted:
        return None
    exact = [
        r
        for step in steps
        if " ".join(_field(step, "action").lower().split()) == wanted
        and (r := _reward(step)) is not None
    ]
    if exact:
        return sum(exact) / len(exact)
    wanted_tokens = set(_text.tokens(wanted))
    best: tuple[float, float | None] = (0.0, None)
    for step in steps:
        got = set(_text.tokens(_field(step, "action")))
        if not got or not wanted_tokens:
            continue
        overlap = len(got & wanted_tokens) / len(got | wanted_tokens)
        if overlap > best[0]:
            best = (overlap, _reward(step))
    return best[1] if best[0] >= 0.5 else None


# ---- merge_intent -------------------------------------------------------------------------


def _merge_intent(inputs: dict[str, Any]) -> LLMResponse:
    # The surviving INTENT node keeps its text: rewording it on every merge would drift the
    # node's embedding and make the identity/merge thresholds unstable.
    intent = _str(inputs, "existing") or _str(inputs, "new")
    return LLMResponse(data={"intent": intent}, usage=_NO_USAGE)


def _contradiction_task(inputs: dict[str, Any]) -> LLMResponse:
    verdict = _contradiction.contradicts(_str(inputs, "existing"), _str(inputs, "new"))
    return LLMResponse(data={"contradicts": verdict}, usage=_NO_USAGE)


# ---- memory_update / memory_persist -------------------------------------------------------

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
_MEMORY_LABELS = {
    "decision": "Decision",
    "context": "Context",
    "correction": "Correction",
    "preference": "Preference",
}
_MEMORY_TOPIC_WORDS = 3
_MEMORY_DESCRIPTION_WORDS = 12


def _memory_statement(text: str) -> str:
    text = " ".join(text.split()).strip(" ,;:-\u2014")
    if not text:
        return ""
    text = text[:1].upper() + text[1:]
    return text if text[-1] in ".!" else f"{text}."


def _has_subject(text: str) -> bool:
    """Whether `text` is about something: an informative word or a capitalised name."""
    return any(
        _text.is_informative(w) or (w[:1].isupper() and not _text.is_stopword(w))
        for w in _text.words(text)
    )


def _memory_signal(sentence: str) -> tuple[str | None, str, str]:
    """The kind of signal `sentence` carries, the statement to keep, and the words that name
    its topic (the sentence without its marker; "user" for what the user says about
    themselves). ("pending", "", "") for a bare correction marker ("That's wrong."), whose
    content is the next sentence."""
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
        if not _has_subject(topic_words):
            continue
        if kind == "context":
            # A context marker holds the subject ("Our database is ..."), so the whole
            # sentence names the topic, except what users say about themselves.
            about_user = _MEMORY_ABOUT_USER.match(match.group(0))
            topic_words = "user" if about_user else sentence
        return ("correction" if corrected else kind), _memory_statement(sentence), topic_words
    return None, "", ""


def _memory_signals(conversation: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(kind, statement, topic words) for every qualifying sentence, in conversation order."""
    found: list[tuple[str, str, str]] = []
    for message in conversation:
        role, content = _field(message, "role"), _field(message, "content")
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
    """The stems of the words that can name a topic, case-insensitively: topics are stored
    lower-case, where "vpn" is no longer an acronym to `_text.is_informative`."""
    return {
        _text.stem(t)
        for t in _text.tokens(text)
        if not _text.is_stopword(t) and (len(t) >= 3 or any(c.isdigit() for c in t))
    }


def _entry_stems(line: str) -> set[str]:
    return _text.content_stems(_MEMORY_ENTRY_PREFIX.sub("", line, count=1))


def _near_duplicate(stems: set[str], line: str) -> bool:
    """Whether a statement with these content stems says nothing `line` does not."""
    other = _entry_stems(line)
    return bool(stems) and stems <= other


def _corrected(stems: set[str], line: str) -> bool:
    """Whether a correction with these content stems replaces `line`: same subject, most
    words shared ("The API runs on port 8080" by "... port 8443")."""
    other = _entry_stems(line)
    shared = stems & other
    return len(shared) >= 2 and len(shared) >= 0.5 * len(stems | other)


@dataclass(slots=True)
class _MemoryTopic:
    """A topic file as the `memory_update` heuristic builds it up."""

    topic: str
    description: str
    stems: set[str]
    lines: list[str]
    signals: list[str] = field(default_factory=list)
    changed: bool = False


def _memory_update(inputs: dict[str, Any]) -> LLMResponse:
    topics = [
        _MemoryTopic(
            topic=_field(item, "topic"),
            description=_field(item, "description"),
            stems=_topic_stems(_field(item, "topic")),
            # Without "content" the file was not shown: its reply holds only the new entries.
            lines=[line.strip() for line in _field(item, "content").splitlines() if line.strip()],
        )
        for item in _dicts(inputs, "files")
        if _field(item, "topic")
    ]
    for kind, statement, topic_words in _memory_signals(_dicts(inputs, "conversation")):
        stems = _text.content_stems(statement)
        if any(_near_duplicate(stems, line) for t in topics for line in t.lines):
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
            target.lines = [line for line in target.lines if not _corrected(stems, line)]
        target.lines.append(f"- {_MEMORY_LABELS[kind]}: {statement}")
        target.changed = True
        if kind not in target.signals:
            target.signals.append(kind)
    files = [
        {
            "topic": t.topic,
            "description": t.description,
            "signals": t.signals,
            "content": "\n".join(t.lines),
        }
        for t in topics
        if t.changed
    ]
    return LLMResponse(data={"files": files}, usage=_NO_USAGE)


def _memory_persist(inputs: dict[str, Any]) -> LLMResponse:
    statement = " ".join(_str(inputs, "statement").split())
    stems = _topic_stems(statement)
    best: tuple[int, dict[str, Any]] | None = None
    for item in _dicts(inputs, "files"):
        overlap = len(stems & _topic_stems(_field(item, "topic")))
        if overlap and (best is None or overlap > best[0]):
            best = (overlap, item)
    if best is not None:
        topic, description = _field(best[1], "topic"), _field(best[1], "description")
    else:
        topic = _text.key_phrase(statement, max_words=_MEMORY_TOPIC_WORDS) or "notes"
        description = _text.clip_words(statement, _MEMORY_DESCRIPTION_WORDS)
    data = {"topic": topic, "description": description, "entry": statement}
    return LLMResponse(data=data, usage=_NO_USAGE)


def _memory_condense(inputs: dict[str, Any]) -> LLMResponse:
    limit = _int(inputs, "max_chars", 4000)
    texts = [_MEMORY_BULLET.sub("", e).strip() for e in _str_list(inputs, "entries")]
    texts = [t for t in texts if t]
    stems = [_entry_stems(t) for t in texts]
    # Merging: an entry that says nothing a later entry does not say goes.
    merged = [
        t
        for i, t in enumerate(texts)
        if not (stems[i] and any(stems[i] <= stems[j] for j in range(i + 1, len(texts))))
    ]
    kept: list[str] = []
    room = limit
    for text in reversed(merged):
        if len(text) + 3 > room:
            # Only the newest entry is shortened (to its leading sentences); older ones go.
            text = _shortened(text, room - 3) if not kept else ""
        if text:
            kept.append(text if text.startswith("#") else f"- {text}")
            room -= len(text) + 3
    kept.reverse()
    description = _str(inputs, "description")
    said = set().union(*(_entry_stems(line) for line in kept))
    if kept and not _text.content_stems(description) & said:
        description = _text.clip_words(kept[0][2:], _MEMORY_DESCRIPTION_WORDS)
    data = {"description": description, "content": "\n".join(kept)}
    return LLMResponse(data=data, usage=_NO_USAGE)


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


# ---- summary / eviction / snapshot_fold (conversation memory) -----------------------------

# A user (or system) sentence that gives an instruction or corrects the assistant: eviction
# pins such messages word for word, since a summary would blur them.
_CONVERSATION_INSTRUCTION = re.compile(
    r"\b(?:always|never|make sure|be sure to|remember (?:to|that)|from now on|going forward|"
    r"(?:don'?t|do not) (?:ever )?\w+|must(?: not)?|instead of|rather than|i prefer|"
    r"i want you to|you (?:should|must|need to|have to)|please (?:use|keep|avoid|stop|"
    r"always|never|don'?t|do not|make sure)|avoid|stick (?:to|with)|only use|use only)\b",
    re.IGNORECASE,
)
_CONVERSATION_CORRECTION = re.compile(
    r"^(?:no|nope|wrong|actually|correction|not quite|wait,? no)\b|"
    r"\b(?:that'?s (?:wrong|incorrect|not (?:right|correct|what i))|"
    r"you (?:misunderstood|got it wrong|were wrong)|i meant|not \w+(?: \w+)?,? but)\b",
    re.IGNORECASE,
)
_ZONE_LINE = re.compile(r"^message (\d+)(?:-(\d+))?: (.*)$")
_ZONE_ROLE = re.compile(r"^([\w-]+): (.*)$")
_SPEAKERS = {"user": "User", "assistant": "Assistant", "system": "System", "developer": "System"}
_SUMMARY_SENTENCE_WORDS = 40


def _states_instruction(text: str) -> bool:
    return any(
        _CONVERSATION_INSTRUCTION.search(s) or _CONVERSATION_CORRECTION.search(s)
        for s in _text.sentences(text)
    )


def _extractive_summary(items: list[tuple[str, str]], max_words: int, previous: str = "") -> str:
    """The most informative sentences of `items` ((speaker, text) pairs, speaker "" for none)
    and of a previous summary, in their order, within `max_words` words.

    A sentence scores its informative words; instructions and corrections count double, tool
    output half. The previous summary's sentences compete with the new ones, so a rolling
    summary keeps what matters most from both.
    """
    candidates: list[tuple[float, int, str]] = []
    order = 0
    for sentence in _text.sentences(previous):
        candidates.append((_sentence_score(sentence) + 0.5, order, sentence))
        order += 1
    for speaker, text in items:
        for raw in _text.sentences(text):
            sentence = _text.clip_words(_strip_filler(raw), _SUMMARY_SENTENCE_WORDS)
            if len(_text.words(sentence)) < 3 or _GREETING.match(sentence):
                continue
            score = _sentence_score(sentence)
            if speaker in {"User", "System"} and _states_instruction(sentence):
                score *= 2
            if speaker == "Tool":
                score /= 2
            shown = f"{speaker}: {sentence}" if speaker else sentence
            candidates.append((score, order, shown))
            order += 1
    picked: list[tuple[int, str]] = []
    used = 0
    for score, position, sentence in sorted(candidates, key=lambda c: (-c[0], c[1])):
        size = len(sentence.split())
        if score > 0 and used + size <= max_words:
            picked.append((position, sentence))
            used += size
    text = " ".join(s if s[-1:] in ".!?" else s + "." for _, s in sorted(picked))
    return text


def _sentence_score(sentence: str) -> float:
    ws = _text.words(sentence)
    informative = sum(1 for w in ws if _text.is_informative(w))
    specific = sum(1 for w in ws if any(c.isdigit() for c in w) or _text.is_acronym(w))
    return informative + 0.5 * specific


def _speaker(role: str) -> str:
    return _SPEAKERS.get(role, "Tool")


def _summary_task(inputs: dict[str, Any]) -> LLMResponse:
    messages = _dicts(inputs, "messages")
    items = [(_speaker(_field(m, "role")), _field(m, "text")) for m in messages]
    max_words = max(16, _int(inputs, "max_words", 200))
    summary = _extractive_summary(items, max_words, _str(inputs, "previous_summary"))
    if not summary:
        # Nothing informative was said: say so rather than invent content.
        summary = f"{len(messages)} earlier messages held no informative statement."
    return LLMResponse(data={"summary": summary}, usage=_NO_USAGE)


def _snapshot_fold(inputs: dict[str, Any]) -> LLMResponse:
    snapshots = _dicts(inputs, "snapshots")
    items = [("", _field(s, "text")) for s in snapshots]
    max_words = max(16, _int(inputs, "max_words", 200))
    summary = _extractive_summary(items, max_words) or _text.clip_words(
        " ".join(text for _, text in items), max_words
    )
    if not summary:
        summary = f"{len(snapshots)} earlier snapshots held no informative statement."
    return LLMResponse(data={"summary": summary}, usage=_NO_USAGE)


def _eviction(inputs: dict[str, Any]) -> LLMResponse:
    if _str_list(inputs, "done"):
        # The tools already ran in an earlier round: finish.
        return LLMResponse(tool_calls=[ToolCall("everything_ok", {}, "call_0")], usage=_NO_USAGE)
    messages: list[tuple[int, str, str]] = []
    for line in _str(inputs, "zone").splitlines():
        found = _ZONE_LINE.match(line.strip())
        if not found or found.group(2):
            continue  # a collapsed run of tool calls carries no sentence
        said = _ZONE_ROLE.match(found.group(3))
        if said:
            messages.append((int(found.group(1)), said.group(1), said.group(2)))
    max_words = max(16, _int(inputs, "max_words", 100))
    calls: list[ToolCall] = []
    snapshot = _extractive_summary([(_speaker(r), t) for _, r, t in messages], max_words)
    if snapshot:
        calls.append(ToolCall("save_snapshot", {"text": snapshot}, f"call_{len(calls)}"))
    goals = _dicts(inputs, "goals")
    for seq, role, text in messages:
        if role not in {"user", "system", "developer"} or not _states_instruction(text):
            continue
        goal_ids = _goals_for(text, goals)
        if goal_ids:
            calls.append(
                ToolCall(
                    "attach_messages_to_goals",
                    {"message_ids": [seq], "goal_ids": goal_ids},
                    f"call_{len(calls)}",
                )
            )
    calls.append(ToolCall("everything_ok", {}, f"call_{len(calls)}"))
    return LLMResponse(tool_calls=calls, usage=_NO_USAGE)


def _goals_for(text: str, goals: list[dict[str, Any]]) -> list[str]:
    """The goals sharing a content word with `text`, else the newest goal (the current one)."""
    stems = _text.content_stems(text)
    ids = [_field(g, "id") for g in goals if stems & _text.content_stems(_field(g, "description"))]
    if not ids and goals:
        ids = [_field(goals[-1], "id")]
    return [gid for gid in ids if gid]


# ---- recall ------------------------------------------------------------------------------

_PROCEDURAL_QUERY = re.compile(
    r"\bhow (?:do|to|can|should|would)\b|\bsteps?\b|\bprocedure\b|\binstructions?\b"
    r"|\bwhat should (?:i|we)\b|\bhow did (?:i|we|you) (?:fix|solve|set|install|configure)",
    re.IGNORECASE,
)
_EPISODIC_QUERY = re.compile(
    r"\bwhen\b|\bwhat happened\b|\blast time\b|\byesterday\b|\bago\b"
    r"|\bdid (?:i|we|you|he|she|they)\b|\bhas \w+ ever\b",
    re.IGNORECASE,
)
_SEMANTIC_QUERY = re.compile(
    r"\bwhat (?:is|are|was|were|does|do|kind)\b|\bwho\b|\bwhich\b|\bwhere\b"
    r"|\bprefer|\bfavou?rite\b|\blikes?\b",
    re.IGNORECASE,
)


def _recall_plan(inputs: dict[str, Any]) -> LLMResponse:
    """Mode from the query's question form (how-to: procedural; when/did: episodic; what/who/
    which: semantic; else mixed); tags are its concept labels."""
    query = _str(inputs, "query")
    if _PROCEDURAL_QUERY.search(query):
        mode = "procedural"
    elif _EPISODIC_QUERY.search(query):
        mode = "episodic"
    elif _SEMANTIC_QUERY.search(query):
        mode = "semantic"
    else:
        mode = "mixed"
    return LLMResponse(
        data={"mode": mode, "tags": _text.concepts(query, limit=6)}, usage=_NO_USAGE
    )


def _recall_synthesis(inputs: dict[str, Any]) -> LLMResponse:
    """Extractive: the first memory, quoted, since no model is there to reason over them."""
    memories = _str_list(inputs, "memories")
    answer = memories[0] if memories else "No memory answers this."
    return LLMResponse(data={"answer": answer}, usage=_NO_USAGE)


def _recall_rerank(inputs: dict[str, Any]) -> LLMResponse:
    """The retrieval's order: no model is there to judge relevance better than it."""
    memories = _str_list(inputs, "memories")
    return LLMResponse(data={"order": list(range(1, len(memories) + 1))}, usage=_NO_USAGE)


_HANDLERS: dict[str, Callable[[dict[str, Any]], LLMResponse]] = {
    "state": _state,
    "subgoal": _subgoal,
    "reward": _reward_task,
    "semantic": _semantic,
    "procedural": _procedural,
    "return": _return,
    "merge_intent": _merge_intent,
    "contradiction": _contradiction_task,
    "memory_update": _memory_update,
    "memory_persist": _memory_persist,
    "memory_condense": _memory_condense,
    "summary": _summary_task,
    "eviction": _eviction,
    "snapshot_fold": _snapshot_fold,
    "recall_plan": _recall_plan,
    "recall_synthesis": _recall_synthesis,
    "recall_rerank": _recall_rerank,
}
