"""How the memory-file tasks ask the model: each ask within `LLM_TIMEOUT_S`, usage summed."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from mnemo import deadline
from mnemo.calls import tasks
from mnemo.errors import LLMTimeout
from mnemo.ports import LLM, LLMRequest, LLMResponse, Usage

T = TypeVar("T")

LLM_TIMEOUT_S = 120.0


class Metered:
    """An LLM wrapper that sums the usage of every reply, retries included."""

    def __init__(self, llm: LLM) -> None:
        self._llm = llm
        self.usage: Usage | None = None

    async def generate(self, request: LLMRequest) -> LLMResponse:
        response = await self._llm.generate(request)
        if response.usage is not None:
            self.usage = response.usage if self.usage is None else self.usage + response.usage
        return response


async def ask(
    llm: LLM,
    request: LLMRequest,
    parse: Callable[[LLMResponse], T],
    *,
    shorten: Callable[[LLMRequest], LLMRequest | None] | None = None,
) -> T:
    """`calls.tasks.ask` (with `shorten`) within `LLM_TIMEOUT_S`.

    Raises:
        LLMError: as `calls.tasks.ask`.
        LLMTimeout: no usable answer within `LLM_TIMEOUT_S` seconds.
    """
    try:
        with deadline.fail_after(LLM_TIMEOUT_S):
            return await tasks.ask(llm, request, parse, shorten=shorten)
    except TimeoutError as exc:
        raise LLMTimeout(
            f"the LLM did not answer task {request.task!r} within {LLM_TIMEOUT_S:g} s"
        ) from exc
