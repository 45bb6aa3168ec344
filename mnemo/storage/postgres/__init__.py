"""The PostgreSQL backend: pgvector for vectors, full-text search for words.

Needs the extra `pymnemo[postgres]` (psycopg 3 and its pool); `import mnemo` never imports this
package, so an install without the extra keeps working on SQLite.
"""
