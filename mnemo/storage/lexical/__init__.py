"""Recall's lexical channel: a tantivy index of the graph's node texts, kept from the store's
log (`index`), with the changes not yet committed to it searched beside it (`fresh`)."""

from mnemo.storage.lexical.index import LOG_KEEP, LexicalIndex, LexicalSource, Row

__all__ = ["LOG_KEEP", "LexicalIndex", "LexicalSource", "Row"]
