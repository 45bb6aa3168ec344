"""The offline LLM keeps identifiers as written: a word with an underscore, a dot, a slash, a
hyphen, a digit or an inner capital, a path, a URL or a code span is never re-cased or
reworded, in a fact, a procedure, a subgoal or a memory file's topic; and what it extracts is
stored so, on each backend."""

from __future__ import annotations

import re
from typing import Any

import mnemo
from mnemo.adapters.offline import OfflineLLM
from mnemo.episode import parse_subgoal, subgoal_request
from mnemo.extraction.prompts import (
    parse_facts,
    parse_instructions,
    procedural_request,
    semantic_request,
)
from mnemo.memoryfiles.prompts import memory_persist_request, parse_persist
from tests.conftest import REPO

IDENTIFIERS = ("test_upload", "tests/test_media.py::test_upload", "AWS_DEFAULT_REGION",
               "https://ci.example.org/runs/12", "`pytest -x`", "conftest.py", "NoRegionError",
               "iPhone", "eu-central-1", "CONN_MAX_AGE")
STEPS: list[dict[str, Any]] = [
    {"index": 0,
     "observation": "test_upload fails on CI about one run in five.",
     "action": "okay, tests/test_media.py::test_upload needs a mock for the S3 bucket."},
    {"index": 1,
     "observation": "It's always test_upload that times out. https://ci.example.org/runs/12 "
                    "shows the whole log.",
     "action": "set AWS_DEFAULT_REGION to eu-central-1 in conftest.py for the S3 mock."},
    {"index": 2,
     "observation": "iPhone users see NoRegionError after the deploy.",
     "action": "`pytest -x` stops at the first failing test; set CONN_MAX_AGE = 0 in "
               "settings."},
]


def recased(text: str) -> list[str]:
    """The identifiers `text` holds in another case than written."""
    return [i for i in IDENTIFIERS
            if i.lower() in text.lower() and i not in text]


async def test_facts_and_procedures_keep_identifiers_as_written() -> None:
    """Facts, procedures (intent, condition, instruction) and a subgoal name each identifier
    exactly as the steps do, even at the start of a sentence or after a resolved pronoun."""
    llm = OfflineLLM()
    facts = parse_facts(await llm.generate(semantic_request(
        goal="Fix CI", subgoal="test_upload flaky on CI", steps=STEPS)))
    texts = [fact.proposition for fact in facts]
    assert "test_upload fails on CI about one run in five." in texts
    assert "tests/test_media.py::test_upload needs a mock for the S3 bucket." in texts
    assert any(t.startswith("test_upload flaky CI: is always test_upload") for t in texts)
    instructions = parse_instructions(await llm.generate(procedural_request(
        goal="Fix CI", subgoal="AWS_DEFAULT_REGION for test_upload", steps=STEPS)))
    texts += [f"{i.intent} | {i.condition} | {i.instruction}" for i in instructions]
    subgoal = parse_subgoal(await llm.generate(subgoal_request(
        goal="Fix CI", observation=STEPS[1]["action"], action="Run it.",
        previous_subgoal=None, recent_steps=[])))
    texts.append(subgoal)
    assert "AWS_DEFAULT_REGION" in subgoal
    assert [t for t in texts if recased(t)] == []
    for fact in facts:
        assert all(c == c.lower() or c in fact.proposition for c in fact.concepts)


async def test_a_memory_topic_keeps_identifiers_as_written() -> None:
    """A topic named from a statement's key phrase keeps its identifiers' case."""
    filed = parse_persist(await OfflineLLM().generate(memory_persist_request(
        statement="test_upload needs AWS_DEFAULT_REGION set.", files=[])))
    assert "AWS_DEFAULT_REGION" in filed.topic
    assert filed.entry == "test_upload needs AWS_DEFAULT_REGION set."
    assert recased(filed.topic) == []


async def test_stored_nodes_keep_identifiers_as_written(store: str) -> None:
    """Through a Memory on the offline defaults, no stored node (fact, procedure, subgoal,
    intent, tag, step) holds an identifier of the steps in another case, and recall finds
    "test_upload" as written."""
    async with mnemo.Memory(store) as mem:
        await mem.open_repo(REPO)
        sid = await mem.start_session("Fix the flaky test_upload", repo=REPO)
        for step in STEPS:
            await mem.append(sid, step["observation"], step["action"])
        await mem.close_and_commit(sid)
        nodes = await mem.get_nodes_by_type(REPO, list(mnemo.NodeType))
        hits = (await mem.recall(REPO, "why does test_upload fail?", reinforce=False)).memories
    assert [n.text for n in nodes if recased(n.text)] == []
    assert any(n.text.startswith("test_upload fails") for n in nodes
               if n.type is mnemo.NodeType.SEMANTIC)
    assert not any(re.search(r"\bTest_upload\b", n.text) for n in nodes)
    assert "test_upload" in hits[0].node.text
