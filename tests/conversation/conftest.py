"""Fixtures for the conversation tests: a Memory on the offline LLM (with failure controls)
and the one-hot fake embedder, and a manual clock."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import mnemo
from tests.conversation._support import ManualClock, OfflineFake
from tests.fakes import FakeEmbedder


@pytest.fixture
def offline() -> OfflineFake:
    return OfflineFake()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def cmem(
    offline: OfflineFake, embedder: FakeEmbedder, store: str
) -> AsyncIterator[mnemo.Memory]:
    async with mnemo.Memory(store, llm=offline, embedder=embedder) as m:
        yield m
