"""`update` with a small model over real HTTP to the local fake server: a context of 4,096
tokens, replies cut at max_tokens, a model that writes as long as its schema lets it, prompts
refused as longer than the context. The update still writes, and loses no entry."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import mnemo
from mnemo.adapters.openai import OpenAICompatible
from mnemo.calls.tasks import task_inputs
from mnemo.memoryfiles import _select
from mnemo.memoryfiles.prompts import MAX_NEW_CHARS, MAX_UPDATE_FILES
from mnemo.ports import JSONObject
from tests.adapters.provider_server import LONGEST, Answer, ProviderServer, Recorded
from tests.memoryfiles.fakes import write

CONTEXT = 4096  # SmolLM2-135M as llama.cpp's server ran it (`-c 4096`, one slot)
MESSAGES = [f"Message {i}: we decided the service number {i} runs on port {8000 + i}."
            for i in range(10)]


def _llm(server: ProviderServer) -> OpenAICompatible:
    return OpenAICompatible("m", base_url=server.openai_url, api_key="k", max_retries=0)


def _history(texts: list[str]) -> list[dict[str, str]]:
    return [{"role": "user", "content": text} for text in texts]


def _file(directory: Path, topic: str, entries: int) -> list[str]:
    """Writes a topic file of `entries` entries (about 3,200 characters for 30); returns them."""
    lines = [f"- {topic} fact {i}: the {topic} setting number {i} is {'x' * 70}."
             for i in range(entries)]
    write(directory / f"{topic}.md",
          f'---\ntopic: "{topic}"\ndescription: "About {topic}"\n---\n' + "\n".join(lines) + "\n")
    return lines


def _inputs(request: Recorded) -> JSONObject:
    return task_inputs(mnemo.LLMRequest("memory_update", "", request.messages))


async def test_a_model_that_writes_to_its_bounds_fits_a_small_context(tmp_path: Path) -> None:
    """A model writing the longest reply the schema allows (a small model running on under
    the server's grammar) ends within the request's max_tokens and the context: one call, and
    the update writes."""
    files = mnemo.MemoryFiles(tmp_path / "memory")
    with ProviderServer(context=CONTEXT) as server:
        server.answer_task("memory_update", Answer(data=LONGEST))
        async with _llm(server) as llm:
            result = await files.update(_history(MESSAGES), llm=llm, iterations=10)
        statuses, (request,) = server.statuses, server.requests
    assert result.error is None
    assert statuses == [200]
    assert len(result.written) == 1  # the longest reply names one topic four times
    (stored,) = files.list()
    assert len(stored.content) <= MAX_NEW_CHARS + 3
    assert request.body["max_tokens"] < CONTEXT // 2
    assert request.body["response_format"]["json_schema"]["schema"]["properties"]["files"][
        "maxItems"] == MAX_UPDATE_FILES


async def test_files_too_long_for_the_context_are_shown_in_part_and_lose_nothing(
    tmp_path: Path,
) -> None:
    """Four files of 3,200 characters are more than a 4,096-token context holds: the update
    asks again showing about half of their text (the newest entries), and every entry the
    model was not shown stays in its file beside the new ones."""
    directory = tmp_path / "memory"
    kept = {topic: _file(directory, topic, 30) for topic in ("alpha", "beta", "gamma", "delta")}
    files = mnemo.MemoryFiles(directory)
    reply = {"files": [{"topic": "alpha", "description": "About alpha", "signals": ["decision"],
                        "content": "- alpha runs on port 9000.", "remove": []}]}
    with ProviderServer(context=CONTEXT) as server:
        server.answer_task("memory_update", Answer(data=reply))
        async with _llm(server) as llm:
            result = await files.update(_history(MESSAGES), llm=llm, iterations=10)
        requests = server.requests
    assert result.error is None
    assert result.written == ["alpha"]
    assert len(requests) == 2
    first, second = (json.dumps(r.messages) for r in requests)
    assert len(second) < 0.75 * len(first)
    shown = _inputs(requests[1])["files"]
    assert isinstance(shown, list)
    assert any("content" in f and "fact 29" in f["content"] and "fact 0:" not in f["content"]
               for f in shown)
    by_topic = {f.topic: f.content.splitlines() for f in files.list()}
    for topic, lines in kept.items():
        assert by_topic[topic][: len(lines)] == lines
    assert by_topic["alpha"][-1] == "- alpha runs on port 9000."


async def test_a_long_conversation_is_cut_to_its_newest_messages_until_it_fits(
    tmp_path: Path,
) -> None:
    """A conversation the server refuses as longer than its context (HTTP 400) is asked
    again with about half of it, the newest messages, until it fits: one call each."""
    history = _history([f"Note {i}: the build cache of project {i} lives in bucket b{i}."
                        for i in range(400)])
    files = mnemo.MemoryFiles(tmp_path / "memory")
    with ProviderServer(context=CONTEXT) as server:
        async with _llm(server) as llm:
            result = await files.update(history, llm=llm, iterations=10)
        statuses, requests = server.statuses, server.requests
    assert statuses[-1] == 200
    assert set(statuses[:-1]) == {400}
    assert 2 <= len(statuses) <= 6
    sizes = [len(json.dumps(r.messages)) for r in requests]
    assert sizes == sorted(sizes, reverse=True)
    last = _inputs(requests[-1])["conversation"]
    assert isinstance(last, list)
    assert last[-1] == history[-1]
    assert result.error is None
    (stored,) = files.list()
    assert stored.content == f"- {history[-1]['content']}\n"


async def test_a_context_too_small_for_any_prompt_is_reported(tmp_path: Path) -> None:
    """When even the smallest prompt is refused, the update stops after six calls, writes
    nothing and reports the context error."""
    files = mnemo.MemoryFiles(tmp_path / "memory")
    with ProviderServer(context=100) as server:
        async with _llm(server) as llm:
            result = await files.update(_history(MESSAGES), llm=llm, iterations=10)
        statuses = server.statuses
    assert statuses == [400] * 6
    assert result.error is not None
    assert "LLMContextError" in result.error
    assert files.list() == []


def test_views_halve_keeping_the_newest_messages_and_the_most_related_files() -> None:
    """Each smaller view holds about half the text of the one before: the newest messages
    (always the last), the files' names while they fit, then the first files' content cut
    to its newest entries."""
    conversation = _history([f"message {i} " + "y" * 90 for i in range(64)])
    files = [{"topic": f"t{n}", "description": "d",
              "content": "".join(f"- entry {i} {'z' * 40}\n" for i in range(20))}
             for n in range(4)]
    entries = files[0]["content"].splitlines()
    views = list(_select.views(conversation, files))
    assert len(views) == 6
    assert views[0] == (conversation, files)
    said = [sum(len(m["content"]) for m in v[0]) for v in views]
    filed = [sum(len(json.dumps(f)) for f in v[1]) for v in views]
    for before, after in itertools.pairwise(said):
        assert after <= before // 2 + 100
    assert filed == sorted(filed, reverse=True)
    assert filed[-1] < filed[0] // 8
    assert all(len(shown) == len(files) for _, shown in views)
    assert "content" not in views[2][1][1]
    for messages, shown in views:
        assert messages[-1] == conversation[-1]
        assert [f["topic"] for f in shown] == [f["topic"] for f in files][: len(shown)]
        for item in shown:
            lines = item.get("content", "").splitlines()
            assert lines == entries[len(entries) - len(lines):]
