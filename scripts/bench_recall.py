"""Recall latency at 10k, 50k, 100k and 1M nodes, next to an exact numpy scan, in one run.

For each size a fresh SQLite file is prepared: the repo is created through the public API
(`mnemo.Memory(path).open_repo`), then a synthetic graph shaped like the pipeline's output is
written straight into mnemo's schema with `executemany` (nodes with their FTS5 entries by the
schema's triggers, vectors, links), because running the pipeline on 1M nodes would take hours:

- per trajectory: a SOURCE (one per episode of two trajectories), a SUBGOAL, five EPISODIC
  steps ("Observation: ... Action: ...", named "episodic_<episode>:<index>" as the pipeline
  names them, so that recall's neighbours and the words index's windows reach them), three
  SEMANTIC facts tagged with two concepts (TAG nodes, shared across the graph: "<adjective>
  <noun>", "<noun> in the <place>"), one PROCEDURAL instruction under an INTENT ("<verb> the
  <adjective> <noun>", shared), linked as the pipeline links them (subgoal-step, step-source,
  fact-step, tag-fact, fact siblings, intent-procedure, procedure-step);
- text: sentences from templates over a vocabulary of people, verbs, adjectives, nouns and
  places; `created_at` spread over the last 90 days;
- vectors (384-d, the default embedder's dimension): NOT a neural embedder. Every content word
  has a fixed random vector drawn from a 64-dimensional subspace plus noise (all-MiniLM-L6-v2
  vectors have an effective dimension of about 61); a text's
  vector is the normalised sum of its words' vectors plus per-node noise. The same model embeds
  the queries (`WordVectorEmbedder`, instant), so the dense channel finds related nodes.

Then `mnemo.Memory(path, embedder=WordVectorEmbedder())` opens the file and, per size:

- index load (SQLite rows to the in-memory matrix, on first use) and, above 20k vectors
  (`ann.DEFAULT_THRESHOLD`) with faiss-cpu installed, the HNSW graphs: built in their worker
  thread and saved beside the file ("<file>.hnsw"), or read back from there when a reused
  file has them (waited for either way; the table says which);
- `mem.recall(repo, query, k=10)` over generated questions: p50/p95 wall time, and the median
  of each stage of `RecallResult.trace`;
- mnemo's dense search alone (`search_vectors`, k=10, over every type as recall's hop 0
  asks, and over SEMANTIC only) and, in the same process, an exact numpy scan (`matrix @ q`,
  argpartition) over the same matrix, with the recall@10 of the former against the latter;
  each in its own loop over the queries.

Goal: recall p50 <= 20 ms at 1M nodes, flat in N.

With `--where`, every node carries the metadata `{"user_id": "user<n>"}` of its trajectory's
user (`--users`, 1,000 by default: trajectory t is user t mod users; a shared tag or intent is
its first trajectory's user's), written with the scope index as mnemo writes it, and each
size also times `mem.recall(repo, query, k=10, where={"user_id": ...})` over the same queries,
each for one user in turn, right after the same query unfiltered (so that a change of the
machine's load weighs on both alike). Goal: a filtered recall's p50 within 1.5x of the
unfiltered one's.

With `--store URL|embedded` (scripts/_stores.py), each size is also measured on PostgreSQL
in the same run: the same graph and vectors are copied into a fresh database
(scripts/_pg_recall.py), the repo's pgvector HNSW index is built and timed, and the same
queries run through `mnemo.Memory(url)`; pgvector's dense search is compared with the exact
numpy scan of the same vectors.

Run: `.venv/bin/python scripts/bench_recall.py [--sizes 10000,50000,100000,1000000] [--quick]
[--queries 200] [--dir DIR] [--exact] [--set FIELD=VALUE ...] [--store URL|embedded]
[--where [--users 1000]]`.
`--set` overrides a Config field of the Memory and the repo, to time a recall lever.
The 1M size takes long to prepare and, with faiss, to build the HNSW graphs on 2 cores;
leave it out with `--sizes`. `--quick` is 10k with 50 queries. `--exact` hides faiss,
to time the pipeline on exact search alone. `--dir` keeps the prepared files there and reuses
them on the next run (a file or database prepared before the steps were named so is refused:
delete it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sqlite3
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from statistics import median
from typing import Any

import _pg_recall
import anyio
import numpy as np
import numpy.typing as npt
from _bench import config_of, facts_table, machine_facts, markdown_table, rss_bytes, verdict
from _stores import POSTGRES, SQLITE, open_stores, store_argument
from rich.console import Console
from rich.table import Table
from threadpoolctl import threadpool_limits

import mnemo
from mnemo.graph import ann
from mnemo.graph.model import NodeType
from mnemo.storage.postgres import schema
from mnemo.storage.postgres.connection import HNSW_EF_SEARCH
from mnemo.storage.postgres.vectors import EXACT_BELOW

REPO = "bench"
DIM = 384
GOAL_MS = 20.0
# A filtered recall's p50, at most this many times the unfiltered one's.
WHERE_GOAL = 1.5
console = Console(width=None if sys.stdout.isatty() else 120)

PEOPLE = (
    "alice bob carol dave erin frank grace heidi ivan judy mallory niaj olivia peggy rupert sybil "
    "trent victor walter yvonne zara omar priya kenji lucia mateo noor sven tomas ulla vera "
    "wendy xavier yusuf amara bruno chloe diego elena"
).split()
VERBS = [
    ("open", "opened"), ("close", "closed"), ("clean", "cleaned"), ("move", "moved"),
    ("fix", "fixed"), ("check", "checked"), ("fill", "filled"), ("empty", "emptied"),
    ("paint", "painted"), ("sort", "sorted"), ("lift", "lifted"), ("wash", "washed"),
    ("dry", "dried"), ("fold", "folded"), ("label", "labelled"), ("measure", "measured"),
    ("weigh", "weighed"), ("count", "counted"), ("lock", "locked"), ("unlock", "unlocked"),
    ("charge", "charged"), ("polish", "polished"), ("repair", "repaired"), ("store", "stored"),
    ("stack", "stacked"), ("hang", "hung"), ("plant", "planted"), ("water", "watered"),
    ("cut", "cut"), ("sharpen", "sharpened"), ("heat", "heated"), ("cool", "cooled"),
    ("tighten", "tightened"), ("loosen", "loosened"), ("inspect", "inspected"),
    ("replace", "replaced"), ("carry", "carried"), ("find", "found"), ("hide", "hid"),
    ("pack", "packed"),
]
ADJECTIVES = (
    "red blue green yellow black white grey brown small large heavy light old new broken "
    "shiny dusty wooden metal plastic glass ceramic woven leather rusty sturdy fragile wet dry "
    "warm cold round square narrow wide tall short soft hard empty full spare"
).split()
NOUNS = (
    "kettle teapot mug cup plate bowl spoon fork knife pan pot lid jar bottle tray towel sponge "
    "broom mop bucket ladder hammer wrench screwdriver drill saw chisel tape rope hose shovel "
    "rake trowel watering-can wheelbarrow lantern torch candle lamp bulb battery charger cable "
    "router laptop monitor keyboard mouse printer scanner phone tablet camera tripod speaker "
    "headphones radio clock watch calendar notebook pencil pen marker stapler folder binder "
    "envelope stamp parcel box crate basket bag backpack suitcase umbrella coat jacket scarf "
    "glove boot shoe sock hat helmet bicycle pump lock chain key wallet purse ticket map "
    "compass book magazine newspaper letter poster frame mirror vase plant pot-plant seed "
    "fertiliser blanket pillow cushion curtain rug carpet mat chair stool table desk shelf "
    "drawer cabinet wardrobe cupboard fridge freezer oven stove toaster blender mixer grinder "
    "scale thermometer fan heater radiator kettlebell dumbbell yoga-mat racket ball net "
    "fishing-rod tent sleeping-bag stove-top cooler flask canteen whistle first-aid-kit "
    "bandage"
).split()
PLACES = (
    "kitchen garden shed garage attic cellar hallway bathroom bedroom study office library "
    "pantry porch balcony workshop greenhouse laundry nursery playroom loft basement driveway "
    "patio terrace conservatory utility-room dining-room living-room guest-room boot-room "
    "storeroom gym studio barn stable cabin caravan boathouse courtyard"
).split()
RELATIONS = ("in", "near", "under", "behind", "beside", "above")
QUERY_TEMPLATES = (
    "where is the {adj} {noun}?",
    "what did {person} {verb} in the {place}?",
    "how do I {verb} the {adj} {noun}?",
    "which {noun} is kept in the {place}?",
    "did {person} {verb} the {noun} near the {place} last week?",
    "{adj} {noun} {place}",
)


class WordVectorEmbedder:
    """A bag-of-word-vectors `mnemo.Embedder` for this benchmark (not a neural model).

    Content words (people, verbs in both tenses, adjectives, nouns, places) have fixed random
    vectors in a 64-dimensional subspace of R^384 plus noise; other words count for nothing.
    A text's vector is the normalised sum of its words' vectors. Embedding is a dictionary
    lookup and a sum, so the query costs recall nothing measurable.
    """

    name = "bench-word-vectors"

    def __init__(self, dim: int = DIM, effective_dim: int = 64, seed: int = 0) -> None:
        self.dim = dim
        words = [*PEOPLE, *(base for base, _ in VERBS), *ADJECTIVES, *NOUNS, *PLACES]
        self.ids = {word: i for i, word in enumerate(words)}
        for base, past in VERBS:
            self.ids.setdefault(past, self.ids[base])
        rng = np.random.default_rng(seed)
        basis = rng.normal(size=(effective_dim, dim))
        table = rng.normal(size=(len(words), effective_dim)) @ basis
        table /= np.linalg.norm(table, axis=1, keepdims=True)
        table += 0.3 * rng.normal(size=table.shape) / math.sqrt(dim)
        table /= np.linalg.norm(table, axis=1, keepdims=True)
        # One more row of zeros, the padding of `vectors`.
        self.table = np.vstack([table, np.zeros((1, dim))]).astype(np.float32)

    def word_ids(self, text: str) -> list[int]:
        return [self.ids[w] for w in re.findall(r"[a-z][a-z'-]*", text.lower()) if w in self.ids]

    def vectors(
        self, id_lists: Sequence[Sequence[int]], *, noise: float = 0.0, seed: int = 0
    ) -> npt.NDArray[np.float32]:
        """Unit rows: the sum of each list's word vectors, plus `noise` x a random unit vector."""
        rng = np.random.default_rng(seed)
        out = np.zeros((len(id_lists), self.dim), dtype=np.float32)
        pad = len(self.table) - 1
        for start in range(0, len(id_lists), 8192):
            chunk = id_lists[start : start + 8192]
            width = max((len(ids) for ids in chunk), default=1) or 1
            padded = np.full((len(chunk), width), pad, dtype=np.int64)
            for row, ids in enumerate(chunk):
                padded[row, : len(ids)] = ids
            block = self.table[padded].sum(axis=1)
            if noise:
                jitter = rng.normal(size=block.shape).astype(np.float32)
                jitter /= np.linalg.norm(jitter, axis=1, keepdims=True)
                block += noise * np.linalg.norm(block, axis=1, keepdims=True) * jitter
            norms = np.linalg.norm(block, axis=1, keepdims=True)
            out[start : start + len(chunk)] = np.divide(
                block, norms, out=np.zeros_like(block), where=norms > 0
            )
        return out

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return self.vectors([self.word_ids(text) for text in texts])


