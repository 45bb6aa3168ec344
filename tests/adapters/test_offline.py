from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from mnemo.adapters.offline import OfflineLLM, outcome_reward
from mnemo.episode import (
    parse_reward,
    parse_state,
    parse_subgoal,
    reward_request,
    state_request,
    subgoal_request,
)
from mnemo.errors import LLMError
from mnemo.extraction.prompts import (
    merge_intent_request,
    parse_facts,
    parse_instructions,
    parse_merged_intent,
    parse_returns,
    procedural_request,
    return_request,
    semantic_request,
)
from mnemo.ports import LLM, LLMRequest, Usage
from tests.fakes import js

GOAL = "Deploy the Flask app behind nginx"
NGINX = "I need to configure nginx as a reverse proxy for my Flask app."

STEPS: list[dict[str, Any]] = [
    {
        "index": 0,
        "observation": "Hi! Okay, so my server runs Ubuntu 22.04 with 16GB of RAM. "
        "Can you help me with nginx?",
        "action": "Sure. Run sudo nginx -t to validate the nginx configuration.",
    },
    {
        "index": 1,
        "observation": "It says the syntax is ok. Thanks!",
        "action": "Great. Restart nginx with sudo systemctl restart nginx.",
    },
    {
        "index": 2,
        "observation": "That fixed it, the site loads now.",
        "action": "ok",
    },
]


async def subgoal_for(
    llm: OfflineLLM, observation: str, previous: str | None, recent: list[str] | None = None
) -> str:
    request = subgoal_request(
        goal=GOAL,
        observation=observation,
        action="Let me look.",
        previous_subgoal=previous,
        recent_steps=recent or [],
    )
    return parse_subgoal(await llm.generate(request))


def test_offline_llm_is_an_llm() -> None:
    """OfflineLLM satisfies the LLM protocol."""
    assert isinstance(OfflineLLM(), LLM)


async def test_state_is_first_sentence_and_last_action() -> None:
    """The state reply is the observation's first sentence followed by the last action."""
    request = state_request(
        goal=GOAL,
        observation="The site returns 502 Bad Gateway. It started after the upgrade.",
        action="Check the upstream block",
        previous_state=None,
    )
    response = await OfflineLLM().generate(request)
    assert response.usage == Usage(0, 0, 0.0)
    assert parse_state(response) == (
        "The site returns 502 Bad Gateway. Last action: Check the upstream block"
    )


async def test_state_trims_long_observations() -> None:
    """A long first sentence is cut to about forty words."""
    observation = " ".join(f"word{i}" for i in range(100)) + "."
    request = state_request(goal=GOAL, observation=observation, action="wait", previous_state=None)
    state = parse_state(await OfflineLLM().generate(request))
    assert len(state.split()) <= 45


async def test_subgoal_is_key_phrase_of_observation() -> None:
    """Without a previous subgoal the reply is the observation's lower-case key phrase."""
    subgoal = await subgoal_for(OfflineLLM(), NGINX, None)
    assert subgoal.startswith("configure nginx reverse proxy")
    assert subgoal == subgoal.lower()
    assert 2 <= len(subgoal.split()) <= 5


async def test_subgoal_continues_on_shared_topic() -> None:
    """An observation sharing a content word with the previous subgoal keeps it verbatim."""
    llm = OfflineLLM()
    first = await subgoal_for(llm, NGINX, None)
    second = await subgoal_for(llm, "Nginx now answers with 502 Bad Gateway.", first)
    assert second == first


async def test_subgoal_continues_on_shared_word_with_last_step() -> None:
    """A word shared with the most recent step (not the subgoal) also keeps the subgoal."""
    llm = OfflineLLM()
    recent = ["The upstream points at gunicorn on port 8000 -> check the socket"]
    subgoal = await subgoal_for(llm, "Gunicorn is running fine.", "configure nginx", recent)
    assert subgoal == "configure nginx"


async def test_subgoal_continues_on_contentless_observation() -> None:
    """A reply like "yes" names no new topic, so the previous subgoal stays."""
    assert await subgoal_for(OfflineLLM(), "yes", "configure nginx reverse proxy") == (
        "configure nginx reverse proxy"
    )


async def test_subgoal_changes_on_topic_shift_marker() -> None:
    """A topic-shift marker starts a new subgoal named after what follows it."""
    subgoal = await subgoal_for(
        OfflineLLM(),
        "The nginx proxy works now. Moving on, set up nightly Postgres database backups.",
        "configure nginx reverse proxy",
    )
    assert subgoal != "configure nginx reverse proxy"
    assert "postgres" in subgoal
    assert "nginx" not in subgoal


