"""`LimitedLLM`: an LLM whose calls wait for a slot of their provider's limiter and whose
usage is booked; `slot` takes a limiter's token without a trip through the event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext

import anyio

from mnemo.calls import deadline
from mnemo.calls.retry import RetryPolicy, policy_of, task_budget
from mnemo.ports import LLM, LLMRequest, LLMResponse, Usage


class LimitedLLM:
    """An LLM whose calls each wait for a slot of its provider's limiter
    (`Config.llm_concurrency`), and whose replies' usage goes to `meter`, with the calls
    (retries and re-asks among them) each `generate` charged to its task's budget; each
    `generate` runs inside `calling()`, when given (who waits on the calls sees them under
    way)."""

    def __init__(
        self,
        llm: LLM,
        slots: anyio.CapacityLimiter,
        meter: Callable[[Usage], None] | None = None,
        calling: Callable[[], AbstractContextManager[None]] | None = None,
    ) -> None:
        self._llm, self._slots, self._meter = llm, slots, meter
        self._calling = calling or nullcontext

    @property
    def retry_policy(self) -> RetryPolicy:
        """The wrapped LLM's policy (`mnemo.calls.retry.policy_of`)."""
        return policy_of(self._llm)

    async def generate(self, request: LLMRequest) -> LLMResponse:
        with task_budget(self.retry_policy) as budget, self._calling():
            before = budget.counts()
            try:
                async with slot(self._slots):
                    response = await self._llm.generate(request)
            finally:
                # Booked even when the call failed: a 429 storm's calls were spent all the same.
                budget.charge_bare(before)
                if self._meter is not None:
                    calls, retries, re_asks = budget.counts()
                    self._meter(Usage(calls=calls - before[0], retries=retries - before[1],
                                      re_asks=re_asks - before[2]))
        if self._meter is not None and response.usage is not None:
            self._meter(response.usage)
        return response


def book(llm: LLM, usage: Usage) -> None:
    """Books `usage` that no reply carried (what a retry saved) on `llm`'s meter, when `llm` is
    a metered `LimitedLLM`; otherwise there is nowhere to book it."""
    if isinstance(llm, LimitedLLM) and llm._meter is not None:
        llm._meter(usage)


@asynccontextmanager
async def slot(limiter: anyio.CapacityLimiter) -> AsyncIterator[None]:
    """Holds one token of `limiter`, taking a free one without a trip through the event loop
    (anyio's `acquire` always yields once, which the append path would pay per call).
    Waiting for one counts against no deadline (`mnemo.calls.deadline.waiting`)."""
    try:
        limiter.acquire_nowait()
    except anyio.WouldBlock:
        with deadline.waiting():
            await limiter.acquire()
    try:
        yield
    finally:
        limiter.release()