# ---- the synthetic graph ----------------------------------------------------------------------


@dataclass
class Graph:
    """Rows ready for executemany: nodes (without vectors), their word ids, and links."""

    nodes: list[tuple[str, str, str, str, str | None, str | None, str]] = field(
        default_factory=list
    )
    words: list[list[int]] = field(default_factory=list)
    links: list[tuple[str, str, str, str]] = field(default_factory=list)
    keys: set[str] = field(default_factory=set)
    # The user of each node (its trajectory's; `--where`).
    users: list[int] = field(default_factory=list)


def user_name(user: int) -> str:
    return f"user{user:04d}"


def generate(target: int, embedder: WordVectorEmbedder, seed: int = 1, users: int = 1000
             ) -> Graph:
    """Trajectories until the graph holds at least `target` nodes."""
    rng = np.random.default_rng(seed)
    now = datetime.now(UTC)
    graph = Graph()
    ids = embedder.ids
    t = 0

    def add(node_id: str, kind: str, text: str, data: dict[str, object], words: list[str],
            key: str | None = None, source: str | None = None) -> None:
        created = (now - timedelta(seconds=float(rng.uniform(0, 90 * 86400)))).isoformat()
        graph.nodes.append(
            (node_id, kind, text, json.dumps(data, sort_keys=True), key, source, created)
        )
        graph.words.append([ids[w] for w in words if w in ids])
        graph.users.append(t % users)

    def link(src: str, dst: str, kind: str) -> None:
        graph.links.append((REPO, src, dst, kind))

    while len(graph.nodes) < target:
        person, place = PEOPLE[rng.integers(len(PEOPLE))], PLACES[rng.integers(len(PLACES))]
        adj, noun = ADJECTIVES[rng.integers(len(ADJECTIVES))], NOUNS[rng.integers(len(NOUNS))]
        verb, past = VERBS[rng.integers(len(VERBS))]
        episode, trajectory = f"ep{t // 2}", f"t{t}"
        source = f"source_{episode}"
        if t % 2 == 0:
            goal = f"{person} wants to {verb} the {adj} {noun} in the {place}"
            add(source, "source", goal, {"goal": goal, "episode_id": episode},
                [person, verb, adj, noun, place], source=episode)
        subgoal = f"subgoal_{trajectory}"
        add(subgoal, "subgoal", f"find the {adj} {noun} in the {place}",
            {"trajectory_id": trajectory, "episode_id": episode}, [adj, noun, place],
            source=episode)
        steps = []
        for i in range(5):
            other_adj = ADJECTIVES[rng.integers(len(ADJECTIVES))] if i % 2 else adj
            other_noun = NOUNS[rng.integers(len(NOUNS))] if i % 2 else noun
            shelf = PLACES[rng.integers(len(PLACES))]
            step_verb, _ = VERBS[rng.integers(len(VERBS))]
            observation = f"{person} sees the {other_adj} {other_noun} on the {shelf} shelf"
            action = f"{step_verb} the {other_adj} {other_noun}"
            # Named as the pipeline names a step (its episode's two trajectories in turn), so
            # that recall's neighbours and the words index's windows find its neighbours.
            index = (t % 2) * 5 + i
            step = f"episodic_{episode}:{index}"
            add(step, "episodic", f"{observation} -> {action}",
                {"observation": observation, "action": action,
                 "reward": round(float(rng.uniform(0, 1)), 2), "index": index,
                 "trajectory_id": trajectory, "episode_id": episode},
                [person, other_adj, other_noun, shelf, step_verb], source=episode)
            link(subgoal, step, "hierarchical")
            link(step, source, "provenance")
            steps.append(step)
        facts = []
        for j in range(3):
            fact_adj = adj if j == 0 else ADJECTIVES[rng.integers(len(ADJECTIVES))]
            fact_noun = noun if j == 0 else NOUNS[rng.integers(len(NOUNS))]
            relation = RELATIONS[rng.integers(len(RELATIONS))]
            text = f"The {fact_adj} {fact_noun} is kept {relation} the {place}."
            fact = f"fact_{trajectory}_{j}"
            concepts = [f"{fact_adj} {fact_noun}", f"{fact_noun} in the {place}"]
            add(fact, "semantic", text,
                {"concepts": concepts, "confidence": round(float(rng.uniform(0.5, 1)), 2),
                 "trajectory_id": trajectory},
                [fact_adj, fact_noun, place], source=episode)
            link(fact, steps[int(rng.integers(5))], "provenance")
            for concept in concepts:
                tag = "tag_" + concept.replace(" ", "_")
                if concept not in graph.keys:
                    graph.keys.add(concept)
                    add(tag, "tag", concept, {"label": concept}, concept.split(), key=concept)
                link(tag, fact, "membership")
            facts.append(fact)
        for a in range(3):
            for b in range(a + 1, 3):
                link(facts[a], facts[b], "sibling")
        intent_text = f"{verb} the {adj} {noun}"
        intent = "intent_" + intent_text.replace(" ", "_")
        if intent_text not in graph.keys:
            graph.keys.add(intent_text)
            add(intent, "intent", intent_text, {"intent": intent_text}, [verb, adj, noun])
        tool_noun = NOUNS[rng.integers(len(NOUNS))]
        tool_verb, _ = VERBS[rng.integers(len(VERBS))]
        instruction = f"To {verb} the {adj} {noun}, {tool_verb} the {tool_noun} first"
        procedure = f"procedure_{trajectory}"
        add(procedure, "procedural", instruction,
            {"intent": intent_text, "instruction": instruction, "condition": f"in the {place}",
             "expected_outcome": f"the {noun} is {past}",
             "return_score": int(rng.integers(1, 11)), "trajectory_id": trajectory},
            [verb, adj, noun, tool_verb, tool_noun, place], source=episode)
        link(intent, procedure, "hierarchical")
        link(procedure, steps[-1], "provenance")
        t += 1
    return graph


