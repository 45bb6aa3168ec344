"""Shared Hypothesis strategies for mnemo's stored values."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from mnemo.graph.model import (
    Changeset,
    CommitReceipt,
    Link,
    LinkType,
    NodeDraft,
    NodeType,
    Vector,
    normalise_label,
)


# Text a store keeps as given: valid Unicode but NUL, which PostgreSQL's text cannot hold
# (`mnemo.errors`' checks refuse both on every backend).
def texts(*, min_size: int = 0, max_size: int | None = None) -> st.SearchStrategy[str]:
    alphabet = st.characters(exclude_characters="\x00", exclude_categories=["Cs"])
    return st.text(alphabet, min_size=min_size, max_size=max_size)


ids = texts(min_size=1, max_size=24)
node_types = st.sampled_from(list(NodeType))
link_types = st.sampled_from(list(LinkType))

# JSON values that survive json.dumps/json.loads and a store unchanged: no NaN, no tuples,
# no NUL, and floats within 1e15 of zero (PostgreSQL's jsonb keeps numbers as decimals, so a
# float that JSON writes in exponent form, 1e+16 and up, comes back as an integer).
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(min_value=-1e15, max_value=1e15, allow_nan=False, allow_infinity=False)
    | texts(max_size=20)
)
json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(texts(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
json_objects: st.SearchStrategy[dict[str, Any]] = st.dictionaries(
    texts(max_size=8), json_values, max_size=5
)

# Components are 0 or at least 2**-6 in size, so a float32 norm never underflows to zero.
vector_components = st.one_of(
    st.just(0.0),
    st.floats(min_value=2**-6, max_value=1.0, width=32),
    st.floats(min_value=-1.0, max_value=-(2**-6), width=32),
)


def vectors(dim: int) -> st.SearchStrategy[Vector]:
    return arrays(np.float32, (dim,), elements=vector_components)


def matrices(rows: st.SearchStrategy[int], dim: int) -> st.SearchStrategy[Vector]:
    return rows.flatmap(lambda n: arrays(np.float32, (n, dim), elements=vector_components))


@st.composite
def node_drafts(draw: st.DrawFn, dim: int = 8) -> NodeDraft:
    kind = draw(node_types)
    text = draw(texts(max_size=40))
    return NodeDraft(
        id=draw(ids),
        type=kind,
        text=text,
        data=draw(json_objects),
        vector=draw(vectors(dim)),
        key=normalise_label(text) if kind is NodeType.TAG else draw(st.none() | ids),
        source_id=draw(st.none() | ids),
    )


links = st.builds(Link, src=ids, dst=ids, type=link_types)


def changesets(dim: int = 8) -> st.SearchStrategy[Changeset]:
    return st.builds(
        Changeset,
        id=ids,
        repo=ids,
        nodes=st.lists(node_drafts(dim), max_size=5),
        links=st.lists(links, max_size=5),
        step_ids=st.lists(ids, max_size=5),
        generation=st.integers(min_value=0, max_value=2**31),
    )


commit_receipts = st.builds(
    CommitReceipt, changeset_id=ids, repo=ids, node_ids=st.lists(ids, max_size=8)
)
