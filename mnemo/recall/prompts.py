"""The recall tasks: planning a query, re-ranking candidates, and synthesising an answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec

from mnemo.calls.reply import Meta, Reply, read_reply, reply_schema
from mnemo.calls.tasks import ask, task_request
from mnemo.ports import LLM, LLMRequest, LLMResponse


class PlanReply(Reply, frozen=True):
    mode: Literal["episodic", "semantic", "procedural", "mixed"]
    # At most 8 asked; more are cut when read, never a reason to refuse the plan.
    tags: Annotated[list[str], Meta(extra_json_schema={"maxItems": 8})] = msgspec.field(
        default_factory=list)


class SynthesisReply(Reply, frozen=True):
    answer: str


class RerankReply(Reply, frozen=True):
    # Numbers outside the memories, and anything but integers, are left out when read.
    order: list[Annotated[object, Meta(extra_json_schema={"type": "integer"})]]


PLAN_SCHEMA = reply_schema(PlanReply)
SYNTHESIS_SCHEMA = reply_schema(SynthesisReply)
RERANK_SCHEMA = reply_schema(RerankReply)


@dataclass(frozen=True, slots=True)
class Plan:
    """How to search: which kind of memory the query wants, and topic tags to route by."""

    mode: str
    tags: tuple[str, ...]


def plan_request(*, query: str) -> LLMRequest:
    return task_request(
        "recall_plan",
        system="You route queries to an agent's long-term memory.",
        instructions=(
            "Classify what the query asks of memory. mode: 'episodic' for what happened "
            "(events, when something was done), 'semantic' for facts and preferences, "
            "'procedural' for how to do something, 'mixed' when unsure. tags: 1 to 8 short "
            "lower-case topic labels (names, things, activities) that memories about the "
            "answer would be filed under; no question words."
        ),
        inputs={"query": query},
        schema=PLAN_SCHEMA,
        max_tokens=256,
    )


def parse_plan(response: LLMResponse) -> Plan:
    """Raises ValueError when the reply is not a plan."""
    plan = read_reply(response, PlanReply, "recall_plan")
    return Plan(plan.mode, tuple(t.strip().lower() for t in plan.tags if t.strip())[:8])


def synthesis_request(*, query: str, memories: list[str]) -> LLMRequest:
    return task_request(
        "recall_synthesis",
        system="You answer from an agent's memories only.",
        instructions=(
            "Answer the query using only the numbered memories. Be brief; cite memory numbers "
            "in brackets. If they do not contain the answer, say so."
        ),
        inputs={"query": query, "memories": [f"[{i}] {m}" for i, m in enumerate(memories, 1)]},
        schema=SYNTHESIS_SCHEMA,
        max_tokens=512,
    )


def parse_synthesis(response: LLMResponse) -> str:
    try:
        answer = read_reply(response, SynthesisReply, "recall_synthesis").answer.strip()
    except ValueError:
        answer = ""
    if answer:
        return answer
    if response.text.strip():
        return response.text.strip()
    raise ValueError("a synthesis needs a non-empty answer")


def rerank_request(*, query: str, memories: list[str]) -> LLMRequest:
    return task_request(
        "recall_rerank",
        system="You rank an agent's memories by how much they help answer a query.",
        instructions=(
            "Order the numbered memories from most to least useful for answering the query: "
            "those that hold the answer or a part of it (a date, a name, one step of a "
            "multi-step answer) first. order: the memory numbers, best first; leave out none."
        ),
        inputs={"query": query, "memories": [f"[{i}] {m}" for i, m in enumerate(memories, 1)]},
        schema=RERANK_SCHEMA,
        max_tokens=16 + 6 * len(memories),
    )


def parse_rerank(response: LLMResponse) -> list[int]:
    """The reply's order as 0-based indexes (its numbers are 1-based; what is not an integer
    is dropped).

    Raises ValueError when the reply holds no order."""
    order = read_reply(response, RerankReply, "recall_rerank").order
    return [n - 1 for n in order if isinstance(n, int) and not isinstance(n, bool)]


def full_order(order: Sequence[object], count: int) -> list[int]:
    """Every index below `count` once: those of `order` first (strangers and repeats
    dropped), then the ones it left out, in their old order."""
    chosen = dict.fromkeys(
        i for i in order if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < count)
    return [*chosen, *(i for i in range(count) if i not in chosen)]


@dataclass(frozen=True, slots=True)
class LLMReranker:
    """The `Reranker` a model makes: one call (task "recall_rerank") per recall, its prompt
    one snippet per candidate."""

    llm: LLM

    async def rerank(self, query: str, texts: Sequence[str]) -> list[int]:
        return await ask(self.llm, rerank_request(query=query, memories=list(texts)),
                         parse_rerank)
