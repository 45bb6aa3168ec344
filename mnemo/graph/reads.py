"""The checks of what `Memory` reads of a repo's graph by id, type or link."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice

from mnemo.config import Config
from mnemo.errors import InvalidInputError, check_id
from mnemo.graph.model import LinkType, NodeType

RESULTS = "Config.max_results"
# The most node types one call takes (there are seven; a longer list repeats them).
MAX_TYPES = 100
# The most ids `node_ids` returns.
MAX_IDS = 100
# The largest offset a listing takes: the largest integer both backends' SQL holds.
MAX_OFFSET = 2**63 - 1

def node_id_list(node_ids: object, config: Config) -> list[str]:
    """`node_ids` as a list of at most `config.max_results` checked ids (an iterable read no
    further than one past the bound); InvalidInputError for a string, a non-iterable, too
    many ids or a bad id."""
    if isinstance(node_ids, str | bytes) or not isinstance(node_ids, Iterable):
        raise InvalidInputError(
            f"node_ids must be a list of node ids, got {type(node_ids).__name__}"
            + (f" (write [{node_ids!r}] for one id)" if isinstance(node_ids, str) else ""))
    most = config.max_results
    ids = list(islice(node_ids, most + 1))
    if len(ids) > most:
        raise InvalidInputError(
            f"node_ids holds more than the {most:,} ids one call takes ({RESULTS})")
    return [check_id(node_id, "node id") for node_id in ids]


def node_types(types: Iterable[NodeType | str]) -> list[NodeType]:
    """`types` as a list of `NodeType` (a lone string is one type); InvalidInputError for
    anything else or more than `MAX_TYPES`."""
    try:
        if isinstance(types, str):
            return [NodeType(types)]
        kinds = [NodeType(t) for t in islice(types, MAX_TYPES + 1)]
        if len(kinds) <= MAX_TYPES:
            return kinds
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(
            f"types must be node types ({', '.join(t.value for t in NodeType)}): {exc}"
        ) from exc
    raise InvalidInputError(f"types holds more than the {MAX_TYPES} types one call takes")


def link_type_of(link_type: LinkType | str | None) -> LinkType | None:
    """`link_type` as a `LinkType` (None: every type); InvalidInputError for anything else."""
    try:
        return None if link_type is None else LinkType(link_type)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(
            f"link_type must be a link type ({', '.join(t.value for t in LinkType)}): {exc}"
        ) from exc


def literal(text: str) -> str:
    """`text` as a LIKE pattern that matches it alone."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
