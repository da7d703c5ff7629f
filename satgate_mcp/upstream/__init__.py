"""Connections to upstream MCP servers, shared by every client session."""
