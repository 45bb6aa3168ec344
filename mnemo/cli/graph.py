"""`mnemo graph REPO`: counts by node and link type, and the whole graph as JSON or GraphML
(written never over the store)."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree as ET

from mnemo.graph.model import Link, LinkType, Node, NodeType
from mnemo.jsonable import label, link_json, node_json
from mnemo.storage.ports import is_postgres

GRAPHML_NS = "http://graphml.graphdrawing.org/xmlns"
# Characters XML 1.0 cannot carry at all, not even escaped.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


@dataclass(frozen=True, slots=True)
class GraphDump:
    """A repo's nodes (oldest first) and links."""

    repo: str
    nodes: list[Node]
    links: list[Link]

    def counts(self) -> dict[str, dict[str, int]]:
        """Nodes and links by type, every type listed (0 when absent)."""
        nodes = Counter(label(n.type) for n in self.nodes)
        links = Counter(label(e.type) for e in self.links)
        return {
            "nodes": {t.value: nodes[t.value] for t in NodeType},
            "links": {t.value: links[t.value] for t in LinkType}}


def to_json(graph: GraphDump) -> dict[str, object]:
    return {
        "repo": graph.repo, "counts": graph.counts(), "nodes": [node_json(n) for n in graph.nodes],
        "links": [link_json(e) for e in graph.links]}


def to_graphml(graph: GraphDump) -> str:
    """The graph as GraphML (directed, as links are stored): node attributes `type`, `text`,
    `created_at` and `data` (JSON text), edge attribute `type`."""
    ET.register_namespace("", GRAPHML_NS)
    root = ET.Element(f"{{{GRAPHML_NS}}}graphml")
    keys = [("node", "type"), ("node", "text"), ("node", "created_at"), ("node", "data"),
            ("edge", "type")]
    for scope, name in keys:
        ET.SubElement(
            root, f"{{{GRAPHML_NS}}}key",
            {"id": f"{scope}_{name}", "for": scope, "attr.name": name, "attr.type": "string"})
    body = ET.SubElement(
        root, f"{{{GRAPHML_NS}}}graph", {"id": graph.repo, "edgedefault": "directed"})
    for node in graph.nodes:
        element = ET.SubElement(body, f"{{{GRAPHML_NS}}}node", {"id": node.id})
        values = {
            "type": label(node.type), "text": node.text, "created_at": node.created_at.isoformat(),
            "data": json.dumps(node.data, sort_keys=True, ensure_ascii=False)}
        for name, value in values.items():
            _data(element, f"node_{name}", value)
    for number, edge in enumerate(graph.links):
        element = ET.SubElement(body, f"{{{GRAPHML_NS}}}edge",
                                {"id": f"e{number}", "source": edge.src, "target": edge.dst})
        _data(element, "edge_type", label(edge.type))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _data(parent: ET.Element, key: str, value: str) -> None:
    ET.SubElement(parent, f"{{{GRAPHML_NS}}}data", {"key": key}).text = _NOT_XML.sub("", value)


# What mnemo keeps beside a SQLite store "<file>": its journals, its caches, its memory files.
_BESIDE = ("", "-wal", "-shm", "-journal", ".lexical", ".hnsw", ".memory")


def is_kept_beside(path: Path, store: str) -> bool:
    """Whether `path` is the SQLite file `store`, or one mnemo keeps beside it (see `_BESIDE`,
    and its locks "<file>-*.lock") under the name `store` gives or the file's own, whatever
    link, relative path or letter case names it."""
    if is_postgres(store):
        return False
    with contextlib.suppress(OSError):
        if os.path.samefile(path, store):
            return True
    names = {path.absolute(), path.resolve()}
    return any(
        name == k or k in name.parents or (
            name.parent == base.parent and name.name.startswith(f"{base.name}-")
            and name.suffix == ".lock")
        for base in {Path(store).absolute(), Path(store).resolve()} for name in names
        for k in [Path(f"{base}{tail}") for tail in _BESIDE])
