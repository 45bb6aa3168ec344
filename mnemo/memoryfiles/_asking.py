"""How the memory-file tasks ask the model: each ask within `LLM_TIMEOUT_S`, usage summed, and
a prompt the model's context refuses asked again smaller."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

import anyio

from mnemo.calls import tasks
from mnemo.calls.retry import LimitedLLM, fail_after
from mnemo.errors import LLMContextError, LLMTimeout
from mnemo.ports import LLM, LLMRequest, LLMResponse, Usage, add_usage

T = TypeVar("T")

log = logging.getLogger("mnemo")

LLM_TIMEOUT_S = 120.0


class CountingLLM(LimitedLLM):
    """`llm`, one call at a time under its own retry policy, summing in `usage` the tokens of
    every reply and the calls, retries and re-asks of every task (a failed call included)."""

    def __init__(self, llm: LLM) -> None:
        super().__init__(llm, anyio.CapacityLimiter(1), self._add)
        self.usage: Usage | None = None

    def _add(self, usage: Usage) -> None:
        self.usage = add_usage(self.usage, usage)


async def ask(llm: LLM, request: LLMRequest, parse: Callable[[LLMResponse], T], *,
              shorten: Callable[[LLMRequest], LLMRequest | None] | None = None) -> T:
    """`calls.tasks.ask` (with `shorten`) within `LLM_TIMEOUT_S` (LLMError, LLMTimeout)."""
    try:
        with fail_after(LLM_TIMEOUT_S):
            return await tasks.ask(llm, request, parse, shorten=shorten)
    except TimeoutError as exc:
        raise LLMTimeout(
            f"the LLM did not answer task {request.task!r} within {LLM_TIMEOUT_S:g} s") from exc


async def ask_fitting(llm: LLM, requests: Sequence[LLMRequest],
                      parse: Callable[[LLMResponse], T]) -> T:
    """`ask` the first of `requests` (each smaller than the one before), and the next while the
    model's context refuses them (`LLMContextError` when the last did not fit either); `ask`
    shortens none of them itself."""
    *larger, smallest = requests
    for request in larger:
        try:
            return await ask(llm, request, parse, shorten=lambda _: None)
        except LLMContextError:
            log.warning("task %s: the prompt did not fit the model's context; asking with "
                        "smaller inputs", request.task)
    return await ask(llm, smallest, parse, shorten=lambda _: None)
