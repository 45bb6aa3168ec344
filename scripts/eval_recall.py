"""The fact-first suite as a benchmark: MRR and hit@1 of the extracted fact or procedure that
answers each question (`tests/recall/fact_first.py`).

Every session of the suite is run through a `Memory` with the suite's test model (a fake LLM
that extracts exactly the facts written beside each step), then each question is recalled with
`types=None` (every node type, as an agent asks) and the rank of its answer is read.

    .venv/bin/python scripts/eval_recall.py [--embedder default|hash|minilm|e5-small-q4]
        [--set FIELD=VALUE ...] [--store PATH] [--misses] [--suite fact-first|knowledge-update]

`--set` overrides a `mnemo.Config` field (as in `eval_locomo.py`); `--set recall_rerank=true`
with `--llm URI` measures the opt-in LLM re-ranker with a real model (the suite's extraction
stays the test model's).

`--suite knowledge-update` runs the knowledge-update set instead
(`tests/recall/knowledge_update.py`, through the offline LLM): the share of cases whose stale
fact is retired and whose current value a recall names first.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _bench import config_of

import mnemo
from mnemo.adapters.uri import embedder_from_uri, llm_from_uri
from tests.recall import knowledge_update
from tests.recall.fact_first import (
    CASES,
    REPO,
    Case,
    SuiteLLM,
    evaluate,
    remember,
)


class _RerankingLLM(SuiteLLM):
    """The suite's test model for extraction; another LLM for recall's re-ranking."""

    def __init__(self, other: mnemo.LLM) -> None:
        super().__init__()
        self._other = other

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        if request.task == "recall_rerank":
            return await self._other.generate(request)
        return await super().generate(request)


async def main(args: argparse.Namespace) -> None:
    config = config_of(args.set)
    embedder = None if args.embedder == "default" else embedder_from_uri(args.embedder)
    if args.suite == "knowledge-update":
        await _updates(embedder, config, args.misses)
        return
    llm: mnemo.LLM = SuiteLLM() if args.llm is None else _RerankingLLM(llm_from_uri(args.llm))
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or str(Path(tmp) / "suite.db")
        async with mnemo.Memory(store, llm=llm, embedder=embedder, config=config) as mem:
            started = time.perf_counter()
            if not (args.kept and await mem.list_repos()):
                await remember(mem)
            remembered = time.perf_counter() - started
            started = time.perf_counter()
            report = await evaluate(mem)
            recalled = time.perf_counter() - started
    print(f"embedder {args.embedder}; config overrides: {args.set or 'none'}")
    print(f"{len(CASES)} questions: MRR {report.mrr:.3f}, hit@1 {report.hit_at_1:.3f}, "
          f"in the top 3 {sum(r is not None and r <= 3 for _, r, _ in report.ranks)}, "
          f"missing from the top 10 {sum(r is None for _, r, _ in report.ranks)}")
    print(f"sessions committed in {remembered:.1f} s; recall {1000 * recalled / len(CASES):.1f} "
          "ms a question")
    if args.misses:
        for case, rank, texts in report.ranks:
            if rank != 1:
                print(f"\n{rank}: {case.question}\n  want: {case.answer}")
                for text in texts[:3]:
                    print(f"  got:  {text[:110]}")
    if args.store:
        await _types(args.store, llm, embedder, config, [c for c, r, _ in report.ranks if r != 1])


async def _updates(embedder: mnemo.Embedder | None, config: mnemo.Config, misses: bool) -> None:
    cases = knowledge_update.CASES
    with tempfile.TemporaryDirectory() as tmp:
        async with mnemo.Memory(str(Path(tmp) / "updates.db"), embedder=embedder,
                                config=config) as mem:
            await knowledge_update.remember(mem)
            missed = await knowledge_update.evaluate(mem)
    print(f"{len(cases)} knowledge updates: the current value first in "
          f"{len(cases) - len(missed)} ({1 - len(missed) / len(cases):.3f})")
    for case, why in missed if misses else []:
        print(f"\n{case.question}\n  want: {case.current}, not {case.stale}\n  {why}")


async def _types(store: str, llm: mnemo.LLM, embedder: mnemo.Embedder | None,
                 config: mnemo.Config, cases: list[Case]) -> None:
    """The type, phase and score of the top 3 of each question not answered first."""
    async with mnemo.Memory(store, llm=llm, embedder=embedder, config=config) as mem:
        for case in cases:
            result = await mem.recall(REPO, case.question, k=3, reinforce=False)
            print(f"\n{case.question}")
            for m in result.memories:
                print(f"  {m.score:.3f} {m.node.type} {m.phase}/{m.hop} {m.retired} "
                      f"{m.node.text[:70]}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--embedder", default="default")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--llm", help="a model URI for the re-ranker (with recall_rerank=true)")
    parser.add_argument("--store", help="a store to keep (default: a temporary file); one "
                        "that holds the suite already is recalled from as it is")
    parser.add_argument("--misses", action="store_true", help="print each question not first")
    parser.add_argument("--suite", choices=["fact-first", "knowledge-update"],
                        default="fact-first")
    args = parser.parse_args()
    args.kept = bool(args.store) and Path(args.store).exists()
    return args


if __name__ == "__main__":
    anyio.run(main, parse_args())
