"""An MCP server with one tool, run over stdio by the MCP tests (``python tests/mcp_calculator.py``): the ``mcp``
package's own server, as an agent's tools would come from one."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("calculator")


@server.tool()
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


if __name__ == "__main__":
    server.run("stdio")
