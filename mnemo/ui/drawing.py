"""Pictures of the graph laid out for SVG (pure coordinates the templates draw): a node's
`neighbourhood`, and the graph `picture` by a seeded force-directed layout."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import zip_longest

import numpy as np
import numpy.typing as npt

from mnemo.graph.model import LinkType, Node, NodeType
from mnemo.text import shorten
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
    NodeType.SEMANTIC: (0.0, 0), NodeType.PROCEDURAL: (45.0, 4), NodeType.EPISODIC: (0.0, 4),
    NodeType.SUBGOAL: (-90.0, 3), NodeType.TAG: (90.0, 3), NodeType.SOURCE: (0.0, 6),
    NodeType.INTENT: (-90.0, 5)}


@dataclass(frozen=True, slots=True)
class Layout:
    """The geometry of a drawing: its width, the box, the column of markers, the characters a
    label keeps, and whether the box stands beside the column or above it."""

    width: int
    box_width: float
    box_chars: int
    box_lines: int
    mark_x: float
    label_chars: int
    beside: bool


WIDE = Layout(width=720, box_width=184, box_chars=22, box_lines=6, mark_x=262,
              label_chars=54, beside=True)
NARROW = Layout(width=400, box_width=380, box_chars=44, box_lines=4, mark_x=40,
                label_chars=42, beside=False)
# The narrow layout's trunk: the vertical line its branches leave from.
TRUNK_X = 22.0


@dataclass(frozen=True, slots=True)
class Mark:
    """A node drawn: its marker (`path`) centred on (x, y), its label from `label_x` anchored
    at `anchor`; the link types joining it to the middle node, or whether it is the picture's
    `focus`."""

    node: Node
    x: float
    y: float
    path: str
    label: str
    label_x: float
    links: tuple[LinkType, ...] = ()
    anchor: str = "start"
    focus: bool = False


@dataclass(frozen=True, slots=True)
class Line:
    """A link drawn, coloured by its (first) type: from the middle node's box to a
    neighbour, or between two nodes' markers in a picture."""

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
    """What `node.html` draws: the middle node's box, the curves, headings and marks, and how
    many neighbours were left out."""

    width: int
    height: int
    node: Node
    box_x: float
    box_width: float
    box_y: float
    box_height: float
    box_lines: tuple[str, ...]
    curves: tuple[Line, ...]
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
    angles = [math.radians(start + 360 * i / corners) for i in range(corners)]
    return "M" + "L".join(f"{x + radius * math.cos(a):.1f},{y + radius * math.sin(a):.1f}"
                          for a in angles) + "Z"


def _grouped(linked: Sequence[LinkedNode]) -> list[tuple[LinkType, list[Node]]]:
    """Neighbours by the first link type that reaches them (in `LinkType` order), each node
    once, each group's nodes by type, then text."""
    order, kinds = list(LinkType), list(NodeType)
    first: dict[str, LinkedNode] = {}
    for item in sorted(linked, key=lambda i: order.index(i.link_type)):
        first.setdefault(item.node.id, item)
    groups = [(link_type, sorted((i.node for i in first.values() if i.link_type is link_type),
                                 key=lambda n: (kinds.index(n.type), n.text, n.id)))
              for link_type in order]
    return [(link_type, nodes) for link_type, nodes in groups if nodes]


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


def neighbourhood(node: Node, linked: Sequence[LinkedNode], layout: Layout = WIDE) -> Drawing:
    """The layout of `node` and the nodes one link away (`linked`, a node once per link type
    that reaches it), at most `MAX_DRAWN` of them drawn."""
    groups = _grouped(linked)
    links_of: dict[str, dict[LinkType, None]] = {}  # each neighbour's link types, in order
    for item in linked:
        links_of.setdefault(item.node.id, {})[item.link_type] = None
    box_lines = (node.type.value + (" (retired)" if node.retired else ""),
                 *textwrap.wrap(node.text, layout.box_chars, max_lines=layout.box_lines,
                                placeholder=" …"))
    box_height = len(box_lines) * LINE + 20
    y = float(MARGIN) if layout.beside else MARGIN + box_height + 6
    headings: list[Heading] = []
    placed: list[tuple[Node, LinkType, float]] = []
    for (link_type, members), keep in zip(groups, _chosen(groups, MAX_DRAWN), strict=True):
        drawn = [n for n in members if n.id in keep]
        if not drawn:
            continue
        headings.append(Heading(link_type, f"{link_type.value} ({len(members)})",
                                y + GROUP_HEAD - 10))
        y += GROUP_HEAD
        for member in drawn:
            placed.append((member, link_type, y + ROW / 2))
            y += ROW
    hidden = len(links_of) - len(placed)
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
        marks.append(Mark(member, layout.mark_x, mark_y, shape(member.type, layout.mark_x, mark_y),
                          label, layout.mark_x + 2 * RADIUS + 2, kinds))
        curves.append(Line(_curve(layout, box_y, box_height, mark_y), link_type,
                           ", ".join(k.value for k in kinds) + f": {shorten(member.text, 80)}"))
    present = {node.type, *(m.node.type for m in marks)}
    return Drawing(layout.width, math.ceil(height), node, MARGIN, layout.box_width, box_y,
                   box_height, box_lines, tuple(curves), tuple(headings), tuple(marks),
                   layout.mark_x - RADIUS, hidden, tuple(t for t in NodeType if t in present))


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


