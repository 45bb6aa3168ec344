"""Evidence recall of `Memory.recall` on LoCoMo (conversations 0-6, `--data`).

Every conversation turn (speaker, session date, text, image caption) is ingested into one repo
per conversation, one session a trajectory. For every question of categories 1-4, `recall`
returns k nodes; a node counts for a turn when it was made from that turn (an EPISODIC node
from its step; a fact or procedure through its PROVENANCE links). recall@k is the share of
the question's evidence turns covered by the top k, averaged over questions; hit@10 is the
share of questions with at least one evidence turn in the top 10. session R@5 counts as
engram-search and LongMemEval's retrieval scripts do, by session: the share of questions with
an evidence turn's session among the sessions the top 5 were made from. answer@5 is
answer-level: the
share of questions whose gold answer, normalised (lower case, punctuation and articles dropped,
spaces collapsed), occurs whole in the texts of the top 5 (each node's own text and the turns
its provenance points to), so that a fact that states the answer counts as much as the turn.

In the same run, over the same turns: a plain FTS5 BM25 baseline (one row per turn), a
dense-only baseline (cosine over the embedder's turn vectors), and engram-search's first stage
without a model (`chunk_baseline`: sessions cut into chunks of `CHUNK` turns with the
speakers' names in their text, FTS5 BM25 and dense fused by reciprocal rank), whose rows
count chunks, not turns: compare its session R@5.

    .venv/bin/python scripts/eval_locomo.py [--conversations 0-6]
        [--embedder default|hash|e5-small-q4] [--set FIELD=VALUE ...] [--db PATH]
        [--ingest-only] [--no-reinforce]

With `--db` and `--ingest-only` a store is ingested once and left as it is; each later run on a
copy of it is the same as a fresh ingest's (a recall reinforces what it returns, so a run moves
the next one on the same file, unless `--no-reinforce`).

`--set` overrides one `mnemo.Config` field for the repos of the run (repeat it; the value is
read as JSON, else as a string): every recall lever is a Config field, so each measured
row of BENCHMARKS.md is one command. A recall-side lever can reuse an ingested database
(`--db`, after copying it: a recall reinforces what it returns, which moves the next run).
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from _bench import config_of
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

import mnemo
from mnemo.adapters.uri import embedder_from_uri
from mnemo.recall.query import query_side
from mnemo.storage.sqlite.graph import fts_query

DATA = next((folder / "shared" / "data" / "locomo_dev.json"
             for folder in Path(__file__).resolve().parents
             if (folder / "shared" / "data" / "locomo_dev.json").exists()),
            Path("locomo_dev.json"))
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
KS = (1, 5, 10)
MEMORY_TYPES = [mnemo.NodeType.EPISODIC, mnemo.NodeType.SEMANTIC, mnemo.NodeType.PROCEDURAL]
console = Console(width=160)


@dataclass(frozen=True, slots=True)
class Turn:
    dia_id: str
    session: int
    text: str  # what is ingested and indexed: speaker, date, words, photo caption


@dataclass(frozen=True, slots=True)
class Question:
    text: str
    category: int
    evidence: frozenset[str]
    answer: str = ""


@dataclass(slots=True)
class Conversation:
    sample_id: str
    sessions: dict[int, tuple[str, list[Turn]]]  # number -> (date, turns)
    questions: list[Question]
    unmatched: int = 0
    index: int = 0  # its place in the data file

    def texts(self) -> dict[str, str]:
        """Each turn's text by its id."""
        return {t.dia_id: t.text for _, turns in self.sessions.values() for t in turns}


