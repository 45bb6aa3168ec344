"""The lexical index's slots as folders (`mnemo.storage.lexical.index`): what a process does
to the slots it does not hold."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import filelock

from mnemo.storage.lexical.schema import open_index, schema

# The writer's memory budget (tantivy splits it between its threads).
HEAP = 32_000_000
# tantivy's writer lock in a slot's folder: an OS lock (flock) its holder keeps while it lives.
WRITER_LOCK = ".tantivy-writer.lock"


def wipe_free(place: Path, layout: str, *, keep: Path | None) -> None:
    """Deletes the documents of every slot under `place` (a store's folder) that no process
    holds, but `keep`, and the free slots of the index's older layouts than `layout` (its
    `FORMAT`, "v5"; a PostgreSQL store's folder also holds its saved graphs, "hnsw")."""
    if not place.is_dir():
        return
    drop_older(place, layout)
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


def drop_older(place: Path, layout: str) -> None:
    """Deletes the slots of the index's older layouts ("v4" beside "v5") that no process
    holds (one of an older mnemo may), and each such layout's folder once it is empty."""
    for older in place.iterdir():
        name = older.name
        if not (name[:1] == "v" and name[1:].isdigit() and name != layout and older.is_dir()):
            continue
        for folder in older.iterdir():
            lock = filelock.FileLock(folder / WRITER_LOCK, timeout=0)
            try:
                with lock:
                    shutil.rmtree(folder, ignore_errors=True)
            except (filelock.Timeout, OSError):
                continue  # held: its process keeps it
        with contextlib.suppress(OSError):
            older.rmdir()
