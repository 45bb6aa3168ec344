"""`Config`: every tunable of a repo or session, frozen, with defaults; each field's type (and
range, a `msgspec.Meta` in its annotation) is checked by `Config.__post_init__`."""

from __future__ import annotations

import dataclasses
import json
import logging
import types
import typing
from dataclasses import dataclass, replace
from functools import cache
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from mnemo.errors import DEFAULT_MAX_TEXT_CHARS, MAX_TEXT_CHARS_LIMIT, InvalidInputError, check_text

# The highest value of each per-call bound (docs/DECISIONS.md, "Per-call bounds").
COUNT_CEILINGS = {
    "max_steps_per_ingest": 1_000, "max_messages_per_save": 100_000,
    "max_tool_calls_per_message": 1_024, "max_open_goals": 10_000, "max_results": 10_000}

DAY = 86_400.0
# The longest duration of each kind, in seconds (docs/DECISIONS.md, "Durations").
DURATION_CEILINGS = {"wait": DAY, "inactivity": 365 * DAY, "age": 100 * 365 * DAY}
# The default `Config.idle_session_timeout` (at most a week: `IdleSeconds`).
DEFAULT_IDLE_SESSION_TIMEOUT = 3600.0

# The ranges of the fields, by what they measure; a count is at most `max_results`' ceiling.
Seconds = Annotated[float, Meta(gt=0, le=DURATION_CEILINGS["wait"])]
# Below a second, a heartbeat (a third of it) slower than a store write loses a live holder's work.
Lease = Annotated[float, Meta(ge=1, le=DURATION_CEILINGS["wait"])]
Wait = Annotated[float, Meta(ge=0, le=DURATION_CEILINGS["wait"])]
Inactivity = Annotated[float, Meta(gt=0, le=DURATION_CEILINGS["inactivity"])]
IdleSeconds = Annotated[float, Meta(gt=0, le=7 * DAY)]
Days = Annotated[float, Meta(gt=0, le=DURATION_CEILINGS["age"] / DAY)]
Share = Annotated[float, Meta(ge=0, le=1)]
Cosine = Annotated[float, Meta(ge=-1, le=1)]
Whole = Annotated[int, Meta(ge=0, le=COUNT_CEILINGS["max_results"])]
Count = Annotated[int, Meta(ge=1, le=COUNT_CEILINGS["max_results"])]
Steps = Annotated[int, Meta(ge=1, le=COUNT_CEILINGS["max_steps_per_ingest"])]
Messages = Annotated[int, Meta(ge=1, le=COUNT_CEILINGS["max_messages_per_save"])]
ToolCalls = Annotated[int, Meta(ge=1, le=COUNT_CEILINGS["max_tool_calls_per_message"])]
Goals = Annotated[int, Meta(ge=1, le=COUNT_CEILINGS["max_open_goals"])]
Results = Annotated[int, Meta(ge=1, le=COUNT_CEILINGS["max_results"])]
# At most what PostgreSQL's full-text search can index (`errors.MAX_TEXT_CHARS_LIMIT`).
TextChars = Annotated[int, Meta(ge=1, le=MAX_TEXT_CHARS_LIMIT)]


