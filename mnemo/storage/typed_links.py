"""What both backends' `typed_links` and `neighbors` reads make of their rows (one place: the
SQL differs, the reading of a row does not)."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from mnemo.graph.model import LINK_TYPES, NODE_TYPES
from mnemo.graph.ports import Neighbor, TypedLink
from mnemo.storage.row import Row


def seen_from_asked(
    rows: Iterable[Row], asked: Collection[str]
) -> list[TypedLink]:
    """Rows of (src, its type, dst, its type, link type) as typed links seen from each end
    that was asked for: a link between two asked nodes is seen from both."""
    found: list[TypedLink] = []
    for src, src_type, dst, dst_type, kind in rows:
        link = LINK_TYPES[kind]
        if src in asked:
            found.append((src, NODE_TYPES[src_type], dst, NODE_TYPES[dst_type], link))
        if dst in asked:
            found.append((dst, NODE_TYPES[dst_type], src, NODE_TYPES[src_type], link))
    return found


def neighbors_seen_from_asked(
    rows: Iterable[Row], asked: Collection[str]
) -> list[Neighbor]:
    """Rows of (src, dst, link type) as neighbors seen from each end that was asked for: a
    link between two asked nodes is seen from both."""
    found: list[Neighbor] = []
    for src, dst, kind in rows:
        link = LINK_TYPES[kind]
        if src in asked:
            found.append(Neighbor(src, dst, link))
        if dst in asked:
            found.append(Neighbor(dst, src, link))
    return found
