"""mnemo: memory for LLM agents."""
