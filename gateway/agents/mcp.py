"""MCP tools for `openai` agents: each configured server kept connected, its tools offered.

`McpToolbox` holds one `McpServerLink` per entry of the agent's `mcp_servers`. A link is a
background task that connects through the official `mcp` SDK (a stdio `command` started
as a child process, or a streamable-HTTP `url`), lists the server's tools, and stays
connected; while it is down its tools are missing and the agent runs without them. A
server that cannot start, or drops, is logged and connected again with doubling waits
(`gateway.app.backoff.Backoff`: 1 s up to 60 s). The gateway's `/readyz` does not look at
MCP servers: it is about bots being connected.

Each tool is offered as `<server>__<tool>` (`McpTool.wire_name`) with its input schema, and
is classified for the turn's LoopGuard by its MCP annotations first (`readOnlyHint` or
`idempotentHint` true: idempotent; `destructiveHint` true: mutating), then by its own
name without the server prefix (`guards.loop_guard.classify_tool_name`). A call's result
is the text the model reads; a result with `isError` raises `McpToolError`, so the guard
records a failed call.

Decisions where DESIGN.md is silent:
- OpenAI function names must match `^[a-zA-Z0-9_-]{1,64}$`: a character outside that set
  in a tool's name becomes `_` (`files.read` is offered as `fs__files_read`); a tool whose
  name then has no letter or digit, whose full name is longer than 64 characters, or
  that collides with another tool of the same server after that replacement, is not
  offered (a warning names the agent, server and tool). Server names are validated by
  the config so that `<server>__` is an unambiguous prefix.
- A tool is not offered when its input schema is not a JSON object schema
  (`type: object`), is larger than 64 KiB as JSON, or nests deeper than 32 levels; a
  description is cut to 1,024 characters; a server's first 128 tools are offered
  (OpenAI's limit per request), the rest skipped with one warning.
- A result is the text of its content blocks, one per line; an image, audio or binary
  resource is summarised as `[image image/png, 32 bytes not shown]`; structured content
  is sent as JSON only when there is no text. The model gets at most 64 KiB of it, cut
  on a character boundary with a note of how much was cut.
- A server that answers a call with something the SDK cannot read (a result that is not
  a `CallToolResult`, a protocol error) fails that call only; a connection that closes
  during a call fails the call with `McpUnavailable`, and the link reconnects. Every 30 s
  a connected link lists the tools again: a health check that also picks up new tools.
- A stdio server's stderr is the gateway's stderr; its child process gets the SDK's
  safe default environment plus `env`. Secret values (`env`, `headers`) are `SecretStr`
  in the config and never logged; log lines name the agent and server, never the URL.
- The links start on the agent's first turn, which waits (at most `connect_timeout`)
  until each server has connected or failed once, so the first message sees the tools.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import anyio
import httpx2
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import (
    CONNECTION_CLOSED,
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    Tool,
)
from pydantic import ValidationError

from gateway.app.backoff import Backoff, Sleep
from gateway.app.errors import LoopwardenError
from gateway.app.jsonbody import JsonBodyError, parse_json
from gateway.config import McpServerConfig
from guards.loop_guard import classify_tool_name

log = logging.getLogger("loopwarden.agents.mcp")

SEPARATOR = "__"
MAX_NAME = 64
MAX_RESULT_BYTES = 64 * 1024
MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 32
MAX_DESCRIPTION = 1024
MAX_TOOLS_PER_SERVER = 128
MAX_LIST_PAGES = 16
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)  # the SDK's defaults: a response may stream


class McpToolError(LoopwardenError):
    """An MCP tool answered `isError`: a failed call, with the server's text as the reason."""


class McpUnavailable(LoopwardenError):
    """The tool's MCP server is not connected, or its connection closed during the call."""


def wire_name(server: str, tool: str) -> str | None:
    """`<server>__<tool>` as an OpenAI function name, or None when the tool's name cannot fit."""
    safe = _UNSAFE.sub("_", tool)
    name = f"{server}{SEPARATOR}{safe}"
    if len(name) > MAX_NAME or not re.search(r"[A-Za-z0-9]", safe):
        return None
    return name


def is_idempotent(tool: Tool) -> bool:
    """The tool's LoopGuard bucket: its annotations first, then its own name."""
    hints = tool.annotations
    if hints is not None:
        if hints.read_only_hint or hints.idempotent_hint:
            return True
        if hints.destructive_hint:
            return False
    return classify_tool_name(tool.name) == "idempotent"


def schema_problem(schema: object) -> str | None:
    """Why an input schema cannot be offered to the model (None: it can)."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return "its input schema is not a JSON object schema"
    try:
        text = json.dumps(schema, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return "its input schema is not JSON"
    if len(text.encode("utf-8", "replace")) > MAX_SCHEMA_BYTES:
        return f"its input schema is larger than {MAX_SCHEMA_BYTES // 1024} KiB"
    try:
        parse_json(text, max_depth=MAX_SCHEMA_DEPTH)
    except JsonBodyError:
        return f"its input schema nests deeper than {MAX_SCHEMA_DEPTH} levels"
    return None


def cap_text(text: str, limit: int = MAX_RESULT_BYTES) -> str:
    """At most `limit` bytes of UTF-8 text, cut on a character boundary with a note."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    kept = data[:limit].decode("utf-8", "ignore")
    return f"{kept}\n[{len(data) - limit} more bytes cut by loopwarden]"


