"""`calls.tasks.ask`: the re-ask of an unusable reply, and `unusable`: a reply that stays
unusable once the task's re-asks are spent stands for it (a reward's neutral 0.5); a failure of
the LLM itself still raises."""

from __future__ import annotations

import pytest

import mnemo
from mnemo.calls.tasks import ask, task_request
from mnemo.ports import LLMRequest, LLMResponse

REQUEST = task_request("reward", system="s", instructions="i", inputs={})


class Replies:
    """An LLM that answers every call with `reply`, or raises it."""

    def __init__(self, reply: LLMResponse | Exception) -> None:
        self.reply = reply
        self.calls = 0
        self.requests: list[LLMRequest] = []

    async def generate(self, request: LLMRequest) -> LLMResponse:
        self.calls += 1
        self.requests.append(request)
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply


def unreadable(response: LLMResponse) -> float:
    raise ValueError("not a number")


async def test_a_reply_unusable_after_the_re_ask_stands_for_the_given_value(
    caplog: pytest.LogCaptureFixture,
) -> None:
    llm = Replies(LLMResponse(text="very good"))
    assert await ask(llm, REQUEST, unreadable, unusable=0.5) == 0.5
    assert llm.calls == 2  # asked, then re-asked once
    assert any("unusable" in r.getMessage() for r in caplog.records)
    with pytest.raises(mnemo.LLMReplyError):
        await ask(Replies(LLMResponse(text="very good")), REQUEST, unreadable)


async def test_an_adapters_refused_reply_stands_for_it_and_a_failed_call_raises() -> None:
    refused = Replies(mnemo.LLMReplyError("did not match its schema"))
    assert await ask(refused, REQUEST, unreadable, unusable=0.5) == 0.5
    with pytest.raises(mnemo.LLMReplyError):
        await ask(refused, REQUEST, unreadable)
    with pytest.raises(mnemo.LLMError) as failed:
        await ask(Replies(mnemo.LLMError("HTTP 503")), REQUEST, unreadable, unusable=0.5)
    assert not isinstance(failed.value, mnemo.LLMReplyError)


async def test_the_re_ask_shows_the_reply_and_its_problem_unless_it_was_empty() -> None:
    """The re-ask adds the model's reply and the reader's problem to the request; an empty
    reply is asked again as it was (a provider refuses an empty turn)."""
    said = Replies(LLMResponse(text="very good"))
    with pytest.raises(mnemo.LLMReplyError):
        await ask(said, REQUEST, unreadable)
    assert said.requests[1].messages[-2:] == [
        {"role": "assistant", "content": "very good"},
        {"role": "user", "content": "Your reply could not be used: not a number. Reply again."},
    ]
    silent = Replies(LLMResponse(text=""))
    with pytest.raises(mnemo.LLMReplyError):
        await ask(silent, REQUEST, unreadable)
    assert silent.requests[1] == silent.requests[0]
