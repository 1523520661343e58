"""The RAG example's search as an MCP server (the ``mcp`` package's own server, stdio transport), the way an
agent's tools often come from one: ``python -m examples.rag_agent.search_server`` (the agent's ``rag_agent_mcp``
entry point starts it per rollout with the Agents SDK's ``MCPServerStdio``)."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

from examples.rag_agent.knowledge import search_documents

server = MCPServer("knowledge")


@server.tool()
def search(query: str) -> str:
    """Search the knowledge base. Returns the (at most two) documents that best match the query."""
    return search_documents(query)


if __name__ == "__main__":
    server.run("stdio")
