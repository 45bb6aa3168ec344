"""Conversation memory: threads of chat messages, their viewport, eviction, search, erasure."""