@pytest.mark.parametrize(
    "observation",
    [
        "Next, the nginx logs need rotating weekly.",
        "Now let's rotate the nginx logs weekly.",
        "Switching to nginx log rotation.",
    ],
)
async def test_shift_markers_win_over_shared_words(observation: str) -> None:
    """A shift marker starts a new subgoal even when the observation shares a word."""
    subgoal = await subgoal_for(OfflineLLM(), observation, "configure nginx reverse proxy")
    assert subgoal != "configure nginx reverse proxy"
    assert "rotat" in subgoal


async def test_subgoal_changes_on_unrelated_observation() -> None:
    """An observation with no content word in common gets a new key phrase."""
    subgoal = await subgoal_for(
        OfflineLLM(), "My daughter's birthday party is on Saturday afternoon.", "configure nginx"
    )
    assert subgoal != "configure nginx"
    assert "birthday" in subgoal


async def test_subgoal_reasoning_names_the_rule() -> None:
    """The subgoal reply's reasoning says which rule fired."""
    request = subgoal_request(
        goal=GOAL,
        observation="Moving on: the database.",
        action="ok",
        previous_subgoal="configure nginx",
        recent_steps=[],
    )
    response = await OfflineLLM().generate(request)
    assert js(response.data)["reasoning"].startswith("topic shift")


@pytest.mark.parametrize(
    ("next_observation", "expected"),
    [
        ("It works now, thanks!", 0.9),
        ("That fixed the error.", 0.9),
        ("The tests passed with no errors.", 0.9),
        ("Still getting the same error.", 0.2),
        ("Permission denied when opening the socket.", 0.2),
        ("It's not working.", 0.2),
        ("Here is the config file you asked for.", 0.6),
    ],
)
async def test_reward_reads_the_next_observation(next_observation: str, expected: float) -> None:
    """Success reads as 0.9, failure as 0.2, and a neutral continuation as 0.6."""
    request = reward_request(
        goal=GOAL,
        subgoal="configure nginx",
        observation="The proxy fails.",
        action="Restart nginx.",
        next_observation=next_observation,
    )
    assert parse_reward(await OfflineLLM().generate(request)) == expected


async def test_reward_of_last_step_reads_its_own_observation() -> None:
    """With no next observation the step's own observation is judged."""
    request = reward_request(
        goal=GOAL,
        subgoal="s",
        observation="Great, it is resolved.",
        action="Close the ticket.",
        next_observation=None,
    )
    assert parse_reward(await OfflineLLM().generate(request)) == 0.9


def test_reward_with_nothing_to_judge_is_neutral() -> None:
    """Blank text has no outcome: 0.5."""
    assert outcome_reward("  ") == 0.5


async def test_facts_are_self_contained_sentences_with_step_index() -> None:
    """Informative sentences become facts carrying their step index; filler is stripped;
    concepts are lower-case but for identifiers, written as in the fact ("16GB")."""
    request = semantic_request(goal=GOAL, subgoal="fix the nginx 502 error", steps=STEPS)
    facts = parse_facts(await OfflineLLM().generate(request))
    by_text = {fact.proposition: fact for fact in facts}
    server = by_text["My server runs Ubuntu 22.04 with 16GB of RAM."]
    assert server.steps == (0,)
    assert "ubuntu" in server.concepts
    assert 0.6 <= server.confidence <= 0.9
    assert by_text["Nginx 502 error: fixed it, the site loads now."].steps == (2,)
    for fact in facts:
        assert 1 <= len(fact.concepts) <= 4
        assert all(concept == concept.lower() or concept in fact.proposition
                   for concept in fact.concepts)


