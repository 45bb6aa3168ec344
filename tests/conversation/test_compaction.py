"""Automatic summaries and compactions saved by hand: no summary's content is lost."""

from __future__ import annotations

import pytest

import mnemo
from mnemo.conversation.prompts import CHARS_PER_WORD
from mnemo.conversation.viewport import snapshot_words
from tests.conversation._support import OfflineFake, user
from tests.fakes import FakeEmbedder

MANUAL = "MANUAL: the deploy password rotates on fridays"


@pytest.mark.parametrize("manual", [(1, 2), (0, 2)], ids=["inside", "rolled-in"])
async def test_summary_keeps_a_compaction_it_replaces(
    cmem: mnemo.Memory, offline: OfflineFake, manual: tuple[int, int]
) -> None:
    """An automatic summary whose range holds a save_compaction record (inside it, or the
    previous record it rolls in) gets that record's text in its request, and load still
    shows what the record said, in the one summary standing for the range."""
    conv = cmem.conversation(compression=mnemo.Summary(max_tokens=60, keep=1))
    history = [user(f"m{i} routine chatter about nothing much") for i in range(4)]
    await conv.save("t", history)
    await conv.save_compaction("t", *manual, MANUAL)
    history += [
        user(f"m{i} more routine chatter about the weather and lunch plans today")
        for i in range(4, 12)
    ]
    await conv.save("t", history)

    records = await conv.compactions("t")
    assert [(c.start_seq, c.end_seq) for c in records] == [(0, 10)]
    [request] = [r for r in offline.calls if r.task == "summary"]
    assert MANUAL in str(request.messages), "the replaced record was not summarised"
    loaded = await conv.load("t")
    summaries = [str(m["content"]) for m in loaded if m["role"] == "system"]
    assert len(summaries) == 1
    assert "password rotates on fridays" in summaries[0]
    assert loaded[1:] == history[11:]


class Verbose:
    """The offline LLM, except that its summaries and folds ignore max_tokens (as data, or as
    prose in `text`)."""

    def __init__(self, as_text: bool) -> None:
        self.offline = OfflineFake()
        self.as_text = as_text

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        if request.task not in ("summary", "snapshot_fold"):
            return await self.offline.generate(request)
        long = "the deploy went fine " * 30_000
        return mnemo.LLMResponse(text=long) if self.as_text else mnemo.LLMResponse(
            data={"summary": long})


@pytest.mark.parametrize("as_text", [False, True], ids=["data", "text"])
async def test_a_summary_past_its_words_is_clipped(store: str, as_text: bool) -> None:
    """A summary or a fold longer than its request's bound is stored clipped to it."""
    async with mnemo.Memory(store, llm=Verbose(as_text), embedder=FakeEmbedder()) as mem:
        conv = mem.conversation(compression=mnemo.Summary(max_tokens=60, keep=1))
        await conv.save("t", [user(f"m{i} routine chatter about the weather") for i in range(12)])
        [record] = await conv.compactions("t")
        assert 0 < len(record.summary_text) <= CHARS_PER_WORD * 48
        await conv.save("f", [user(f"message {i} says plain things here") for i in range(200)])
        folded = [(await mem.evict("f", token_budget=4000)).folded for _ in range(5)][-1]
        assert folded is not None
        assert 0 < len(folded.text) <= CHARS_PER_WORD * snapshot_words(4000, 2)
