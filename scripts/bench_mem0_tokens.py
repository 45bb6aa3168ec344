"""Model calls and tokens per remembered message: mnemo beside mem0 2.2.1, with one real model.

Both remember the same 20 short messages (`bench_real_model.MESSAGES`), one at a time, through
one llama.cpp server running SmolLM2-135M-Instruct (started here as `bench_real_model.py`
does, one slot). Between them and the server sits a proxy on 127.0.0.1 that forwards every
chat request and counts what the server's replies report (`usage.prompt_tokens`,
`completion_tokens`); it answers embeddings itself with mnemo's `HashEmbedder(384)` (the
server runs no embedding model), so only chat calls are counted.

- mnemo: `Memory.ingest` of a one-step trajectory per message, `OpenAICompatible` with its
  defaults but `temperature=0.2`.
- mem0 2.2.1 (`--mem0-python`, default /work/mem0-venv/bin/python: `python3 -m venv
  /work/mem0-venv && /work/mem0-venv/bin/pip install mem0ai==2.2.1`): `Memory.add` of one user
  message with its default inference (fact extraction, then the add/update/delete decision),
  through `scripts/_mem0_tokens_half.py`.

Run: `.venv/bin/python scripts/bench_mem0_tokens.py --llama-python /work/llama-venv/bin/python
[--messages 20] [--context 4096]`. mem0's fact-extraction prompt alone is about 8,600 tokens,
past a 4,096-token context (the server refuses it with HTTP 400) and SmolLM2's trained 8,192:
`--context 16384` lets it through. Takes minutes (each call decodes on two CPU cores).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anyio
import httpx
from _bench import facts_table, machine_facts, markdown_table
from bench_real_model import MESSAGES, locate, server
from rich.console import Console

import mnemo
from mnemo.adapters.embeddings import OpenAIEmbedder
from mnemo.adapters.hashing import HashEmbedder
from mnemo.adapters.openai import OpenAICompatible

console = Console()


class Counts:
    """What the proxy saw, under a lock (the proxy answers on threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.totals: Counter[str] = Counter()

    def add(self, **values: int) -> None:
        with self.lock:
            self.totals.update(values)

    def take(self) -> Counter[str]:
        with self.lock:
            taken, self.totals = self.totals, Counter()
            return taken


def proxy(upstream: str, counts: Counts) -> ThreadingHTTPServer:
    """A proxy on 127.0.0.1: chat completions forwarded to `upstream` and counted,
    embeddings answered with `HashEmbedder(384)`."""
    embedder = HashEmbedder(384)
    client = httpx.Client(base_url=upstream, timeout=900)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path.endswith("/embeddings"):
                texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
                vectors = anyio.run(embedder.embed, texts)
                reply = {"object": "list", "model": "fake-embed", "data": [
                    {"object": "embedding", "index": i, "embedding": [float(x) for x in v]}
                    for i, v in enumerate(vectors)]}
                status = 200
            else:
                response = client.post("/chat/completions", json=body)
                status, reply = response.status_code, response.json()
                usage = reply.get("usage") or {}
                counts.add(calls=1, prompt=int(usage.get("prompt_tokens") or 0),
                           completion=int(usage.get("completion_tokens") or 0),
                           failed=int(status != 200))
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


async def mnemo_side(url: str, messages: list[str]) -> tuple[float, int]:
    llm = OpenAICompatible("smollm2", base_url=url, temperature=0.2)
    embedder = OpenAIEmbedder("fake-embed", base_url=url, dim=384)
    failures = 0
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        async with llm, mnemo.Memory(Path(folder) / "m.db", llm=llm, embedder=embedder) as mem:
            await mem.open_repo("tokens")
            for i, message in enumerate(messages):
                try:
                    await mem.ingest("tokens", mnemo.Trajectory(
                        "remember", [mnemo.Step(message, "Noted.")]), source_id=f"m{i}")
                except mnemo.MnemoError as exc:
                    failures += 1
                    console.log(f"mnemo ingest {i} failed: {exc}"[:200])
    return time.perf_counter() - started, failures


def mem0_side(python: str, url: str, messages: list[str]) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as folder:
        job = json.dumps({"url": url, "dir": folder, "messages": messages})
        started = time.perf_counter()
        done = subprocess.run([python, str(Path(__file__).parent / "_mem0_tokens_half.py")],
                              input=job, capture_output=True, text=True, check=True)
        took = time.perf_counter() - started
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for error in result["errors"]:
        console.log(f"mem0 add failed: {error}")
    return took, len(result["errors"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-python", default=sys.executable)
    parser.add_argument("--mem0-python", default="/work/mem0-venv/bin/python")
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--context", type=int, default=4096,
                        help="the server's context in tokens (mem0's prompts need over 8,192)")
    args = parser.parse_args()
    binary, model, build = locate(args.llama_python)
    console.print(facts_table({**machine_facts(), "llama-server": build, "model": model.name}))
    messages = MESSAGES[:args.messages]
    counts = Counts()
    rows = []
    with server(binary, model, args.context, 1) as upstream:
        httpd = proxy(upstream, counts)
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        for name in ("mnemo", "mem0 2.2.1"):
            if name == "mnemo":
                took, failed = anyio.run(mnemo_side, url, messages)
            else:
                took, failed = mem0_side(args.mem0_python, url, messages)
            seen = counts.take()
            n = len(messages)
            rows.append([name, f"{seen['calls'] / n:.2f}", f"{seen['prompt'] / n:,.0f}",
                         f"{seen['completion'] / n:,.0f}",
                         f"{(seen['prompt'] + seen['completion']) / n:,.0f}",
                         f"{took / n:.1f}", str(failed)])
            console.log(f"{name}: {seen}")
        httpd.shutdown()
    console.rule("Summary (Markdown, for BENCHMARKS.md)")
    console.print(markdown_table(
        ["per remembered message", "chat calls", "prompt tokens", "completion tokens",
         "tokens", "seconds", "failed (of all)"], rows), markup=False)


if __name__ == "__main__":
    main()
