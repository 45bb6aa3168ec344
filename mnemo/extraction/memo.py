"""`TaskMemo`: the validated result of each extraction task, kept with its episode.

An extraction asks several tasks per trajectory (semantic, procedural, the optional return
scoring) and one for the episode (the last step's deferred reward). When one of them fails, the
others' results stay here, so the retry (`commit` on a failed session, `close_and_commit`'s
retries, the next auto-commit flush) re-asks only what failed (issue 13, item 5). A result is
found again only for the same trajectory, task and request (`request_digest`): when a step or
an earlier result changed, the request differs and the task is asked anew.

What a kept result cost when it was asked is booked again, as saved, each time a retry uses it
(`Usage.saved_calls`, `saved_input_tokens`, `saved_output_tokens`; see `Memory.usage`).

The memo lives in memory, with the session (`mnemo.session.service`); a `Memory` reopened on
the store asks everything again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, cast

from mnemo.ports import LLM, LLMRequest, LLMResponse, Usage, ask, book
from mnemo.retry import policy_of, task_budget

T = TypeVar("T")

# (trajectory id, task, digest of the request)
Key = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class _Kept:
    value: object
    cost: Usage


class TaskMemo:
    """Validated task results of one episode, by (trajectory id, task, request digest)."""

    def __init__(self, episode_id: str) -> None:
        self.episode_id = episode_id
        self._kept: dict[Key, _Kept] = {}

    def __len__(self) -> int:
        return len(self._kept)

    async def ask(
        self,
        llm: LLM,
        trajectory_id: str,
        request: LLMRequest,
        parse: Callable[[LLMResponse], T],
    ) -> T:
        """The parsed reply to `request` for `trajectory_id`: the kept one (booking its cost
        as saved on `llm`'s meter), else asked through `ports.ask` and kept.

        Raises:
            LLMError: as `ports.ask`; nothing is kept then.
        """
        key = (trajectory_id, request.task, request_digest(request))
        kept = self._kept.get(key)
        if kept is not None:
            book(llm, Usage(
                saved_calls=kept.cost.calls,
                saved_input_tokens=kept.cost.input_tokens,
                saved_output_tokens=kept.cost.output_tokens,
            ))
            return cast(T, kept.value)
        tokens = _Tokens(llm)
        # Opened here so that `ask` and the adapter join this budget: its count of calls
        # (retries and re-asks included) is what the task cost.
        with task_budget(policy_of(llm)) as budget:
            before = budget.calls
            value = await ask(tokens, request, parse, policy=budget.policy)
            calls = budget.calls - before
        self._kept[key] = _Kept(
            value, Usage(tokens.input_tokens, tokens.output_tokens, calls=calls)
        )
        return value


class _Tokens:
    """Passes calls through to `llm`, summing the tokens its replies report."""

    def __init__(self, llm: LLM) -> None:
        self._llm = llm
        self.input_tokens = 0
        self.output_tokens = 0

    async def generate(self, request: LLMRequest) -> LLMResponse:
        response = await self._llm.generate(request)
        if response.usage is not None:
            self.input_tokens += response.usage.input_tokens
            self.output_tokens += response.usage.output_tokens
        return response


def request_digest(request: LLMRequest) -> str:
    """A digest of everything the model is given: the same digest, the same question."""
    payload = json.dumps(
        [request.task, request.system, request.messages, request.schema, request.tools,
         request.max_tokens],
        sort_keys=True, ensure_ascii=False, default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()
