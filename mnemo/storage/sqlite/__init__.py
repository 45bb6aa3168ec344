"""The SQLite backend: one file (or `:memory:`) holds every store, on one connection."""
