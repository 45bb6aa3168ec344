"""`update` over real HTTP: a reply that leaves out its optional keys is filed, and the usage
counts the model calls made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import mnemo
from mnemo.adapters.openai import OpenAICompatible
from tests.adapters.provider_server import Answer, Fail, ProviderServer
from tests.memoryfiles.fakes import user

DECIDED = "We decided to deploy on Tuesdays with gunicorn on port 8000."


def _llm(server: ProviderServer, **options: Any) -> OpenAICompatible:
    return OpenAICompatible("m", base_url=server.openai_url, api_key="k", **options)


async def test_a_loose_reply_is_filed(tmp_path: Path) -> None:
    """A model in JSON mode without a grammar leaves out `signals`, `description` and `remove`:
    its entries are written, from one call, and the usage counts that call."""
    files = mnemo.MemoryFiles(tmp_path / "memory", min_iterations=1)
    with ProviderServer(shapes="loose", json_schema=False, tools=False) as server:
        async with _llm(server, structured="json") as llm:
            result = await files.update(user(DECIDED), llm=llm, iterations=3)
    assert result.error is None
    assert result.written == [f.topic for f in files.list()] != []
    assert DECIDED in files.list()[0].content
    assert server.tasks() == ["memory_update"]
    assert result.usage is not None
    assert result.usage.calls == 1


@pytest.mark.parametrize("signals", [None, []], ids=["missing", "empty"])
async def test_a_change_without_signals_is_filed(
    tmp_path: Path, signals: list[str] | None
) -> None:
    """`signals` is optional: a change without them (left out or empty) adds its entries, and
    removes none."""
    files = mnemo.MemoryFiles(tmp_path / "memory", min_iterations=1)
    await files.persist("Deploys use npm.", llm=None)
    (before,) = files.list()
    change: dict[str, Any] = {"topic": before.topic, "content": "- Always use pnpm.",
                              "remove": ["Deploys use npm."]}
    if signals is not None:
        change["signals"] = signals
    with ProviderServer() as server:
        server.script(Answer(data={"files": [change]}))
        async with _llm(server) as llm:
            result = await files.update(user("Always use pnpm."), llm=llm, iterations=3)
    assert result.error is None
    assert result.written == [before.topic]
    assert files.list()[0].content == "- Deploys use npm.\n- Always use pnpm.\n"
    assert server.tasks() == ["memory_update"]


async def test_usage_counts_retries_and_re_asks(tmp_path: Path) -> None:
    """An update whose first reply is a 500 and whose second is unusable counts the three
    calls it made, one a retry and one a re-ask."""
    files = mnemo.MemoryFiles(tmp_path / "memory", min_iterations=1)
    with ProviderServer() as server:
        server.script(Fail(500), Answer(data={"files": "none"}))
        async with _llm(server, retry=mnemo.RetryPolicy(max_calls=3, max_re_asks=1)) as llm:
            result = await files.update(user(DECIDED), llm=llm, iterations=3)
    assert result.error is None
    assert result.written
    assert result.usage is not None
    assert (result.usage.calls, result.usage.retries, result.usage.re_asks) == (3, 1, 1)
    assert len(server.requests) == 3


async def test_the_adapters_retry_policy_holds(tmp_path: Path) -> None:
    """An adapter that may make one call gives up after a 500, and the update reports that
    call in its usage."""
    files = mnemo.MemoryFiles(tmp_path / "memory", min_iterations=1)
    with ProviderServer() as server:
        server.script(Fail(500))
        async with _llm(server, max_retries=0) as llm:
            result = await files.update(user(DECIDED), llm=llm, iterations=3)
    assert result.error is not None
    assert "500" in result.error
    assert len(server.requests) == 1
    assert result.usage is not None
    assert result.usage.calls == 1