async def test_an_actions_command_is_a_fact_only_when_it_names_a_value() -> None:
    """A command the agent ran is an instruction, not a fact ("Note the wifi password." would
    rank above the password's fact); one that names a value (a number, an assignment, or what
    a setting verb sets its object to) tells what holds after it."""
    steps = [{"index": 0, "observation": "The office wifi password is hunter2.",
              "action": "Note the wifi password."},
             {"index": 1, "observation": "gunicorn listens on port 8001.",
              "action": "Bind gunicorn to 127.0.0.1:8000."},
             {"index": 2, "observation": "The cron jobs run at midnight UTC.",
              "action": "Restart the nginx service over SSH."},
             {"index": 3, "observation": "The server clock is wrong.",
              "action": "I'll set the default timezone to Europe/Rome."},
             {"index": 4, "observation": "The logs are too quiet.",
              "action": "Set LOG_LEVEL=debug on the staging server."},
             {"index": 5, "observation": "The deploy job is flaky.",
              "action": "Switch to the staging branch first."},
             {"index": 6, "observation": "The TLS certificate expired.",
              "action": "Renew the certificate with certbot."}]
    request = semantic_request(goal=GOAL, subgoal="set up the office", steps=steps)
    facts = [fact.proposition for fact in parse_facts(await OfflineLLM().generate(request))]
    assert facts == ["The office wifi password is hunter2.", "Gunicorn listens on port 8001.",
                     "Bind gunicorn to 127.0.0.1:8000.", "The cron jobs run at midnight UTC.",
                     "The server clock is wrong.", "I'll set the default timezone to Europe/Rome.",
                     "The logs are too quiet.", "Set LOG_LEVEL=debug on the staging server.",
                     "The deploy job is flaky.", "The TLS certificate expired."]


@pytest.mark.parametrize(("subgoal", "sentence", "fact"), [
    ("Dana last week", "It was set up by Dana last week.", "It was set up by Dana last week."),
    ("10 31 13 2023", "It was set up by Dana in Lisbon.", "It was set up by Dana in Lisbon."),
    ("7 55 2023 melanie", "It was set up by Dana in Lisbon.",
     "It was set up by Dana in Lisbon."),
    ("nginx 502", "It happens after every deploy.", "Nginx 502: happens after every deploy."),
    ("Q3 2024 report", "It was sent on Friday.", "Q3 2024 report: was sent on Friday."),
    ("staging server", "That shared folder holds the logs.",
     "Staging server: the shared folder holds the logs."),
    ("staging server", "That fixed it for the team.", "Staging server: fixed it for the team."),
    ("staging server", "That fixed CI for everyone.", "Staging server: fixed CI for everyone."),
    ("staging server", "That embedded device reboots nightly.",
     "Staging server: the embedded device reboots nightly."),
])
async def test_a_pronoun_becomes_a_topic_that_names_something(
    subgoal: str, sentence: str, fact: str
) -> None:
    """"It" becomes the topic only when the topic names something the sentence does not (not
    its own key phrase, not a time of numbers); "That" before a noun's words is "the", before
    its verb ("That fixed it") it goes."""
    request = semantic_request(goal=GOAL, subgoal=subgoal, steps=[{
        "index": 0, "observation": sentence, "action": "ok"}])
    facts = parse_facts(await OfflineLLM().generate(request))
    assert [f.proposition for f in facts] == [fact]


async def test_questions_and_greetings_are_not_facts() -> None:
    """Questions, greetings, thanks and short filler never become facts."""
    request = semantic_request(goal=GOAL, subgoal="fix the nginx 502 error", steps=STEPS)
    propositions = [f.proposition for f in parse_facts(await OfflineLLM().generate(request))]
    assert not any(p.endswith("?") for p in propositions)
    assert not any(
        p.lower().startswith(("hi", "thanks", "sure", "great", "ok")) for p in propositions
    )


async def test_leading_pronoun_is_replaced_by_the_topic() -> None:
    """A fact opening with "It" names the subgoal's key phrase instead of the pronoun."""
    steps = [
        {
            "index": 3,
            "observation": "It listens on port 8080 behind the firewall.",
            "action": "noted",
        }
    ]
    request = semantic_request(goal=GOAL, subgoal="configure gunicorn server", steps=steps)
    [fact] = parse_facts(await OfflineLLM().generate(request))
    assert (
        fact.proposition == "Configure gunicorn server: listens on port 8080 behind the firewall."
    )
    assert fact.steps == (3,)


