"""`mnemo ui`: a small local web app to look inside a memory (the `ui` extra)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import uvicorn

from mnemo.memory import Memory
from mnemo.ports import LLM, Embedder
from mnemo.ui.app import create_app
from mnemo.ui.guard import Access, Redaction, exposure
from mnemo.ui.source import MemorySource


@asynccontextmanager
async def open_view(db: Path | str, *, allow_writes: bool = False, llm: LLM | None = None,
                    embedder: Embedder | None = None) -> AsyncIterator[MemorySource]:
    """A `MemorySource` over the memory at `db`, opened for inspection while the block runs
    (without models, each repo's recorded ones)."""
    async with Memory(db, llm=llm, embedder=embedder, inspect=True) as memory:
        yield MemorySource(memory, writes=allow_writes)


async def serve(view: MemorySource, access: Access, *, host: str = "127.0.0.1", port: int = 8765,
                allow_writes: bool = False) -> None:
    """Serves the web app over `view` on `host`:`port` until interrupted, answering as `access`
    allows (`Access.bound`: make it before opening the view, so a bad host or token stops the
    command first)."""
    app = create_app(view, allow_writes=allow_writes, access=access)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info"))
    # After uvicorn.Config, which configures these loggers.
    access_log = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, Redaction) for f in access_log.filters):
        access_log.addFilter(Redaction())
    for line in exposure(host, access):
        logging.getLogger("uvicorn.error").warning(line)
    await server.serve()
