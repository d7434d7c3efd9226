"""How a simulated harness puts its Anthropic-shaped history on another wire: OpenAI Chat
Completions or OpenAI Responses (the Codex CLI's API), and reads a reply back into blocks.

A Responses-speaking harness keeps what the server sent: reasoning comes back as the
`encrypted_content` it was given, and each call under its `call_id`, as Codex does.
"""

from __future__ import annotations

import json
from typing import Any


def to_openai(system: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Anthropic-shaped history to Chat Completions messages."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for m in messages:
        content = m["content"]
        if m["role"] == "system":
            out.append({"role": "system", "content": content})
        elif m["role"] == "user":
            if isinstance(content, str):
                out.append({"role": "user", "content": content})
                continue
            texts = []
            for block in content:
                if block["type"] == "tool_result":
                    out.append(
                        {
                            "role": "tool",
                            "tool_call_id": block["tool_use_id"],
                            "content": block["content"],
                        }
                    )
                else:
                    texts.append(block["text"])
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
        else:
            msg: dict[str, Any] = {
                "role": "assistant",
                "content": "".join(b["text"] for b in content if b["type"] == "text") or None,
            }
            thinking = "\n".join(b["thinking"] for b in content if b["type"] == "thinking")
            if thinking:
                msg["reasoning_content"] = thinking
            calls = [
                {
                    "id": b["id"],
                    "type": "function",
                    "function": {"name": b["name"], "arguments": json.dumps(b["input"])},
                }
                for b in content
                if b["type"] == "tool_use"
            ]
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def from_openai(payload: dict[str, Any]) -> list[dict[str, Any]]:
    message = payload["choices"][0]["message"]
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        blocks.append(
            {"type": "thinking", "thinking": message["reasoning_content"], "signature": ""}
        )
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": call["function"]["name"],
                "input": json.loads(call["function"]["arguments"]),
            }
        )
    return blocks


def wire_tools(tools: list[dict[str, Any]], protocol: str) -> list[dict[str, Any]]:
    """Anthropic-shaped tool declarations on the OpenAI wires. A tool marked
    `"type": "custom"` is a free-form one (Codex's `apply_patch`) on the Responses wire."""
    out = []
    for t in tools:
        if protocol == "responses" and t.get("type") == "custom":
            out.append({"type": "custom", "name": t["name"], "description": t["description"]})
            continue
        params = t.get("input_schema", {"type": "object", "properties": {}})
        if protocol == "responses":
            out.append(
                {
                    "type": "function",
                    "name": t["name"],
                    "description": t.get("description", ""),
                    "strict": False,
                    "parameters": params,
                }
            )
        else:
            function = {
                "name": t["name"],
                "description": t.get("description", ""),
                "parameters": params,
            }
            out.append({"type": "function", "function": function})
    return out


def to_responses(system: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Anthropic-shaped history to Responses input items."""
    items: list[dict[str, Any]] = [_message("developer", "input_text", system)]
    custom: set[str] = set()
    for m in messages:
        content = m["content"]
        if m["role"] in ("system", "user") and isinstance(content, str):
            role = "developer" if m["role"] == "system" else "user"
            items.append(_message(role, "input_text", content))
            continue
        if m["role"] == "user":
            texts = []
            for block in content:
                if block["type"] == "tool_result":
                    kind = (
                        "custom_tool_call_output"
                        if block["tool_use_id"] in custom
                        else ("function_call_output")
                    )
                    items.append(
                        {"type": kind, "call_id": block["tool_use_id"], "output": block["content"]}
                    )
                else:
                    texts.append(block["text"])
            if texts:
                items.append(_message("user", "input_text", "\n".join(texts)))
            continue
        for block in content:
            if block["type"] == "thinking":
                items.append(
                    {
                        "type": "reasoning",
                        "summary": [],
                        "content": [{"type": "reasoning_text", "text": block["thinking"]}],
                        "encrypted_content": block.get("signature") or block["thinking"],
                    }
                )
            elif block["type"] == "text":
                items.append(_message("assistant", "output_text", block["text"]))
            elif block.get("custom"):
                custom.add(block["id"])
                items.append(
                    {
                        "type": "custom_tool_call",
                        "call_id": block["id"],
                        "name": block["name"],
                        "input": block["input"]["input"],
                    }
                )
            else:
                items.append(
                    {
                        "type": "function_call",
                        "call_id": block["id"],
                        "name": block["name"],
                        "arguments": block.get("arguments") or json.dumps(block["input"]),
                    }
                )
    return items


def _message(role: str, part: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


def from_responses(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """A Responses reply's output items as content blocks, keeping what the server sent."""
    blocks: list[dict[str, Any]] = []
    for item in payload["output"]:
        kind = item["type"]
        if kind == "reasoning":
            text = "".join(p["text"] for p in item.get("content") or ())
            blocks.append(
                {"type": "thinking", "thinking": text, "signature": item.get("encrypted_content")}
            )
        elif kind == "message":
            text = "".join(p["text"] for p in item["content"] if p["type"] == "output_text")
            blocks.append({"type": "text", "text": text})
        elif kind == "function_call":
            blocks.append(
                {
                    "type": "tool_use",
                    "id": item["call_id"],
                    "name": item["name"],
                    "input": json.loads(item["arguments"]),
                    "arguments": item["arguments"],
                }
            )
        elif kind == "custom_tool_call":
            blocks.append(
                {
                    "type": "tool_use",
                    "id": item["call_id"],
                    "name": item["name"],
                    "input": {"input": item["input"]},
                    "custom": True,
                }
            )
    return blocks
