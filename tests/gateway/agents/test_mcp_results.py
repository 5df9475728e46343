"""The pure parts of MCP tools: names, classification, schemas and results (issue 11)."""

from __future__ import annotations

from mcp.types import (
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
    Tool,
    ToolAnnotations,
)

from gateway.agents.mcp import (
    MAX_RESULT_BYTES,
    cap_text,
    is_idempotent,
    result_text,
    schema_problem,
    wire_name,
)
from tests.fakes import mcp_servers


def test_issue11_names_fit_openai_function_names() -> None:
    assert wire_name("fs", "files.read") == "fs__files_read"
    assert wire_name("fs", "lire-fichier") == "fs__lire-fichier"
    assert wire_name("fs", "読む") is None
    assert wire_name("fs", "x" * 60) == "fs__" + "x" * 60  # 64 characters: fits
    assert wire_name("fs", "x" * 61) is None
    assert wire_name("fs", "..") is None


def test_issue11_annotations_classify_first_then_the_name() -> None:
    def tool(name: str, **hints: bool) -> Tool:
        annotations = ToolAnnotations(**hints) if hints else None  # type: ignore[arg-type]
        return Tool(name=name, input_schema={"type": "object"}, annotations=annotations)

    assert is_idempotent(tool("delete_row", read_only_hint=True))
    assert is_idempotent(tool("set_flag", idempotent_hint=True))
    assert not is_idempotent(tool("get_secret", destructive_hint=True))
    assert not is_idempotent(tool("write_file"))
    assert is_idempotent(tool("list_files"))
    assert is_idempotent(tool("list_files", destructive_hint=False))


def test_issue11_absurd_schemas_are_refused() -> None:
    assert schema_problem({"type": "object", "properties": {}}) is None
    assert schema_problem({"type": "array"}) == "its input schema is not a JSON object schema"
    assert schema_problem(["type", "object"]) == "its input schema is not a JSON object schema"
    assert schema_problem(mcp_servers._nested(40)) == (
        "its input schema nests deeper than 32 levels"
    )
    huge = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(5000)}}
    assert schema_problem(huge) == "its input schema is larger than 64 KiB"
    assert schema_problem({"type": "object", "default": float("inf")}) == (
        "its input schema is not JSON"
    )


def test_issue11_results_are_text_capped_on_a_character_boundary() -> None:
    text = "é" * 40_000  # two bytes each: 80,000 bytes
    capped = cap_text(text)
    assert capped.startswith("é" * 32_768)
    assert capped.endswith(f"\n[{80_000 - MAX_RESULT_BYTES} more bytes cut by loopwarden]")
    resource = EmbeddedResource(
        type="resource", resource=TextResourceContents(uri="file:///a.txt", text="hello")
    )
    result = CallToolResult(
        content=[
            TextContent(type="text", text="one"),
            ImageContent(type="image", data="AAAA", mime_type="image/gif"),
            resource,
        ]
    )
    assert result_text(result) == (
        "one\n[image image/gif, 3 bytes not shown]\n[resource file:///a.txt]\nhello"
    )
    structured = CallToolResult(content=[], structured_content={"n": 1})
    assert result_text(structured) == '{"n": 1}'
