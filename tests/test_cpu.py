"""`cpu.dumps` and `cpu.pieces` give `json.dumps`'s text, built by short C calls."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given, strategies as st

import mnemo
from mnemo import cpu
from mnemo.ingest.service import _digest

texts = st.text(st.characters(codec="utf-8"), max_size=40)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(texts, inner, max_size=5),
    max_leaves=30,
)


@given(values, st.booleans())
def test_the_pieces_make_json_dumps_text(value: object, sort_keys: bool) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpu, "_SLICE", 7)  # long strings and values cut into many pieces
        assert cpu.dumps(value, sort_keys=sort_keys) == json.dumps(
            value, ensure_ascii=False, sort_keys=sort_keys)
        assert "".join(cpu.pieces(value, sort_keys=sort_keys)) == cpu.dumps(
            value, sort_keys=sort_keys)


def test_a_source_digest_is_the_sha256_of_its_canonical_json() -> None:
    """The digest an ingest stores (and later compares) is read from the pieces without one long
    string, and is the same as that of the whole canonical text."""
    steps = [mnemo.Step("é" * 300_000 + f" step {i}", f"act {i}", {"n": i}) for i in range(3)]
    trajectory = mnemo.Trajectory("a long goal \u2603", steps, {"team": "a"})
    payload = {"goal": trajectory.goal, "metadata": trajectory.metadata,
               "steps": [{"action": s.action, "metadata": s.metadata, "observation": s.observation}
                         for s in steps]}
    text = json.dumps(payload, ensure_ascii=False, sort_keys=True) + '{"user": "u"}'
    assert _digest(trajectory, {"user": "u"}) == hashlib.sha256(text.encode()).hexdigest()
