"""The offline LLM's heuristics for annotating a step: `state`, `subgoal` and `reward` (see
`mnemo.adapters.offline`)."""

from __future__ import annotations

import re

from mnemo import text as _text
from mnemo.adapters._offline_common import Answer, Inputs

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

_MAX_ACTION_WORDS_IN_STATE = 40
_SUBGOAL_WORDS = 5


def _state(inputs: Inputs) -> Answer:
    observed = _text.first_sentence(inputs.observation.strip())
    if not observed:
        observed = (inputs.previous_state or "").strip() or "Nothing new was observed."
    if observed[-1] not in ".!?":
        observed += "."
    action = _text.clip_words(inputs.action.strip(), _MAX_ACTION_WORDS_IN_STATE)
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
        return _subgoal_reply("first subgoal: the key phrase of the observation", fresh)
    if shift := _TOPIC_SHIFT.search(observation):
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
    context = _text.content_stems("\n".join([previous, *inputs.recent_steps[-1:]]))
    if shared := sorted(stems & context):
        return _subgoal_reply(
            f"continuity: the observation shares {', '.join(shared[:3])} with the previous "
            "subgoal or the last step",
            previous,
        )
    return _subgoal_reply(
        "new topic: no informative word in common with the previous subgoal or the last step",
        fresh,
    )


def _subgoal_reply(reasoning: str, subgoal: str) -> Answer:
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
