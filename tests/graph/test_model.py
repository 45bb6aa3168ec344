"""Round-trips of the graph's stored values, and the tag label normalisation."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mnemo.graph.model import (
    LINK_TYPES,
    NODE_TYPES,
    Changeset,
    CommitReceipt,
    LinkType,
    Node,
    NodeDraft,
    NodeId,
    NodeType,
    normalise_label,
    step_order,
)
from mnemo.ports import vector_from_blob, vector_to_blob
from mnemo.storage.sqlite.graph import SqliteGraph
from tests.graph._support import DIM, axis, draft, policy
from tests.strategies import changesets, commit_receipts, json_objects, texts, vectors

# Node types whose drafts are never deduplicated away (tags and intents have their own tests).
PLAIN_TYPES = [t for t in NodeType if t not in (NodeType.TAG, NodeType.INTENT)]


def assert_drafts_equal(got: NodeDraft, want: NodeDraft) -> None:
    assert (got.id, got.type, got.text, got.data, got.key, got.source_id) == (
        want.id,
        want.type,
        want.text,
        want.data,
        want.key,
        want.source_id,
    )
    assert got.vector.dtype == np.float32
    np.testing.assert_array_equal(got.vector, want.vector)


@pytest.mark.slow
@given(changesets(DIM))
def test_changeset_json_round_trip(changeset: Changeset) -> None:
    """A changeset read back from its JSON equals the original, vectors bit for bit."""
    back = Changeset.from_json(changeset.to_json())
    assert (back.id, back.repo, back.links, back.step_ids, back.generation) == (
        changeset.id,
        changeset.repo,
        changeset.links,
        changeset.step_ids,
        changeset.generation,
    )
    assert len(back.nodes) == len(changeset.nodes)
    for got, want in zip(back.nodes, changeset.nodes, strict=True):
        assert_drafts_equal(got, want)


@pytest.mark.slow
@given(changesets(DIM))
def test_changeset_json_is_canonical(changeset: Changeset) -> None:
    """Writing a changeset read back from JSON gives the same JSON text."""
    text = changeset.to_json()
    assert Changeset.from_json(text).to_json() == text


def test_changeset_json_is_compact_utf8_with_sorted_keys() -> None:
    """A changeset's JSON lists every object's keys in order and writes text as it is (no
    escapes, no spaces), as msgspec does; `from_json` reads it back."""
    node = NodeDraft("n1", NodeType.SEMANTIC, "Zoë's café", {"b": 1, "a": [0.5]},
                     np.zeros(DIM, dtype=np.float32))
    text = Changeset("c1", "r", [node]).to_json()
    assert text.startswith('{"id":"c1","links":[],"nodes":[{"data":{"a":[0.5],"b":1},"id":"n1",')
    assert "\"text\":\"Zoë's café\"" in text
    assert Changeset.from_json(text).nodes[0].text == "Zoë's café"


@given(commit_receipts)
def test_commit_receipt_round_trip(receipt: CommitReceipt) -> None:
    """A commit receipt read back from its JSON equals the original."""
    assert CommitReceipt.from_json(receipt.to_json()) == receipt


@given(vectors(DIM))
def test_vector_blob_round_trip(vector: np.ndarray[Any, np.dtype[np.float32]]) -> None:
    """A vector read back from its blob is the same float32 vector."""
    back = vector_from_blob(vector_to_blob(vector))
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back, vector)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    nodes=st.lists(
        st.tuples(st.sampled_from(PLAIN_TYPES), texts(), json_objects), min_size=1, max_size=4
    )
)
async def test_node_row_round_trip(
    graph: SqliteGraph, nodes: list[tuple[NodeType, str, dict[str, Any]]]
) -> None:
    """Nodes read back from the store have the text, type and data they were applied with."""
    repo = f"repo-{uuid.uuid4()}"  # a fresh repo per example: nothing to deduplicate against
    # Vectors apart: two facts alike in text and vector are one.
    drafts = [draft(str(uuid.uuid4()), kind, text, axis(i), data=data)
              for i, (kind, text, data) in enumerate(nodes)]
    before = datetime.now(UTC)
    receipt = await graph.apply(Changeset(str(uuid.uuid4()), repo, drafts), intents=policy())
    assert receipt.node_ids == [d.id for d in drafts]
    got = await graph.get_nodes(repo, [d.id for d in drafts])
    assert [(n.id, n.type, n.text, n.data) for n in got] == [
        (d.id, d.type, d.text, d.data) for d in drafts
    ]
    for node in got:
        assert node.created_at.tzinfo is not None
        assert before - timedelta(seconds=1) <= node.created_at <= datetime.now(UTC)


@given(st.text())
def test_normalise_label_is_idempotent(label: str) -> None:
    """Normalising a normalised label changes nothing."""
    once = normalise_label(label)
    assert normalise_label(once) == once


@given(st.text())
def test_normalise_label_is_trimmed_lowercase_and_single_spaced(label: str) -> None:
    """A normalised label has no outer whitespace, no upper case, and single inner spaces."""
    label_n = normalise_label(label)
    assert label_n == label_n.strip()
    assert label_n == label_n.lower()
    assert "  " not in label_n
    assert all(not ch.isspace() or ch == " " for ch in label_n)


@given(st.text(), st.text(alphabet=" \t\n\r\x0b\x0c\u00a0\u2003", max_size=4))
def test_normalise_label_ignores_case_and_surrounding_whitespace(label: str, pad: str) -> None:
    """Padding with whitespace or changing to lower case keeps a label's identity."""
    assert normalise_label(pad + label + pad) == normalise_label(label)
    assert normalise_label(label.lower()) == normalise_label(label)


def test_normalise_label_examples() -> None:
    """ " Nginx  Proxy " is "nginx proxy"; a blank label is empty."""
    assert normalise_label(" Nginx  Proxy ") == "nginx proxy"
    assert normalise_label(" \t\n") == ""


def test_type_tables_name_every_member_as_the_enums_do() -> None:
    """The stores decode type names through `NODE_TYPES` and `LINK_TYPES` (a dict look-up,
    not the enum's call): each maps every stored name to the member the enum would give."""
    for table, enum in ((NODE_TYPES, NodeType), (LINK_TYPES, LinkType)):
        assert set(table) == {member.value for member in enum}
        for name, member in table.items():
            assert member is enum(name)


def test_steps_are_ordered_by_their_index_as_a_number() -> None:
    """Step 10 of an episode comes after step 2 (`mnemo show` and the web app list steps so)."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    steps = [Node(NodeId(f"episodic_e:{i}"), NodeType.EPISODIC, f"step {i}",
                  {"episode_id": "e", "index": i}, at) for i in (10, 2, 1, 11)]
    assert [n.data["index"] for n in sorted(steps, key=step_order)] == [1, 2, 10, 11]
