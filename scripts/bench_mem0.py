"""mnemo beside mem0 2.2.1: add and search latency at 100, 1,000 and 10,000 memories.

Both libraries talk to the same fake model server, a process of its own on 127.0.0.1
(`--serve`, started by this script): an OpenAI-compatible `POST /v1/embeddings` whose vectors
are mnemo's `HashEmbedder(384)` (hashed words, bigrams and trigrams: deterministic, instant,
and texts that share words are near), as base64 or JSON numbers, whichever the client asks for
(`encoding_format`, as OpenAI answers: mnemo asks for base64, mem0 for floats), and a
`POST /v1/chat/completions` that answers `{}` (neither side calls it here). Both write to
the same disk (one temporary folder).

- mem0 2.2.1 runs in its own venv (`--mem0-python`, default /work/mem0-venv/bin/python; make
  it with `python3 -m venv /work/mem0-venv && /work/mem0-venv/bin/pip install mem0ai==2.2.1`)
  through `scripts/_mem0_half.py`: its default local stores (Qdrant on disk, SQLite history),
  one `add([{"role": "user", "content": sentence}], user_id=..., infer=False)` per sentence
  (no LLM: the sentence is embedded and stored as it is), then `search(query, top_k=10)`.
- mnemo, in this process: `mnemo.Memory(path, embedder=OpenAIEmbedder(..., base_url=<the
  server>))`, one `mem.ingest(repo, Trajectory(goal=sentence, steps=[Step(observation=
  sentence, action="")]), source_id=...)` per sentence, then `mem.recall(repo, query, k=10)`.
  `ingest` is the public way to store a memory: the offline pipeline (no model call) keeps
  the sentence as a SEMANTIC fact, an EPISODIC step and its SOURCE, with their tags, so a
  search runs over about five nodes per sentence, as it would in use. That is the comparable
  unit: one sentence in, searchable by its text and vector, nothing inferred by an LLM.

Measured per size: add latency per sentence (p50), search latency p50/p95 over the same
generated questions (after 5 warm-up searches), mnemo's median per recall stage
(`RecallResult.trace`), the query embedding's p50 on each side (mnemo's "embed" stage, the
query and its search tags in one request; mem0's embedder called alone on each question after
its searches: the floor of a search that embeds its query over the same server), and **exact
restatement**: 20 queries that are the exact text of a stored sentence, counted when the first
result's text is that sentence. Goals: mnemo's search p50 no slower than mem0's at every
size, and recall's own work (the sum of its stage medians but the query embedding) at most
3 ms at 1,000 memories.

Run: `.venv/bin/python scripts/bench_mem0.py [--sizes 100,1000,10000] [--queries 100]
[--mem0-python PATH] [--skip-mem0]` (from a git worktree, with `PYTHONPATH=.`: the venv's
editable install points at the main checkout's mnemo). Under load the ratio swings with
the machine more than with the code: run it on a quiet one, or twice.
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from statistics import median
from typing import Any

import anyio
import numpy as np
from _bench import facts_table, machine_facts, markdown_table, verdict
from rich.console import Console
from rich.table import Table

import mnemo
from mnemo.adapters.hashing import HashEmbedder

REPO = "bench"
DIM = 384
MEM0_PYTHON = "/work/mem0-venv/bin/python"
HALF = Path(__file__).resolve().parent / "_mem0_half.py"
console = Console(width=None if sys.stdout.isatty() else 120)

PEOPLE = (
    "alice bob carol dave erin frank grace heidi ivan judy mallory niaj olivia peggy rupert "
    "sybil trent victor walter yvonne zara omar priya kenji lucia mateo noor sven tomas ulla"
).split()
ADJECTIVES = (
    "red blue green yellow black white grey brown small large heavy light old new broken "
    "shiny dusty wooden metal plastic glass ceramic woven leather rusty sturdy fragile"
).split()
NOUNS = (
    "kettle teapot mug plate bowl spoon pan jar bottle tray towel broom bucket ladder hammer "
    "wrench drill saw rope hose shovel lantern torch lamp battery charger cable router laptop "
    "monitor keyboard printer phone tablet camera tripod speaker radio clock notebook stapler "
    "folder envelope parcel crate basket backpack suitcase umbrella jacket scarf helmet "
    "bicycle pump wallet ticket map compass mirror vase blanket pillow cushion rug chair desk"
).split()
PLACES = (
    "kitchen garden shed garage attic cellar hallway bathroom bedroom study office library "
    "pantry porch balcony workshop greenhouse laundry loft basement"
).split()
RELATIONS = ("in", "near", "under", "behind", "beside", "above")
DAYS = "monday tuesday wednesday thursday friday saturday sunday".split()
VERBS = "cleaned repaired painted moved sold borrowed found packed labelled replaced".split()
TEMPLATES = (
    "{person} keeps the {adj} {noun} {rel} the {place}.",
    "{person} {verb} the {adj} {noun} in the {place} on {day}.",
    "The {adj} {noun} that {person} bought is {rel} the {place}.",
    "{person} prefers the {adj} {noun} to the {adj2} {noun2}.",
)


def sentences(count: int, seed: int = 7) -> tuple[list[str], list[str]]:
    """`count` distinct sentences, and one question per sentence about its person and thing."""
    rng = np.random.default_rng(seed)
    seen: set[str] = set()
    out: list[str] = []
    asks: list[str] = []

    def pick(words: list[str] | tuple[str, ...]) -> str:
        return words[int(rng.integers(len(words)))]

    while len(out) < count:
        slots = {
            "person": pick(PEOPLE).capitalize(), "adj": pick(ADJECTIVES), "noun": pick(NOUNS),
            "rel": pick(RELATIONS), "place": pick(PLACES), "day": pick(DAYS),
            "verb": pick(VERBS), "adj2": pick(ADJECTIVES), "noun2": pick(NOUNS),
        }
        text = TEMPLATES[len(out) % len(TEMPLATES)].format(**slots)
        if text in seen:
            continue
        seen.add(text)
        out.append(text)
        asks.append(f"What about {slots['person']}'s {slots['adj']} {slots['noun']}?")
    return out, asks


# ---- the fake model server ------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: both clients reuse their connection
    # Headers and body go out in two writes: with Nagle's algorithm the second waits for the
    # client's delayed ACK, 40 ms a reply on Linux, which would swamp what is measured.
    disable_nagle_algorithm = True
    embedder = HashEmbedder(DIM)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if self.path.endswith("/embeddings"):
            texts = body.get("input", [])
            texts = [texts] if isinstance(texts, str) else [str(t) for t in texts]
            vectors = self.embedder.embed_sync(texts)
            # As OpenAI: base64 of little-endian float32s when asked for (mnemo asks for it,
            # mem0 asks for floats), JSON numbers otherwise.
            packed = body.get("encoding_format") == "base64"
            reply: dict[str, Any] = {
                "object": "list", "model": body.get("model", "fake"),
                "data": [{"object": "embedding", "index": i,
                          "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode()
                          if packed else v.tolist()}
                         for i, v in enumerate(vectors)],
                "usage": {"prompt_tokens": 1, "total_tokens": 1},
            }
        else:
            reply = {
                "id": "chatcmpl-bench", "object": "chat.completion", "created": 0,
                "model": body.get("model", "fake"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "{}"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def serve() -> None:
    """The fake server in this process: prints its port, then serves until killed."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


