"""`OfflineLLM`: the default LLM, answering mnemo's tasks with deterministic heuristics, no
model and no network. States and subgoals are key phrases (a subgoal repeats while the topic
holds), rewards read success or failure words, facts are the informative declarative sentences
(pronouns replaced by the topic), instructions come from the steps' actions, summaries are
extractive, and memory updates keep statements of a decision, a preference, a correction or
lasting context."""

from __future__ import annotations

import re
from collections.abc import Callable

from mnemo import cpu, text as _text
from mnemo.adapters._offline_common import (
    Answer,
    Inputs,
    Step,
    _capitalised,
    _is_fact,
    _sentence_score,
    _strip_filler,
)
from mnemo.adapters._offline_memory import HANDLERS as MEMORY_HANDLERS
from mnemo.calls.tasks import unit_score
from mnemo.errors import LLMError
from mnemo.graph.contradiction import contradicts
from mnemo.ports import JSONObject, LLMRequest, LLMResponse, Usage
from mnemo.recall.query import offline_plan

_LEADING_PRONOUN = re.compile(
    r"^(it|they|this|that|these|those)(?:['\u2019](s|re|ve|ll|d))?(?![\w'\u2019])\s*",
    re.IGNORECASE,
)
# What a contraction after the pronoun spells out ("They've been" -> "<topic>: have been"); 's
# before "been" is "has", 'd before a participle "had" ("They'd migrated").
_CONTRACTED = {"s": "is", "re": "are", "ve": "have", "ll": "will", "d": "would"}
_PERFECT = {"s": "has", "d": "had"}
_PARTICIPLES = {
    "s": frozenset({"been", "got", "gotten", "had"}),  # "It's done" stays "is done"
    "d": frozenset({"been", "got", "gotten", "had", "done", "gone"}),
}
# A "this"/"that" followed by one of these, or by a past tense ("That fixed it"), is a pronoun
# subject ("That is why..."), otherwise it is a determiner ("This server runs...").
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
    we he she it they this that there the a an my your our yesterday today tomorrow tonight
    meanwhile still also again later earlier once""".split()
)
# Words an imperative's object opens with, right after its verb.
_OBJECT_LEADS = frozenset(
    "the a an this that these those my your his her its our their all every each some it them"
    .split()
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


_NO_USAGE = Usage(0, 0, 0.0)


class OfflineLLM:
    """An `LLM` that answers mnemo's tasks with deterministic heuristics."""

    name = "offline"

    async def generate(self, request: LLMRequest) -> LLMResponse:
        """Answers `request` from its inputs, with zero usage; a long request in a worker thread."""
        handler = _HANDLERS.get(request.task)
        if handler is None:
            raise LLMError(f"the offline LLM has no heuristic for task {request.task!r}")
        # On the loop, a long request kept it blocked, so no `wait_for` could fire.
        chars = sum(len(content) for m in request.messages
                    if isinstance(content := m.get("content"), str))
        out = await cpu.run(lambda: handler(Inputs.of(request)), chars, abandon_on_cancel=True)
        if isinstance(out, str):
            return LLMResponse(text=out, usage=_NO_USAGE)
        if isinstance(out, list):
            return LLMResponse(tool_calls=out, usage=_NO_USAGE)
        return LLMResponse(data=out, usage=_NO_USAGE)


def _resolve_pronoun(sentence: str, topic: str) -> str:
    """Replaces an opening "It/They/This/That" with `topic` (a heuristic, see the module doc),
    unless the topic cannot stand for it (`_names_something`)."""
    match = _LEADING_PRONOUN.match(sentence)
    if not match or not _names_something(topic, sentence):
        return sentence
    pronoun = match.group(1).lower()
    rest = sentence[match.end() :]
    if not rest:
        return sentence
    if match.group(2):
        suffix = match.group(2).lower()
        following = rest.split(maxsplit=1)[0].lower()
        # A past participle ("migrated"), not a base form ending so ("need", "proceed").
        perfect = following in _PARTICIPLES.get(suffix, ()) or (
            suffix == "d" and following.endswith("ed") and not following.endswith("eed")
        )
        verb = _PERFECT[suffix] if suffix in _PERFECT and perfect else _CONTRACTED[suffix]
        rest = f"{verb} {rest}"
    if pronoun in {"this", "that", "these", "those"} and not _is_verb(rest.lower().split()[:4]):
        rest = f"the {rest}"
    return f"{_capitalised(topic)}: {rest}"


