"""The PostgreSQL test server's fixtures (tests/pg.py) come from the root conftest."""
