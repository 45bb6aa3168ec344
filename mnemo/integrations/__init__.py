"""mnemo inside the frameworks agents are built with, each an optional extra:

- `openai_agents`: `MnemoSession`, the OpenAI Agents SDK's `Session` over a mnemo thread
  (`pip install "pymnemo[openai-agents]"`)."""
