"""mnemo inside the frameworks agents are built with, each an optional extra: `openai_agents`
(`MnemoSession`, `pip install "pymnemo[openai-agents]"`)."""