def _is_verb(words: list[str]) -> bool:
    """Whether the first of `words` (those after "this"/"that") is the pronoun's verb ("That
    is why", "That fixed CI", "That failed."), not a word of the noun it determines ("That
    shared folder holds the logs": a past form before a noun and a verb of its own)."""
    word, *after = [w.strip(",.;:!?") for w in words]
    if word in _VERB_AFTER_DEMONSTRATIVE:
        return True
    if not (len(word) > 4 and word.endswith("ed") and not word.endswith("eed")):
        return False
    if words[0][-1] in ",.;:!?" or not after or after[0] in _OBJECTS:
        return True  # "That worked.", "That fixed it"
    verb = after[1] if len(after) > 1 else ""
    return not (verb in _VERB_AFTER_DEMONSTRATIVE or (
        len(verb) > 3 and verb.endswith("s") and not verb.endswith(("ss", "ous"))
        and verb not in _NOT_VERBS))


# Words in -s that are not a noun's verb ("That caused errors sometimes").
_NOT_VERBS = frozenset("sometimes always perhaps afterwards towards nowadays".split())


# What follows a past form that is the verb ("That fixed it", "That failed in CI").
_OBJECTS = frozenset("""it them me us him her everything nothing all the a an this that my
    our your their his its things on in at to for by with from""".split())


def _names_something(topic: str, sentence: str) -> bool:
    """Whether `topic` can stand for a pronoun of `sentence`: not a time ("7 55 2023 melanie":
    two numbers or more, more numbers than words), and a content word the sentence lacks (not
    its own key phrase)."""
    ws = topic.split()
    numbers = sum(1 for w in ws if w.isdigit())
    time = numbers >= 2 and 2 * numbers > len(ws)
    return not time and not _text.content_stems(topic) <= _text.content_stems(sentence)


def _names_a_value(sentence: str) -> bool:
    """Whether `sentence` names a value: a word with a digit ("port 8000", "v2"), an
    assignment ("LOG_LEVEL=debug"), or what a setting verb sets its object to ("I'll set the
    timezone to Europe/Rome.")."""
    body = _ACTION_LEAD_IN.sub("", sentence, count=1)
    return (any(c.isdigit() for c in sentence) or bool(re.search(r"\w=\S", sentence))
            or bool(_SETS.match(body)))


# A command that sets an object (not "Switch to ...", "Move on to ...") to a value.
_SETS = re.compile(r"(?i)^(?:set|change|switch|move|bind|point|rename|update|pin|raise|lower)"
                   r"\s+(?!(?:to|on|back|over|into)\b)\S.*\s(?:to|as)\s+\S")


def _confidence(sentence: str) -> float:
    ws = _text.words(sentence)
    informative = sum(1 for w in ws if _text.is_informative(w))
    specific = any(any(c.isdigit() for c in w) or _text.is_acronym(w) for w in ws)
    score = 0.6 + 0.05 * min(max(informative - 2, 0), 4) + (0.1 if specific else 0.0)
    return round(min(0.9, score), 2)


def _semantic(inputs: Inputs) -> Answer:
    topic = (_text.key_phrase(inputs.subgoal.strip())
             or _text.key_phrase(inputs.goal.strip()))
    found: dict[str, JSONObject] = {}  # by proposition, case and spacing aside
    for position, step in enumerate(inputs.steps):
        index = position if step.index is None else step.index
        for part, acted in ((step.observation.strip(), False), (step.action.strip(), True)):
            for raw in _text.sentences(part):
                sentence = _strip_filler(raw)
                # An action's command is an instruction (`_procedural`); a fact only when it
                # names a value ("Bind gunicorn to port 8000.") that holds after it.
                if not _is_fact(sentence) or (acted and _is_action(sentence)
                                              and not _names_a_value(sentence)):
                    continue
                proposition = _resolve_pronoun(sentence, topic)
                key = " ".join(proposition.lower().split())
                if key not in found:
                    found[key] = {
                        "proposition": proposition,
                        "concepts": _text.concepts(sentence) or [topic or "general"],
                        "confidence": _confidence(sentence),
                        "steps": [index],
                    }
    facts = list(found.values())
    if len(facts) > MAX_FACTS:
        # A trajectory's facts are linked pairwise: keep the most informative, in their order.
        ranked = sorted(
            range(len(facts)), key=lambda i: (-_sentence_score(str(facts[i]["proposition"])), i)
        )
        facts = [facts[i] for i in sorted(ranked[:MAX_FACTS])]
    return {"facts": facts}


