"""`persist` over real HTTP with a model that rewrites or replaces the statement: the file keeps
the statement's own words."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import mnemo
from mnemo.adapters.openai import OpenAICompatible
from tests.adapters.provider_server import Answer, ProviderServer

STATEMENT = "The blog runs on port 8000 behind nginx."


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as s:
        yield s


def _llm(server: ProviderServer) -> OpenAICompatible:
    return OpenAICompatible("m", base_url=server.openai_url, api_key="k", max_retries=0)


async def test_an_invented_entry_is_replaced_by_the_statement(
    server: ProviderServer, tmp_path: Path
) -> None:
    """A model that answers with text of its own (as SmolLM2-135M did) chooses the topic, but
    the file holds the statement as given, not the invented entry."""
    server.script(Answer(data={
        "topic": "web server", "description": "How the blog is served",
        "entry": "The user enjoys long walks and prefers the color blue.",
    }))
    files = mnemo.MemoryFiles(tmp_path / "memory")
    async with _llm(server) as llm:
        stored = await files.persist(STATEMENT, llm=llm)
    assert stored.topic == "web server"
    assert STATEMENT in stored.content
    assert "walks" not in stored.content
    assert server.tasks() == ["memory_persist"]


async def test_a_faithful_rewording_is_kept(server: ProviderServer, tmp_path: Path) -> None:
    """An entry that keeps the statement's content (its words, a name for "I") is filed as
    the model wrote it."""
    server.script(Answer(data={
        "topic": "code style", "description": "How the user wants code written",
        "entry": "The user prefers tabs over spaces in Python code.",
    }))
    files = mnemo.MemoryFiles(tmp_path / "memory")
    async with _llm(server) as llm:
        stored = await files.persist("I prefer tabs over spaces in Python code.", llm=llm)
    assert "The user prefers tabs over spaces in Python code." in stored.content
