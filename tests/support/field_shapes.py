"""Request shapes the official APIs refuse for a field's type or presence (`REFUSED`: route,
body, extra headers, what the 400 names) and shapes the SDKs and harnesses send that they take
(`SERVED`), for `tests/test_strict_fields.py` and `benches/hostile_requests.py`. Each field's
type is the one the `anthropic` and `openai` SDKs' request params give it.
"""

from __future__ import annotations

from typing import Any

USER = [{"role": "user", "content": "hi"}]
ANTHROPIC = {"model": "m", "max_tokens": 2048, "messages": USER}
CHAT = {"model": "m", "max_tokens": 64, "messages": USER}
RESPONSES = {"model": "m", "input": "hi", "max_output_tokens": 64}
TOOL = {"name": "Read", "description": "read", "input_schema": {"type": "object"}}
FUNCTION = {"type": "function", "function": {"name": "Read", "parameters": {"type": "object"}}}
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}


def without(body: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != key}


def chat_call(arguments: str) -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": {"name": "Read", "arguments": arguments}}
    return {
        **CHAT,
        "tools": [FUNCTION],
        "messages": [
            *USER,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "x = 1"},
        ],
    }


def responses_call(arguments: str) -> dict[str, Any]:
    return {
        **RESPONSES,
        "tools": [{"type": "function", "name": "Read", "parameters": {"type": "object"}}],
        "input": [
            {"type": "message", "role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c1", "name": "Read", "arguments": arguments},
            {"type": "function_call_output", "call_id": "c1", "output": "x = 1"},
        ],
    }


M, C, R = "/v1/messages", "/v1/chat/completions", "/v1/responses"
TEXT_PLAIN = {"Content-Type": "text/plain"}
TWO_KEYS = {"Authorization": "Bearer alice", "x-api-key": "bob"}