# ---- the two halves ---------------------------------------------------------------------------


def pct(samples: list[float], q: float) -> float:
    return float(np.percentile(samples, q)) if samples else float("nan")


async def mnemo_half(
    url: str, folder: Path, texts: list[str], asks: list[str], exact: list[str]
) -> dict[str, Any]:
    embedder = mnemo.OpenAIEmbedder("fake-embed", base_url=url, dim=DIM, api_key="not-used")
    add_ms: list[float] = []
    search_ms: list[float] = []
    stages: dict[str, list[float]] = {}
    async with mnemo.Memory(folder / "mnemo.db", embedder=embedder) as mem:
        await mem.open_repo(REPO)
        for i, text in enumerate(texts):
            trajectory = mnemo.Trajectory(goal=text, steps=[mnemo.Step(observation=text,
                                                                       action="")])
            started = time.perf_counter()
            await mem.ingest(REPO, trajectory, source_id=f"s{i}")
            add_ms.append((time.perf_counter() - started) * 1000)
        for query in asks[:5]:
            await mem.recall(REPO, query, k=10)
        for query in asks:
            started = time.perf_counter()
            result = await mem.recall(REPO, query, k=10)
            search_ms.append((time.perf_counter() - started) * 1000)
            for stage, seconds in result.trace.items():
                stages.setdefault(stage, []).append(seconds * 1000)
        first = 0
        misses: list[str] = []
        for query in exact:
            memories = (await mem.recall(REPO, query, k=10)).memories
            if memories and memories[0].node.text.strip() == query.strip():
                first += 1
            else:
                top = memories[0].node.text if memories else "(nothing)"
                misses.append(f"{query!r} -> {top!r}")
    return {"add_ms": add_ms, "search_ms": search_ms, "exact_first": first,
            "exact_total": len(exact), "misses": misses,
            "stages": {stage: median(v) for stage, v in stages.items()}}


