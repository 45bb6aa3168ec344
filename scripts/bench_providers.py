"""Sessions and ingests against simulated providers: how long they take and how many requests
the server sees, against what they need.

Every LLM call goes over a real socket to the fake provider of `tests/adapters/provider_server.py`,
which here behaves like a real server under load: it answers `slots` requests at once and
queues the rest, each reply takes a base latency plus its tokens at the profile's speed (4
characters a token), and a request whose client gave up is still worked on to its end. The
adapter is `OpenAICompatible` with its defaults (no timeout set, `max_concurrency` 8, the
concurrency adapting below it); the embedder is the in-process `HashEmbedder`.

Profiles: hosted API (32 slots, 0.4 s + 60 tokens/s), local GPU (4 slots, 80
tokens/s), local CPU (1 slot, 15 tokens/s). For each:

1. an 8-step session of 4 topics (2 steps each): appends, then close to ready (timed from
   `close` to the "ready" transition), and the whole session's wall time;
2. 20 one-step ingests, one after another;
3. the requests the server received against the requests the same work needs (the count
   against a fake server with room that answers at once).

Run: `.venv/bin/python scripts/bench_providers.py [--quick] [--profiles hosted,gpu,cpu]`;
`--quick` runs 5 ingests instead of 20. The CPU profile's requests make most of a full
run. Measure an older checkout with `PYTHONPATH=<its root>`: the
script appends its own root to `sys.path` only to borrow the fake provider.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
from _bench import facts_table, machine_facts, markdown_table
from rich.console import Console

import mnemo
from mnemo.adapters.openai import OpenAICompatible

sys.path.append(str(Path(__file__).resolve().parent.parent))
from tests.adapters.provider_server import ProviderServer

console = Console()
REPO = "bench"
TOPICS = ("nginx returns 502 on the blog", "postgres refuses connections",
          "certbot says the certificate expires", "backups of the wiki stopped")
MESSAGES = tuple(f"{topic} again, note {i}" for i in range(5) for topic in TOPICS)


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    slots: int
    latency: float
    tokens_per_second: float


PROFILES = {
    "hosted": Profile("hosted API", 32, 0.4, 60.0),
    "gpu": Profile("local GPU", 4, 0.0, 80.0),
    "cpu": Profile("local CPU", 1, 0.0, 15.0),
}


@dataclass(slots=True)
class Run:
    close_s: float = 0.0
    session_s: float = 0.0
    session_requests: int = 0
    ingests_s: float = 0.0
    ingest_requests: int = 0
    failures: int = 0


async def workload(server: ProviderServer, ingests: int) -> Run:
    """The session, then the ingests, through one new adapter and Memory."""
    run = Run()
    ready = anyio.Event()

    def on_event(event: mnemo.Event) -> None:
        if event.kind == "transition" and event.data.get("to") in ("ready", "failed"):
            ready.set()

    llm = OpenAICompatible("bench", base_url=server.openai_url)
    async with llm, mnemo.Memory(":memory:", llm=llm, embedder=mnemo.HashEmbedder(),
                                 on_event=on_event) as mem:
        await mem.open_repo(REPO)
        started = time.perf_counter()
        sid = await mem.start_session("keep the servers healthy", repo=REPO)
        for topic in TOPICS:
            for step in range(2):
                await mem.append(sid, f"{topic}, look {step}", f"check {topic.split()[0]}")
        close = time.perf_counter()
        await mem.close(sid)
        await ready.wait()
        run.close_s = time.perf_counter() - close
        if await mem.session_state(sid) is mnemo.State.READY:
            await mem.commit(sid)
        else:
            run.failures += 1
        run.session_s = time.perf_counter() - started
        run.session_requests = len(server.requests)
        started = time.perf_counter()
        for i in range(ingests):
            trajectory = mnemo.Trajectory("remember", [mnemo.Step(MESSAGES[i], "noted")])
            try:
                await mem.ingest(REPO, trajectory, source_id=f"m{i}")
            except mnemo.PipelineError:
                run.failures += 1
        run.ingests_s = time.perf_counter() - started
        run.ingest_requests = len(server.requests) - run.session_requests
    return run


async def measure(profile: Profile, ingests: int) -> tuple[Run, Run]:
    """(the run on the profile's server, the run on a server with room)."""
    with ProviderServer() as roomy:
        needed = await workload(roomy, ingests)
    with ProviderServer(slots=profile.slots, latency=profile.latency,
                        tokens_per_second=profile.tokens_per_second) as server:
        console.log(f"{profile.name}: running")
        run = await workload(server, ingests)
    return run, needed


def rows(results: dict[str, tuple[Run, Run]], ingests: int) -> list[list[str]]:
    out = []
    for key, (run, needed) in results.items():
        profile = PROFILES[key]
        sent = run.session_requests + run.ingest_requests
        need = needed.session_requests + needed.ingest_requests
        out.append([
            f"{profile.name} ({profile.slots} slot{'s' if profile.slots > 1 else ''})",
            f"{run.close_s:.1f}", f"{run.session_s:.1f}", f"{run.ingests_s:.1f}",
            f"{run.ingest_requests / max(ingests, 1):.1f}",
            f"{sent}/{need} ({sent / max(need, 1):.2f}x)", str(run.failures),
        ])
    return out


HEADERS = ["profile", "close-to-ready s", "8-step session s", "ingests s",
           "requests per ingest", "requests sent/needed", "failures"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 ingests instead of 20")
    parser.add_argument("--profiles", default="hosted,gpu,cpu")
    args = parser.parse_args()
    ingests = 5 if args.quick else 20
    console.print(facts_table(machine_facts()))
    results = {key: anyio.run(measure, PROFILES[key], ingests)
               for key in args.profiles.split(",")}
    console.rule(f"Summary (Markdown, for BENCHMARKS.md), {ingests} ingests")
    console.print(markdown_table(HEADERS, rows(results, ingests)), markup=False)


if __name__ == "__main__":
    main()
