"""The PostgreSQL backend (pgvector, full-text search); needs `pymnemo[postgres]`, and
`import mnemo` never imports it."""
