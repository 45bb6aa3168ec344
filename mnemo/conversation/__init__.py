"""Conversation memory: threads of chat messages, their viewport, eviction, search, erasure.

- `ports`: `ThreadStore`, the backend's part (the message log with its seq counters,
  compactions, vectors, TTL and purge; goals and pins; snapshots; full-text search), which
  `mnemo.storage.<backend>.conversation` implements;
- `manager`: `ConversationManager`, Phronomy's save/load with retrieval and compression;
- `viewport`, `eviction`: Anima's token-budgeted viewport, the eviction loop, layered
  snapshots, goals and pins;
- `search`: the query's words and the ranking by recency; `service`: the locks and the glue.

Import the public names from `mnemo`.
"""
