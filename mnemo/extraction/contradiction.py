"""The "contradiction" task: which new facts end existing ones about the same subject ("Dana
lives in Lisbon" / "Dana moved to Porto"), asked once a commit as numbered pairs, and
`intent_policy`, what a commit asks the model."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Protocol

import anyio

from mnemo.calls.retry import fail_after
from mnemo.calls.schema import MOST_ITEMS, Reply, bounded, items, reply_schema
from mnemo.calls.tasks import ask, read_reply, task_request
from mnemo.config import Config
from mnemo.errors import EmbeddingError, LLMError, LLMReplyError
from mnemo.extraction.entities import embedded_again
from mnemo.extraction.prompts import (
    merge_intent_request,
    merge_intents_request,
    parse_merged_intent,
    parse_merged_intents,
)
from mnemo.graph.contradiction import Question, contradicts as contradicts_offline
from mnemo.graph.model import Changeset, Vector
from mnemo.graph.ports import IntentPolicy
from mnemo.ports import LLM, Embedder, LLMRequest, LLMResponse, embed

log = logging.getLogger("mnemo")


class ContradictionReply(Reply, frozen=True):
    contradicted: Annotated[list[int], items(MOST_ITEMS)]


CONTRADICTION_SYSTEM = "You keep an agent's memory of facts consistent over time."
CONTRADICTION_INSTRUCTIONS = """\
Each pair holds an existing fact and a new fact. A pair contradicts when the new fact says
that the existing one no longer holds: the same subject and relation with a different value
(a new address, a changed setting, a reversed decision, a negation). A pair does not
contradict when both facts can hold at once, when they are about different subjects, or when
you are not sure.
Reply with JSON listing the indices of the pairs that contradict (an empty list when none
does), for example {"contradicted": [0, 2]}."""


def contradiction_request(
    questions: Sequence[Question],
) -> tuple[LLMRequest, list[tuple[int, int]]]:
    """The "contradiction" task over `questions`, as numbered pairs, and what each pair's
    index stands for: (question, position of the existing fact in it)."""
    pairs = [(q, p) for q, question in enumerate(questions)
             for p in range(len(question.existing))]
    inputs = {"pairs": [
        {"index": k, "existing": questions[q].existing[p], "new": questions[q].new}
        for k, (q, p) in enumerate(pairs)]}
    schema, max_tokens = bounded(
        reply_schema(ContradictionReply), "contradicted", len(pairs), most=None, floor=32)
    return task_request(
        "contradiction", system=CONTRADICTION_SYSTEM, instructions=CONTRADICTION_INSTRUCTIONS,
        inputs=inputs, schema=schema, max_tokens=max_tokens), pairs


def parse_contradiction(resp: LLMResponse, pairs: Sequence[tuple[int, int]],
                        questions: int) -> list[set[int]]:
    """For each question, the positions of the existing facts its new fact ends; raises ValueError
    when the reply is not {"contradicted": [int, ...]}."""
    listed = read_reply(resp, ContradictionReply, "contradiction").contradicted
    ended: list[set[int]] = [set() for _ in range(questions)]
    for k in listed:
        if 0 <= k < len(pairs):
            question, position = pairs[k]
            ended[question].add(position)
    return ended


async def merged_intents(llm: LLM, pairs: Sequence[tuple[str, str]]) -> dict[int, str]:
    """Pair index -> the merged wording of each (existing, new) intent pair: several in one
    "merge_intents" call; one pair, or pairs whose call the model answered with no usable reply
    (the contract's table lists only "merge_intent"), in one "merge_intent" call a pair, at
    once, where a failed pair stays unmerged (absent). Another failure of the batch raises."""
    if len(pairs) > 1:
        try:
            return await ask(llm, merge_intents_request(list(pairs)),
                             lambda reply: parse_merged_intents(reply, len(pairs)))
        except LLMReplyError as exc:
            log.info("a batch of intent merges was refused, asking pair by pair: %r", exc)
    texts: dict[int, str] = {}

    async def one(index: int, existing: str, new: str) -> None:
        try:
            texts[index] = await ask(llm, merge_intent_request(existing=existing, new=new),
                                     parse_merged_intent)
        except LLMError as exc:
            log.warning("an intent merge failed, keeping %r: %r", existing, exc)

    async with anyio.create_task_group() as group:
        for index, (existing, new) in enumerate(pairs):
            group.start_soon(one, index, existing, new)
    return texts


class Embedding(Protocol):
    embedder: Embedder
    generation: int


# The repo's embedding, brought up to its record when its generation is not the one given.
Refresh = Callable[[str, int], Awaitable[Embedding]]


def intent_policy(
    config: Config, embedder: Embedder, llm: LLM, repo: str, refresh: Refresh
) -> IntentPolicy:
    """How commits made with `config` and `embedder` merge intents and retire contradicted facts
    through `llm`, and how an older changeset of `repo` is embedded again (`refresh`)."""
    limit = config.extraction_timeout

    async def merge(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, Vector] | None]:
        try:
            with fail_after(limit):
                merged = sorted((await merged_intents(llm, pairs)).items())
                vectors = await embed(embedder, [text for _, text in merged])
        except (LLMError, EmbeddingError, TimeoutError) as exc:
            log.warning("intent merges failed, keeping the existing wordings: %r", exc)
            return [None] * len(pairs)
        found = {i: (text, vector) for (i, text), vector in zip(merged, vectors, strict=True)}
        return [found.get(i) for i in range(len(pairs))]

    async def contradicts(questions: Sequence[Question]) -> list[set[int]]:
        request, pairs = contradiction_request(questions)
        try:
            with fail_after(limit):
                return await ask(
                    llm, request, lambda reply: parse_contradiction(reply, pairs, len(questions))
                )
        except LLMReplyError as exc:
            # A model that cannot judge (the contract's table does not list the task): the
            # offline heuristic judges, as the offline LLM does.
            log.warning("no usable contradiction answer, judged offline: %r", exc)
            return [{p for p, existing in enumerate(q.existing)
                     if contradicts_offline(existing, q.new)}
                    for q in questions]
        except (LLMError, TimeoutError) as exc:
            # Not knowing is not contradicting: the facts stay live.
            log.warning("contradiction check failed, every fact stays live: %r", exc)
            return [set() for _ in questions]

    async def restamp(changeset: Changeset, generation: int) -> Changeset:
        nonlocal embedder
        fresh = await refresh(repo, generation)
        made = await embedded_again(changeset, fresh.embedder, fresh.generation, limit)
        embedder = fresh.embedder
        return made

    return IntentPolicy(
        identity_threshold=config.intent_identity_threshold,
        merge_threshold=config.intent_merge_threshold,
        merge=merge,
        contradicts=contradicts,
        contradiction_candidates=config.contradiction_candidates,
        contradiction_similarity=config.contradiction_similarity,
        restamp=restamp,
    )