def queries(count: int, seed: int = 2) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        template = QUERY_TEMPLATES[i % len(QUERY_TEMPLATES)]
        out.append(template.format(
            person=PEOPLE[rng.integers(len(PEOPLE))].capitalize(),
            verb=VERBS[rng.integers(len(VERBS))][0],
            adj=ADJECTIVES[rng.integers(len(ADJECTIVES))],
            noun=NOUNS[rng.integers(len(NOUNS))],
            place=PLACES[rng.integers(len(PLACES))],
        ))
    return out


CHUNK = 20_000


def node_vectors(graph: Graph, embedder: WordVectorEmbedder, start: int) -> npt.NDArray[np.float32]:
    """The vectors of the nodes from `start` on, `CHUNK` of them at most (each chunk seeds its
    own noise, so every backend gets the same vectors)."""
    return embedder.vectors(graph.words[start : start + CHUNK], noise=0.25, seed=start)


async def prepare(path: Path, graph: Graph, embedder: WordVectorEmbedder, scoped: bool = False
                  ) -> tuple[int, float]:
    """Writes the synthetic graph into a fresh file (with `scoped`, each node's user as its
    metadata and in the scope index); returns its node count and seconds."""
    started = time.perf_counter()
    async with mnemo.Memory(path, embedder=embedder) as mem:
        await mem.open_repo(REPO)
    conn = sqlite3.connect(path)
    try:
        # A benchmark file: durability while writing it does not matter, speed does.
        conn.execute("PRAGMA synchronous=OFF")
        chunk = CHUNK
        with conn:
            for start in range(0, len(graph.nodes), chunk):
                rows = graph.nodes[start : start + chunk]
                vectors = node_vectors(graph, embedder, start)
                users = graph.users[start : start + chunk]
                conn.executemany(
                    "INSERT INTO nodes(id, repo, type, text, data, key, source_id, created_at,"
                    " metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(i, REPO, kind, text, data, key, source, created,
                      json.dumps({"user_id": user_name(u)}) if scoped else None)
                     for (i, kind, text, data, key, source, created), u
                     in zip(rows, users, strict=True)],
                )
                if scoped:  # mnemo's scope index (`mnemo.graph.scope`)
                    conn.executemany(
                        "INSERT INTO node_scopes(repo, key, value, node)"
                        " SELECT ?, 'user_id', ?, rowid FROM nodes WHERE id = ?",
                        [(REPO, json.dumps(user_name(u)), row[0])
                         for row, u in zip(rows, users, strict=True)],
                    )
                # mnemo's layout: float16, keyed by the node's rowid.
                conn.executemany(
                    "INSERT INTO vectors(node, vec) SELECT rowid, ? FROM nodes WHERE id = ?",
                    [(vector.astype(np.float16).tobytes(), row[0])
                     for row, vector in zip(rows, vectors, strict=True)],
                )
            # mnemo's layout: a link names its ends by their nodes' rowids.
            conn.executemany(
                "INSERT OR IGNORE INTO links(src, dst, type) SELECT a.rowid, b.rowid, ?"
                " FROM nodes a, nodes b WHERE a.id = ? AND b.id = ?",
                [(kind, src, dst) for _, src, dst, kind in graph.links],
            )
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return len(graph.nodes), time.perf_counter() - started


