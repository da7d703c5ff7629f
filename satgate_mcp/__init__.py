"""satgate-mcp: an MCP gateway whose sessions survive restarts and cross machines."""

__version__ = "0.1.0"
SERVER_NAME = "satgate-mcp"
