"""The pictures of the graph: a node's neighbourhood (the node page) and a part of a repo's
graph (the graph page), their layouts (pure) and their SVG."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from datetime import UTC, datetime

import httpx
import numpy as np
import pytest

import mnemo
from mnemo.graph.model import Link, LinkType, Node, NodeId, NodeType
from mnemo.ui.app import create_app, subgraph
from mnemo.ui.drawing import (
    MAX_DRAWN,
    NARROW,
    RADIUS,
    ROW,
    WIDE,
    Layout,
    force_layout,
    neighbourhood,
    picture,
    shape,
)
from mnemo.ui.source import LinkedNode, MemorySource
from tests.ui.conftest import REPO, client_of

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


# ---- the graph page's picture ----------------------------------------------------------------


def _cliques(size: int) -> list[tuple[int, int]]:
    """Two cliques of `size` nodes (0.. and size..), joined by one link."""
    pairs = [(a, b) for part in (0, size) for a, b in
             itertools.combinations(range(part, part + size), 2)]
    return [*pairs, (0, size)]


def test_the_force_layout_is_the_same_each_time_and_fills_the_square() -> None:
    """The same graph gets the same places, spread over the whole unit square."""
    first = force_layout(12, _cliques(6))
    assert (first == force_layout(12, _cliques(6))).all()
    assert first.min(axis=0).tolist() == [0.0, 0.0]
    assert first.max(axis=0).tolist() == [1.0, 1.0]
    assert force_layout(1, []).tolist() == [[0.5, 0.5]]


def test_linked_nodes_stand_together_and_apart_from_the_rest() -> None:
    """Two cliques joined by a link: a node stands nearer each node of its clique than any
    node of the other, and no two nodes share a place."""
    place = force_layout(12, _cliques(6))
    gap = np.linalg.norm(place[:, None] - place[None, :], axis=-1)
    within = max(gap[a, b] for part in (0, 6)
                 for a, b in itertools.combinations(range(part, part + 6), 2))
    across = min(gap[a, b] for a in range(6) for b in range(6, 12))
    assert within < across
    assert gap[np.triu_indices(12, 1)].min() > 0.02


def test_the_picture_holds_each_node_once_and_the_links_among_them() -> None:
    """Every node is a spot inside the picture, a link to a node not drawn is left out, tags
    and sources are labelled and facts not, the focus stands out, and the legend lists the
    types present."""
    fact = node("f", NodeType.SEMANTIC, "Nginx returns 502: gunicorn listens on 8001.")
    tag = node("t", NodeType.TAG, "nginx")
    step = node("s", NodeType.EPISODIC, "nginx returns 502 -> bind gunicorn")
    drawn = picture([fact, tag, step], [("f", "t", LinkType.MEMBERSHIP),
                                        ("f", "s", LinkType.PROVENANCE),
                                        ("f", "gone", LinkType.SIBLING)], focus="f")
    assert [s.node.id for s in drawn.spots] == ["f", "t", "s"]
    assert [line.link_type for line in drawn.lines] == [LinkType.MEMBERSHIP,
                                                        LinkType.PROVENANCE]
    for spot in drawn.spots:
        assert 0 < spot.x < drawn.width
        assert 0 < spot.y < drawn.height
    assert [s.label for s in drawn.spots] == [fact.text[:38] + "…", "nginx", ""]
    assert [s.focus for s in drawn.spots] == [True, False, False]
    assert drawn.node_types == (NodeType.EPISODIC, NodeType.SEMANTIC, NodeType.TAG)
    assert drawn.link_types == (LinkType.MEMBERSHIP, LinkType.PROVENANCE)


def _within(links: Sequence[Link], seeds: Sequence[str], hops: int) -> set[str]:
    """The nodes up to `hops` links from the seeds, by the repo's whole list of links."""
    reached, frontier = set(seeds), set(seeds)
    for _ in range(hops):
        frontier = {b for link in links for a, b in ((link.src, link.dst), (link.dst, link.src))
                    if a in frontier} - reached
        reached |= frontier
    return reached


def _drawn(page: str) -> tuple[list[str], list[str]]:
    """The node ids of the picture's spots, and its lines' link types."""
    svg = page.split('<svg id="graph-picture"')[1].split("</svg>")[0]
    return (re.findall(r'<a class="spot[^"]*" href="[^"]+" data-id="([^"]+)"', svg),
            re.findall(r'<path class="line link-([a-z]+)"', svg))


async def test_the_graph_page_draws_the_newest_knowledge_and_its_links(store: str) -> None:
    """The graph page's SVG has one spot per node up to two links from the newest facts and
    procedures and one line per link among them, as the repo's links say, each spot a link
    to its node's page; `focus` draws the part around one node, standing out."""
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder()) as mem:
        await mem.open_repo(REPO)
        sid = await mem.start_session("Deploy the blog", repo=REPO)
        await mem.append(sid, "nginx returns 502: gunicorn listens on port 8001.",
                         "Bind gunicorn to 127.0.0.1:8000 and reload nginx.")
        await mem.append(sid, "The TLS certificate expires in 3 days.", "Run certbot renew.")
        await mem.close_and_commit(sid)
        links = await mem.links(REPO)
        facts = await mem.latest(REPO, types=["semantic", "procedural"], top_k=24)
        async with client_of(create_app(MemorySource(mem))) as client:
            page = (await client.get("/graph", params={"repo": REPO})).text
            fact = facts[-1]
            around = (await client.get("/graph", params={"repo": REPO, "focus": fact.id})).text
            missing = await client.get("/graph", params={"repo": REPO, "focus": "nope"})
    for text, seeds in ((page, [f.id for f in facts]), (around, [fact.id])):
        spots, lines = _drawn(text)
        expected = _within(links, seeds, 2)
        assert len(spots) == len(set(spots))
        assert {s.replace("%3A", ":") for s in spots} == expected
        among = {(frozenset((link.src, link.dst)), link.type.value) for link in links
                 if {link.src, link.dst} <= expected}
        assert sorted(lines) == sorted(kind for _, kind in among)
        assert len(spots) > 10
        assert len(lines) > 10
    assert f'<a class="spot focus" href="/node?repo={REPO}&amp;id={fact.id}"' in around
    assert "style=" not in page
    assert missing.status_code == 404


async def test_a_bounded_part_keeps_the_links_among_its_nodes(memory: mnemo.Memory) -> None:
    """With fewer nodes allowed than are near, the part holds that many, nearest first, and
    every link among them."""
    view = MemorySource(memory)
    seeds = await memory.latest(REPO, types=[NodeType.SEMANTIC], top_k=2)
    nodes, links = await subgraph(view, REPO, seeds, hops=2, limit=7)
    ids = {n.id for n in nodes}
    assert len(nodes) == 7
    assert {s.id for s in seeds} <= ids
    every = await memory.links(REPO)
    assert set(links) == {(*sorted((link.src, link.dst)), link.type) for link in every
                          if {link.src, link.dst} <= ids}