def _not_shown(kind: str, mime: str | None, base64_data: str) -> str:
    """A summary of binary content the model cannot read."""
    size = len(base64_data) * 3 // 4 - base64_data[-2:].count("=")
    return f"[{kind} {mime or 'of unknown type'}, {size} bytes not shown]"


def result_text(result: CallToolResult) -> str:
    """What the model reads of a tool result: its text, binary content summarised, capped."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        elif isinstance(block, ImageContent):
            parts.append(_not_shown("image", block.mime_type, block.data))
        elif isinstance(block, AudioContent):
            parts.append(_not_shown("audio", block.mime_type, block.data))
        elif isinstance(block, ResourceLink):
            parts.append(f"[resource link {block.uri}]")
        elif isinstance(block, EmbeddedResource):
            contents = block.resource
            if isinstance(contents, BlobResourceContents):
                parts.append(_not_shown("resource", contents.mime_type, contents.blob))
            else:
                parts.append(f"[resource {contents.uri}]\n{contents.text}")
    if not parts and result.structured_content is not None:
        try:
            parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
        except (ValueError, RecursionError):
            parts.append("[structured content not shown: it is not JSON]")
    return cap_text("\n".join(parts))


def _describe(exc: BaseException) -> str:
    """`Type: message` of the first real failure inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc)
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


@dataclass(frozen=True, slots=True)
class McpTool:
    """One tool of an MCP server as offered to the model."""

    wire_name: str
    name: str
    description: str
    parameters: Mapping[str, object]
    idempotent: bool
    link: McpServerLink = field(repr=False, compare=False)

    async def call(self, arguments: dict[str, object]) -> str:
        """Call the tool on its server; the text the model reads (isError raises McpToolError)."""
        return await self.link.call(self.name, arguments)