# The graph page's picture: its size, each type's marker radius, and the labelled node types.
PICTURE_WIDTH = 960
PICTURE_HEIGHT = 640
PICTURE_MARGIN = 24
SIZES: dict[NodeType, float] = {
    NodeType.SEMANTIC: 7.0, NodeType.PROCEDURAL: 7.5, NodeType.EPISODIC: 6.0,
    NodeType.SOURCE: 9.0, NodeType.SUBGOAL: 5.0, NodeType.TAG: 5.0, NodeType.INTENT: 6.0}
LABELLED = {NodeType.SOURCE: 32, NodeType.TAG: 18, NodeType.INTENT: 24}
# The pull to the middle: enough to keep unlinked parts near, too weak to crush clusters.
GRAVITY = 0.1


@dataclass(frozen=True, slots=True)
class Picture:
    """What the graph page draws: the nodes, the links among them, the node and link types
    present (for the legend)."""

    width: int
    height: int
    spots: tuple[Mark, ...]
    lines: tuple[Line, ...]
    node_types: tuple[NodeType, ...]
    link_types: tuple[LinkType, ...]


def force_layout(count: int, pairs: Sequence[tuple[int, int]]) -> npt.NDArray[np.float64]:
    """Positions in the unit square for `count` nodes joined by `pairs` (Fruchterman-Reingold, 300
    rounds of linear cooling from a seeded start, with a weak pull to the middle)."""
    rng = np.random.default_rng(7)
    # A position is a complex number: one array op moves both coordinates.
    place = rng.random(count) + 1j * rng.random(count)
    if count < 2:
        return np.full((count, 2), 0.5)
    joined = np.zeros((count, count))
    for a, b in pairs:
        if a != b:
            joined[a, b] = joined[b, a] = 1.0
    ideal = 1.0 / math.sqrt(count)
    heat = 0.1
    for _ in range(300):
        delta = place[:, None] - place[None, :]
        distance = np.maximum(np.abs(delta), 0.01)
        pull = ideal * ideal / distance**2 - joined * distance / ideal
        shift = (delta * pull).sum(axis=1) - GRAVITY * (place - (0.5 + 0.5j))
        length = np.maximum(np.abs(shift), 1e-9)
        place += shift * (np.minimum(length, heat) / length)
        heat -= 0.1 / 301
    points = np.stack([place.real, place.imag], axis=1)
    low, high = points.min(axis=0), points.max(axis=0)
    return np.asarray((points - low) / np.maximum(high - low, 1e-9), dtype=np.float64)


def picture(nodes: Sequence[Node], links: Sequence[tuple[str, str, LinkType]],
            focus: str | None = None) -> Picture:
    """`nodes` and the `links` among them (src, dst, type; a link to a node not in `nodes`
    is left out), placed by `force_layout`; `focus` is the id of a node to stand out."""
    index: dict[str, int] = {node.id: number for number, node in enumerate(nodes)}
    drawn = [(src, dst, kind) for src, dst, kind in links if src in index and dst in index]
    place = force_layout(len(nodes), [(index[src], index[dst]) for src, dst, _ in drawn])
    inner = np.array([PICTURE_WIDTH - 2 * PICTURE_MARGIN, PICTURE_HEIGHT - 2 * PICTURE_MARGIN])
    at = PICTURE_MARGIN + place * inner
    spots = []
    for node, (x, y) in zip(nodes, at, strict=True):
        chars = LABELLED.get(node.type, 0) or (40 if node.id == focus else 0)
        radius = SIZES.get(node.type, RADIUS) * (1.6 if node.id == focus else 1.0)
        left = x > 0.7 * PICTURE_WIDTH
        spots.append(Mark(node, float(x), float(y), shape(node.type, float(x), float(y), radius),
                          shorten(node.text, chars) if chars else "",
                          float(x - radius - 3 if left else x + radius + 3), (),
                          "end" if left else "start", node.id == focus))
    lines = []
    for src, dst, kind in drawn:
        (x1, y1), (x2, y2) = at[index[src]], at[index[dst]]
        ends = f"{shorten(nodes[index[src]].text, 40)} → {shorten(nodes[index[dst]].text, 40)}"
        lines.append(Line(f"M{x1:.1f},{y1:.1f}L{x2:.1f},{y2:.1f}", kind,
                          f"{kind.value}: {ends}"))
    present = {node.type for node in nodes}
    kinds = {kind for _, _, kind in drawn}
    return Picture(
        PICTURE_WIDTH, PICTURE_HEIGHT, tuple(spots), tuple(lines),
        tuple(t for t in NodeType if t in present), tuple(k for k in LinkType if k in kinds))
