"""The MCP server (`mnemo mcp`): `server` holds the tools, `transport` serves them; this package
imports nothing, so naming it does not load the `mcp` SDK."""
