"""The PostgreSQL test server's fixtures (tests/pg.py), for tests/storage/test_transfer.py."""

from __future__ import annotations

from tests.pg import pg_clones, pg_empty_url, pg_server, pg_template, pg_url

__all__ = ["pg_clones", "pg_empty_url", "pg_server", "pg_template", "pg_url"]
