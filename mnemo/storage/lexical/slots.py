"""The lexical index's slots as folders (`mnemo.storage.lexical.index`): what a process does
to the slots it does not hold."""

from __future__ import annotations

import shutil
from pathlib import Path

from mnemo.storage.lexical.schema import open_index, schema

# The writer's memory budget (tantivy splits it between its threads).
HEAP = 32_000_000


def wipe_free(place: Path, layout: str, *, keep: Path | None) -> None:
    """Deletes the documents of every slot under `place` (a store's folder) that no process
    holds, but `keep`, and the folders of the index's other layouts than `layout` (its
    `FORMAT`: "v4"; a PostgreSQL store's folder also holds its saved graphs, "hnsw")."""
    if not place.is_dir():
        return
    for folder in place.iterdir():
        older = folder.name[:1] == "v" and folder.name[1:].isdigit()
        if older and folder.name != layout and folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
    current = place / layout
    if not current.is_dir():
        return
    fields = schema()
    for folder in sorted(current.iterdir()):
        if folder == keep or not folder.is_dir():
            continue
        try:
            index = open_index(folder, fields)
            writer = index.writer(heap_size=HEAP, num_threads=1)
        except ValueError as error:
            if "LockBusy" not in str(error):
                shutil.rmtree(folder, ignore_errors=True)
            continue
        try:
            # Without the epoch's mark: its next holder starts it over (`_take`).
            writer.delete_all_documents()
            writer.commit()
            writer.garbage_collect_files()
        finally:
            del writer
