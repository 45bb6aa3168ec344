"""Recall's four yardsticks, from one run each: LoCoMo dev evidence recall (R@10 over turns,
and R@5 by session as engram-search counts it), answer@5 on the same questions, the
fact-first suite and the knowledge-update suite. Every recall change reports them together:
none may fall when another rises.

- **LoCoMo** (`eval_locomo.py`): dev conversations 0-6 ingested offline, each question
  recalled with k=10 (reinforcing, as a user's recalls do).
- **The fact-first suite** (`tests/recall/fact_first.py`): 46 questions each answered by one
  fact or procedure extracted from an agent's sessions; MRR and hit@1 (goal >= 0.95).
- **The knowledge-update suite** (`tests/recall/knowledge_update.py`): 45 facts corrected in
  a later session; hit@1 of the current value (goal >= 0.9).

Both suites run their sessions through a `Memory` with their test model (a fake LLM that
extracts exactly the facts written beside each step) and recall with `types=None`.

    .venv/bin/python scripts/eval_recall.py [--embedder default|hash|minilm|e5-small-q4]
        [--set FIELD=VALUE ...] [--locomo-db DIR] [--conversations 0-6] [--no-locomo]
        [--misses]

`--locomo-db DIR` reuses an ingest (`eval_locomo.py --db 'DIR/{conversation}.db'
--ingest-only`), on copies of it: a recall reinforces what it returns. `--set` overrides a
`mnemo.Config` field; `--set recall_rerank=true` with `--llm URI` measures the opt-in LLM
re-ranker with a real model (the suites' extraction stays the test model's).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import eval_locomo
from _bench import config_of

import mnemo
from mnemo.adapters.uri import embedder_from_uri, llm_from_uri
from tests.recall import fact_first, knowledge_update
from tests.recall.fact_first import Case, Report, Session, SuiteLLM, evaluate, remember


class _RerankingLLM(SuiteLLM):
    """The suite's test model for extraction; another LLM for recall's re-ranking."""

    def __init__(self, other: mnemo.LLM, sessions: Sequence[Session],
                 corrections: frozenset[tuple[str, str]]) -> None:
        super().__init__(sessions, corrections)
        self._other = other

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        if request.task == "recall_rerank":
            return await self._other.generate(request)
        return await super().generate(request)


async def suite(args: argparse.Namespace, sessions: Sequence[Session], cases: Sequence[Case],
                corrections: frozenset[tuple[str, str]]) -> Report:
    """One suite's sessions remembered in a new store, then its questions asked."""
    config = config_of(args.set)
    embedder = None if args.embedder == "default" else embedder_from_uri(args.embedder)
    llm: mnemo.LLM = (SuiteLLM(sessions, corrections) if args.llm is None
                      else _RerankingLLM(llm_from_uri(args.llm), sessions, corrections))
    with tempfile.TemporaryDirectory() as tmp:
        async with mnemo.Memory(Path(tmp) / "suite.db", llm=llm, embedder=embedder,
                                config=config) as mem:
            await remember(mem, sessions)
            return await evaluate(mem, cases)


async def locomo(args: argparse.Namespace) -> eval_locomo.Scores:
    """LoCoMo dev's evidence recall, on copies of `--locomo-db` or a fresh ingest."""
    first, _, last = args.conversations.partition("-")
    conversations = eval_locomo.load(eval_locomo.DATA, range(int(first), int(last or first) + 1))
    options = eval_locomo.parse_args([])
    options.baselines = False
    options.set = args.set
    results = {"mnemo recall": eval_locomo.Scores()}
    embedder = eval_locomo.pick_embedder(args.embedder)
    with tempfile.TemporaryDirectory() as tmp:
        for conversation in conversations:
            path = Path(tmp) / f"{conversation.index}.db"
            if args.locomo_db:
                kept = Path(args.locomo_db) / f"{conversation.index}.db"
                shutil.copy(kept, path)
            await eval_locomo._run(path, [conversation], embedder, config_of(args.set),
                                   options, results)
    return results["mnemo recall"]


def _misses(name: str, report: Report) -> None:
    for case, rank, texts in report.ranks:
        if rank != 1:
            print(f"\n{name} {rank}: {case.question}\n  want: {case.answer}")
            for text in texts[:3]:
                print(f"  got:  {text[:110]}")


async def main(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    facts = await suite(args, fact_first.SESSIONS, fact_first.CASES, fact_first.CORRECTIONS)
    updates = await suite(args, knowledge_update.SESSIONS, knowledge_update.CASES,
                          knowledge_update.CORRECTIONS)
    scores = None if args.no_locomo else await locomo(args)
    print(f"embedder {args.embedder}; config overrides: {args.set or 'none'}; "
          f"{time.perf_counter() - started:.0f} s")
    if scores is not None:
        print(f"LoCoMo dev {args.conversations} ({scores.count} questions): evidence R@10 "
              f"{scores.mean(10):.3f} (R@5 {scores.mean(5):.3f}, R@1 {scores.mean(1):.3f}), "
              f"session R@5 {scores.mean(eval_locomo.SESSION):.3f}, "
              f"answer@5 {scores.mean(eval_locomo.ANSWER):.3f}")
    print(f"fact-first suite ({len(fact_first.CASES)} questions): hit@1 {facts.hit_at_1:.3f}, "
          f"MRR {facts.mrr:.3f}")
    print(f"knowledge-update suite ({len(knowledge_update.CASES)} questions): hit@1 "
          f"{updates.hit_at_1:.3f}, MRR {updates.mrr:.3f}")
    if args.misses:
        _misses("fact-first", facts)
        _misses("knowledge-update", updates)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--embedder", default="default")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--llm", help="a model URI for the re-ranker (with recall_rerank=true)")
    parser.add_argument("--locomo-db", metavar="DIR",
                        help="a folder of LoCoMo stores ingested before, N.db each (copied)")
    parser.add_argument("--conversations", default="0-6", help="LoCoMo's, e.g. 0-6 or 2")
    parser.add_argument("--no-locomo", action="store_true", help="the two suites alone")
    parser.add_argument("--misses", action="store_true", help="print each question not first")
    return parser.parse_args()


if __name__ == "__main__":
    anyio.run(main, parse_args())
