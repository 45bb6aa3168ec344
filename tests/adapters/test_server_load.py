"""Sessions against servers that behave like real ones under load: a few slots and a queue
for the rest, requests of clients that gave up still worked on (tests/adapters/provider_server.py).

A model served locally (llama.cpp's server, Ollama) answers one request at a time by default;
the adapter must learn that and never build a queue that outlasts its timeout.
"""

from __future__ import annotations

import anyio
import pytest

import mnemo
from mnemo import NodeType
from mnemo.adapters.openai import OpenAICompatible
from tests.adapters.provider_server import ProviderServer
from tests.fakes import FakeEmbedder

REPO = "r"
# Six topics, one step each: the server's subgoal is the observation's first word, so each
# step is a trajectory of its own.
TOPICS = [
    ("nginx returns 502 on the blog", "bind gunicorn to port 8000"),
    ("postgres refuses connections above 100 clients", "put pgbouncer in front"),
    ("certbot says the certificate expires in 3 days", "run certbot renew"),
    ("backups of the wiki stopped on Monday", "restart the cron job"),
    ("disk on the build host is 95 percent full", "prune old docker images"),
    ("upload tests fail when the network is slow", "raise the client timeout"),
]


async def _session(server: ProviderServer, *, request_timeout: float) -> list[mnemo.Node]:
    """Runs the six-topic session through a new adapter; the facts it committed."""
    llm = OpenAICompatible("m", base_url=server.openai_url, timeout=request_timeout)
    async with llm, mnemo.Memory(":memory:", llm=llm, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        sid = await mem.start_session("keep the servers healthy", repo=REPO)
        for observation, action in TOPICS:
            await mem.append(sid, observation, action)
        await mem.close_and_commit(sid)
        return await mem.get_nodes_by_type(REPO, [NodeType.SEMANTIC])


@pytest.mark.slow
async def test_a_one_slot_server_gets_every_fact_at_little_more_than_the_calls_needed() -> None:
    """A server of one slot answering in 0.25 s, an adapter timeout of 1.25 s: the session
    commits all six facts, and the server sees at most 1.25 times the requests the same
    session sends to a server with room (a fixed eight in flight queued past the timeout,
    and the retries piled on)."""
    with ProviderServer() as roomy:
        facts = await _session(roomy, request_timeout=1.25)
        needed = len(roomy.requests)
    assert len(facts) == len(TOPICS)
    with ProviderServer(slots=1, latency=0.25) as one_slot:
        facts = await _session(one_slot, request_timeout=1.25)
        sent = len(one_slot.requests)
        assert one_slot.max_in_flight == 1
    assert sorted(f.text for f in facts) == sorted(
        f"The agent observed: {observation}" for observation, _ in TOPICS
    )
    assert sent <= 1.25 * needed


async def test_a_refused_mode_and_the_servers_concurrency_are_remembered_for_the_repo(
    store: str,
) -> None:
    """A server that refuses json_schema refuses one request of the first adapter (the others
    wait for that one to settle the mode, a burst of them got five refusals), and none of
    the next adapter's, made for the same repo in a new Memory; that one also starts at the
    concurrency the first learned."""
    with ProviderServer(json_schema=False) as server:
        first = OpenAICompatible("m", base_url=server.openai_url, max_concurrency=16)
        async with first, mnemo.Memory(store, llm=first, embedder=FakeEmbedder()) as mem:
            await mem.open_repo(REPO)
            sid = await mem.start_session("keep the servers healthy", repo=REPO)
            for observation, action in TOPICS:
                await mem.append(sid, observation, action)
            await mem.close_and_commit(sid)
            learned = first.concurrency.current
        assert [r.mode for r in server.requests].count("json_schema") == 1
        assert first.structured_mode == "tool"
        assert learned > 2
        second = OpenAICompatible("m", base_url=server.openai_url, max_concurrency=16)
        async with second, mnemo.Memory(store, llm=second, embedder=FakeEmbedder()) as mem:
            await mem.open_repo(REPO)
            assert second.structured_mode == "tool"
            assert second.concurrency.current == learned
            sid = await mem.start_session("again", repo=REPO)
            await mem.append(sid, *TOPICS[0])
        assert [r.mode for r in server.requests].count("json_schema") == 1


async def test_a_burst_to_a_server_that_refuses_the_mode_gets_one_refusal() -> None:
    """Five structured requests at once from a new adapter to a server that refuses
    json_schema: one tries the mode and is refused, the other four wait for it and go out as
    tool calls (each paid the refusal, as retries, and a resumed extraction five at once)."""
    with ProviderServer(json_schema=False) as server:
        async with OpenAICompatible("m", base_url=server.openai_url) as llm:
            request = mnemo.LLMRequest(
                "reward", "", [{"role": "user", "content": "how did it go?"}],
                schema={"type": "object", "properties": {"reward": {"type": "number"}},
                        "required": ["reward"]},
            )
            async with anyio.create_task_group() as tg:
                for _ in range(5):
                    tg.start_soon(llm.generate, request)
        modes = [r.mode for r in server.requests]
    assert modes.count("json_schema") == 1
    assert modes.count("tool") == 5
