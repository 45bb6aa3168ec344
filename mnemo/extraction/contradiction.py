"""The "contradiction" task: which new facts end existing ones about the same subject ("Dana
lives in Lisbon" / "Dana moved to Porto")? A commit asks it once, for every new fact and the
few close existing facts recall finds for it, as numbered pairs; a fact contradicted is
retired, not deleted (`mnemo.graph.contradiction`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from mnemo.calls.tasks import (
    MOST_ITEMS,
    Reply,
    bounded,
    items,
    read_reply,
    reply_schema,
    task_request,
)
from mnemo.graph.contradiction import Question
from mnemo.ports import LLMRequest, LLMResponse


class ContradictionReply(Reply, frozen=True):
    contradicted: Annotated[list[int], items(MOST_ITEMS)]


CONTRADICTION_SCHEMA = reply_schema(ContradictionReply)
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
        CONTRADICTION_SCHEMA, "contradicted", len(pairs), most=None, floor=32)
    request = task_request(
        "contradiction", system=CONTRADICTION_SYSTEM, instructions=CONTRADICTION_INSTRUCTIONS,
        inputs=inputs, schema=schema, max_tokens=max_tokens)
    return request, pairs


def parse_contradiction(resp: LLMResponse, pairs: Sequence[tuple[int, int]],
                        questions: int) -> list[set[int]]:
    """For each question, the positions of the existing facts its new fact ends, from a
    "contradiction" reply (indices outside the pairs are ignored).

    Raises:
        ValueError: when the reply is not {"contradicted": [int, ...]}.
    """
    listed = read_reply(resp, ContradictionReply, "contradiction").contradicted
    ended: list[set[int]] = [set() for _ in range(questions)]
    for k in listed:
        if 0 <= k < len(pairs):
            question, position = pairs[k]
            ended[question].add(position)
    return ended
