"""Threads with an embedder that learns its dimension from its first reply (no repo opened)."""

from __future__ import annotations

import hashlib
import json

import httpx

import mnemo
from tests.conversation._support import assistant, user

DIM = 8


class Embeddings:
    """An OpenAI embeddings endpoint answering plain float lists of `DIM` (a hash of the text),
    recording each request's inputs."""

    def __init__(self) -> None:
        self.inputs: list[list[str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        texts = json.loads(request.content)["input"]
        self.inputs.append(texts)
        data = [
            {"index": i, "embedding": [b / 255 for b in hashlib.sha256(t.encode()).digest()[:DIM]]}
            for i, t in enumerate(texts)
        ]
        usage = {"prompt_tokens": 1, "total_tokens": 1}
        return httpx.Response(200, json={"data": data, "usage": usage})


async def test_semantic_load_detects_the_dimension(store: str) -> None:
    """An OpenAIEmbedder without `dim` on a Memory with no repo open: a Semantic load with a
    query learns the dimension from a reply and picks by similarity, rather than raising."""
    server = Embeddings()
    embedder = mnemo.OpenAIEmbedder(
        "m", base_url="http://x/v1", transport=httpx.MockTransport(server)
    )
    async with mnemo.Memory(store, embedder=embedder) as mem:
        await mem.conversation().save("t", [user("the cat sat"), assistant("ok dog")])
        assert server.inputs == [], "Recent retrieval embeds nothing"
        semantic = mem.conversation(retrieval=mnemo.Semantic(k=1))
        loaded = await semantic.load("t", query="the cat sat")
    assert loaded == [user("the cat sat")]
    assert embedder.dim == DIM
    assert sorted(t for batch in server.inputs for t in batch).count("the cat sat") == 2


async def test_semantic_save_embeds_with_an_unknown_dimension(store: str) -> None:
    """A Semantic save embeds its new messages with the first reply (the dimension comes from
    it, no probe), and a later load embeds nothing again."""
    server = Embeddings()
    embedder = mnemo.OpenAIEmbedder(
        "m", base_url="http://x/v1", transport=httpx.MockTransport(server)
    )
    async with mnemo.Memory(store, embedder=embedder) as mem:
        semantic = mem.conversation(retrieval=mnemo.Semantic(k=1))
        await semantic.save("t", [user("the cat sat"), assistant("ok dog")])
        assert server.inputs == [["the cat sat", "ok dog"]]
        assert await semantic.load("t", query="ok dog") == [assistant("ok dog")]
    assert server.inputs == [["the cat sat", "ok dog"], ["ok dog"]]
