"""Conversation memory: threads of chat messages, their viewport, eviction, search, erasure.

`ports.ThreadStore` is the backend's part; `manager` saves and loads with retrieval and
compression; `viewport` and `eviction` keep a thread within a token budget. Import the public
names from `mnemo`."""
