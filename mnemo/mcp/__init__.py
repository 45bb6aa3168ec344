"""The MCP server (`mnemo mcp`): mnemo's memory as tools for any MCP-capable agent.

`mnemo.mcp.server` holds the tools, `mnemo.mcp.transport` serves them; this package imports
nothing, so that naming it costs nothing when the optional-weight `mcp` SDK is not wanted."""
