"""Commits: a changeset applied together with the session's side of it (`commit_steps`), and
how a commit deduplicates intents and retires contradicted facts (`intent_policy`).

Below the machine's moves (`transitions`) and the extraction runner (`extracting`): both commit
through it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from mnemo.calls.retry import fail_after
from mnemo.calls.tasks import ask
from mnemo.episode.annotation import embed
from mnemo.episode.model import StepRecord
from mnemo.errors import EmbeddingError, LLMError
from mnemo.extraction.contradiction import contradiction_request, parse_contradiction
from mnemo.extraction.entities import embedded_again
from mnemo.extraction.prompts import (
    merge_intent_request,
    merge_intents_request,
    parse_merged_intent,
    parse_merged_intents,
)
from mnemo.graph.contradiction import Question
from mnemo.graph.model import Changeset, CommitReceipt, Vector
from mnemo.graph.ports import IntentPolicy, Restamp, StepsCommitted
from mnemo.ports import LLM
from mnemo.session.machine import State
from mnemo.session.records import Runtime, SessionRecord
from mnemo.session.registry import Sessions

log = logging.getLogger("mnemo")


async def commit_steps(
    live: Sessions,
    session: SessionRecord,
    changeset: Changeset,
    steps: list[StepRecord],
    state: State | None,
) -> CommitReceipt:
    """Applies `changeset` with the session's side (steps committed, and `state` unless
    None) in the same transaction, then marks the steps committed in memory."""
    episode_id = session.episode.id if session.episode else None
    side = StepsCommitted(
        session.id,
        episode_id,
        changeset.id,
        tuple((s.id, s.reward) for s in steps),
        None if state is None else state.value,
        # A commit that moves the session checks that no other Memory moved it first.
        None if state is None else session.version,
    )
    runtime = session.runtime
    policy = intent_policy(runtime, live.llm_for(runtime, session.repo, session.id),
                           session.repo, live.refresh_repo)
    receipt = await live.graph.apply(changeset, intents=policy, also=[side])
    if side.version is not None:
        # The version the write made, not one more than the record's now: a read that took
        # the write in meanwhile (`Sessions.reload`) already holds it.
        session.version = side.version + 1
    for step in steps:
        step.committed_in = changeset.id
    return receipt


# The repo's runtime, brought up to its record when the generation of its vectors is not
# the one given (`Repos.refresh`).
Refresh = Callable[[str, int], Awaitable[Runtime]]


def intent_policy(
    runtime: Runtime, llm: LLM, repo: str | None = None, refresh: Refresh | None = None
) -> IntentPolicy:
    """How commits made with `runtime` deduplicate intents (merging through `llm`, all of a
    commit's merges in one call) and retire contradicted facts (one call a commit); with
    `refresh`, how a changeset made before `repo` was re-embedded is embedded again (with the
    repo's embedder now, which then embeds the merges too)."""
    limit = runtime.config.extraction_timeout
    embedder = runtime.embedder

    async def merge(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, Vector] | None]:
        try:
            with fail_after(limit):
                if len(pairs) == 1:
                    existing, new = pairs[0]
                    texts = {0: await ask(llm, merge_intent_request(existing=existing, new=new),
                                          parse_merged_intent)}
                else:
                    texts = await ask(llm, merge_intents_request(list(pairs)),
                                      lambda reply: parse_merged_intents(reply, len(pairs)))
                merged = sorted(texts.items())
                vectors = await embed(embedder, [text for _, text in merged])
        except (LLMError, EmbeddingError, TimeoutError) as exc:
            log.warning("intent merges failed, keeping the existing wordings: %r", exc)
            return [None] * len(pairs)
        found = {i: (text, vector) for (i, text), vector in zip(merged, vectors, strict=True)}
        return [found.get(i) for i in range(len(pairs))]

    async def contradicts(questions: Sequence[Question]) -> list[set[int]]:
        request, pairs = contradiction_request(questions)
        try:
            with fail_after(limit):
                return await ask(
                    llm, request, lambda reply: parse_contradiction(reply, pairs, len(questions))
                )
        except (LLMError, TimeoutError) as exc:
            # Not knowing is not contradicting: the facts stay live.
            log.warning("contradiction check failed, every fact stays live: %r", exc)
            return [set() for _ in questions]

    restamp: Restamp | None = None
    if refresh is not None and repo is not None:

        async def again(changeset: Changeset, generation: int, refresh: Refresh = refresh,
                        repo: str = repo) -> Changeset:
            nonlocal embedder
            fresh = await refresh(repo, generation)
            try:
                with fail_after(limit):
                    made = await embedded_again(changeset, fresh.embedder, fresh.generation)
            except TimeoutError as exc:
                raise EmbeddingError(f"the embedder took more than {limit} s") from exc
            embedder = fresh.embedder
            return made

        restamp = again

    return IntentPolicy(
        identity_threshold=runtime.config.intent_identity_threshold,
        merge_threshold=runtime.config.intent_merge_threshold,
        merge=merge,
        contradicts=contradicts,
        contradiction_candidates=runtime.config.contradiction_candidates,
        contradiction_similarity=runtime.config.contradiction_similarity,
        restamp=restamp,
    )
