"""Generation speed of llama.cpp's `llama-server` by its thread count, on this machine as it is.

    .venv/bin/python scripts/bench_server_threads.py --llama-python PYTHON [--threads default,1,2]

Starts the server of `bench_real_model.py` (SmolLM2-135M, one slot) once per thread count and
prints, as a Markdown table, the tokens a second of three 64-token replies and the load
average. Run it while other work keeps the machine busy to see what a busy laptop gets.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_real_model import locate, server


def speeds(binary: Path, model: Path, threads: str) -> list[float]:
    found = []
    with server(binary, model, 2048, 1, None if threads == "default" else int(threads)) as url:
        for i in range(3):
            reply = httpx.post(f"{url}/chat/completions", timeout=600, json={
                "messages": [{"role": "user", "content": f"Write a long story about cat {i}."}],
                "max_tokens": 64, "temperature": 0.2}).json()
            found.append(round(float(reply["timings"]["predicted_per_second"]), 1))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-python", default=sys.executable)
    parser.add_argument("--threads", default="default,1,2")
    args = parser.parse_args()
    binary, model, _ = locate(args.llama_python)
    print("| server threads | tokens a second (3 replies) | load average (1 min) |")
    print("| --- | --- | --- |")
    for threads in args.threads.split(","):
        found = speeds(binary, model, threads)
        print(f"| {threads} | {', '.join(map(str, found))} | {os.getloadavg()[0]:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
