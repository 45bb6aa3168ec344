"""A node's neighbourhood laid out for an SVG drawn on the server (no script, no network).

The nodes one link away stand in a column, grouped by the type of the link, each group under
its link type's name; the node itself stands in a box, left of the column on a wide screen
(`WIDE`, a curve to each neighbour) and above it on a phone (`NARROW`, a tree's branches), so
that the text stays readable at either width. A node's type is its marker's shape and colour
(a shape for readers who cannot tell the colours apart); a retired fact's marker is dashed.
The layout is pure: `neighbourhood` returns coordinates, and `drawing.html` writes the SVG.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import zip_longest

from mnemo.graph.model import LinkType, Node, NodeType
from mnemo.ui.source import LinkedNode

MARGIN = 10
ROW = 28
GROUP_HEAD = 30
LINE = 18
# More neighbours than this are listed below the drawing, not drawn.
MAX_DRAWN = 24
RADIUS = 7.0
# Corners of each type's marker, as (angle of the first corner, corners); 0 is a circle.
SHAPES: dict[NodeType, tuple[float, int]] = {
    NodeType.SEMANTIC: (0.0, 0),
    NodeType.PROCEDURAL: (45.0, 4),
    NodeType.EPISODIC: (0.0, 4),
    NodeType.SUBGOAL: (-90.0, 3),
    NodeType.TAG: (90.0, 3),
    NodeType.SOURCE: (0.0, 6),
    NodeType.INTENT: (-90.0, 5),
}


@dataclass(frozen=True, slots=True)
class Layout:
    """The geometry of a drawing: its width, the box (its width and what text fits in it),
    the x of the column of markers, the characters a label keeps (at 14 px, under 8 px a
    character), and whether the box stands beside the column or above it."""

    width: int
    box_width: float
    box_chars: int
    box_lines: int
    mark_x: float
    label_chars: int
    beside: bool

    @property
    def label_x(self) -> float:
        return self.mark_x + 2 * RADIUS + 2


WIDE = Layout(width=720, box_width=184, box_chars=22, box_lines=6, mark_x=262,
              label_chars=54, beside=True)
NARROW = Layout(width=400, box_width=380, box_chars=44, box_lines=4, mark_x=40,
                label_chars=42, beside=False)
# The narrow layout's trunk: the vertical line its branches leave from.
TRUNK_X = 22.0


@dataclass(frozen=True, slots=True)
class Mark:
    """A neighbour drawn: its marker at (x, y), its label's text and baseline, and the types
    of the links that join it to the middle node."""

    node: Node
    x: float
    y: float
    label: str
    label_x: float
    label_y: float
    links: tuple[LinkType, ...]
    path: str


@dataclass(frozen=True, slots=True)
class Curve:
    """A link from the middle node's box to a neighbour, coloured by its (first) type."""

    path: str
    link_type: LinkType
    title: str


@dataclass(frozen=True, slots=True)
class Heading:
    """A link type's name above its group of neighbours."""

    link_type: LinkType
    text: str
    y: float


@dataclass(frozen=True, slots=True)
class Drawing:
    """What `node.html` draws: the box of the middle node (its text in lines), the curves,
    the headings and the marks, and how many neighbours were left out."""

    width: int
    height: int
    node: Node
    box_x: float
    box_width: float
    box_y: float
    box_height: float
    box_lines: tuple[str, ...]
    curves: tuple[Curve, ...]
    headings: tuple[Heading, ...]
    marks: tuple[Mark, ...]
    heading_x: float
    hidden: int
    node_types: tuple[NodeType, ...]


def shape(node_type: NodeType, x: float, y: float, radius: float = RADIUS) -> str:
    """The SVG path of a `node_type` marker centred on (x, y)."""
    start, corners = SHAPES.get(node_type, (0.0, 0))
    if corners == 0:
        return (f"M{x - radius:.1f},{y:.1f}a{radius:.1f},{radius:.1f} 0 1,0 {2 * radius:.1f},0"
                f"a{radius:.1f},{radius:.1f} 0 1,0 {-2 * radius:.1f},0Z")
    points = []
    for i in range(corners):
        angle = math.radians(start + 360 * i / corners)
        points.append(f"{x + radius * math.cos(angle):.1f},{y + radius * math.sin(angle):.1f}")
    return "M" + "L".join(points) + "Z"


def shorten(text: str, limit: int) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _grouped(linked: Sequence[LinkedNode]) -> list[tuple[LinkType, list[Node]]]:
    """Neighbours by the first link type that reaches them (in `LinkType` order), each node
    once, each group's nodes by type, then text."""
    first: dict[str, LinkType] = {}
    nodes: dict[str, Node] = {}
    order = list(LinkType)
    for item in sorted(linked, key=lambda i: order.index(i.link_type)):
        first.setdefault(item.node.id, item.link_type)
        nodes.setdefault(item.node.id, item.node)
    groups: dict[LinkType, list[Node]] = {}
    for node_id, link_type in first.items():
        groups.setdefault(link_type, []).append(nodes[node_id])
    kinds = list(NodeType)
    return [
        (link_type, sorted(groups[link_type], key=lambda n: (kinds.index(n.type), n.text, n.id)))
        for link_type in order
        if link_type in groups
    ]