# The most facts one "semantic" answer holds.
MAX_FACTS = 64


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
    # A verb the list lacks, read by its object ("Renew the certificate", "Rotate your keys");
    # not an adverb opening a statement ("Apparently the key expired", "Yesterday the ...").
    if (len(body_words) > 1 and body_words[1].lower() in _OBJECT_LEADS
            and first.lower() not in _NOT_AN_ACTION and not _text.is_stopword(first)
            and not first.lower().endswith("ly")):
        return True
    # A lower-case opening word that is not a function word reads as a command ("git status",
    # "kubectl get pods"); a capitalised one may just start a statement ("Paris is ...").
    return first.islower() and first not in _NOT_AN_ACTION and not _text.is_stopword(first)


def _procedural(inputs: Inputs) -> Answer:
    subgoal = inputs.subgoal.strip()
    steps = inputs.steps
    by_text: dict[str, JSONObject] = {}  # in the steps' order
    for position, step in enumerate(steps):
        action = step.action.strip()
        if not _is_action(action):
            continue
        index = position if step.index is None else step.index
        key = " ".join(action.lower().split())
        if key in by_text:
            seen = by_text[key]["steps"]
            if isinstance(seen, list):
                seen.append(index)
            continue
        situation = _text.key_phrase(step.observation.strip(), max_words=5)
        later = steps[position + 1].observation.strip() if position + 1 < len(steps) else ""
        by_text[key] = {
            "intent": subgoal or _text.key_phrase(action) or action,
            "condition": f"When {situation or subgoal or 'working on the task'}",
            "instruction": action,
            "expected_outcome": _text.first_sentence(later) or "the step succeeds",
            "steps": [index],
        }
    data: JSONObject = {"instructions": list(by_text.values())}
    if inputs.score_last_step and steps:
        data["last_reward"] = outcome_reward(steps[-1].observation.strip())
    return data


def _return(inputs: Inputs) -> Answer:
    scores: list[dict[str, int]] = []
    for position, item in enumerate(inputs.instructions):
        index = position if item.index is None else item.index
        reward = _matched_reward(item.instruction.strip(), inputs.steps)
        score = 5 if reward is None else round(1 + 9 * reward)
        scores.append({"index": index, "return_score": score})
    return {"scores": scores}


def _matched_reward(instruction: str, steps: list[Step]) -> float | None:
    """The mean reward of the steps whose action is the instruction (or, failing that, of the
    step whose action shares the most words with it, if at least half)."""
    wanted = " ".join(instruction.lower().split())
    if not wanted:
        return None
    exact = [
        r
        for step in steps
        if " ".join(step.action.lower().split()) == wanted
        and (r := unit_score(step.reward)) is not None
    ]
    if exact:
        return sum(exact) / len(exact)
    wanted_tokens = set(_text.tokens(wanted))
    best: tuple[float, float | None] = (0.0, None)
    for step in steps:
        got = set(_text.tokens(step.action.strip()))
        if not got or not wanted_tokens:
            continue
        overlap = len(got & wanted_tokens) / len(got | wanted_tokens)
        if overlap > best[0]:
            best = (overlap, unit_score(step.reward))
    return best[1] if best[0] >= 0.5 else None


def _merge_intent(inputs: Inputs) -> Answer:
    # The surviving INTENT node keeps its text, so its embedding never drifts.
    return {"intent": inputs.existing.strip() or inputs.new.strip()}


def _merge_intents(inputs: Inputs) -> Answer:
    return {"intents": [{"index": i if pair.index is None else pair.index,
                         "intent": pair.existing.strip() or pair.new.strip()}
                        for i, pair in enumerate(inputs.pairs)]}


