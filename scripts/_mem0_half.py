"""The mem0 half of `scripts/bench_mem0.py`, run by mem0's own interpreter (never mnemo's venv).

Reads a JSON job on stdin: {"url", "dir", "sentences", "queries", "exact"}; adds every sentence
to a fresh mem0 2.2.1 `Memory` with `infer=False` (one `add` per sentence: embedded by the fake
server, written to the local Qdrant store and the history database, no LLM call), then times
`search` (top_k=10) over the queries, then the query embedding alone, and writes one JSON line
of results on stdout. It imports only mem0 and the standard library, so it runs in
/work/mem0-venv.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("MEM0_TELEMETRY", "False")

from mem0 import Memory  # after the telemetry switch, which mem0 reads at import

USER = "bench"


def main() -> None:
    job = json.load(sys.stdin)
    folder = job["dir"]
    dim = int(job.get("dim", 384))
    config = {
        "vector_store": {
            "provider": "qdrant",
            "config": {"collection_name": "bench", "path": os.path.join(folder, "qdrant"),
                       "embedding_model_dims": dim, "on_disk": True},
        },
        "embedder": {
            "provider": "openai",
            "config": {"model": "fake-embed", "api_key": "not-used",
                       "openai_base_url": job["url"], "embedding_dims": dim},
        },
        "llm": {
            "provider": "openai",
            "config": {"model": "fake-chat", "api_key": "not-used",
                       "openai_base_url": job["url"]},
        },
        "history_db_path": os.path.join(folder, "history.db"),
    }
    memory = Memory.from_config(config)
    add_ms: list[float] = []
    ids: dict[str, str] = {}
    for sentence in job["sentences"]:
        started = time.perf_counter()
        out = memory.add([{"role": "user", "content": sentence}], user_id=USER, infer=False)
        add_ms.append((time.perf_counter() - started) * 1000)
        for item in out.get("results", []):
            ids[item["id"]] = sentence
    filters = {"user_id": USER}
    for query in job["queries"][:5]:
        memory.search(query, top_k=10, filters=filters)
    search_ms: list[float] = []
    for query in job["queries"]:
        started = time.perf_counter()
        memory.search(query, top_k=10, filters=filters)
        search_ms.append((time.perf_counter() - started) * 1000)
    # The query embedding alone (one HTTP round trip through mem0's OpenAI embedder): the part
    # of a search that a search embedding its query over the same server cannot go under.
    embed_ms: list[float] = []
    for query in job["queries"]:
        started = time.perf_counter()
        memory.embedding_model.embed(query, "search")
        embed_ms.append((time.perf_counter() - started) * 1000)
    first = 0
    for query in job["exact"]:
        results = memory.search(query, top_k=10, filters=filters).get("results", [])
        if results and results[0].get("memory") == query:
            first += 1
    json.dump({"add_ms": add_ms, "search_ms": search_ms, "embed_ms": embed_ms,
               "exact_first": first, "exact_total": len(job["exact"])}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
