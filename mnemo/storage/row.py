"""A row as a database driver returns it (sqlite3, psycopg): what type each column has is
known only from the statement that read it, so the reader beside each statement narrows it."""

from __future__ import annotations

from typing import Any

# A column's value, as the driver decoded it.
Column = Any
Row = tuple[Column, ...]
