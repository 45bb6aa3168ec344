"""Fixtures for the memory-file tests: a ticking clock, a recording LLM, a files directory."""

from __future__ import annotations

from pathlib import Path

import pytest

import mnemo
from tests.memoryfiles.fakes import Clock, RecordingLLM


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def llm() -> RecordingLLM:
    return RecordingLLM()


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    return tmp_path / "memory"


@pytest.fixture
def files(directory: Path, clock: Clock) -> mnemo.MemoryFiles:
    return mnemo.MemoryFiles(directory, clock=clock)