@dataclass(frozen=True, slots=True)
class Config:
    """Settings for a repo, inherited by its sessions.

    An unknown field is a `TypeError` (dataclass behaviour); a value of the wrong type or out of
    range is an `InvalidInputError`. Times are seconds; `None` means never."""

    auto_commit: bool = False
    flush_timeout: Inactivity | None = 120.0
    session_timeout: Inactivity | None = 600.0
    # Seconds an idle session (between episodes) lives untouched before it is ended.
    idle_session_timeout: IdleSeconds = DEFAULT_IDLE_SESSION_TIMEOUT
    trajectory_threshold: Cosine = 0.75
    max_pending_ops: Count = 5
    append_timeout: Seconds = 60.0
    extraction_timeout: Seconds = 60.0
    intent_merge_threshold: Cosine = 0.8
    intent_identity_threshold: Cosine = 0.95
    llm_concurrency: Count = 16
    # Seconds a write waits for another writer before `StorageError("busy")` (off the loop).
    busy_timeout: Wait = 5.0
    # Seconds after which background work held by a vanished `Memory` is taken over.
    lease_timeout: Lease = 30.0
    # Recall: candidates per channel, reciprocal-rank-fusion constant, score kept per hop.
    recall_candidates: Count = 50
    rrf_k: Count = 60
    # Weight of the dense ranking against the lexical one in the fusion (lexical: 1).
    recall_dense_weight: Share = 0.5
    hop_decay: Cosine = 0.5
    recall_max_hops: Whole = 2
    # Routing: a tag (intent) leads on only when its raw cosine to the query reaches this.
    recall_tag_threshold: Cosine = 0.35
    recall_intent_threshold: Cosine = 0.5
    # Per type: the most results of that type, and the least score one must have.
    recall_top_k_semantic: Count = 10
    recall_top_k_episodic: Count = 10
    recall_top_k_procedural: Count = 5
    recall_min_score_semantic: Cosine = 0.02
    recall_min_score_episodic: Cosine = 0.02
    recall_min_score_procedural: Cosine = 0.02
    # One result per moment: a fact and the step it came from are one memory.
    recall_distinct_steps: bool = True
    # Extra hop rounds through bridge tags when the best results stop changing.
    recall_refine_budget: Whole = 1
    # "offline": plan recalls with the built-in heuristics; "llm": ask the repo's LLM.
    recall_planner: str = "offline"
    # Ask the LLM to synthesise an answer from the memories (RecallResult.reasoned).
    recall_synthesis: bool = False
    # Maximal marginal relevance's lambda (1.0: relevance alone; 0.7 measured best on LoCoMo).
    recall_mmr_lambda: Share = 0.7
    # Pseudo-relevance feedback: words of the best lexical hits for a second query (0: off).
    recall_prf_terms: Whole = 0
    # Steps next to each top episodic hit join the candidates at this share of its score (0: off).
    recall_neighbour_weight: Share = 0.9
    # How many steps on each side of a hit are its neighbours (2 measured best on LoCoMo).
    recall_neighbour_width: Annotated[int, Meta(ge=1, le=100)] = 2
    # Re-rank the best `recall_rerank_candidates` with the repo's LLM (one call per recall;
    # the offline LLM keeps the order).
    recall_rerank: bool = False
    recall_rerank_candidates: Count = 20
    # The value function: relevance x recency decay x frequency floor x reward.
    recency_half_life_days: Days = 30.0
    frequency_floor: Cosine = 0.5
    # score = relevance x value ^ value_weight (0: relevance alone).
    value_weight: Share = 0.25
    decay_threshold: Cosine = 0.1
    consolidate_threshold: Cosine = 0.85
    # The longest text (and metadata as JSON) accepted; at most `MAX_TEXT_CHARS_LIMIT`.
    max_text_chars: TextChars = DEFAULT_MAX_TEXT_CHARS
    # Per-call bounds, each at most its `COUNT_CEILINGS` entry: steps in one `ingest`,
    max_steps_per_ingest: Steps = 100
    # new messages one `save` or `append` stores,
    max_messages_per_save: Messages = 1_000
    # tool calls in one message,
    max_tool_calls_per_message: ToolCalls = 128
    # open goals of one thread (each is in every eviction prompt),
    max_open_goals: Goals = 100
    # and what one read may ask for (recall's `k`, a `limit`, the ids of one call).
    max_results: Results = 1_000
    # Where recall's lexical index (a cache) lives: None is beside a SQLite file, else
    # `$MNEMO_LEXICAL_DIR` or the user's cache folder; "" turns it off. The Memory's only.
    lexical_dir: str | None = None
    # Where the HNSW graphs are saved (a cache, checked when read: mnemo.graph.ann_files):
    # None is beside a SQLite file, else the lexical index's folder; "" turns saving off.
    ann_dir: str | None = None
    # numpy's BLAS threads, set when a Memory opens; None (or a BLAS env variable): untouched.
    blas_threads: Count | None = 1
    # Live facts per recall channel each new fact is checked against for contradiction (0: none).
    contradiction_candidates: Annotated[int, Meta(ge=0, le=100)] = 3
    # The cosine a live fact must reach to be checked for contradiction.
    contradiction_similarity: Cosine = 0.6
    # An extraction task that fails for good: False fails the extraction; True commits the
    # rest, the receipt's `missing` naming each task left out and why.
    partial_commits: bool = False
    # Ingest: a relative date in a step ("yesterday") is followed by the date it means.
    ingest_resolve_dates: bool = False
    # Ingest: each step joins a TAG per speaker and name it mentions (extraction.entities).
    ingest_entity_tags: bool = False
    # Recall: a candidate whose speaker the query names scores 1 + this times more (0: off).
    recall_speaker_boost: Share = 0.5
    # Recall: the dense channel embeds the query without the names it mentions.
    recall_dense_without_names: bool = True

    def __post_init__(self) -> None:
        for name, check in _checks().items():
            check(name, getattr(self, name))
        if self.intent_merge_threshold > self.intent_identity_threshold:
            raise InvalidInputError(
                "Config.intent_merge_threshold must not exceed intent_identity_threshold "
                f"({self.intent_merge_threshold} > {self.intent_identity_threshold})")
        if self.recall_planner not in ("offline", "llm"):
            raise InvalidInputError(
                f'Config.recall_planner must be "offline" or "llm", got {self.recall_planner!r}')

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Config:
        """Reads what `to_json` wrote; fields this version does not know are dropped."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise InvalidInputError(f"a stored Config must be a JSON object, got {text[:80]!r}")
        fields = {k: v for k, v in raw.items() if k in _checks()}  # the known fields
        for name, check in _checks().items():
            wanted, high, low = fields.get(name), check.high, check.low
            if not isinstance(wanted, int | float) or isinstance(wanted, bool):
                continue
            bound = (high if high is not None and wanted > high
                     else low if low is not None and wanted < low else None)
            if bound is not None:
                # Stored before there was this ceiling (or floor): the store opens, at it.
                logging.getLogger("mnemo").warning(
                    "a stored Config.%s of %s is brought to its bound, %s", name, wanted,
                    _num(bound))
                fields[name] = type(wanted)(bound)
        return cls(**fields)


class _Check(typing.NamedTuple):
    """The check of one field: its annotation (checked by `msgspec.convert`), what it takes in
    words, and its ceiling (None: unbounded or not a number)."""

    hint: Any
    wanted: str
    high: float | None
    low: float | None = None  # a floor raised since a stored value may have been written

    def __call__(self, name: str, value: object) -> None:
        try:  # a float's subclass (numpy's float64) is checked as the float it is
            msgspec.convert(float(value) if isinstance(value, float) else value, self.hint)
            if isinstance(value, str):  # stored as JSON: no NUL, no lone surrogate (PostgreSQL)
                check_text(value, f"Config.{name}", limit=MAX_TEXT_CHARS_LIMIT, blank_ok=True)
        except msgspec.ValidationError:
            raise InvalidInputError(f"Config.{name} must be {self.wanted}, got {value!r}") from None


def _phrase(kind: type, meta: Meta | None, optional: bool) -> str:
    """What a field of `kind` (within `meta`'s bounds) takes, in words."""
    if meta is None:
        text = "True or False" if kind is bool else "a string"
        return f"{text} or None" if optional else text
    low = meta.ge if meta.ge is not None else meta.gt
    high = meta.le if meta.le is not None else meta.lt
    assert low is not None, "every numeric field has both bounds"
    assert high is not None, "every numeric field has both bounds"
    if kind is int:
        text = f"an integer from {low:,} to {high:,}"
    else:
        opened, closed = "(" if meta.ge is None else "[", ")" if meta.le is None else "]"
        text = f"a number within {opened}{_num(low)}, {_num(high)}{closed}"
    return f"{text} or None" if optional else text


def _num(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:g}"


# Fields whose floor was raised: a config stored before opens at the floor.
_RAISED_FLOORS = frozenset({"lease_timeout"})


@cache
def _checks() -> dict[str, _Check]:
    checks: dict[str, _Check] = {}
    for name, hint in typing.get_type_hints(Config, include_extras=True).items():
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        parts = typing.get_args(hint) if union else (hint,)
        (kind,) = [part for part in parts if part is not type(None)]
        meta = None
        if typing.get_origin(kind) is Annotated:
            kind, meta = typing.get_args(kind)[:2]
        high = None if meta is None else meta.le if meta.le is not None else meta.lt
        low = meta.ge if meta is not None and name in _RAISED_FLOORS else None
        checks[name] = _Check(hint, _phrase(kind, meta, type(None) in parts), high, low)
    return checks


@cache
def ceilings() -> Config:
    """A Config with every bound at its ceiling, for input to a repo not known yet."""
    fields: dict[str, Any] = {"max_text_chars": MAX_TEXT_CHARS_LIMIT, **COUNT_CEILINGS}
    return Config(**fields)


# The timeouts of work: raised, never lowered, by a later Memory or `open_repo`.
TIMEOUTS = ("append_timeout", "extraction_timeout")


def with_longer_timeouts(config: Config, *others: Config) -> Config:
    """`config` with each of its `TIMEOUTS` the longest of its own and `others`'."""
    longer = {name: max(getattr(c, name) for c in (config, *others)) for name in TIMEOUTS}
    if all(longer[name] == getattr(config, name) for name in TIMEOUTS):
        return config
    return replace(config, **longer)
