"""Where log records go while a command runs: warnings on stderr, one line each, the
PostgreSQL driver's only from ERROR up; with `--verbose`, mnemo's INFO records too."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager


class _Stderr(logging.Handler):
    """Writes to the current `sys.stderr` (a test's runner swaps it per command)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(f"{record.levelname.lower()}: {record.name}: {record.getMessage()}\n")
        except Exception:
            self.handleError(record)


@contextmanager
def command_logging(*, verbose: bool = False) -> Iterator[None]:
    """Routes log records as the module doc says while the block runs, then restores them."""
    root = logging.getLogger()
    handler = _Stderr(logging.INFO if verbose else logging.WARNING)
    drivers = [logging.getLogger(name) for name in ("psycopg", "psycopg.pool")]
    saved = {logger: logger.level for logger in (root, *drivers)}
    root.addHandler(handler)
    if verbose:
        root.setLevel(min(root.level, logging.INFO))
    for driver in drivers:
        driver.setLevel(logging.WARNING if verbose else logging.ERROR)
    try:
        yield
    finally:
        root.removeHandler(handler)
        for logger, level in saved.items():
            logger.setLevel(level)
