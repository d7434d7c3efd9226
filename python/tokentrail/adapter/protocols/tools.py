"""A request's declared tools and its tool choice: each tool checked (`tool_schema`), the list
read with typed tools the harness does not run withheld (`translate_tools`, `DeclaredTools`),
and a forced choice held to the tools offered (`tool_choice`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokentrail.errors import RequestError
from tokentrail.kinds import ToolChoice
from tokentrail.messages import ToolSchema, function_tool

__all__ = ["DeclaredTools", "tool_choice", "tool_schema", "translate_tools"]


def tool_schema(pos: int, name: object, description: object, schema: object) -> ToolSchema:
    """One declared tool, checked: a string name and an object schema."""
    if not isinstance(name, str):
        raise RequestError(f"tools[{pos}] must have a string name")
    if schema is None:
        schema = {"type": "object", "properties": {}}
    if not isinstance(schema, dict):
        raise RequestError(f"tools[{pos}]: the parameter schema must be an object")
    return function_tool(name, description, schema)


@dataclass
class DeclaredTools:
    """A request's tools: the functions offered to the model, and the typed tools withheld.

    A typed tool the harness does not execute itself (Anthropic's server tools such as
    `web_search_20250305` or `code_execution_*`, OpenAI's non-function tools) would render as
    a parameterless function whose calls nobody runs; it is withheld from the prompt and named
    in `withheld` (its `type`), which the turn's sample metadata lists.
    """

    tools: list[ToolSchema] | None
    withheld: list[str] = field(default_factory=list)


def translate_tools(
    tools: object, read: Callable[[int, Any], ToolSchema | str], *, unique: bool = False
) -> DeclaredTools:
    """A request's tool list through the protocol's `read(pos, tool)`, which returns a tool
    or the type of a tool to withhold; tools None when absent. With `unique`, two functions of
    one name are a 400 (the Messages API refuses them: a call could not say which it meant)."""
    if tools is None:
        return DeclaredTools(None)
    if not isinstance(tools, list):
        raise RequestError("tools must be a list")
    out = DeclaredTools([])
    seen: dict[str, int] = {}
    for pos, tool in enumerate(tools):
        read_tool = read(pos, tool)
        if isinstance(read_tool, str):
            out.withheld.append(read_tool)
            continue
        name = read_tool["function"]["name"]
        if unique and seen.setdefault(name, pos) != pos:
            raise RequestError(
                f"tools[{pos}].name: {name!r} is the name of tools[{seen[name]}] too; tool "
                "names must be unique"
            )
        assert out.tools is not None
        out.tools.append(read_tool)
    return out


def tool_choice(
    mode: ToolChoice, name: object, declared: DeclaredTools, where: str = "tool_choice"
) -> tuple[ToolChoice, str | None]:
    """A request's tool choice, checked against its tools: a forced choice needs tools, and a
    named tool must be one of the offered functions."""
    if mode is not ToolChoice.REQUIRED:
        return mode, None
    names = [t["function"]["name"] for t in declared.tools or ()]
    if not names:
        raise RequestError(f"{where} forces a tool call but the request offers no tools")
    if name is None:
        return mode, None
    if not isinstance(name, str):
        raise RequestError(f"{where}: the tool name must be a string")
    if name not in names:
        withheld = " (a server tool, withheld)" if name in declared.withheld else ""
        raise RequestError(f"{where} names {name!r}, which is not a declared tool{withheld}")
    return mode, name
