"""Conversation memory: threads of chat messages, their viewport, eviction, search, erasure.

- `log`: the append-only message log (seq counters, compactions, vectors, TTL, purge);
- `manager`: `ConversationManager`, Phronomy's save/load with retrieval and compression;
- `viewport`, `eviction`, `snapshots`, `goals`: Anima's token-budgeted viewport, the
  eviction loop, layered snapshots, goals and pins;
- `search`: FTS5 keyword search and drill-down; `service`: the locks and the glue.

Import the public names from `mnemo`.
"""