def _contradiction_task(inputs: Inputs) -> Answer:
    return {"contradicted": [
        i if pair.index is None else pair.index for i, pair in enumerate(inputs.pairs)
        if contradicts(pair.existing.strip(), pair.new.strip())]}


def _recall_plan(inputs: Inputs) -> Answer:
    plan = offline_plan(inputs.query)
    return {"mode": plan.mode, "tags": list(plan.tags)}


def _recall_synthesis(inputs: Inputs) -> Answer:
    """Extractive: the first memory, quoted, since no model is there to reason over them."""
    return {"answer": inputs.memories[0] if inputs.memories else "No memory answers this."}


def _recall_rerank(inputs: Inputs) -> Answer:
    """The retrieval's order: no model is there to judge relevance better than it."""
    return {"order": list(range(1, len(inputs.memories) + 1))}


_TOPIC_SHIFT = re.compile(
    r"\b(?:now,? let'?s|now let us|next,|moving on|move on to|switching to|switch to|"
    r"let'?s switch|another thing|another question|one more thing|different topic|"
    r"different question|different subject|new topic|new task|new question|"
    r"change of topic|changing topic|unrelated (?:question|topic|note)|on another note|"
    r"separate question|(?:ask|about|on to|talk about) something (?:else|different))(?!\w)",
    re.IGNORECASE,
)

# Phrases are matched, then blanked out, before single words ("not working", "no errors").
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

_SUBGOAL_WORDS = 5


def _state(inputs: Inputs) -> Answer:
    observed = (_text.first_sentence(inputs.observation.strip())
                or (inputs.previous_state or "").strip() or "Nothing new was observed.")
    if observed[-1] not in ".!?":
        observed += "."
    action = _text.clip_words(inputs.action.strip(), 40)
    return f"{observed} Last action: {action}" if action else observed


def _subgoal(inputs: Inputs) -> Answer:
    observation = inputs.observation.strip()
    previous = (inputs.previous_subgoal or "").strip()
    fresh = (
        _text.key_phrase(observation, max_words=_SUBGOAL_WORDS)
        or _text.key_phrase(inputs.action.strip(), max_words=_SUBGOAL_WORDS)
        or _text.key_phrase(inputs.goal.strip(), max_words=_SUBGOAL_WORDS)
        or "continue the task"
    )
    if not previous:
        reasoning, subgoal = "first subgoal: the key phrase of the observation", fresh
    elif shift := _TOPIC_SHIFT.search(observation):
        # The new topic is named after the marker ("... Now let's set up backups").
        after = _text.key_phrase(observation[shift.end() :], max_words=_SUBGOAL_WORDS)
        reasoning = f"topic shift: the observation says {shift.group(0)!r}; new key phrase"
        subgoal = after or fresh
    elif not (stems := _text.content_stems(observation)):
        reasoning = "continuity: the observation names no new topic, so the subgoal stays"
        subgoal = previous
    elif shared := sorted(stems & _text.content_stems(
            "\n".join([previous, *inputs.recent_steps[-1:]]))):
        reasoning = (f"continuity: the observation shares {', '.join(shared[:3])} with the "
                     "previous subgoal or the last step")
        subgoal = previous
    else:
        reasoning = ("new topic: no informative word in common with the previous subgoal or "
                     "the last step")
        subgoal = fresh
    return {"reasoning": reasoning, "subgoal": subgoal}


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


def _reward_task(inputs: Inputs) -> Answer:
    judged = (inputs.next_observation or "").strip() or inputs.observation.strip()
    return {"reward": outcome_reward(judged)}


_HANDLERS: dict[str, Callable[[Inputs], Answer]] = {
    "state": _state,
    "subgoal": _subgoal,
    "reward": _reward_task,
    "semantic": _semantic,
    "procedural": _procedural,
    "return": _return,
    "merge_intent": _merge_intent,
    "merge_intents": _merge_intents,
    "contradiction": _contradiction_task,
    **MEMORY_HANDLERS,
    "recall_plan": _recall_plan,
    "recall_synthesis": _recall_synthesis,
    "recall_rerank": _recall_rerank,
}
