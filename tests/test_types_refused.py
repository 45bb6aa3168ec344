"""Types are refused at the door: a `Memory` path that names no store, a string where a list
of ids belongs, a callback that cannot be called: `InvalidInputError`, before anything is
created or stored."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import mnemo
from tests.conftest import REPO, Enter

NO_STORE: list[Any] = [12.5, 123, b"x.db", "   ", "", "x\0.db", "mysql://me@host/db", None]


@pytest.mark.parametrize("path", NO_STORE, ids=repr)
async def test_a_path_that_names_no_store_is_refused_before_a_file_is_made(
    path: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Memory(12.5)`, `Memory(b"x.db")`, `Memory("   ")` made files of those names, and
    `Memory("x\\0.db")` raised a bare ValueError."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(mnemo.InvalidInputError, match="path"):
        async with mnemo.Memory(path):
            pass
    assert os.listdir(tmp_path) == []


async def test_a_path_like_opens_the_file_it_names(tmp_path: Path) -> None:
    async with mnemo.Memory(tmp_path / "m.db", embedder=mnemo.HashEmbedder(8)) as mem:
        await mem.open_repo(REPO)
    assert (tmp_path / "m.db").exists()


@pytest.mark.parametrize(
    "kwargs", [{"on_event": "print"}, {"synchronous": "OFF"}, {"synchronous": 1}], ids=repr
)
def test_a_setting_of_the_wrong_kind_is_refused(kwargs: dict[str, Any]) -> None:
    """A non-callable `on_event` was accepted and failed at each event; a bad `synchronous`
    raised a bare ValueError."""
    with pytest.raises(mnemo.InvalidInputError):
        mnemo.Memory(":memory:", **kwargs)


async def test_a_string_is_not_a_list_of_node_ids(mem: mnemo.Memory) -> None:
    """`delete_nodes("r", "node_abc")` read the string as one-letter ids; now a string where
    a list of ids belongs is refused, and nothing is deleted."""
    receipt = await mem.ingest(
        REPO, mnemo.Trajectory("g", [mnemo.Step("nginx listens on 8080", "note it")]),
        source_id="s",
    )
    node_id = receipt.node_ids[0]
    with pytest.raises(mnemo.InvalidInputError, match=r"list of node ids.*\[" ):
        await mem.delete_nodes(REPO, node_id)
    with pytest.raises(mnemo.InvalidInputError, match="list of node ids"):
        await mem.get_linked_nodes(REPO, node_id)
    assert await mem.get_node(REPO, node_id) is not None
    assert await mem.delete_nodes(REPO, [node_id]) == 1


@pytest.mark.parametrize("call", ["append", "close", "commit", "discard", "start_episode"])
async def test_a_callback_that_cannot_be_called_is_refused_before_the_operation(
    mem: mnemo.Memory, enter: Enter, call: str
) -> None:
    """A callback that is not callable was accepted, the operation ran (a step stored) and
    its result was lost to a logged TypeError; now nothing is accepted."""
    sid = await enter(mnemo.State.COLLECTING)
    args = {"append": ("look", "wave"), "start_episode": ("again",)}.get(call, ())
    with pytest.raises(mnemo.InvalidInputError, match="callback"):
        await getattr(mem, f"{call}_async")(sid, *args, callback="done")
    assert await mem.session_state(sid) is mnemo.State.COLLECTING
    context = await mem.session_context(sid)
    assert context is not None
    assert context.recent_steps == []
