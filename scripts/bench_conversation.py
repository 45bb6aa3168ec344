"""Conversation memory benchmarks: message search at scale, save/load throughput, purge cost.

Every Memory here is a real SQLite file (WAL, `synchronous=NORMAL`) in a temporary
directory, driven through the public API; the LLM is the offline default and the embedder the
default hashed one, so what is measured is mnemo's own work.

1. Search. A file holding N messages (100k and 1M; 10k and 100k with `--quick`) in threads
   of 100 is built directly: mnemo creates the schema, then the rows go in with one
   `executemany` per 50k (the FTS5 index is filled by mnemo's own triggers, so it is the index
   a real file would have). 50 threads are written at a time, their messages interleaved, so
   one thread's messages are spread over 5,000 rows as with concurrent conversations.
   The text is synthetic but shaped like agent conversations: user
   requests, assistant answers and tool output from templates over a few hundred domain words
   (services, hosts, errors, people, numbers, paths), so common words are in most messages and
   names in few. 300 queries of 1 to 3 words, some with AND / NOT, are timed through
   `mem.search_messages(q, limit=5)`, after a warm-up, across all threads and within one
   thread; p50 / p90 / p99 in ms.
2. Save and load. The agent loop: each turn appends a user and an assistant message to the
   history and saves the whole history (so each save stores 2 new messages), over many
   threads; then every thread is loaded with `Recent(10)` and with `Semantic(10)` and a query.
   Throughput in calls/s and messages/s.
3. Erasure. Erasing one 100-message thread from each search file (`purge`), its newest
   message (`pop`) and the five oldest messages of a thread whose ttl just ended them: each
   deletes with `secure_delete` on and merges the whole FTS index so no deleted word
   survives, so its cost grows with the index.

Run: `.venv/bin/python scripts/bench_conversation.py [--quick]`. The full run builds the
1M-message file first (a few minutes); `--quick` takes well under a minute.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
from _bench import Latency, facts_table, machine_facts, markdown_table, ms
from rich.console import Console
from rich.table import Table

import mnemo

console = Console(width=None if sys.stdout.isatty() else 120)

THREAD_SIZE = 100
ACTIVE = 50
BATCH = 50_000
QUERIES = 300
WARMUP = 30


@dataclass(frozen=True, slots=True)
class Sizes:
    search: tuple[int, ...]
    threads: int
    turns: int


FULL = Sizes(search=(100_000, 1_000_000), threads=100, turns=100)
QUICK = Sizes(search=(10_000, 100_000), threads=20, turns=50)

# ---- synthetic conversations --------------------------------------------------------------

SERVICES = """nginx postgres redis kafka kubernetes docker terraform grafana prometheus
elasticsearch rabbitmq celery django flask fastapi react webpack vite node jenkins gitlab
github vault consul envoy istio airflow spark snowflake bigquery s3 lambda cloudfront route53
letsencrypt certbot systemd cron haproxy traefik minio clickhouse mongodb mysql sqlite
memcached sentry datadog pagerduty stripe twilio auth0 keycloak okta""".split()
THINGS = """backup migration deployment rollout certificate invoice report dashboard alert
pipeline cluster replica index schema queue worker cache token session webhook endpoint
container volume snapshot release branch build test config secret quota limit timeout retry
upload export import cronjob firewall gateway proxy bucket table column trigger job build
ticket sprint roadmap budget contract customer order payment refund subscription""".split()
ADJECTIVES = """slow failing stale broken flaky new old primary secondary staging production
nightly weekly encrypted public private internal external expired missing duplicate large
small critical minor urgent blocked healthy degraded""".split()
PEOPLE = """Alice Bob Carol Dave Erin Frank Grace Heidi Ivan Judy Mallory Niaj Olivia Peggy
Rupert Sybil Trent Victor Walter Yara Zoe Priya Mateo Aisha Kenji Lars Ines Omar""".split()
VERBS = """restart check update rotate rebuild migrate deploy roll back scale inspect patch
configure enable disable monitor verify compress archive delete rename tag pin upgrade
downgrade reindex vacuum flush drain cordon""".split()
ERRORS = """connection refused|permission denied|disk full|out of memory|timeout after 30s|
certificate expired|no such host|503 service unavailable|deadlock detected|too many open files|
relation does not exist|authentication failed|rate limit exceeded|segmentation fault""".replace(
    "\n", "").split("|")
FILLER = """I think we should probably look at this again tomorrow morning before the standup.
Let me know if that works for you. Thanks, that makes sense. Can you double check the logs
first? Sounds good to me. I am not sure this is related, but it started after the last
release. We talked about this last week in the planning meeting.""".replace("\n", " ").split(". ")

USER_TEMPLATES = [
    "Can you {verb} the {adj} {thing} on {service}? {person} says it has been {adj} since {day}.",
    "The {service} {thing} is {adj} again, we see {error} in the logs.",
    "Please always {verb} the {thing} before touching {service} in {env}.",
    "{person} asked whether the {thing} for {service} will be ready by {day}.",
    "Why does {service} report {error} when the {thing} runs at {hour}:00?",
    "Actually, I meant the {env} {thing}, not the {adj} one.",
    "Remember that our {service} {thing} lives in {path} on host {host}.",
]
ASSISTANT_TEMPLATES = [
    "I will {verb} the {thing} on {service} now and report back.",
    "The {adj} {thing} on {service} was caused by {error}; I changed the {thing2} limit to {n}.",
    "Done: {service} {thing} in {env} is {adj2} after I ran {verb} on {host}.",
    "I could not {verb} {service} because of {error}. Shall I ask {person}?",
    "Here is the plan: {verb} the {thing}, then {verb2} {service}, then check the {thing2}.",
]
TOOL_TEMPLATES = [
    "$ {command} {service}\n{error} (exit code 1)",
    "$ {command} {service}\nok: {n} {thing}s processed in {ms} ms",
    "{path}: {n} lines, last modified {day} {hour}:00 by {person}",
]
ENVS = ["staging", "production", "dev", "eu-west-1", "us-east-2", "the canary"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "yesterday", "last night"]


def _fill(template: str, rng: random.Random) -> str:
    return template.format(
        verb=rng.choice(VERBS), verb2=rng.choice(VERBS), adj=rng.choice(ADJECTIVES),
        adj2=rng.choice(ADJECTIVES), thing=rng.choice(THINGS), thing2=rng.choice(THINGS),
        service=rng.choice(SERVICES), person=rng.choice(PEOPLE), error=rng.choice(ERRORS),
        day=rng.choice(DAYS), hour=rng.randrange(24), env=rng.choice(ENVS),
        path=f"/srv/{rng.choice(SERVICES)}/{rng.choice(THINGS)}.conf",
        host=f"{rng.choice(SERVICES)}-{rng.randrange(1, 40):02d}.internal",
        n=rng.randrange(2, 5000), ms=rng.randrange(1, 900),
        command=rng.choice(["kubectl get", "systemctl status", "journalctl -u", "psql -c", "curl"]),
    )


def message_text(role: str, rng: random.Random) -> str:
    """One synthetic message of `role` ("user", "assistant" or "tool")."""
    if role == "tool":
        return _fill(rng.choice(TOOL_TEMPLATES), rng)
    templates = USER_TEMPLATES if role == "user" else ASSISTANT_TEMPLATES
    parts = [_fill(rng.choice(templates), rng) for _ in range(rng.choice((1, 1, 2, 2, 3)))]
    if rng.random() < 0.4:
        parts.append(rng.choice(FILLER).strip().rstrip(".") + ".")
    return " ".join(parts)


def roles(rng: random.Random) -> Iterator[str]:
    """user, assistant, sometimes a tool call and its output in between."""
    while True:
        yield "user"
        if rng.random() < 0.3:
            yield "assistant"
            yield "tool"
        yield "assistant"


def make_queries(rng: random.Random, count: int) -> list[str]:
    """1-3 word queries over the same vocabulary, a few with operators."""
    pools = [SERVICES, THINGS, PEOPLE, ADJECTIVES, VERBS]
    queries = []
    for i in range(count):
        words = [rng.choice(rng.choice(pools)) for _ in range(rng.choice((1, 2, 2, 3)))]
        if i % 10 == 0 and len(words) >= 2:
            words.insert(1, rng.choice(["AND", "NOT"]))
        queries.append(" ".join(words))
    return queries


# ---- 1. search ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SearchResult:
    messages: int
    build_s: float
    file_mb: float
    everywhere: Latency
    one_thread: Latency
    mean_hits: float
    purge_s: float
    pop_s: float
    expire_s: float


async def build_file(path: Path, messages: int) -> float:
    """Creates mnemo's schema in `path`, then inserts `messages` rows; returns seconds."""
    async with mnemo.Memory(path):
        pass
    rng = random.Random(messages)
    started = time.perf_counter()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    base = datetime.now(UTC) - timedelta(days=365)
    stamp = 0
    threads = messages // THREAD_SIZE
    rows: list[tuple[object, ...]] = []

    def flush() -> None:
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO messages(id, thread_id, seq, role, text, content, data, recorded_at,"
            " tokens) VALUES (?, ?, ?, ?, ?, NULL, '{}', ?, ?)",
            rows,
        )
        conn.execute("COMMIT")
        rows.clear()

    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO threads(id, next_seq, history_len, boundary_seq, created_at)"
        " VALUES (?, ?, ?, 0, ?)",
        [(f"thread-{t}", THREAD_SIZE, THREAD_SIZE, base.isoformat()) for t in range(threads)],
    )
    conn.execute("COMMIT")
    for first in range(0, threads, ACTIVE):
        # ACTIVE conversations run at a time, their messages interleaved as they would be.
        group = range(first, min(first + ACTIVE, threads))
        kinds = {t: roles(rng) for t in group}
        for seq in range(THREAD_SIZE):
            for t in group:
                role = next(kinds[t])
                text = message_text(role, rng)
                stamp += 1
                at = (base + timedelta(seconds=stamp * 30)).isoformat(timespec="microseconds")
                rows.append((f"msg_{uuid.UUID(int=rng.getrandbits(128)).hex}", f"thread-{t}",
                             seq, role, text, at, len(text) // 4 + 5))
            if len(rows) >= BATCH:
                flush()
    if rows:
        flush()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return time.perf_counter() - started


async def bench_search(tmp: Path, messages: int) -> SearchResult:
    path = tmp / f"search-{messages}.db"
    build_s = await build_file(path, messages)
    rng = random.Random(7)
    queries = make_queries(rng, QUERIES + WARMUP)
    threads = messages // THREAD_SIZE
    everywhere: list[int] = []
    one_thread: list[int] = []
    hits = 0
    async with mnemo.Memory(path) as mem:
        for query in queries[:WARMUP]:
            await mem.search_messages(query)
        for query in queries[WARMUP:]:
            started = time.perf_counter_ns()
            found = await mem.search_messages(query, limit=5)
            everywhere.append(time.perf_counter_ns() - started)
            hits += len(found)
            thread = f"thread-{rng.randrange(threads)}"
            started = time.perf_counter_ns()
            await mem.search_messages(query, thread_id=thread, limit=5)
            one_thread.append(time.perf_counter_ns() - started)
        conv = mem.conversation()
        started_s = time.perf_counter()
        await conv.purge("thread-0")
        purge_s = time.perf_counter() - started_s
        started_s = time.perf_counter()
        await conv.pop("thread-1")
        pop_s = time.perf_counter() - started_s
        # A ttl that has just ended the oldest five messages of a thread: the next read erases.
        fifth = (await conv.raw("thread-2"))[5].recorded_at
        aging = mem.conversation(ttl=3600, clock=lambda: fifth + timedelta(seconds=3600))
        started_s = time.perf_counter()
        left = await aging.count("thread-2")
        expire_s = time.perf_counter() - started_s
        assert left == THREAD_SIZE - 5
    return SearchResult(
        messages=messages,
        build_s=build_s,
        file_mb=path.stat().st_size / 2**20,
        everywhere=Latency.of(everywhere),
        one_thread=Latency.of(one_thread),
        mean_hits=hits / QUERIES,
        purge_s=purge_s,
        pop_s=pop_s,
        expire_s=expire_s,
    )


def search_table(results: list[SearchResult]) -> Table:
    table = Table(title="Search (search_messages, limit 5)")
    for column in ("messages", "file", "build", "all threads p50 / p90 / p99",
                   "one thread p50 / p90 / p99", "hits/query", "purge one thread", "pop",
                   "ttl erases 5"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            f"{r.messages:,}", f"{r.file_mb:,.0f} MB",
            f"{r.build_s:,.0f} s ({r.messages / r.build_s:,.0f}/s)",
            _latency(r.everywhere), _latency(r.one_thread), f"{r.mean_hits:.1f}",
            f"{r.purge_s:,.2f} s", f"{r.pop_s * 1000:,.0f} ms", f"{r.expire_s * 1000:,.0f} ms",
        )
    return table


def _latency(latency: Latency) -> str:
    return " / ".join(ms(v / 1e6) for v in (latency.p50_us, latency.p90_us, latency.p99_us)) + (
        " ms"
    )


# ---- 2. save and load ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ThroughputResult:
    saves: int
    messages: int
    save_s: float
    save: Latency
    recent_loads: int
    recent_s: float
    recent: Latency
    semantic_loads: int
    semantic_s: float
    semantic: Latency


async def bench_save_load(tmp: Path, sizes: Sizes) -> ThroughputResult:
    rng = random.Random(11)
    save_ns: list[int] = []
    recent_ns: list[int] = []
    semantic_ns: list[int] = []
    stored = 0
    async with mnemo.Memory(tmp / "throughput.db") as mem:
        recent = mem.conversation(retrieval=mnemo.Recent(k=10))
        semantic = mem.conversation(retrieval=mnemo.Semantic(k=10))
        histories: dict[str, list[dict[str, str]]] = {
            f"t{i}": [] for i in range(sizes.threads)
        }
        started = time.perf_counter()
        for _ in range(sizes.turns):
            for thread, history in histories.items():
                history.append({"role": "user", "content": message_text("user", rng)})
                history.append({"role": "assistant", "content": message_text("assistant", rng)})
                began = time.perf_counter_ns()
                # Semantic embeds at save, as an app using it would.
                stored += len(await semantic.save(thread, history))
                save_ns.append(time.perf_counter_ns() - began)
        save_s = time.perf_counter() - started
        started = time.perf_counter()
        for thread in histories:
            began = time.perf_counter_ns()
            await recent.load(thread)
            recent_ns.append(time.perf_counter_ns() - began)
        recent_s = time.perf_counter() - started
        started = time.perf_counter()
        for thread in histories:
            began = time.perf_counter_ns()
            await semantic.load(thread, query=make_queries(rng, 1)[0])
            semantic_ns.append(time.perf_counter_ns() - began)
        semantic_s = time.perf_counter() - started
    return ThroughputResult(
        saves=len(save_ns), messages=stored, save_s=save_s, save=Latency.of(save_ns),
        recent_loads=len(recent_ns), recent_s=recent_s, recent=Latency.of(recent_ns),
        semantic_loads=len(semantic_ns), semantic_s=semantic_s, semantic=Latency.of(semantic_ns),
    )


def throughput_rows(r: ThroughputResult, sizes: Sizes) -> list[list[str]]:
    length = 2 * sizes.turns
    return [
        [f"save (2 new messages, Semantic embeds them; {sizes.threads} threads x "
         f"{sizes.turns} turns)",
         f"{r.saves / r.save_s:,.0f} saves/s, {r.messages / r.save_s:,.0f} messages/s",
         _latency_us(r.save)],
        [f"load Recent(10) of a {length}-message thread",
         f"{r.recent_loads / r.recent_s:,.0f} loads/s", _latency_us(r.recent)],
        [f"load Semantic(10) with a query, {length}-message thread",
         f"{r.semantic_loads / r.semantic_s:,.0f} loads/s", _latency_us(r.semantic)],
    ]


def _latency_us(latency: Latency) -> str:
    return f"p50 {latency.p50_us / 1000:,.2f} ms, p99 {latency.p99_us / 1000:,.2f} ms"


def throughput_table(r: ThroughputResult, sizes: Sizes) -> Table:
    table = Table(title="Save and load")
    for column in ("call", "throughput", "latency"):
        table.add_column(column)
    for row in throughput_rows(r, sizes):
        table.add_row(*row)
    return table


# ---- main ---------------------------------------------------------------------------------


def summary(searches: list[SearchResult], throughput: ThroughputResult, sizes: Sizes) -> str:
    rows = [
        [f"search p50 / p90 / p99, {r.messages:,} messages, all threads",
         _latency(r.everywhere)]
        for r in searches
    ]
    rows += [
        [f"search p50 / p90 / p99, {r.messages:,} messages, one thread", _latency(r.one_thread)]
        for r in searches
    ]
    rows += [[f"pop one message / a ttl erasing 5, {r.messages:,} messages",
              f"{r.pop_s * 1000:,.0f} / {r.expire_s * 1000:,.0f} ms"] for r in searches]
    rows += [[f"purge one 100-message thread, {r.messages:,} messages", f"{r.purge_s:,.2f} s"]
             for r in searches]
    rows += [[call, f"{rate}; {latency}"] for call, rate, latency in
             throughput_rows(throughput, sizes)]
    return markdown_table(["measure", "result"], rows)


async def run(sizes: Sizes) -> None:
    with tempfile.TemporaryDirectory(prefix="mnemo-bench-conv-") as name:
        tmp = Path(name)
        searches = []
        for messages in sizes.search:
            console.print(f"[dim]building and searching {messages:,} messages...[/]")
            searches.append(await bench_search(tmp, messages))
            (tmp / f"search-{messages}.db").unlink()
        console.print(search_table(searches))
        throughput = await bench_save_load(tmp, sizes)
        console.print(throughput_table(throughput, sizes))
    console.rule("Summary (Markdown, for BENCHMARKS.md)")
    console.print(summary(searches, throughput, sizes), markup=False, highlight=False,
                  soft_wrap=True)


def parse_args() -> argparse.Namespace:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10k and 100k messages, fewer turns")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    sizes = QUICK if args.quick else FULL
    console.print(facts_table({**machine_facts(), "sizes": "quick" if args.quick else "full"}))
    started = time.perf_counter()
    anyio.run(run, sizes)
    console.print(f"[dim]total {time.perf_counter() - started:.1f} s[/]")


if __name__ == "__main__":
    main()
