"""The drawn neighbourhood of a node: the layout (pure) and the SVG of the node page."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime

import httpx
import pytest

import mnemo
from mnemo.graph.model import LinkType, Node, NodeId, NodeType
from mnemo.ui.drawing import MAX_DRAWN, NARROW, RADIUS, ROW, WIDE, Layout, neighbourhood, shape
from mnemo.ui.source import LinkedNode
from tests.ui.conftest import REPO

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def node(node_id: str, kind: NodeType, text: str, *, retired: bool = False) -> Node:
    return Node(NodeId(node_id), kind, text, {}, NOW, retired_at=NOW if retired else None)


@pytest.mark.parametrize("layout", [WIDE, NARROW])
def test_every_neighbour_is_drawn_once_inside_the_picture_in_rows(layout: Layout) -> None:
    """Each neighbour gets one mark (a node reached by two link types too, with both), all
    inside the picture, one row apart, below the box when it is above them, grouped under
    their link type in LinkType order."""
    middle = node("f", NodeType.SEMANTIC, "Nginx returns 502: gunicorn listens on 8001. " * 5)
    linked = [
        LinkedNode(LinkType.PROVENANCE, node("s", NodeType.EPISODIC, "a step")),
        LinkedNode(LinkType.MEMBERSHIP, node("t1", NodeType.TAG, "nginx")),
        LinkedNode(LinkType.MEMBERSHIP, node("t2", NodeType.TAG, "gunicorn")),
        LinkedNode(LinkType.SIBLING, node("g", NodeType.SEMANTIC, "x" * 200)),
        LinkedNode(LinkType.SUPERSEDES, node("g", NodeType.SEMANTIC, "x" * 200)),
        LinkedNode(LinkType.SUPERSEDES, node("old", NodeType.SEMANTIC, "it was 8000",
                                             retired=True)),
    ]
    drawing = neighbourhood(middle, linked, layout=layout)
    assert sorted(m.node.id for m in drawing.marks) == ["g", "old", "s", "t1", "t2"]
    assert [h.link_type for h in drawing.headings] == [
        LinkType.MEMBERSHIP, LinkType.PROVENANCE, LinkType.SIBLING, LinkType.SUPERSEDES]
    assert next(h.text for h in drawing.headings) == "membership (2)"
    both = next(m for m in drawing.marks if m.node.id == "g")
    assert both.links == (LinkType.SIBLING, LinkType.SUPERSEDES)
    ys = [m.y for m in drawing.marks]
    assert ys == sorted(ys)
    assert all(b - a >= ROW for a, b in itertools.pairwise(ys))
    for m in drawing.marks:
        assert RADIUS <= m.y <= drawing.height - RADIUS
        assert len(m.label) <= layout.label_chars
        # 14 px text averages under 8 px a character.
        assert m.label_x + 8 * len(m.label) <= drawing.width
    assert both.label.endswith("…")
    assert next(m for m in drawing.marks if m.node.id == "old").label.endswith("(retired)")
    assert drawing.box_y >= 0
    assert drawing.box_y + drawing.box_height <= drawing.height
    assert drawing.box_x + drawing.box_width <= drawing.width
    if not layout.beside:
        assert min(ys) - RADIUS > drawing.box_y + drawing.box_height
    assert drawing.box_lines[0] == "semantic"
    assert drawing.hidden == 0
    assert len(drawing.curves) == len(drawing.marks)
    assert drawing.node_types == (NodeType.EPISODIC, NodeType.SEMANTIC, NodeType.TAG)


def test_many_neighbours_are_capped_with_every_link_type_shown() -> None:
    """Past the cap, the rest are counted as hidden, and each link type still shows."""
    linked = [LinkedNode(LinkType.MEMBERSHIP, node(f"t{i}", NodeType.TAG, f"tag {i}"))
              for i in range(60)]
    linked.append(LinkedNode(LinkType.PROVENANCE, node("s", NodeType.EPISODIC, "a step")))
    drawing = neighbourhood(node("f", NodeType.SEMANTIC, "fact"), linked)
    assert len(drawing.marks) == MAX_DRAWN
    assert drawing.hidden == 61 - MAX_DRAWN
    assert {h.link_type for h in drawing.headings} == {LinkType.MEMBERSHIP, LinkType.PROVENANCE}
    assert drawing.headings[0].text == "membership (60)"
    assert max(m.y for m in drawing.marks) < drawing.height - ROW / 2


def test_each_node_type_has_a_shape_of_its_own() -> None:
    """Node types differ by shape, not only by colour."""
    assert len({shape(kind, 0, 0) for kind in NodeType}) == len(NodeType)


async def test_the_node_page_draws_its_neighbourhood(
    client: httpx.AsyncClient, memory: mnemo.Memory
) -> None:
    """A fact's page holds an SVG in each layout with a linked mark per neighbour, each link
    type named, each node type in the legend, and no inline style (the CSP forbids it)."""
    facts = await memory.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])
    fact = next(f for f in facts if f.text.startswith("Nginx returns 502"))
    neighbours = {n.id for n in await memory.get_linked_nodes(REPO, [fact.id])}
    page = await client.get("/node", params={"repo": REPO, "id": fact.id})
    for name in ("wide", "narrow"):
        svg = page.text.split(f'<svg id="drawing-{name}"')[1].split("</svg>")[0]
        drawn = re.findall(r'<a class="neighbour" href="/node\?repo=ops&amp;id=([^"]+)"', svg)
        assert {d.replace("%3A", ":") for d in drawn} == neighbours
        for link_type in ("membership", "provenance", "sibling"):
            assert f'class="heading link-{link_type}"' in svg
        assert "<script" not in svg
    legend = page.text.split('id="legend"')[1].split("</ul>")[0]
    assert [t for t in ("episodic", "semantic", "tag") if f"> {t}</li>" in legend] == [
        "episodic", "semantic", "tag"]
    assert "style=" not in page.text
