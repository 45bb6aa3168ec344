"""Fakes and helpers for the memory-file tests: a ticking clock, recording and slow LLMs."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio

import mnemo
from mnemo.adapters.offline import OfflineLLM

USAGE = mnemo.Usage(input_tokens=10, output_tokens=5, cost=0.01)


class Clock:
    """A clock that moves one second forward every time it is read."""

    def __init__(self) -> None:
        self.now = datetime(2025, 1, 1, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


class RecordingLLM:
    """An LLM that records every request and answers through the offline LLM (with usage),
    unless a test scripts a reply, makes it fail, or makes it answer garbage."""

    def __init__(self) -> None:
        self.calls: list[mnemo.LLMRequest] = []
        self.reply: Callable[[mnemo.LLMRequest], Any] | None = None
        self.fail = False
        self.garbage = False
        self._offline = OfflineLLM()

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        self.calls.append(request)
        if self.fail:
            raise RuntimeError("provider down")
        if self.garbage:
            return mnemo.LLMResponse(text="I think you should remember things.", usage=USAGE)
        if self.reply is not None:
            return mnemo.LLMResponse(data=self.reply(request), usage=USAGE)
        answer = await self._offline.generate(request)
        return mnemo.LLMResponse(data=answer.data, usage=USAGE)


class SlowOffline:
    """The offline LLM, answering after `delay` seconds, so concurrent writers would overlap
    if they did not take turns."""

    def __init__(self, delay: float = 0.01) -> None:
        self.delay = delay
        self._offline = OfflineLLM()

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        await anyio.sleep(self.delay)
        return await self._offline.generate(request)


def snapshot(directory: Path) -> dict[str, str]:
    """Every file in `directory` (hidden ones included) and its text."""
    if not directory.exists():
        return {}
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(directory.iterdir())}


def stamps(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file in `directory` (lock files included): its bytes and modification time."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in directory.iterdir()}


def user(*texts: str) -> list[dict[str, str]]:
    """A history of user messages, each answered by a short assistant message."""
    history: list[dict[str, str]] = []
    for text in texts:
        history.append({"role": "user", "content": text})
        history.append({"role": "assistant", "content": "Let me look into that."})
    return history


def write(path: Path, text: str) -> None:
    """Writes `text` to `path` as a person would, creating its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
