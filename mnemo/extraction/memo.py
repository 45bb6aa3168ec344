"""`TaskMemo`: the validated result of each extraction task, kept with its episode, so a retry
re-asks only what failed; a result is reused only for the same trajectory, task and request."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass
from typing import TypeVar

from mnemo.calls.retry import book, policy_of, task_budget
from mnemo.calls.tasks import ask
from mnemo.ports import LLM, LLMRequest, LLMResponse, Usage

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class KeptResult:
    """One task's reply that passed validation, and what asking for it cost (as stored)."""

    trajectory_id: str
    task: str
    digest: str
    text: str
    data: object
    cost: Usage

    def reply_json(self) -> str:
        return json.dumps({"text": self.text, "data": self.data}, sort_keys=True, default=str)

    def cost_json(self) -> str:
        cost = self.cost
        return json.dumps(
            {"calls": cost.calls, "input_tokens": cost.input_tokens,
             "output_tokens": cost.output_tokens},
            sort_keys=True)

    @classmethod
    def from_json(cls, trajectory_id: str, task: str, digest: str, reply: str,
                  cost: str) -> KeptResult:
        answer, spent = json.loads(reply), json.loads(cost)
        return cls(
            trajectory_id, task, digest, str(answer.get("text") or ""), answer.get("data"),
            Usage(int(spent["input_tokens"]), int(spent["output_tokens"]),
                  calls=int(spent["calls"])))


@dataclass(slots=True)
class _Fresh:
    """A result kept by this memo, its request hashed once it is needed."""

    trajectory_id: str
    request: LLMRequest
    text: str
    data: object
    cost: Usage
    hashed: KeptResult | None = None

    def kept(self) -> KeptResult:
        if self.hashed is None:
            self.hashed = KeptResult(self.trajectory_id, self.request.task,
                                     request_digest(self.request), self.text, self.data,
                                     self.cost)
        return self.hashed


class TaskMemo:
    """Validated task results of one episode, by (trajectory id, task, request digest)."""

    def __init__(self, episode_id: str, kept: Iterable[KeptResult] = ()) -> None:
        self.episode_id = episode_id
        self._kept: dict[tuple[str, str, str], KeptResult] = {}
        self._tasks: set[tuple[str, str]] = set()
        self._fresh: dict[tuple[str, str], list[_Fresh]] = {}
        self._unsaved: list[_Fresh] = []
        for result in kept:
            self._add(result)

    def _add(self, result: KeptResult) -> None:
        self._kept[(result.trajectory_id, result.task, result.digest)] = result
        self._tasks.add((result.trajectory_id, result.task))

    def _hashed(self, task: tuple[str, str]) -> None:
        """Hashes the fresh results of `task` (trajectory id, task) into the kept ones."""
        for fresh in self._fresh.pop(task, ()):
            self._add(fresh.kept())

    def unsaved(self) -> list[KeptResult]:
        """The results kept since the last call (the caller stores them)."""
        found, self._unsaved = self._unsaved, []
        for fresh in found:
            self._hashed((fresh.trajectory_id, fresh.request.task))
        return [fresh.kept() for fresh in found]

    def __len__(self) -> int:
        return len(self._kept) + sum(len(fresh) for fresh in self._fresh.values())

    async def ask(self, llm: LLM, trajectory_id: str, request: LLMRequest,
                  parse: Callable[[LLMResponse], T], *, unusable: T | None = None,
                  any_reply: bool = False) -> T:
        """The parsed reply to `request` for `trajectory_id`: the kept one (its cost booked as
        saved), else asked through `calls.tasks.ask` and kept (LLMError as `ask`)."""
        task = (trajectory_id, request.task)
        if task in self._fresh:
            self._hashed(task)
        kept = self._kept.get((*task, request_digest(request))) if task in self._tasks else None
        if kept is not None:
            with suppress(ValueError):  # kept under another parser's rules: ask again
                value = parse(LLMResponse(text=kept.text, data=kept.data))
                book(llm, Usage(
                    saved_calls=kept.cost.calls, saved_input_tokens=kept.cost.input_tokens,
                    saved_output_tokens=kept.cost.output_tokens))
                return value
        passed: list[LLMResponse] = []
        spent = Usage()  # the tokens of every reply read

        def keep(response: LLMResponse) -> T:
            nonlocal spent
            spent += response.usage or Usage()
            parsed = parse(response)
            passed.append(response)
            return parsed

        # Opened here so that `ask` and the adapter join this budget.
        with task_budget(policy_of(llm)) as budget:
            before = budget.calls
            value = await ask(llm, request, keep, unusable=unusable, any_reply=any_reply)
            calls = budget.calls - before
        if not passed:
            return value
        reply = passed[-1]
        fresh = _Fresh(trajectory_id, request, reply.text, reply.data,
                       Usage(spent.input_tokens, spent.output_tokens, calls=calls))
        self._fresh.setdefault(task, []).append(fresh)
        self._unsaved.append(fresh)
        return value


def request_digest(request: LLMRequest) -> str:
    """A digest of everything the model is given: the same digest, the same question."""
    payload = json.dumps(
        [request.task, request.system, request.messages, request.schema, request.tools,
         request.max_tokens],
        sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()