@pytest.mark.parametrize(
    ("sentence", "expected"),
    [
        ("They've been running behind the firewall since May.",
         "Configure gunicorn server: have been running behind the firewall since May."),
        ("It'll restart the workers every night at midnight.",
         "Configure gunicorn server: will restart the workers every night at midnight."),
        ("It'd need four workers for this traffic level.",
         "Configure gunicorn server: would need four workers for this traffic level."),
        ("They're listening on port 8080 behind the firewall.",
         "Configure gunicorn server: are listening on port 8080 behind the firewall."),
        ("It's been stable since the upgrade last week.",
         "Configure gunicorn server: has been stable since the upgrade last week."),
        ("They\u2019ve been running behind the firewall since May.",
         "Configure gunicorn server: have been running behind the firewall since May."),
        ("It's Been stable since the upgrade last week.",
         "Configure gunicorn server: has Been stable since the upgrade last week."),
        ("It's gotten slower since the upgrade last week.",
         "Configure gunicorn server: has gotten slower since the upgrade last week."),
        ("It's broken since the upgrade last week.",
         "Configure gunicorn server: is broken since the upgrade last week."),
        ("They'd migrated the workers before the upgrade.",
         "Configure gunicorn server: had migrated the workers before the upgrade."),
        ("It'd been down for an hour before the upgrade.",
         "Configure gunicorn server: had been down for an hour before the upgrade."),
    ],
)
async def test_a_contracted_leading_pronoun_is_replaced_with_its_verb(
    sentence: str, expected: str
) -> None:
    """"They've", "It'll", "It'd" are a pronoun and a verb: the topic replaces the pronoun and
    the verb is spelled out, never left as a dangling "'ve"."""
    steps = [{"index": 0, "observation": sentence, "action": "noted"}]
    request = semantic_request(goal=GOAL, subgoal="configure gunicorn server", steps=steps)
    [fact] = parse_facts(await OfflineLLM().generate(request))
    assert fact.proposition == expected


@pytest.mark.parametrize(
    "sentence",
    ["It'sy bitsy workers restart every night at midnight.",
     "They' restart the gunicorn workers every night at midnight."],
)
async def test_a_broken_contraction_is_left_as_it_is(sentence: str) -> None:
    """A pronoun followed by an apostrophe that is no contraction is not resolved: no
    "Topic: 'sy ..." fragment."""
    steps = [{"index": 0, "observation": sentence, "action": "noted"}]
    request = semantic_request(goal=GOAL, subgoal="configure gunicorn server", steps=steps)
    [fact] = parse_facts(await OfflineLLM().generate(request))
    assert fact.proposition == sentence


async def test_duplicate_propositions_are_dropped() -> None:
    """The same sentence in two steps yields one fact."""
    steps = [
        {"index": 0, "observation": "The backup bucket lives in eu-west-1.", "action": "ok"},
        {"index": 1, "observation": "The backup bucket lives in eu-west-1.", "action": "ok"},
    ]
    facts = parse_facts(
        await OfflineLLM().generate(semantic_request(goal=GOAL, subgoal="backups", steps=steps))
    )
    assert len(facts) == 1


async def test_no_facts_from_small_talk() -> None:
    """Small talk yields an empty, valid fact list."""
    steps = [{"index": 0, "observation": "Hello! How are you?", "action": "Thanks, all good."}]
    request = semantic_request(goal=GOAL, subgoal="chat", steps=steps)
    assert parse_facts(await OfflineLLM().generate(request)) == []


async def test_procedures_come_from_actions() -> None:
    """Each real action becomes a WHEN/DO/EXPECT instruction; "ok" does not."""
    steps = [
        dict(step, reward=reward) for step, reward in zip(STEPS, [0.6, 0.9, None], strict=True)
    ]
    request = procedural_request(goal=GOAL, subgoal="fix the nginx 502 error", steps=steps)
    instructions = parse_instructions(await OfflineLLM().generate(request))
    assert [i.steps for i in instructions] == [(0,), (1,)]
    restart = instructions[1]
    assert restart.intent == "fix the nginx 502 error"
    assert restart.condition.startswith("When ")
    assert restart.instruction == "Great. Restart nginx with sudo systemctl restart nginx."
    assert restart.expected_outcome == "That fixed it, the site loads now."
    last = procedural_request(goal=GOAL, subgoal="s", steps=steps[1:2])
    [only] = parse_instructions(await OfflineLLM().generate(last))
    assert only.expected_outcome == "the step succeeds"


async def test_command_style_actions_are_procedures() -> None:
    """Lower-case commands and tool calls count as actions; statements do not."""
    steps = [
        {"index": 0, "observation": "o", "action": "git push origin main", "reward": 0.5},
        {"index": 1, "observation": "o", "action": "search[red running shoes]", "reward": 0.5},
        {
            "index": 2,
            "observation": "o",
            "action": "Paris is the capital of France.",
            "reward": 0.5,
        },
        {"index": 3, "observation": "o", "action": "I think that is right.", "reward": 0.5},
        {"index": 4, "observation": "o", "action": "Renew the certificate with certbot.",
         "reward": 0.5},
        {"index": 5, "observation": "o", "action": "All the pods are healthy.", "reward": 0.5},
        *({"index": 6 + i, "observation": "o", "action": statement, "reward": 0.5}
          for i, statement in enumerate((
              "Yesterday the deploy failed on staging.", "Currently the database holds 3 GB.",
              "Apparently the key expired.", "Unfortunately the cache is stale.")))
    ]
    request = procedural_request(goal=GOAL, subgoal="s", steps=steps)
    instructions = parse_instructions(await OfflineLLM().generate(request))
    assert [i.steps for i in instructions] == [(0,), (1,), (4,)]


