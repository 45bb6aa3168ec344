"""The MCP server (`mnemo mcp`): mnemo's memory as tools for any MCP-capable agent.

Import `mnemo.mcp.server` to use it; this package imports nothing, so that naming it costs
nothing when the optional-weight `mcp` SDK is not wanted.
"""