@dataclass(slots=True)
class Scores:
    """Per-question recall@k, grouped by category."""

    by_category: dict[int, list[dict[int, float]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    latencies: list[float] = field(default_factory=list)

    def add(self, category: int, ranked_turns: Sequence[Iterable[str]], evidence: frozenset[str],
            seconds: float = 0.0, *, answered: bool | None = None) -> None:
        row: dict[int, float] = {}
        for k in (*KS, 0):
            covered: set[str] = set()
            for turns in ranked_turns[: k or 10]:
                covered.update(turns)
            value = len(covered & evidence) / len(evidence)
            row[k] = value if k else float(value > 0)  # key 0 holds hit@10
        if answered is not None:
            row[ANSWER] = float(answered)
        sessions = {session_of(t) for turns in ranked_turns[:SESSION_K] for t in turns}
        row[SESSION] = float(bool(sessions & {session_of(t) for t in evidence}))
        self.by_category[category].append(row)
        self.latencies.append(seconds)

    def mean(self, k: int, category: int | None = None) -> float:
        rows = (self.by_category[category] if category is not None
                else [r for rows in self.by_category.values() for r in rows])
        values = [r[k] for r in rows if k in r]
        return statistics.fmean(values) if values else 0.0

    def has(self, k: int) -> bool:
        return any(k in r for rows in self.by_category.values() for r in rows)

    @property
    def count(self) -> int:
        return sum(len(rows) for rows in self.by_category.values())


# The key of a row's answer-level score (key 0 holds hit@10), and how many results it reads;
# the same for the session-level recall.
ANSWER = -5
ANSWER_K = 5
SESSION = -50
SESSION_K = 5


def session_of(dia_id: str) -> str:
    """The session a turn is of: "D3" for "D3:7"."""
    return dia_id.partition(":")[0]
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = re.compile(r"[^\w\s]")


def normalise_answer(text: str) -> str:
    """SQuAD's answer normalisation: lower case, punctuation and articles dropped, spaces
    collapsed."""
    return " ".join(_ARTICLES.sub(" ", _PUNCTUATION.sub(" ", text.lower())).split())


def answered(answer: str, texts: Iterable[str]) -> bool:
    """Whether the normalised `answer` occurs whole (at word boundaries) in one of `texts`."""
    gold = normalise_answer(answer)
    return bool(gold) and any(f" {gold} " in f" {normalise_answer(t)} " for t in texts)


def normalise_dia_id(raw: str) -> str:
    """'D1:3 ', 'D:1:3' and 'd1:3' all mean D1:3."""
    digits = re.findall(r"\d+", raw)
    return f"D{digits[0]}:{digits[1]}" if len(digits) >= 2 else raw.strip()


def load(path: Path, picks: Sequence[int]) -> list[Conversation]:
    raw = json.loads(path.read_text())
    conversations = []
    for i in picks:
        item = raw[i]
        talk = item["conversation"]
        sessions: dict[int, tuple[str, list[Turn]]] = {}
        for key, turns in talk.items():
            match = re.fullmatch(r"session_(\d+)", key)
            if not match:
                continue
            number = int(match.group(1))
            date = talk.get(f"{key}_date_time", "")
            sessions[number] = (date, [_turn(t, number, date) for t in turns])
        known = {t.dia_id for _, turns in sessions.values() for t in turns}
        questions, unmatched = [], 0
        for qa in item["qa"]:
            if qa.get("category") not in CATEGORIES:
                continue
            evidence = {normalise_dia_id(e) for e in qa.get("evidence", [])}
            unmatched += len(evidence - known)
            evidence &= known
            if evidence:
                questions.append(Question(qa["question"], qa["category"], frozenset(evidence),
                                          str(qa.get("answer", ""))))
        conversations.append(Conversation(item["sample_id"], dict(sorted(sessions.items())),
                                          questions, unmatched, i))
    return conversations


def _turn(raw: dict[str, Any], session: int, date: str) -> Turn:
    text = f"{raw['speaker']} ({date}): {raw['text']}"
    if raw.get("blip_caption"):
        text += f" [shares a photo of {raw['blip_caption']}]"
    return Turn(normalise_dia_id(raw["dia_id"]), session, text)


async def ingest(mem: mnemo.Memory, repo: str, conversation: Conversation,
                 progress: Progress) -> None:
    task = progress.add_task(f"ingest {conversation.sample_id}", total=len(conversation.sessions))
    for number, (date, turns) in conversation.sessions.items():
        trajectory = mnemo.Trajectory(
            goal=f"Conversation session {number} on {date}",
            steps=[mnemo.Step(t.text, "", metadata={"dia_id": t.dia_id}) for t in turns],
        )
        await mem.ingest(repo, trajectory, source_id=f"{conversation.sample_id}/{number}")
        progress.advance(task)


async def turns_of_nodes(mem: mnemo.Memory, repo: str) -> dict[str, frozenset[str]]:
    """Which turns each node was made from."""
    N = mnemo.NodeType
    turn_of = {n.id: n.data["metadata"]["dia_id"]
               for n in await mem.get_nodes_by_type(repo, [N.EPISODIC])}
    made: dict[str, frozenset[str]] = {i: frozenset([d]) for i, d in turn_of.items()}
    for node in await mem.get_nodes_by_type(repo, [N.SEMANTIC, N.PROCEDURAL]):
        linked = await mem.get_linked_nodes(repo, [node.id], mnemo.LinkType.PROVENANCE)
        made[node.id] = frozenset(turn_of[n.id] for n in linked if n.id in turn_of)
    return made


async def evaluate_recall(mem: mnemo.Memory, repo: str, conversation: Conversation,
                          made: dict[str, frozenset[str]], scores: Scores,
                          types: list[mnemo.NodeType] | None,
                          ceiling: tuple[int, Scores] | None = None, *,
                          reinforce: bool = True) -> None:
    said = conversation.texts()
    for q in conversation.questions:
        start = time.perf_counter()
        result = await mem.recall(repo, q.text, k=10, types=types, reinforce=reinforce)
        seconds = time.perf_counter() - start
        ranked = [made.get(m.node.id, frozenset()) for m in result.memories]
        texts = [text for m in result.memories[:ANSWER_K]
                 for text in (m.node.text, *(said[t] for t in made.get(m.node.id, ())))]
        scores.add(q.category, ranked, q.evidence, seconds, answered=answered(q.answer, texts))
        if ceiling is not None:
            width, best_order = ceiling
            best_order.add(q.category, reordered(result, made, q.evidence, width), q.evidence)


def reordered(result: mnemo.RecallResult, made: dict[str, frozenset[str]],
              evidence: frozenset[str], width: int) -> list[frozenset[str]]:
    """The turns of the recall's first `width` candidates (its results, then the other nodes
    it scored, best first; a node made from no turn, or only from turns an earlier one was,
    is skipped, as ranking keeps one result per step) in the best order a re-ranking could
    give them: those that bring evidence first. What a perfect re-ranker of that many
    candidates would reach."""
    seen: set[str] = set()
    turns: list[frozenset[str]] = []
    for node_id in [*(m.node.id for m in result.memories), *(t.node_id for t in result.touched)]:
        made_from = made.get(node_id, frozenset())
        if made_from and not made_from <= seen:
            seen |= made_from
            turns.append(made_from)
            if len(turns) == width:
                break
    return sorted(turns, key=lambda t: -len(t & evidence))


def bm25_baseline(conversation: Conversation, scores: Scores) -> None:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(dia_id UNINDEXED, text, "
               "tokenize='porter unicode61')")
    db.executemany("INSERT INTO t VALUES (?, ?)", [
        (turn.dia_id, turn.text) for _, turns in conversation.sessions.values() for turn in turns
    ])
    for q in conversation.questions:
        match = fts_query(q.text)
        rows = db.execute("SELECT dia_id, text FROM t WHERE t MATCH ? ORDER BY bm25(t) LIMIT 10",
                          (match,)).fetchall() if match else []
        scores.add(q.category, [frozenset([r[0]]) for r in rows], q.evidence,
                   answered=answered(q.answer, [r[1] for r in rows[:ANSWER_K]]))


# Turns per chunk of the chunk baseline: about 250 words, what the default embedder reads.
CHUNK = 8


async def chunk_baseline(embedder: mnemo.Embedder, conversation: Conversation,
                         scores: Scores) -> None:
    """Sessions in chunks of `CHUNK` turns, ranked by reciprocal rank fusion (k 60) of FTS5
    BM25 and the embedder's cosine; each chunk counts for its turns."""
    chunks = [turns[i:i + CHUNK] for _, turns in conversation.sessions.values()
              for i in range(0, len(turns), CHUNK)]
    texts = [" ".join(t.text for t in chunk) for chunk in chunks]
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE c USING fts5(text, tokenize='porter unicode61')")
    db.executemany("INSERT INTO c(rowid, text) VALUES (?, ?)", list(enumerate(texts)))
    matrix = np.asarray(await embedder.embed(texts), dtype=np.float32)
    matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
    queries = np.asarray(await query_side(embedder).embed(
        [q.text for q in conversation.questions]), dtype=np.float32)
    queries /= np.maximum(np.linalg.norm(queries, axis=1, keepdims=True), 1e-12)
    for q, vector in zip(conversation.questions, queries, strict=True):
        match = fts_query(q.text)
        lexical = [r[0] for r in db.execute(
            "SELECT rowid FROM c WHERE c MATCH ? ORDER BY bm25(c) LIMIT 50", (match,))
        ] if match else []
        dense = [int(i) for i in np.argsort(-(matrix @ vector))[:50]]
        fused: dict[int, float] = {}
        for ranking in (lexical, dense):
            for rank, i in enumerate(ranking, start=1):
                fused[i] = fused.get(i, 0.0) + 1 / (60 + rank)
        top = sorted(fused, key=lambda i: -fused[i])[:10]
        scores.add(q.category, [frozenset(t.dia_id for t in chunks[i]) for i in top],
                   q.evidence, answered=answered(q.answer, [texts[i] for i in top[:ANSWER_K]]))


async def dense_baseline(embedder: mnemo.Embedder, conversation: Conversation,
                         scores: Scores) -> None:
    turns = [t for _, ts in conversation.sessions.values() for t in ts]
    matrix = np.asarray(await embedder.embed([t.text for t in turns]), dtype=np.float32)
    matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
    # As recall does: a query goes through the embedder's query side (e5's "query: " prefix).
    questions = [q.text for q in conversation.questions]
    queries = np.asarray(await query_side(embedder).embed(questions), dtype=np.float32)
    queries /= np.maximum(np.linalg.norm(queries, axis=1, keepdims=True), 1e-12)
    for q, vector in zip(conversation.questions, queries, strict=True):
        top = np.argsort(-(matrix @ vector))[:10]
        scores.add(q.category, [frozenset([turns[i].dia_id]) for i in top], q.evidence,
                   answered=answered(q.answer, [turns[i].text for i in top[:ANSWER_K]]))


def pick_embedder(name: str) -> mnemo.Embedder | None:
    if name == "default":
        return None  # the Memory's embedded default
    return embedder_from_uri(name)


def report(results: dict[str, Scores], unmatched: int, questions: int) -> None:
    table = Table(title=f"LoCoMo evidence recall ({questions} questions of categories 1-4)")
    table.add_column("retriever")
    for k in KS:
        table.add_column(f"R@{k}", justify="right")
    table.add_column("hit@10", justify="right")
    table.add_column(f"session R@{SESSION_K}", justify="right")
    table.add_column(f"answer@{ANSWER_K}", justify="right")
    for label in CATEGORIES.values():
        table.add_column(f"R@10 {label}", justify="right")
    table.add_column("p50 / p95 ms", justify="right")
    for name, scores in results.items():
        lat = sorted(scores.latencies)
        timing = (f"{1000 * lat[len(lat) // 2]:.1f} / {1000 * lat[int(len(lat) * 0.95)]:.1f}"
                  if any(lat) else "")
        answer = f"{scores.mean(ANSWER):.3f}" if scores.has(ANSWER) else ""
        table.add_row(name, *(f"{scores.mean(k):.3f}" for k in KS), f"{scores.mean(0):.3f}",
                      f"{scores.mean(SESSION):.3f}", answer,
                      *(f"{scores.mean(10, c):.3f}" for c in CATEGORIES), timing)
    console.print(table)
    console.print(f"evidence ids that match no turn (after normalising): {unmatched}")


def save(path: Path, results: dict[str, Scores], unmatched: int) -> None:
    """Every question's scores and latency, to be combined with other runs' (`--combine`)."""
    path.write_text(json.dumps({"unmatched": unmatched, "results": {
        name: {"rows": {str(c): rows for c, rows in s.by_category.items()},
               "latencies": s.latencies}
        for name, s in results.items()}}))


def combine(paths: Sequence[Path]) -> None:
    """One report of runs saved by `--save` (e.g. one process per conversation)."""
    results: dict[str, Scores] = defaultdict(Scores)
    unmatched = 0
    for path in paths:
        saved = json.loads(path.read_text())
        unmatched += saved["unmatched"]
        for name, part in saved["results"].items():
            for category, rows in part["rows"].items():
                results[name].by_category[int(category)].extend(
                    {int(k): v for k, v in row.items()} for row in rows)
            results[name].latencies.extend(part["latencies"])
    report(dict(results), unmatched, results["mnemo recall"].count)


async def main(args: argparse.Namespace) -> None:
    if args.combine:
        combine(args.combine)
        return
    first, _, last = args.conversations.partition("-")
    picks = range(int(first), int(last or first) + 1)
    conversations = load(args.data, picks)
    results = {"mnemo recall": Scores()}
    if args.ceiling:
        results[f"best order of the first {args.ceiling}"] = Scores()
    if args.baselines:
        results |= {"BM25 (FTS5) baseline": Scores(), "dense-only baseline": Scores(),
                    f"chunks of {CHUNK} turns, BM25 + dense": Scores()}
    embedder = pick_embedder(args.embedder)
    config = config_of(args.set)
    console.print(f"embedder {args.embedder}; config overrides: {args.set or 'none'}")
    with tempfile.TemporaryDirectory() as tmp:
        for path, group in _databases(args.db, Path(tmp), conversations):
            await _run(path, group, embedder, config, args, results)
    if args.ingest_only:
        return
    unmatched = sum(c.unmatched for c in conversations)
    report(results, unmatched, sum(len(c.questions) for c in conversations))
    if args.save:
        save(args.save, results, unmatched)


def _databases(db: str | None, tmp: Path, conversations: list[Conversation]
               ) -> list[tuple[Path, list[Conversation]]]:
    """Which database holds which conversations: `{conversation}` in `--db` gives each its own
    file, so several processes can ingest a split side by side."""
    if db and "{conversation}" in db:
        return [(Path(db.format(conversation=c.index)), [c]) for c in conversations]
    return [(Path(db) if db else tmp / "locomo.db", conversations)]


async def _run(path: Path, conversations: list[Conversation], embedder: mnemo.Embedder | None,
               config: mnemo.Config, args: argparse.Namespace,
               results: dict[str, Scores]) -> None:
    async with mnemo.Memory(path, embedder=embedder, config=config) as mem:
        with Progress(console=console, transient=True) as progress:
            for conversation in conversations:
                repo = f"locomo-{conversation.sample_id}"
                await mem.open_repo(repo, config=config)
                await ingest(mem, repo, conversation, progress)
        if args.ingest_only:
            return
        for conversation in conversations:
            repo = f"locomo-{conversation.sample_id}"
            # A word index of another layout is rebuilt in the background, the store's own
            # search answering meanwhile: each question is asked of the index.
            await mem._graph.settle(repo)
            made = await turns_of_nodes(mem, repo)
            ceiling = (None if not args.ceiling else
                       (args.ceiling, results[f"best order of the first {args.ceiling}"]))
            await evaluate_recall(mem, repo, conversation, made, results["mnemo recall"],
                                  MEMORY_TYPES if args.types == "memories" else None, ceiling,
                                  reinforce=args.reinforce)
            if args.baselines:
                bm25_baseline(conversation, results["BM25 (FTS5) baseline"])
                dense_embedder = embedder or mem._repos.get(repo).embedder
                await dense_baseline(dense_embedder, conversation,
                                     results["dense-only baseline"])
                await chunk_baseline(dense_embedder, conversation,
                                     results[f"chunks of {CHUNK} turns, BM25 + dense"])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--conversations", default="0-6", help="e.g. 0-6 or 2")
    parser.add_argument("--embedder", default="default",
                        help="default (the Memory's), or an embedder URI: hash, minilm, "
                             "e5-small-q4")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a mnemo.Config field, e.g. recall_mmr_lambda=0.7")
    parser.add_argument("--no-baselines", dest="baselines", action="store_false",
                        help="time mnemo's recall alone (no BM25 and dense-only rows)")
    parser.add_argument("--db", help="keep the ingested database at this path (reused); "
                        "'{conversation}' in it gives each conversation its own file")
    parser.add_argument("--save", type=Path,
                        help="also write every question's scores to this JSON file")
    parser.add_argument("--combine", type=Path, nargs="+", metavar="JSON",
                        help="report runs saved with --save together (nothing else runs)")
    parser.add_argument("--ceiling", type=int, default=0, metavar="N",
                        help="also score each recall's first N candidates in the best order "
                             "(the ceiling of a re-ranking of N)")
    parser.add_argument("--ingest-only", action="store_true",
                        help="ingest into --db and stop (copies of it make repeatable runs)")
    parser.add_argument("--no-reinforce", dest="reinforce", action="store_false",
                        help="recall without counting accesses (the store is left as it was)")
    parser.add_argument("--types", choices=["memories", "all"], default="memories",
                        help="recall memories (episodic, semantic, procedural) or every type")
    return parser.parse_args(argv)


if __name__ == "__main__":
    anyio.run(main, parse_args())
