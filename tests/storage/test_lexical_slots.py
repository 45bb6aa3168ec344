"""The lexical index's folders of older layouts: a slot no process holds is deleted, one a
process holds is left to it, and what else the store's folder holds stays."""

from __future__ import annotations

from pathlib import Path

from mnemo.storage.lexical.schema import open_index, schema
from mnemo.storage.lexical.slots import HEAP, drop_older


def test_free_slots_of_older_layouts_go_and_held_ones_stay(tmp_path: Path) -> None:
    """v4's free slot (words and all) is deleted, its held slot stays, and so do the current
    layout's slots and the saved graphs' folder beside them."""
    free, held, current, graphs = (tmp_path / "v4" / "slot-0", tmp_path / "v4" / "slot-1",
                                   tmp_path / "v5" / "slot-0", tmp_path / "hnsw")
    for folder in (free, held, current, graphs):
        folder.mkdir(parents=True)
        (folder / "segment").write_bytes(b"words")
    open_index(free, schema()).writer(heap_size=HEAP, num_threads=1)  # dropped: let go
    writer = open_index(held, schema()).writer(heap_size=HEAP, num_threads=1)
    try:
        drop_older(tmp_path, "v5")
        assert not free.exists()
        assert (held / "segment").exists()
        assert (current / "segment").exists()
        assert (graphs / "segment").exists()
    finally:
        del writer
    drop_older(tmp_path, "v5")
    assert not (tmp_path / "v4").exists()
