"""`SqliteReembeds`: a repo's re-embedding (`storage.reembeds.SqlReembeds`) on SQLite, whose
staged vectors are half floats keyed by their node's rowid, as `vectors` is."""

from __future__ import annotations

from mnemo.graph.model import Vector
from mnemo.storage.reembeds import SqlReembeds
from mnemo.storage.sqlite.rows import half_blob


class SqliteReembeds(SqlReembeds):
    """The re-embedding's statements on SQLite."""

    @staticmethod
    def _vector(vector: Vector) -> object:
        return half_blob(vector)
