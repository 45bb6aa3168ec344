"""The offline LLM's heuristics for recall's tasks: `recall_plan`, `recall_synthesis` and
`recall_rerank` (see `mnemo.adapters.offline`)."""

from __future__ import annotations

import re

from mnemo import text as _text
from mnemo.adapters._offline_common import _NO_USAGE, Inputs
from mnemo.ports import LLMResponse

_PROCEDURAL_QUERY = re.compile(
    r"\bhow (?:do|to|can|should|would)\b|\bsteps?\b|\bprocedure\b|\binstructions?\b"
    r"|\bwhat should (?:i|we)\b|\bhow did (?:i|we|you) (?:fix|solve|set|install|configure)",
    re.IGNORECASE,
)
_EPISODIC_QUERY = re.compile(
    r"\bwhen\b|\bwhat happened\b|\blast time\b|\byesterday\b|\bago\b"
    r"|\bdid (?:i|we|you|he|she|they)\b|\bhas \w+ ever\b",
    re.IGNORECASE,
)
_SEMANTIC_QUERY = re.compile(
    r"\bwhat (?:is|are|was|were|does|do|kind)\b|\bwho\b|\bwhich\b|\bwhere\b"
    r"|\bprefer|\bfavou?rite\b|\blikes?\b",
    re.IGNORECASE,
)


def _recall_plan(inputs: Inputs) -> LLMResponse:
    """Mode from the query's question form (how-to: procedural; when/did: episodic; what/who/
    which: semantic; else mixed); tags are its concept labels."""
    query = inputs.query.strip()
    if _PROCEDURAL_QUERY.search(query):
        mode = "procedural"
    elif _EPISODIC_QUERY.search(query):
        mode = "episodic"
    elif _SEMANTIC_QUERY.search(query):
        mode = "semantic"
    else:
        mode = "mixed"
    return LLMResponse(
        data={"mode": mode, "tags": _text.concepts(query, limit=6)}, usage=_NO_USAGE
    )


def _recall_synthesis(inputs: Inputs) -> LLMResponse:
    """Extractive: the first memory, quoted, since no model is there to reason over them."""
    memories = inputs.memories
    answer = memories[0] if memories else "No memory answers this."
    return LLMResponse(data={"answer": answer}, usage=_NO_USAGE)


def _recall_rerank(inputs: Inputs) -> LLMResponse:
    """The retrieval's order: no model is there to judge relevance better than it."""
    memories = inputs.memories
    return LLMResponse(data={"order": list(range(1, len(memories) + 1))}, usage=_NO_USAGE)
