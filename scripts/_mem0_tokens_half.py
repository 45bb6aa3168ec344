"""The mem0 half of `scripts/bench_mem0_tokens.py`, run by mem0's own interpreter.

Reads a JSON job on stdin: {"url", "dir", "messages"}; adds each message to a fresh mem0 2.2.1
`Memory` as one user message with inference on (its default: fact extraction, then the memory
update decision), through the OpenAI-compatible server at `url` for both the chat model and
the embeddings, and writes one JSON line on stdout: the seconds each add took and any error.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("MEM0_TELEMETRY", "False")

from mem0 import Memory  # after the telemetry switch, which mem0 reads at import


def main() -> None:
    job = json.load(sys.stdin)
    folder = job["dir"]
    memory = Memory.from_config({
        "vector_store": {"provider": "qdrant", "config": {
            "collection_name": "tokens", "path": os.path.join(folder, "qdrant"),
            "embedding_model_dims": 384, "on_disk": True}},
        "embedder": {"provider": "openai", "config": {
            "model": "fake-embed", "api_key": "not-used", "openai_base_url": job["url"],
            "embedding_dims": 384}},
        "llm": {"provider": "openai", "config": {
            "model": "smollm2", "api_key": "not-used", "openai_base_url": job["url"],
            "temperature": 0.2}},
        "history_db_path": os.path.join(folder, "history.db"),
    })
    seconds, errors = [], []
    for message in job["messages"]:
        started = time.perf_counter()
        try:
            memory.add([{"role": "user", "content": message}], user_id="bench")
        except Exception as exc:  # reported; the run goes on
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
        seconds.append(time.perf_counter() - started)
    print(json.dumps({"seconds": seconds, "errors": errors}))


if __name__ == "__main__":
    main()