async def test_returns_follow_step_rewards() -> None:
    """Each instruction scores round(1 + 9 * reward) of its step, 5 when unknown."""
    steps = [
        {"index": 0, "observation": "o", "action": "Restart nginx now please", "reward": 1.0},
        {"index": 1, "observation": "o", "action": "Delete the whole config", "reward": 0.0},
        {"index": 2, "observation": "o", "action": "Check the logs again", "reward": None},
    ]
    instructions = [
        {
            "index": i,
            "intent": "x",
            "condition": "c",
            "instruction": s["action"],
            "expected_outcome": "e",
        }
        for i, s in enumerate(steps)
    ]
    request = return_request(goal=GOAL, subgoal="s", instructions=instructions, steps=steps)
    assert parse_returns(await OfflineLLM().generate(request), 3) == {0: 10, 1: 1, 2: 5}


async def test_merge_intent_keeps_existing_wording() -> None:
    """The merged intent is the existing one, or the new one when the existing is blank."""
    llm = OfflineLLM()
    kept = await llm.generate(merge_intent_request(existing="restart nginx", new="reload nginx"))
    assert parse_merged_intent(kept) == "restart nginx"
    new = await llm.generate(merge_intent_request(existing=" ", new="reload nginx"))
    assert parse_merged_intent(new) == "reload nginx"


async def test_replies_are_deterministic() -> None:
    """The same request always gets the same reply, from any instance."""
    requests: list[LLMRequest] = [
        semantic_request(goal=GOAL, subgoal="fix nginx", steps=STEPS),
        procedural_request(goal=GOAL, subgoal="fix nginx", steps=STEPS),
        subgoal_request(
            goal=GOAL, observation=NGINX, action="a", previous_subgoal=None, recent_steps=[]
        ),
    ]
    for request in requests:
        assert await OfflineLLM().generate(request) == await OfflineLLM().generate(request)


async def test_unknown_task_raises_llm_error() -> None:
    """A task without a heuristic raises LLMError naming it."""
    request = LLMRequest(task="summarise", system="s", messages=[])
    with pytest.raises(LLMError, match="'summarise'"):
        await OfflineLLM().generate(request)


async def test_missing_inputs_still_answer() -> None:
    """A request without inputs gets a schema-shaped answer rather than a crash."""
    for task in ("subgoal", "reward", "semantic", "procedural", "return", "merge_intent"):
        response = await OfflineLLM().generate(LLMRequest(task=task, system="s", messages=[]))
        assert isinstance(response.data, dict)


@settings(max_examples=60, deadline=None)
@given(
    observation=st.text(max_size=300), action=st.text(max_size=100), previous=st.text(max_size=40)
)
async def test_any_text_gets_a_parseable_answer(
    observation: str, action: str, previous: str
) -> None:
    """Whatever the texts, every task answers something its parser accepts."""
    llm = OfflineLLM()
    steps: list[dict[str, Any]] = [
        {"index": 0, "observation": observation, "action": action, "reward": 0.5}
    ]
    parse_state(
        await llm.generate(
            state_request(goal=GOAL, observation=observation, action=action, previous_state=None)
        )
    )
    parse_subgoal(
        await llm.generate(
            subgoal_request(
                goal=GOAL,
                observation=observation,
                action=action,
                previous_subgoal=previous or None,
                recent_steps=[previous],
            )
        )
    )
    reward = await llm.generate(
        reward_request(
            goal=GOAL,
            subgoal=previous,
            observation=observation,
            action=action,
            next_observation=None,
        )
    )
    assert js(reward.data)["reward"] in (0.2, 0.5, 0.6, 0.9)
    parse_facts(await llm.generate(semantic_request(goal=GOAL, subgoal=previous, steps=steps)))
    instructions = parse_instructions(
        await llm.generate(procedural_request(goal=GOAL, subgoal=previous, steps=steps))
    )
    listed = [
        {
            "index": i,
            "intent": x.intent,
            "condition": x.condition,
            "instruction": x.instruction,
            "expected_outcome": x.expected_outcome,
        }
        for i, x in enumerate(instructions)
    ]
    returns = await llm.generate(
        return_request(goal=GOAL, subgoal=previous, instructions=listed, steps=steps)
    )
    assert set(parse_returns(returns, len(listed))) == set(range(len(listed)))