def mem0_half(python: str, url: str, folder: Path, texts: list[str], asks: list[str],
              exact: list[str]) -> dict[str, Any]:
    job = {"url": url, "dir": str(folder), "dim": DIM, "sentences": texts, "queries": asks,
           "exact": exact}
    done = subprocess.run([python, str(HALF)], input=json.dumps(job), capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the mem0 half failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    server = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{int(server.stdout.readline())}/v1"
        rows = []
        for size in args.sizes:
            texts, asks = sentences(size)
            # Questions about sentences spread over the store, the same for both.
            step = max(1, size // args.queries)
            questions = [asks[i] for i in range(0, size, step)][: args.queries]
            exact = [texts[i] for i in range(0, size, max(1, size // 20))][:20]
            with tempfile.TemporaryDirectory(prefix="mnemo-bench-mem0-") as tmp:
                console.print(f"[bold]{size:,} memories[/]: mnemo ...")
                ours = anyio.run(mnemo_half, url, Path(tmp), texts, questions, exact)
                theirs = None
                if not args.skip_mem0:
                    console.print(f"[bold]{size:,} memories[/]: mem0 ...")
                    mem0_dir = Path(tmp) / "mem0"
                    mem0_dir.mkdir()
                    theirs = mem0_half(args.mem0_python, url, mem0_dir, texts, questions, exact)
            rows.append({"size": size, "mnemo": ours, "mem0": theirs})
            _say(rows[-1])
        return rows
    finally:
        server.terminate()
        server.wait(timeout=10)


def _say(row: dict[str, Any]) -> None:
    ours, theirs = row["mnemo"], row["mem0"]
    line = (f"  mnemo search p50 {pct(ours['search_ms'], 50):.2f} ms, exact first "
            f"{ours['exact_first']}/{ours['exact_total']}")
    if theirs is not None:
        line += (f"; mem0 search p50 {pct(theirs['search_ms'], 50):.2f} ms, exact first "
                 f"{theirs['exact_first']}/{theirs['exact_total']}")
    console.print(line)
    for miss in ours["misses"]:
        console.print(f"  [dim]mnemo missed: {miss}[/]", markup=True, highlight=False)


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    headers = ["memories", "mnemo add p50 ms", "mem0 add p50 ms", "mnemo search p50 / p95 ms",
               "mem0 search p50 / p95 ms", "p50 ratio mnemo / mem0 (goal <= 1)",
               "own work ms (goal <= 3 at 1,000)",
               "query embedding p50 ms: mnemo / mem0", "exact first: mnemo", "exact first: mem0"]
    table_rows = []
    for row in rows:
        ours, theirs = row["mnemo"], row["mem0"]
        p50 = pct(ours["search_ms"], 50)
        embed = f"{ours['stages'].get('embed', float('nan')):.2f}"
        cells = [f"{row['size']:,}", f"{pct(ours['add_ms'], 50):.2f}"]
        own = sum(ms for stage, ms in ours["stages"].items() if stage != "embed")
        if theirs is None:
            cells += ["-", f"{p50:.2f} / {pct(ours['search_ms'], 95):.2f}", "-", "-",
                      f"{own:.2f}", f"{embed} / -"]
        else:
            ratio = p50 / pct(theirs["search_ms"], 50)
            cells += [f"{pct(theirs['add_ms'], 50):.2f}",
                      f"{p50:.2f} / {pct(ours['search_ms'], 95):.2f}",
                      f"{pct(theirs['search_ms'], 50):.2f} / {pct(theirs['search_ms'], 95):.2f}",
                      f"{ratio:.2f} {verdict(ratio <= 1)}",
                      f"{own:.2f}" + (f" {verdict(own <= 3)}" if row["size"] == 1000 else ""),
                      f"{embed} / {pct(theirs.get('embed_ms', []), 50):.2f}"]
        cells.append(f"{ours['exact_first']}/{ours['exact_total']}")
        cells.append("-" if theirs is None else f"{theirs['exact_first']}/{theirs['exact_total']}")
        table_rows.append(cells)
    table = Table(title=f"mnemo beside mem0 2.2.1, {args.queries} searches per size, k=10")
    for header in headers:
        table.add_column(header, justify="right")
    for cells in table_rows:
        table.add_row(*cells)
    console.print(table)
    names = sorted({s for row in rows for s in row["mnemo"]["stages"]})
    stage_rows = [[f"{row['size']:,}", *(f"{row['mnemo']['stages'].get(s, float('nan')):.2f}"
                                        for s in names)] for row in rows]
    console.print(facts_table({**machine_facts(), "mem0 python": args.mem0_python}))
    print()
    print("\n\n".join([
        "### mnemo beside mem0 (scripts/bench_mem0.py)",
        markdown_table(headers, table_rows),
        markdown_table(["memories", *(f"{s} (median ms)" for s in names)], stage_rows),
    ]))


def parse_args() -> argparse.Namespace:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,10000", help="comma-separated counts")
    parser.add_argument("--queries", type=int, default=100, help="searches per size (100)")
    parser.add_argument("--mem0-python", default=MEM0_PYTHON,
                        help="the interpreter of a venv with mem0ai==2.2.1")
    parser.add_argument("--skip-mem0", action="store_true", help="measure mnemo alone")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.sizes = [int(s.replace("_", "")) for s in args.sizes.split(",")]
    return args


def main() -> None:
    args = parse_args()
    if args.serve:
        serve()
        return
    rows = run(args)
    report(rows, args)


if __name__ == "__main__":
    main()