# ---- measuring --------------------------------------------------------------------------------


@dataclass
class Result:
    backend: str
    size: int
    prepare_s: float | None
    load_s: float
    ann_s: float | None
    ann_read: bool
    lexical_s: float
    ann_used: bool
    recall_ms: list[float]
    where_ms: list[float]
    where_memories: float
    dense_ms: list[float]
    typed_ms: list[float]
    exact_ms: list[float]
    dense_recall: float
    stages: dict[str, float]
    memories: float
    rss_gib: float

    @property
    def p50(self) -> float:
        return float(np.percentile(self.recall_ms, 50))

    @property
    def p95(self) -> float:
        return float(np.percentile(self.recall_ms, 95))


def pct(samples: Sequence[float], q: float) -> float:
    return float(np.percentile(samples, q))


async def measure(
    store: Path | str, size: int, prepare_s: float | None, texts: list[str],
    embedder: WordVectorEmbedder, config: mnemo.Config | None = None,
    pg: _pg_recall.Prepared | None = None, users: int | None = None,
) -> Result:
    """Recall and dense search over a prepared store; `pg` (a PostgreSQL store) brings the
    vectors for the exact scan and the HNSW build time, which SQLite's index has itself."""
    # The Memory gets the overrides too: some fields are the process's (`blas_threads`).
    async with mnemo.Memory(store, embedder=embedder, config=config) as mem:
        if config is not None:
            await mem.open_repo(REPO, embedder=embedder, config=config)
        # The store behind the facade: the benchmark times its index load and HNSW build
        # separately from recall, and reads the matrix for the exact scan (not public API).
        graph: Any = mem._graph  # both stores have `vector_index`; the port does not
        started = time.perf_counter()
        # On PostgreSQL: only the TAG and INTENT vectors, which PgGraph keeps in memory.
        index = await graph.vector_index(REPO)
        load_s = time.perf_counter() - started
        ann_s = None
        ann_read = False
        if pg is not None:
            ann_s = pg.build_s
            ann_used = await _pg_recall.uses_index(
                str(store), REPO, DIM, (await embedder.embed(texts[:1]))[0])
        elif index.accelerator is not None and len(index) > ann.DEFAULT_THRESHOLD:
            started = time.perf_counter()
            console.print(f"  HNSW graphs for {len(index):,} vectors: built or read ...")
            await graph.settle(REPO)
            ann_s = time.perf_counter() - started
            if isinstance(index.accelerator, ann.HnswAccelerator):
                ann_read = bool(index.accelerator.stats()["read"])
        if pg is None:
            accelerator = index.accelerator
            ann_used = isinstance(accelerator, ann.HnswAccelerator) and accelerator.ready
        # The lexical index (built from the store in the background on first use).
        started = time.perf_counter()
        await graph.settle(REPO)
        lexical_s = time.perf_counter() - started
        for text in texts[:5]:
            await mem.recall(REPO, text, k=10)
        recall_ms: list[float] = []
        where_ms: list[float] = []
        stages: dict[str, list[float]] = {}
        returned = scoped = 0
        for i, text in enumerate(texts):
            started = time.perf_counter()
            result = await mem.recall(REPO, text, k=10)
            recall_ms.append((time.perf_counter() - started) * 1000)
            returned += len(result.memories)
            trace = getattr(result, "trace", None)
            if isinstance(trace, dict):
                for stage, seconds in trace.items():
                    stages.setdefault(stage, []).append(float(seconds) * 1000)
            if users:
                # Each query for another user, spread over them (7919 is prime).
                where = {"user_id": user_name(i * 7919 % users)}
                started = time.perf_counter()
                result = await mem.recall(REPO, text, k=10, where=where)
                where_ms.append((time.perf_counter() - started) * 1000)
                scoped += len(result.memories)
        vectors = await embedder.embed(texts)
        if pg is None:
            snap = index.snapshot()
            matrix, matrix_ids = snap.matrix[: snap.size], snap.ids
        else:
            matrix, matrix_ids = pg.matrix, pg.ids
        # One loop per method: interleaving them would leave each a cache the other evicted.
        dense_ms, dense_ids = [], []
        for vector in vectors:
            started = time.perf_counter()
            dense = await graph.search_vectors(REPO, vector, 10)
            dense_ms.append((time.perf_counter() - started) * 1000)
            dense_ids.append({node_id for node_id, _ in dense})
        typed_ms = []
        for vector in vectors:
            started = time.perf_counter()
            await graph.search_vectors(REPO, vector, 10, [NodeType.SEMANTIC])
            typed_ms.append((time.perf_counter() - started) * 1000)
        exact_ms, overlap = [], 0
        # The reference scan has every core, as a numpy user's would: mnemo limited numpy's
        # BLAS threads when the Memory opened (Config.blas_threads).
        with threadpool_limits(limits=os.cpu_count(), user_api="blas"):
            for vector, found in zip(vectors, dense_ids, strict=True):
                started = time.perf_counter()
                scores = matrix @ vector
                top = np.argpartition(-scores, 9)[:10]
                top = top[np.argsort(-scores[top])]
                exact_ms.append((time.perf_counter() - started) * 1000)
                overlap += len({matrix_ids[i] for i in top.tolist()} & found)
        return Result(
            backend=POSTGRES if pg is not None else SQLITE,
            size=size,
            prepare_s=prepare_s,
            load_s=load_s,
            ann_s=ann_s,
            ann_read=ann_read,
            lexical_s=lexical_s,
            ann_used=ann_used,
            recall_ms=recall_ms,
            where_ms=where_ms,
            where_memories=scoped / len(texts),
            dense_ms=dense_ms,
            typed_ms=typed_ms,
            exact_ms=exact_ms,
            dense_recall=overlap / (10 * len(texts)),
            stages={stage: median(values) for stage, values in stages.items()},
            memories=returned / len(texts),
            rss_gib=rss_bytes() / 2**30,
        )


