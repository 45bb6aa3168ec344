"""Recall's model tasks, each optional: the plan (`Config.recall_planner="llm"`), the
re-ranking (`LLMReranker`, or any `Reranker`) and the synthesis (`Config.recall_synthesis`).
One that fails never fails the recall: it is named in `RecallResult.degraded`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec

from mnemo.calls.schema import Meta, Reply, bounded, items, most_tokens, reply_schema, text
from mnemo.calls.tasks import ask, read_reply, task_request
from mnemo.ports import LLM, LLMRequest, LLMResponse, Reranker
from mnemo.recall.model import Recalled
from mnemo.recall.query import Plan

log = logging.getLogger("mnemo")


class PlanReply(Reply, frozen=True):
    mode: Literal["episodic", "semantic", "procedural", "mixed"]
    # At most 8 asked; more are cut when read, never a reason to refuse the plan.
    tags: Annotated[list[Annotated[str, text(32)]], items(8)] = msgspec.field(
        default_factory=list)


class SynthesisReply(Reply, frozen=True):
    answer: Annotated[str, text(1500)]  # "brief": about 250 words


class RerankReply(Reply, frozen=True):
    # Numbers outside the memories, and anything but integers, are left out when read; as
    # many as the memories asked (`rerank_request`).
    order: list[Annotated[object, Meta(extra_json_schema={"type": "integer"})]]


PLAN_SCHEMA, SYNTHESIS_SCHEMA = reply_schema(PlanReply), reply_schema(SynthesisReply)


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
        max_tokens=most_tokens(PLAN_SCHEMA),
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
        max_tokens=most_tokens(SYNTHESIS_SCHEMA),
    )


def parse_synthesis(response: LLMResponse) -> str:
    with suppress(ValueError):
        if answer := read_reply(response, SynthesisReply, "recall_synthesis").answer.strip():
            return answer
    if text := response.text.strip():
        return text
    raise ValueError("a synthesis needs a non-empty answer")


def rerank_request(*, query: str, memories: list[str]) -> LLMRequest:
    schema, max_tokens = bounded(reply_schema(RerankReply), "order", len(memories), most=None)
    return task_request(
        "recall_rerank",
        system="You rank an agent's memories by how much they help answer a query.",
        instructions=(
            "Order the numbered memories from most to least useful for answering the query: "
            "those that hold the answer or a part of it (a date, a name, one step of a "
            "multi-step answer) first. order: the memory numbers, best first; leave out none."
        ),
        inputs={"query": query, "memories": [f"[{i}] {m}" for i, m in enumerate(memories, 1)]},
        schema=schema,
        max_tokens=max_tokens,
    )


def parse_rerank(response: LLMResponse) -> list[int]:
    """The reply's order as 0-based indexes (its numbers are 1-based; non-integers dropped);
    ValueError when the reply holds no order."""
    order = read_reply(response, RerankReply, "recall_rerank").order
    return [n - 1 for n in order if isinstance(n, int) and not isinstance(n, bool)]


def full_order(order: Sequence[object], count: int) -> list[int]:
    """Every index below `count` once: those of `order` first (strangers and repeats dropped),
    then the rest in their old order."""
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


async def reranked(reranker: Reranker | None, query: str, ranked: list[Recalled], k: int,
                   degraded: list[str]) -> list[Recalled]:
    """`ranked` in the reranker's order, cut to `k`; the retrieval's order when it fails."""
    if len(ranked) < 2 or reranker is None:
        return ranked[:k]
    try:
        given = await reranker.rerank(query, [r.node.text for r in ranked])
        order = full_order(list(given), len(ranked))
    except Exception as exc:  # optional: the retrieval's order stands without it
        log.warning("recall re-ranking failed: %r", exc)
        degraded.append(f"rerank: {exc!r}")
        return ranked[:k]
    return [ranked[i] for i in order][:k]


async def synthesis(llm: LLM, query: str, ranked: list[Recalled], degraded: list[str]
                    ) -> str | None:
    """The model's answer from the memories; None without them, or when it fails."""
    if not ranked:
        return None
    try:
        request = synthesis_request(query=query, memories=[r.node.text for r in ranked])
        return await ask(llm, request, parse_synthesis, any_reply=True)
    except Exception as exc:
        log.warning("recall synthesis failed: %r", exc)
        degraded.append(f"synthesis: {exc!r}")
        return None


async def planned(planner: LLM, query: str, degraded: list[str]) -> Plan:
    """The model's plan of `query`; when it fails, mixed mode without tags."""
    try:
        return await ask(planner, plan_request(query=query), parse_plan)
    except Exception as exc:
        log.warning("recall planning failed, searching in mixed mode: %r", exc)
        degraded.append(f"plan: {exc!r}")
        return Plan("mixed", ())
