"""The HTTP path's own cost: one chat call through mnemo against a bare httpx POST.

Every call goes over a real socket to the fake provider of `tests/adapters/provider_server.py`
on 127.0.0.1, which answers at once, so what is timed is the client side plus the server's
fixed cost (the same for every row). One call at a time, `--calls` of each kind after a
warm-up, interleaved so that load on the machine hits every kind alike. Two clocks: the wall
time of a call, and the CPU time of the event loop's thread during it (`time.thread_time`),
which is the client's own work: the server answers from other threads, and waiting on the
socket costs no CPU, so it holds steady when other work shares the machine and wall times
do not.

- `bare httpx`: `httpx.AsyncClient.post(json=...)` and `response.json()` over httpx's own
  connection pool (httpcore);
- `httpx over Pool`: the same over mnemo's `Pool` (aiohttp's connection pool), the floor of
  what mnemo sends;
- `Transport.post_json`: mnemo's transport (retry budget, concurrency cap, rate gate, attempt
  timeout, over `Pool`) on the same payload;
- `OpenAICompatible.generate`: the whole adapter on a "reward" task (payload building, the
  reply's JSON decoded and validated against the task's schema, usage).

Then the same kinds in bursts, as a close sends them: 32 calls at once then 16, the server
answering each after `--latency` (100 ms), `--bursts` times; client CPU per call is the event
loop thread's CPU over a pair of bursts divided by 48. httpx's own pool scans every pooled
connection on each request and reply, so its cost per call grows with the calls in flight.

`--hide-sniffio` runs the same with `sniffio` unimportable, as when mnemo did not declare it:
httpcore then retries `import sniffio`, a failed import that scans
sys.path, on every connection-pool operation.

Run: `.venv/bin/python scripts/bench_transport.py [--calls 2000] [--hide-sniffio]`.
With no `--hide-sniffio` it also runs itself with it, in a subprocess, and prints
both tables.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from statistics import mean, median
from types import ModuleType
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class _HideSniffio(importlib.abc.MetaPathFinder):
    """Makes `import sniffio` fail the way a missing package does: a scan of sys.path."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name == "sniffio":
            importlib.machinery.PathFinder.find_spec("sniffio_is_not_installed", None)
            raise ModuleNotFoundError("No module named 'sniffio'", name=name)
        return None


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--bursts", type=int, default=20)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--hide-sniffio", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")
    return parser.parse_args()


async def _measure(calls: int, warmup: int, bursts: int, latency: float
                   ) -> dict[str, dict[str, list[float]]]:
    import httpx

    from mnemo.adapters._http import Transport
    from mnemo.adapters._pool import Pool
    from mnemo.adapters.openai import Completion, OpenAICompatible
    from mnemo.episode import reward_request
    from mnemo.errors import LLMError
    from tests.adapters.provider_server import ProviderServer

    request = reward_request(goal="serve the site", subgoal="configure nginx",
                             observation="nginx listens on 8080",
                             action="curl localhost:8080", next_observation="200 OK")
    with ProviderServer() as server:
        async with (
            httpx.AsyncClient(
                base_url=server.openai_url,
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
            ) as bare,
            httpx.AsyncClient(base_url=server.openai_url,
                              transport=Pool(max_connections=64)) as pooled,
            Transport(server.openai_url, name="bench", error=LLMError, max_concurrency=64,
                      concurrency=64) as transport,
            OpenAICompatible("m", base_url=server.openai_url, max_concurrency=64,
                             concurrency=64) as llm,
        ):
            payload = llm._payload(request, "json_schema", request.schema)

            async def httpx_post() -> None:
                response = await bare.post("/chat/completions", json=payload)
                response.raise_for_status()
                response.json()

            async def pooled_post() -> None:
                response = await pooled.post("/chat/completions", json=payload)
                response.raise_for_status()
                response.json()

            async def transport_post() -> None:
                await transport.post_json("/chat/completions", payload, Completion)

            async def generate() -> None:
                await llm.generate(request)

            kinds: dict[str, Callable[[], Awaitable[None]]] = {
                "bare httpx": httpx_post,
                "httpx over Pool": pooled_post,
                "Transport.post_json": transport_post,
                "OpenAICompatible.generate": generate,
            }
            times: dict[str, dict[str, list[float]]] = {
                kind: {"wall": [], "cpu": []} for kind in kinds
            }
            for i in range(warmup + calls):
                for kind, call in kinds.items():
                    start, cpu = time.perf_counter(), time.thread_time()
                    await call()
                    if i >= warmup:
                        times[kind]["wall"].append(time.perf_counter() - start)
                        times[kind]["cpu"].append(time.thread_time() - cpu)
            server.latency = latency
            for kind in kinds:
                times[kind]["burst_cpu"] = []
            for i in range(bursts + 2):
                for kind, call in kinds.items():
                    cpu = time.thread_time()
                    for size in (32, 16):
                        async with anyio.create_task_group() as tg:
                            for _ in range(size):
                                tg.start_soon(call)
                    if i >= 2:
                        times[kind]["burst_cpu"].append((time.thread_time() - cpu) / 48)
    return times


def _table(times: dict[str, dict[str, list[float]]], title: str) -> str:
    floor = median(times["bare httpx"]["cpu"])
    lines = [
        f"{title}",
        "",
        "| path | wall p50 µs | wall mean µs | client CPU p50 µs | CPU over bare httpx |"
        " bursts of 32 + 16: client CPU a call, p50 µs |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for kind, clocks in times.items():
        cpu = median(clocks["cpu"])
        lines.append(
            f"| {kind} | {median(clocks['wall']) * 1e6:,.0f} | {mean(clocks['wall']) * 1e6:,.0f}"
            f" | {cpu * 1e6:,.0f} | {(cpu - floor) * 1e6:+,.0f} µs ({cpu / floor:.2f}x) |"
            f" {median(clocks['burst_cpu']) * 1e6:,.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    args = _parse()
    if args.hide_sniffio:
        sys.modules.pop("sniffio", None)
        sys.meta_path.insert(0, _HideSniffio())
    times = anyio.run(_measure, args.calls, args.warmup, args.bursts, args.latency)
    if args.json:
        print(json.dumps(times))
        return
    label = "sniffio hidden" if args.hide_sniffio else "sniffio importable"
    print(_table(times, f"{args.calls} sequential calls each, {label}"))
    if not args.hide_sniffio:
        hidden = subprocess.run(
            [sys.executable, __file__, "--calls", str(args.calls), "--warmup",
             str(args.warmup), "--bursts", str(args.bursts), "--latency", str(args.latency),
             "--hide-sniffio", "--json"],
            check=True, capture_output=True, text=True,
        )
        other: dict[str, Any] = json.loads(hidden.stdout)
        print()
        print(_table(other, f"{args.calls} sequential calls each, sniffio hidden"))


if __name__ == "__main__":
    main()