# A store prepared before its steps were named as the pipeline names them ("step_<t>_<i>"):
# its steps would get neither words windows nor neighbours, and the graph generated to check it
# would not match it.
OLDER_STEPS = "SELECT 1 FROM nodes WHERE type = 'episodic' AND id LIKE 'step%' LIMIT 1"
OLDER = ("prepared by an older bench_recall.py (steps named step_<t>_<i>, which get no "
         "windows or neighbours); delete it to prepare it again")
UNSCOPED = "SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM node_scopes)"
NO_SCOPES = "prepared without --where (no node has a user); delete it to prepare it again"


async def run(args: argparse.Namespace) -> tuple[list[Result], dict[str, str]]:
    embedder = WordVectorEmbedder()
    texts = queries(args.queries)
    users = args.users if args.where else None
    results = []
    keep = Path(args.dir) if args.dir else None
    async with open_stores(args.store, "mnemo-bench-recall-") as stores:
        facts = await stores.facts()
        folder = keep or stores.tmp
        folder.mkdir(parents=True, exist_ok=True)
        for size in args.sizes:
            graph: Graph | None = None
            path = folder / f"recall-{size}.db"
            prepare_s = None
            if args.skip_sqlite and POSTGRES in stores.backends:
                pass
            elif path.exists() and keep is not None:
                console.print(f"[bold]{size:,} nodes[/]: reusing {path}")
                conn = sqlite3.connect(path)
                nodes = int(conn.execute("SELECT count(*) FROM nodes").fetchone()[0])
                older = conn.execute(OLDER_STEPS).fetchone()
                unscoped = conn.execute(UNSCOPED).fetchone()
                conn.close()
                if older:
                    raise SystemExit(f"{path}: {OLDER}")
                if users and unscoped:
                    raise SystemExit(f"{path}: {NO_SCOPES}")
            else:
                path.unlink(missing_ok=True)
                shutil.rmtree(f"{path}.hnsw", ignore_errors=True)  # graphs of an older file
                console.print(f"[bold]{size:,} nodes[/]: preparing {path} ...")
                started = time.perf_counter()
                graph = generate(size, embedder, users=args.users)
                nodes, _ = await prepare(path, graph, embedder, scoped=bool(users))
                prepare_s = time.perf_counter() - started  # with generating the graph, as before
                console.print(f"  {nodes:,} nodes written in {prepare_s:,.1f} s")
            if not (args.skip_sqlite and POSTGRES in stores.backends):
                results.append(await measure(path, nodes, prepare_s, texts, embedder,
                                             args.config, users=users))
                _say(results[-1])
            if POSTGRES not in stores.backends:
                continue
            kept = f"recall_{size}_kept"
            reuse = args.keep_pg and await _pg_recall.exists(stores.url("postgres"), kept)
            # Refused before the graph is generated (minutes at 1M), not after.
            if reuse and await _pg_recall.holds(stores.url(kept), OLDER_STEPS):
                raise SystemExit(f"database {kept}: {OLDER}")
            if reuse and users and await _pg_recall.holds(stores.url(kept), UNSCOPED):
                raise SystemExit(f"database {kept}: {NO_SCOPES}")
            graph = graph or generate(size, embedder, users=args.users)
            if reuse:
                url = stores.url(kept)
                console.print(f"[bold]{size:,} nodes[/]: reusing the PostgreSQL database {kept}")
                pg = _pg_recall.reused(graph.nodes, DIM, partial(node_vectors, graph, embedder),
                                       CHUNK)
            else:
                if args.keep_pg:
                    await _pg_recall.create(stores.url("postgres"), kept)
                    url = stores.url(kept)
                else:
                    url = str(await stores.fresh(POSTGRES, f"recall_{size}"))
                console.print(f"[bold]{size:,} nodes[/]: preparing a PostgreSQL database ...")
                pg = await _pg_recall.prepare(
                    url, REPO, DIM, embedder, graph.nodes, graph.links,
                    partial(node_vectors, graph, embedder), CHUNK,
                    [user_name(u) for u in graph.users] if users else None)
                console.print(f"  {pg.nodes:,} nodes copied in {pg.prepare_s:,.1f} s, HNSW "
                              f"index built in {pg.build_s:,.1f} s" +
                              "".join(f"\n  notice: {n}" for n in pg.notices))
            facts[f"pgvector notices at {size:,}"] = "; ".join(pg.notices) or "none"
            results.append(await measure(url, pg.nodes, pg.prepare_s, texts, embedder,
                                         args.config, pg, users))
            _say(results[-1])
            del pg
    return results, facts