# (route, body, extra headers, what the error names)
REFUSED: list[tuple[str, dict[str, Any], dict[str, str], str]] = [
    (M, without(ANTHROPIC, "max_tokens"), {}, "max_tokens: Field required"),
    (M, {**ANTHROPIC, "max_tokens": "64"}, {}, "max_tokens: expected an integer"),
    (M, {**ANTHROPIC, "system": [IMAGE]}, {}, "system[0]"),
    (M, {**ANTHROPIC, "system": 5}, {}, "system: expected a string or an array"),
    (M, {**ANTHROPIC, "thinking": {"type": "enabled", "budget_tokens": "x"}}, {},
     "thinking.budget_tokens: expected an integer"),
    (M, {**ANTHROPIC, "thinking": {"type": "enabled"}}, {},
     "thinking.budget_tokens: Field required"),
    (M, {**ANTHROPIC, "thinking": {"type": "enabled", "budget_tokens": 512}}, {},
     "thinking.budget_tokens: must be >= 1024"),
    (M, {**ANTHROPIC, "thinking": {"type": "enabled", "budget_tokens": 4096}}, {},
     "thinking.budget_tokens: must be less than max_tokens"),
    (M, {**ANTHROPIC, "thinking": {"type": "sometimes"}}, {}, "thinking.type"),
    (M, {**ANTHROPIC, "thinking": "on"}, {}, "thinking: expected an object"),
    # A display preference of an unknown name passes (counted); one of another type does not.
    (M, {**ANTHROPIC, "thinking": {"type": "adaptive", "display": 5}}, {},
     "thinking.display: expected a string"),
    (M, {**ANTHROPIC, "tools": [TOOL, TOOL]}, {}, "tools[1].name: 'Read' is the name of tools[0]"),
    (M, {**ANTHROPIC, "tools": [{**TOOL, "name": 5}]}, {}, "tools[0].name: expected a string"),
    (M, ANTHROPIC, TEXT_PLAIN, "Content-Type"),
    (M, ANTHROPIC, TWO_KEYS, "Authorization and x-api-key name different sessions"),
    (M, {**ANTHROPIC, "metadata": "x"}, {}, "metadata: expected an object"),
    (M, {**ANTHROPIC, "metadata": {"user_id": 5}}, {}, "metadata.user_id: expected a string"),
    (M, {**ANTHROPIC, "stop_sequences": "END"}, {}, "stop_sequences: expected an array"),
    (M, {**ANTHROPIC, "stop_sequences": [1]}, {}, "stop_sequences[0]: expected a string"),
    (M, {**ANTHROPIC, "temperature": 1.5}, {}, "temperature: must be <= 1"),
    (M, {**ANTHROPIC, "top_k": "5"}, {}, "top_k: expected an integer"),
    (M, {**ANTHROPIC, "tool_choice": {"type": "tool"}}, {}, "tool_choice.name: Field required"),
    (M, {**ANTHROPIC, "tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}}, {},
     "tool_choice.disable_parallel_tool_use: expected a boolean"),
    (M, {**ANTHROPIC, "service_tier": "fastest"}, {}, "service_tier"),
    (M, {**ANTHROPIC, "stream": "yes"}, {}, "stream: expected a boolean"),
    (M, {**ANTHROPIC, "model": 5}, {}, "model: expected a string"),
    (f"{M}/count_tokens", {**ANTHROPIC, "thinking": {"type": "enabled", "budget_tokens": "x"}},
     {}, "thinking.budget_tokens"),
    (C, chat_call("{not json"), {}, "messages[1].tool_calls[0].function.arguments: not valid JSON"),
    (C, chat_call("[1, 2]"), {}, "messages[1].tool_calls[0].function.arguments: expected the JSON"),
    (C, {**CHAT, "response_format": "json"}, {}, "response_format: expected an object"),
    (C, {**CHAT, "response_format": {"type": "xml"}}, {}, "response_format.type"),
    (C, {**CHAT, "response_format": {"type": "json_schema"}}, {},
     "response_format.json_schema: Field required"),
    (C, {**CHAT, "stream_options": "usage"}, {}, "stream_options: expected an object"),
    (C, {**CHAT, "stream_options": {"include_usage": "yes"}}, {},
     "stream_options.include_usage: expected a boolean"),
    (C, {**CHAT, "frequency_penalty": 3}, {}, "frequency_penalty: must be <= 2"),
    (C, {**CHAT, "presence_penalty": "x"}, {}, "presence_penalty: expected a number"),
    (C, {**CHAT, "logit_bias": [1]}, {}, "logit_bias: expected an object"),
    (C, {**CHAT, "parallel_tool_calls": "no"}, {}, "parallel_tool_calls: expected a boolean"),
    (C, {**CHAT, "stop": ["a", "b", "c", "d", "e"]}, {}, "stop: at most 4 items"),
    (C, {**CHAT, "user": 5}, {}, "user: expected a string"),
    (C, {**CHAT, "metadata": {"k": 1}}, {}, "metadata.k: expected a string"),
    (C, {**CHAT, "temperature": 3}, {}, "temperature: must be <= 2"),
    (C, {**CHAT, "max_completion_tokens": "8"}, {}, "max_completion_tokens: expected an integer"),
    (C, {**CHAT, "seed": 1.5}, {}, "seed: expected an integer"),
    (C, CHAT, TEXT_PLAIN, "Content-Type"),
    (C, CHAT, TWO_KEYS, "Authorization and x-api-key name different sessions"),
    (R, {**RESPONSES, "reasoning": "x"}, {}, "reasoning: expected an object"),
    (R, {**RESPONSES, "include": 5}, {}, "include: expected an array"),
    (R, {**RESPONSES, "text": {"format": 5}}, {}, "text.format: expected an object"),
    (R, {**RESPONSES, "text": {"format": {"type": "json_schema"}}}, {},
     "text.format.name: Field required"),
    (R, {**RESPONSES, "reasoning": {"effort": 5}}, {}, "reasoning.effort: expected a string"),
    (R, {**RESPONSES, "truncation": "sometimes"}, {}, "truncation"),
    (R, {**RESPONSES, "instructions": 5}, {}, "instructions: expected a string or an array"),
    (R, {**RESPONSES, "max_output_tokens": "x"}, {}, "max_output_tokens: expected an integer"),
    (R, responses_call("nope"), {}, "input[1].arguments: not valid JSON"),
    (R, {**RESPONSES, "store": "no"}, {}, "store: expected a boolean"),
    (R, {**RESPONSES, "top_logprobs": 50}, {}, "top_logprobs: must be <= 20"),
    (R, RESPONSES, TEXT_PLAIN, "Content-Type"),
]  # fmt: skip

# What the SDKs and harnesses send, nulls included: all still served.
SERVED: list[tuple[str, dict[str, Any], dict[str, str]]] = [
    (M, {**ANTHROPIC, "thinking": {"type": "adaptive"}}, {}),
    (M, {**ANTHROPIC, "thinking": {"type": "adaptive", "display": "updates"}}, {}),
    (M, {**ANTHROPIC, "thinking": {"type": "enabled", "budget_tokens": 1024}}, {}),
    (M, {**ANTHROPIC, "thinking": {"type": "disabled"}, "temperature": None}, {}),
    (M, {**ANTHROPIC, "metadata": {"user_id": "u1"}, "service_tier": "auto"}, {}),
    (M, {**ANTHROPIC, "system": [{"type": "text", "text": "Be brief.",
                                  "cache_control": {"type": "ephemeral"}}]}, {}),
    (M, {**ANTHROPIC, "tools": [TOOL], "tool_choice": {"type": "auto",
                                                      "disable_parallel_tool_use": True}}, {}),
    (M, {**ANTHROPIC, "context_management": {"edits": []}, "stop_sequences": ["END"]}, {}),
    (M, ANTHROPIC, {"Content-Type": "application/json; charset=utf-8"}),
    (M, ANTHROPIC, {"Authorization": "Bearer same", "x-api-key": "same"}),
    (C, chat_call('{"path": "a.py"}'), {}),
    (C, {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "answer", "schema": {"type": "object"}, "strict": True}}}, {}),
    (C, {**CHAT, "stream": True, "stream_options": {"include_usage": True}}, {}),
    (C, {**CHAT, "metadata": {"k": "v"}, "logit_bias": {"50256": -100}, "stop": "END"}, {}),
    (C, {**CHAT, "tools": None, "tool_choice": None, "response_format": None, "seed": None,
         "reasoning_effort": "high", "parallel_tool_calls": False}, {}),
    (R, {**RESPONSES, "reasoning": {"effort": "high", "summary": "auto"},
         "include": ["reasoning.encrypted_content"], "store": False}, {}),
    (R, {**RESPONSES, "text": {"format": {"type": "text"}, "verbosity": "low"}}, {}),
    (R, responses_call('{"path": "a.py"}'), {}),
]  # fmt: skip
