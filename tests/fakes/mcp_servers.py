"""A real MCP server written with the SDK's MCPServer (v1's FastMCP), for the agent's MCP tests.

Run as `python tests/fakes/mcp_servers.py stdio` (speaks MCP on stdin/stdout) or
`python tests/fakes/mcp_servers.py http --fd N` (streamable HTTP at `/mcp` on the socket
inherited as file descriptor N, bound to 127.0.0.1 by the test, so it knows the port
before the server starts). Its tools cover what the gateway must handle:

- `run_query` (readOnlyHint, with a mutating verb in its name) and `show_once`
  (destructiveHint, with a read verb in its name) always answer the same, so repeated
  calls are a stuck loop;
- `write_note` has no annotations, so only its name classifies it; `read_env` reads an
  environment variable of the server process;
- `fail` answers `isError`; `crash` kills the server in the middle of the call;
- `huge` answers `size` characters of text; `picture` answers an image and a text block;
- `dotted.name` needs its name sanitised for OpenAI; a 70-character name cannot fit;
  `absurd` has an input schema nested 80 levels deep.
"""

from __future__ import annotations

import argparse
import base64
import os
import socket
from typing import Any

import anyio
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.types import ImageContent, TextContent, ToolAnnotations

ABSURD_DEPTH = 80
LONG_NAME = "n" * 70
PNG_BYTES = b"\x89PNG\r\n\x1a\n" + b"\x00" * 24


def _nested(depth: int) -> dict[str, Any]:
    """A JSON schema of objects inside objects, `depth` levels deep."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"inner": schema}}
    return schema


def _absurd() -> str:
    """A tool whose published schema is absurdly deep."""
    return "unreachable"


def build_server() -> MCPServer:
    """The test server with every tool of the module docstring."""
    absurd = Tool.from_function(_absurd, name="absurd")
    absurd = absurd.model_copy(update={"parameters": _nested(ABSURD_DEPTH)})
    server = MCPServer("loopwarden-test", tools=[absurd], log_level="WARNING")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def run_query(key: str) -> str:
        """Look a key up (read-only, despite the mutating verb; the answer never changes)."""
        return f"value of {key}"

    @server.tool(annotations=ToolAnnotations(destructive_hint=True))
    def show_once(token: str) -> str:
        """Show a secret once and burn it (destructive, despite the read verb)."""
        return f"burned {token}"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def read_env(name: str) -> str:
        """The value of an environment variable of the server process ("" when unset)."""
        return os.environ.get(name, "")

    @server.tool()
    def write_note(text: str) -> str:
        """Write a note (no annotations: the name decides)."""
        return "noted"

    @server.tool()
    def fail(reason: str) -> str:
        """Always fail, as an isError result."""
        raise ToolError(f"cannot do that: {reason}")

    @server.tool()
    def crash() -> str:
        """Kill the server process in the middle of the call."""
        os._exit(3)

    @server.tool()
    def huge(size: int) -> str:
        """Answer `size` characters of text."""
        return "x" * size

    @server.tool()
    def picture() -> list[ImageContent | TextContent]:
        """Answer an image and a line of text."""
        data = base64.b64encode(PNG_BYTES).decode("ascii")
        return [
            ImageContent(type="image", data=data, mime_type="image/png"),
            TextContent(type="text", text="a tiny picture"),
        ]

    @server.tool(name="dotted.name")
    def dotted() -> str:
        """A name with a dot, which OpenAI function names cannot have."""
        return "dotted ok"

    @server.tool(name=LONG_NAME)
    def long_name() -> str:
        """A name too long to fit OpenAI's 64 characters with any server prefix."""
        return "long ok"

    return server


async def _serve_http(server: MCPServer, fd: int) -> None:
    """Serve streamable HTTP on the inherited listening socket."""
    sock = socket.socket(fileno=fd)
    sock.listen()
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve(sockets=[sock])


def main() -> None:
    """Run the server on the transport named on the command line."""
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--fd", type=int, default=-1)
    args = parser.parse_args()
    server = build_server()
    if args.transport == "stdio":
        server.run("stdio")
    else:
        anyio.run(_serve_http, server, args.fd)


if __name__ == "__main__":
    main()