def _say(result: Result) -> None:
    console.print(
        f"  {result.backend}: recall p50 {result.p50:.2f} ms, p95 {result.p95:.2f} ms; dense "
        f"recall@10 {result.dense_recall:.3f}; exact scan p50 {pct(result.exact_ms, 50):.2f} ms"
        + (f"; filtered recall p50 {pct(result.where_ms, 50):.2f} ms "
           f"({pct(result.where_ms, 50) / result.p50:.2f}x)" if result.where_ms else "")
    )


def dense_method(r: Result) -> str:
    if r.backend == POSTGRES:
        return (f"pgvector HNSW (ef_search {HNSW_EF_SEARCH})" if r.ann_used else
                "pgvector exact scan")
    return "HNSW + exact re-rank" if r.ann_used else "exact numpy"


def report(results: list[Result], args: argparse.Namespace, facts: dict[str, str]) -> None:
    headers = [
        "backend", "nodes", "prepare s", "index load s", "HNSW build (or read) s",
        "lexical index s",
        "dense search",
        "recall p50 ms", "recall p95 ms", "dense p50 / p95 ms", "dense semantic-only p50 ms",
        "exact numpy p50 / p95 ms",
        "dense recall@10 vs exact", "memories / recall", "RSS GiB",
    ]
    scoped = any(r.where_ms for r in results)
    if scoped:
        headers += ["filtered p50 / p95 ms", "filtered / unfiltered p50",
                    "memories / filtered recall"]
    rows = []
    for r in results:
        rows.append([
            r.backend,
            f"{r.size:,}",
            "reused" if r.prepare_s is None else f"{r.prepare_s:,.1f}",
            f"{r.load_s:,.2f}",
            "-" if r.ann_s is None else f"{r.ann_s:,.1f}" + (" (read)" if r.ann_read else ""),
            f"{r.lexical_s:,.1f}",
            dense_method(r),
            f"{r.p50:.2f}",
            f"{r.p95:.2f}",
            f"{pct(r.dense_ms, 50):.2f} / {pct(r.dense_ms, 95):.2f}",
            f"{pct(r.typed_ms, 50):.2f}",
            f"{pct(r.exact_ms, 50):.2f} / {pct(r.exact_ms, 95):.2f}",
            f"{r.dense_recall:.3f}",
            f"{r.memories:.1f}",
            f"{r.rss_gib:.2f}",
            *([f"{pct(r.where_ms, 50):.2f} / {pct(r.where_ms, 95):.2f}",
               f"{pct(r.where_ms, 50) / r.p50:.2f}x", f"{r.where_memories:.1f}"]
              if scoped else []),
        ])
    table = Table(title=f"mnemo recall, {args.queries} queries per size, k=10")
    for header in headers:
        table.add_column(header, justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    stage_names = sorted({stage for r in results for stage in r.stages})
    stage_rows = [
        [r.backend, f"{r.size:,}",
         *(f"{r.stages.get(stage, float('nan')):.2f}" for stage in stage_names)]
        for r in results
    ]
    if stage_names:
        stage_table = Table(title="median ms per recall stage (RecallResult.trace)")
        stage_table.add_column("backend")
        stage_table.add_column("nodes", justify="right")
        for stage in stage_names:
            stage_table.add_column(stage, justify="right")
        for row in stage_rows:
            stage_table.add_row(*row)
        console.print(stage_table)
    goal_rows = []
    for backend in dict.fromkeys(r.backend for r in results):
        mine = [r for r in results if r.backend == backend]
        largest = max(mine, key=lambda r: r.size)
        smallest = min(mine, key=lambda r: r.size)
        goal_rows.append([
            f"{backend}: recall p50 at {largest.size:,} nodes", f"{largest.p50:.2f} ms",
            f"<= {GOAL_MS:.0f} ms",
            verdict(largest.p50 <= GOAL_MS) if largest.size >= 1_000_000 else
            "[yellow]not measured at 1M[/]",
        ])
        if largest.where_ms:
            ratio = pct(largest.where_ms, 50) / largest.p50
            goal_rows.append([
                f"{backend}: filtered / unfiltered p50 at {largest.size:,} nodes, "
                f"{args.users:,} users", f"{ratio:.2f}x", f"<= {WHERE_GOAL}x",
                verdict(ratio <= WHERE_GOAL) if largest.size >= 1_000_000 else
                "[yellow]not measured at 1M[/]",
            ])
        if len(mine) > 1:
            growth = largest.p50 / smallest.p50
            goal_rows.append([
                f"{backend}: p50 growth {smallest.size:,} -> {largest.size:,}", f"{growth:.2f}x",
                "flat (<= 2x)", verdict(growth <= 2.0),
            ])
    console.print(facts_table({**machine_facts(), **facts}))
    notes = [
        "Graph written with executemany into mnemo's schema (FTS5 and the lexical log by their"
        " triggers), not by the pipeline.",
        "lexical index s: the tantivy index brought up from the store (built from its nodes"
        " on first use, in the background; recall's store search answers meanwhile), before"
        " the timed queries.",
        "Vectors: bag of random word vectors (64-d subspace of R^384 plus noise), not a"
        " neural embedder; queries embedded by the same model.",
        "HNSW (faiss IndexHNSWFlat, M=32, efC=200, efSearch 64-128, one graph per node type"
        " and one of every row for searches of most types, 8x candidates up to efSearch"
        f" re-ranked exactly) is used above {ann.DEFAULT_THRESHOLD:,} vectors when faiss-cpu"
        " is installed"
        + (" (hidden by --exact in this run)." if args.exact else "."),
        f"faiss: {'installed' if ann.load_faiss() is not None else 'not installed'}.",
    ]
    if any(r.backend == POSTGRES for r in results):
        notes += [
            "PostgreSQL: the same graph and vectors copied in (COPY; prepare s excludes"
            " generating the graph, which SQLite's includes), then ANALYZE; HNSW build s is"
            f" schema.ensure_vector_index (m={schema.HNSW_M},"
            f" ef_construction={schema.HNSW_EF_CONSTRUCTION}) on the server's settings.",
            "PostgreSQL: index load s is the TAG and INTENT vectors PgGraph keeps in memory;"
            f" dense search goes to the HNSW index above {EXACT_BELOW:,} vectors (hnsw."
            "iterative_scan=relaxed_order for a typed search); recall@10 is against the exact"
            " numpy scan of the same vectors.",
        ]
    markdown = "\n\n".join([
        "### Recall latency (scripts/bench_recall.py)",
        markdown_table(headers, rows),
        markdown_table(["backend", "nodes", *(f"{s} (median ms)" for s in stage_names)],
                       stage_rows) if stage_names else "",
        markdown_table(["goal", "measured", "target", "met"], goal_rows),
        "\n".join(f"- {note}" for note in notes),
    ])
    # Plain print: a rich console would wrap the Markdown rows at its width.
    print()
    print(markdown)


def parse_args() -> argparse.Namespace:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--sizes", default=None,
                        help="comma-separated node counts (default 10000,100000,1000000)")
    parser.add_argument("--quick", action="store_true", help="10k nodes, 50 queries")
    parser.add_argument("--queries", type=int, default=None, help="queries per size (200)")
    parser.add_argument("--dir", default=None,
                        help="keep the prepared files here and reuse them next time")
    parser.add_argument("--exact", action="store_true",
                        help="hide faiss: every vector search is the exact numpy scan")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a mnemo.Config field of the repo (as eval_locomo.py)")
    parser.add_argument("--keep-pg", action="store_true",
                        help="with --store URL: keep each size's PostgreSQL database"
                        " (recall_SIZE_kept) and reuse it when it exists")
    parser.add_argument("--skip-sqlite", action="store_true",
                        help="with --store: measure PostgreSQL only (a 1M SQLite run takes "
                        "its own half hour)")
    parser.add_argument("--where", action="store_true",
                        help="give every node a user_id and also time recall with where=")
    parser.add_argument("--users", type=int, default=1000,
                        help="with --where: how many users the trajectories belong to")
    parser.add_argument("--store", type=store_argument, default=None,
                        help="also measure on PostgreSQL: a postgresql:// URL of a server "
                             "whose role may CREATE DATABASE, or 'embedded'")
    args = parser.parse_args()
    args.config = config_of(args.set) if args.set else None
    default_sizes = "10000" if args.quick else "10000,50000,100000,1000000"
    args.sizes = [int(s.replace("_", "")) for s in (args.sizes or default_sizes).split(",")]
    args.queries = args.queries or (50 if args.quick else 200)
    return args


def main() -> None:
    args = parse_args()
    if args.exact:
        ann.load_faiss = lambda: None  # --exact: as if not installed
    results, facts = anyio.run(run, args)
    report(results, args, facts)


if __name__ == "__main__":
    main()