def _chosen(groups: list[tuple[LinkType, list[Node]]], limit: int) -> list[set[str]]:
    """Which nodes of each group are drawn: taken from the groups in turn, so that every
    link type shows when there are more neighbours than `limit`."""
    chosen: list[set[str]] = [set() for _ in groups]
    taken = 0
    for row in zip_longest(*(nodes for _, nodes in groups)):
        for index, node in enumerate(row):
            if node is not None and taken < limit:
                chosen[index].add(node.id)
                taken += 1
    return chosen


def neighbourhood(
    node: Node,
    linked: Sequence[LinkedNode],
    limit: int = MAX_DRAWN,
    layout: Layout = WIDE,
) -> Drawing:
    """The layout of `node` and the nodes one link away (`linked`, a node once per link type
    that reaches it), at most `limit` of them drawn."""
    groups = _grouped(linked)
    links_of: dict[str, list[LinkType]] = {}
    for item in linked:
        if item.link_type not in links_of.setdefault(item.node.id, []):
            links_of[item.node.id].append(item.link_type)
    box_lines = (node.type.value + (" (retired)" if node.retired else ""),
                 *textwrap.wrap(node.text, layout.box_chars, max_lines=layout.box_lines,
                                placeholder=" …"))
    box_height = len(box_lines) * LINE + 20
    y = float(MARGIN) if layout.beside else MARGIN + box_height + 6
    headings: list[Heading] = []
    placed: list[tuple[Node, LinkType, float]] = []
    for (link_type, members), keep in zip(groups, _chosen(groups, limit), strict=True):
        drawn = [n for n in members if n.id in keep]
        if not drawn:
            continue
        headings.append(Heading(link_type, f"{link_type.value} ({len(members)})",
                                y + GROUP_HEAD - 10))
        y += GROUP_HEAD
        for member in drawn:
            placed.append((member, link_type, y + ROW / 2))
            y += ROW
    hidden = len({item.node.id for item in linked}) - len(placed)
    column_bottom = y + (ROW if hidden else 0)
    if layout.beside:
        height = max(column_bottom, box_height + 2 * MARGIN) + MARGIN
        box_y = max(MARGIN, (column_bottom + MARGIN) / 2 - box_height / 2)
    else:
        height = column_bottom + MARGIN
        box_y = MARGIN
    marks = []
    curves = []
    for member, link_type, mark_y in placed:
        kinds = tuple(links_of[member.id])
        retired = " (retired)" if member.retired else ""
        label = shorten(member.text, layout.label_chars - len(retired)) + retired
        marks.append(Mark(member, layout.mark_x, mark_y, label, layout.label_x, mark_y + 5,
                          kinds, shape(member.type, layout.mark_x, mark_y)))
        curves.append(Curve(
            _curve(layout, box_y, box_height, mark_y),
            link_type,
            ", ".join(k.value for k in kinds) + f": {shorten(member.text, 80)}",
        ))
    present = {node.type, *(m.node.type for m in marks)}
    return Drawing(
        width=layout.width,
        height=math.ceil(height),
        node=node,
        box_x=MARGIN,
        box_width=layout.box_width,
        box_y=box_y,
        box_height=box_height,
        box_lines=box_lines,
        curves=tuple(curves),
        headings=tuple(headings),
        marks=tuple(marks),
        heading_x=layout.mark_x - RADIUS,
        hidden=hidden,
        node_types=tuple(t for t in NodeType if t in present),
    )


def _curve(layout: Layout, box_y: float, box_height: float, mark_y: float) -> str:
    """The SVG path from the box to a marker at `mark_y`: a curve from the box's right side,
    or a branch off the trunk under the box."""
    end_x = layout.mark_x - RADIUS
    if layout.beside:
        start_x, start_y = MARGIN + layout.box_width, box_y + box_height / 2
        bend = (layout.mark_x - start_x) / 2
        return (f"M{start_x:.1f},{start_y:.1f}C{start_x + bend:.1f},{start_y:.1f} "
                f"{layout.mark_x - bend:.1f},{mark_y:.1f} {end_x:.1f},{mark_y:.1f}")
    turn = min(10.0, end_x - TRUNK_X)
    return (f"M{TRUNK_X:.1f},{box_y + box_height:.1f}V{mark_y - turn:.1f}"
            f"Q{TRUNK_X:.1f},{mark_y:.1f} {TRUNK_X + turn:.1f},{mark_y:.1f}H{end_x:.1f}")