class McpServerLink:
    """One MCP server kept connected by a background task; its tools while it is connected."""

    def __init__(
        self,
        agent: str,
        config: McpServerConfig,
        *,
        connect_timeout: float,
        health_seconds: float,
        backoff: tuple[float, float],
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.agent = agent
        self.name = config.name
        self._config = config
        self._connect_timeout = connect_timeout
        self._health_seconds = health_seconds
        self._backoff = Backoff(*backoff, sleep=sleep)
        self._client: Client | None = None
        self._tools: dict[str, McpTool] = {}
        self._lost = asyncio.Event()
        self.tried = asyncio.Event()
        """Set once the first attempt to connect has ended, however it ended."""
        self.up = asyncio.Event()
        """Set while the server is connected and its tools are offered."""

    @property
    def tools(self) -> Mapping[str, McpTool]:
        """The server's offered tools by wire name (empty while it is not connected)."""
        return self._tools

    async def run(self) -> None:
        """Connect, serve calls until the connection fails, wait, connect again; forever."""
        attempt = 0
        while True:
            attempt += 1
            try:
                await self._connection(attempt)
            except Exception as exc:  # a failing server must never take the agent down
                log.warning(
                    "agent %s: MCP server %s unavailable (attempt %d, next in %.1f s): %s",
                    self.agent,
                    self.name,
                    attempt,
                    self._backoff.delay,
                    _describe(exc),
                )
            finally:
                self._down()
                self.tried.set()
            await self._backoff.wait()

    async def call(self, tool: str, arguments: dict[str, object]) -> str:
        """Call `tool` on this server; see `McpTool.call`."""
        client = self._client
        if client is None:
            raise McpUnavailable(f"MCP server {self.name} is not connected; try again later")
        try:
            result = await client.call_tool(tool, arguments)
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                raise McpToolError(cap_text(f"MCP server {self.name}: {exc.message}")) from None
            self._lose(client, "its connection closed during a call")
            raise McpUnavailable(
                f"MCP server {self.name} went away during the call; its tools are "
                "unavailable until it is back"
            ) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._lose(client, "its connection is closed")
            raise McpUnavailable(f"MCP server {self.name} is not connected") from None
        except ValidationError:
            log.warning(
                "agent %s: MCP server %s answered %s with an unreadable result",
                self.agent,
                self.name,
                tool,
            )
            raise McpToolError(f"MCP server {self.name} answered an unreadable result") from None
        text = result_text(result)
        if result.is_error:
            raise McpToolError(text or f"{tool} failed")
        return text

    def _lose(self, client: Client, why: str) -> None:
        """The connection `client` is gone: its tools go now, the background task reconnects."""
        if self._client is not client:  # already noticed, or a newer connection is up
            return
        log.warning("agent %s: MCP server %s dropped: %s", self.agent, self.name, why)
        self._down()
        self._lost.set()

    def _down(self) -> None:
        """No connection: no tools to offer."""
        self._client = None
        self._tools = {}
        self.up.clear()

    async def _connection(self, attempt: int) -> None:
        """One connection: connect and list, then health-check until it is lost (raises)."""
        async with contextlib.AsyncExitStack() as stack:
            async with asyncio.timeout(self._connect_timeout):
                client = await stack.enter_async_context(self._client_for(stack))
                tools = await self._list(client)
            self._lost.clear()
            self._client, self._tools = client, tools
            self.up.set()
            self._backoff.reset()
            log.info(
                "agent %s: MCP server %s connected (attempt %d), %d tools",
                self.agent,
                self.name,
                attempt,
                len(tools),
            )
            self.tried.set()
            while not await self._lost_within(self._health_seconds):
                async with asyncio.timeout(self._connect_timeout):
                    self._tools = await self._list(client)
            raise McpUnavailable("the connection was lost")

    async def _lost_within(self, seconds: float) -> bool:
        """Whether the connection is found lost within `seconds` (False: time for a check)."""
        try:
            async with asyncio.timeout(seconds):
                await self._lost.wait()
        except TimeoutError:
            return False
        return True

    def _client_for(self, stack: contextlib.AsyncExitStack) -> Client:
        """The SDK client for this server's transport (HTTP clients close with `stack`)."""
        config = self._config
        if config.command is not None:
            command, *args = config.command
            env = {key: value.get_secret_value() for key, value in config.env.items()}
            return Client(StdioServerParameters(command=command, args=args, env=env), cache=None)
        headers = {key: value.get_secret_value() for key, value in config.headers.items()}
        http = httpx2.AsyncClient(headers=headers, timeout=_HTTP_TIMEOUT)
        stack.push_async_callback(http.aclose)
        # No command, so the config has a url: it requires exactly one of the two.
        return Client(streamable_http_client(str(config.url), http_client=http), cache=None)

    async def _list(self, client: Client) -> dict[str, McpTool]:
        """The server's tools that can be offered, by wire name (the rest logged and skipped)."""
        listed: list[Tool] = []
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None or len(listed) > MAX_TOOLS_PER_SERVER:
                break
        if len(listed) > MAX_TOOLS_PER_SERVER:
            log.warning(
                "agent %s: MCP server %s lists more than %d tools; only the first %d are offered",
                self.agent,
                self.name,
                MAX_TOOLS_PER_SERVER,
                MAX_TOOLS_PER_SERVER,
            )
        tools: dict[str, McpTool] = {}
        for tool in listed[:MAX_TOOLS_PER_SERVER]:
            offered = self._offer(tool, tools)
            if offered is not None:
                tools[offered.wire_name] = offered
        return tools

    def _offer(self, tool: Tool, taken: Mapping[str, McpTool]) -> McpTool | None:
        """The tool as offered to the model, or None (logged) when it cannot be."""
        name = wire_name(self.name, tool.name)
        if name is None:
            problem: str | None = (
                f"its name cannot be an OpenAI function name of at most {MAX_NAME} characters"
            )
        elif name in taken:
            problem = f"its name is {name} once sanitised, like {taken[name].name!r}"
        else:
            problem = schema_problem(tool.input_schema)
        if problem is not None or name is None:
            log.warning(
                "agent %s: MCP server %s: tool %r is not offered: %s",
                self.agent,
                self.name,
                tool.name[:100],
                problem,
            )
            return None
        return McpTool(
            wire_name=name,
            name=tool.name,
            description=(tool.description or tool.name)[:MAX_DESCRIPTION],
            parameters=tool.input_schema,
            idempotent=is_idempotent(tool),
            link=self,
        )


class McpToolbox:
    """The MCP servers of one agent: started on its first turn, their tools merged."""

    def __init__(
        self,
        agent: str,
        servers: Sequence[McpServerConfig],
        *,
        connect_timeout: float = 30.0,
        health_seconds: float = 30.0,
        backoff: tuple[float, float] = (1.0, 60.0),
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.agent = agent
        self.links = tuple(
            McpServerLink(
                agent,
                server,
                connect_timeout=connect_timeout,
                health_seconds=health_seconds,
                backoff=backoff,
                sleep=sleep,
            )
            for server in servers
        )
        self._connect_timeout = connect_timeout
        self._tasks: list[asyncio.Task[None]] = []

    def tools(self) -> dict[str, McpTool]:
        """Every connected server's tools, by wire name (server names keep them apart)."""
        return {name: tool for link in self.links for name, tool in link.tools.items()}

    async def start(self) -> None:
        """Start the links (once), then wait until each has connected or failed once."""
        if not self._tasks:
            for link in self.links:
                link.tried.clear()  # set by an earlier run's end: wait for this run's attempt
            self._tasks = [asyncio.create_task(link.run()) for link in self.links]
        try:
            async with asyncio.timeout(self._connect_timeout):
                for link in self.links:
                    await link.tried.wait()
        except TimeoutError:
            log.warning("agent %s: some MCP servers are still connecting", self.agent)

    async def aclose(self) -> None:
        """Stop the links and close their connections (stdio servers are stopped)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
