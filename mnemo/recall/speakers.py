"""Recall levers that weigh a candidate by who it is about (and the query's vector
without the names it mentions, `without_names`).

**Speaker match** (`Config.recall_speaker_boost`): a question that names a person ("What
activities does Melanie partake in?") is mostly answered by what that person said, and a
transcript line says who speaks ("Melanie (8 May 2023): I'm off to go swimming"). A candidate
whose speaker the query names scores `1 + boost` times more than the others (they are divided
by it, so that scores stay within [0, 1]); a fact counts as said by the speaker of the one step
it came from. The query's own words already find the lines that
*mention* the name (BM25); the speaker is what they miss, since a line rarely names its own
speaker in its words. The cost is a regular expression per candidate already read.
"""

from __future__ import annotations

import re

from mnemo import text as _text
from mnemo.extraction.entities import speaker_of
from mnemo.graph.ports import NodeReads
from mnemo.recall.candidates import ReadContext

_POSSESSIVE = re.compile(r"['\u2019]s$", re.IGNORECASE)
_PUNCTUATION = "?!.,;:\"()"


def query_names(query: str) -> frozenset[str]:
    """The names a query mentions, lower-case: its capitalised words that are not stopwords
    (the first word too: "Melanie's pets?"), without a possessive "'s"."""
    names = {
        _POSSESSIVE.sub("", word).lower()
        for word in _text.words(_text.normalise(query))
        if word[:1].isupper()
    }
    return frozenset(n for n in names if n and not _text.is_stopword(n))


def without_names(query: str) -> str:
    """The query as the dense channel embeds it: without the names it mentions ("What did
    Melanie paint?" -> "What did paint?"), or as it is when it is nothing but names. A name
    in a question is matched by the words channel and the speaker match; in its vector it
    pulls towards every line near the name rather than towards the answer (measured on
    LoCoMo dev). The first word counts only with a
    possessive ("Melanie's pets?"): capitalised there, "Restart the webserver" is no name."""
    head, _, rest = query.strip().partition(" ")
    names = query_names(rest)
    if _POSSESSIVE.search(head.strip(_PUNCTUATION)):
        names |= query_names(head)
    if not names:
        return query
    kept = [w for w in query.split()
            if _POSSESSIVE.sub("", w.strip(_PUNCTUATION)).lower() not in names]
    return " ".join(kept) if kept else query


async def speaker_boosts(
    graph: NodeReads, repo: str, names: frozenset[str], context: ReadContext, boost: float
) -> dict[str, float]:
    """The factor of each node recall read (`context.nodes`) whose speaker (its own, else
    that of the one step it came from) the query does not name (`names`: `query_names` of
    it), when some candidate's
    speaker it names: 1 / (1 + boost); nodes not listed keep their score. The steps come from
    the provenance links recall read with the nodes; at most one node read, of the steps not
    read yet, bounded by `len(context.nodes)` (the candidates, bounded by k)."""
    if not names or boost <= 0:
        return {}
    nodes = context.nodes
    speakers = {i: s for i, n in nodes.items() if (s := speaker_of(n.text)) is not None}
    step_of = {
        i: step for i, step in context.steps_of(list(nodes.values())).items()
        if step != i and i not in speakers
    }
    missing = sorted({s for s in step_of.values() if s not in nodes})
    texts = {i: n.text for i, n in nodes.items()}
    texts |= {n.id: n.text for n in await graph.get_nodes(repo, missing)}
    for node_id, step in step_of.items():
        speaker = speaker_of(texts.get(step, ""))
        if speaker is not None:
            speakers[node_id] = speaker
    said = {i for i, speaker in speakers.items() if set(speaker.lower().split()) & names}
    if not said:
        return {}
    # The others go down rather than these up: a score stays within [0, 1].
    return {i: 1.0 / (1.0 + boost) for i in nodes if i not in said}
