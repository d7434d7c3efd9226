"""Chat templates render as transformers renders them, and templates/qwen3.jinja gives the exact
ChatML text a Qwen3 model expects."""

from __future__ import annotations

import json
from typing import Any

import pytest

from support import fixtures
from tokentrail.text.chat_template import TemplateError, render
from tokentrail.text.tokenizer import LoadedTokenizer, load_tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather <now> & 'here'",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

TOOLS_HEADER = (
    "# Tools\n\nYou can call the functions described below to help with the request.\n\n"
    "Their signatures are listed inside <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nTo call a function, answer with a JSON object holding its name and arguments "
    "inside <tool_call></tool_call> XML tags, one block per call:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> LoadedTokenizer:
    return load_tokenizer(cache_dir=tmp_path_factory.getbasetemp() / "tokentrail-cache")


@pytest.fixture(scope="module")
def template(qwen3: LoadedTokenizer) -> str:
    return qwen3.chat_template


def test_plain_conversation(template: str) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    assert render(template, messages) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert render(template, messages[:3], add_generation_prompt=False).endswith(
        "<|im_start|>assistant\nHello.<|im_end|>\n"
    )


def test_tools_calls_results_and_a_late_system_message(template: str) -> None:
    messages = [
        {"role": "user", "content": "Weather in Zürich and Bern?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Two cities, two calls.",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Zürich"}},
                },
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Bern"}'},
                },
            ],
        },
        {"role": "tool", "content": "12°C"},
        {"role": "tool", "content": "10°C"},
        {"role": "system", "content": "Answer in one line."},
        {"role": "assistant", "content": "Zürich 12°C, Bern 10°C.", "reasoning_content": "Easy."},
    ]
    tool_json = json.dumps(WEATHER, ensure_ascii=False)
    assert render(template, messages, tools=[WEATHER], add_generation_prompt=False) == (
        f"<|im_start|>system\n{TOOLS_HEADER}{tool_json}{TOOLS_FOOTER}<|im_end|>\n"
        "<|im_start|>user\nWeather in Zürich and Bern?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nTwo cities, two calls.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Bern"}}\n</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n12°C\n</tool_response>\n"
        "<tool_response>\n10°C\n</tool_response><|im_end|>\n"
        "<|im_start|>system\nAnswer in one line.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nEasy.\n</think>\n\nZürich 12°C, Bern 10°C.<|im_end|>\n"
    )


def test_system_prompt_precedes_tools(template: str) -> None:
    messages = [{"role": "system", "content": "Be careful."}, {"role": "user", "content": "Go"}]
    text = render(template, messages, tools=[WEATHER])
    assert text.startswith(f"<|im_start|>system\nBe careful.\n\n{TOOLS_HEADER}")
    assert text.count("<|im_start|>system") == 1


def test_content_before_a_call_and_text_parts(template: str) -> None:
    call = {"function": {"name": "f", "arguments": {}}}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "Calling.", "tool_calls": [call]},
    ]
    assert render(template, messages, add_generation_prompt=False) == (
        "<|im_start|>user\nab<|im_end|>\n"
        '<|im_start|>assistant\nCalling.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
        "<|im_end|>\n"
    )


def test_every_reasoning_block_is_kept_verbatim(template: str) -> None:
    messages = [
        {"role": "user", "content": "1"},
        {"role": "assistant", "content": "\none\n", "reasoning_content": "\nfirst  "},
        {"role": "user", "content": "2"},
        {"role": "assistant", "content": "two", "reasoning": "second"},
    ]
    text = render(template, messages, add_generation_prompt=False)
    assert "<|im_start|>assistant\n<think>\n\nfirst  \n</think>\n\n\none\n<|im_end|>\n" in text
    # `reasoning` (vLLM's name) is read as reasoning_content, as in transformers.
    assert "<|im_start|>assistant\n<think>\nsecond\n</think>\n\ntwo<|im_end|>\n" in text


def test_thinking_switch(template: str) -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert render(template, messages).endswith("<|im_start|>assistant\n")
    assert render(template, messages, enable_thinking=True).endswith("<|im_start|>assistant\n")
    assert render(template, messages, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_template_rejects_unknown_roles(template: str) -> None:
    with pytest.raises(TemplateError, match="unknown message role"):
        render(template, [{"role": "critic", "content": "x"}])


def test_tojson_is_transformers_tojson() -> None:
    value = {"text": "<b>Zürich & 'Bern'</b>", "n": [1, 2]}
    assert render("{{ value | tojson }}", [], value=value) == json.dumps(value, ensure_ascii=False)
    assert render("{{ value | tojson(indent=2) }}", [], value=value) == json.dumps(
        value, ensure_ascii=False, indent=2
    )
    assert render("{{ 'é' | tojson(ensure_ascii=True) }}", []) == '"\\u00e9"'


def test_raise_exception_is_a_template_error() -> None:
    with pytest.raises(TemplateError, match="no system role here") as info:
        render("{{ raise_exception('no system role here') }}", [])
    assert isinstance(info.value, ValueError)


def test_syntax_errors_and_sandbox_violations_are_template_errors() -> None:
    with pytest.raises(TemplateError, match="syntax"):
        render("{% for m in messages %}", [])
    with pytest.raises(TemplateError):
        render("{% set ns = namespace(_secret=1) %}", [])
    with pytest.raises(TemplateError):
        render("{{ messages.append(1) }}", [])


def test_environment_extras() -> None:
    assert (
        render(
            "{% for i in [1, 2, 3] %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}", []
        )
        == "1"
    )
    assert render("{% generation %}kept{% endgeneration %}", []) == "kept"
    assert render("{{ strftime_now('%Y') | length }}", []) == "4"
    assert render("{% if true %}\n  a\n{% endif %}\nb", []) == "  a\nb"  # trim + lstrip blocks


def test_messages_are_normalized_like_transformers() -> None:
    template = (
        "{% for m in messages %}{{ m.content is defined }}{{ m.reasoning_content }};{% endfor %}"
    )
    messages = [{"role": "assistant", "content": None, "thinking": "t"}]
    assert render(template, messages) == "Falset;"


def test_render_chat_passes_special_tokens(qwen3: LoadedTokenizer) -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert qwen3.render_chat(messages) == render(qwen3.chat_template, messages)
    ended = LoadedTokenizer(**{**vars(qwen3), "chat_template": "{{ eos_token }}{{ pad_token }}"})
    assert ended.render_chat(messages) == "<|im_end|><|endoftext|>"


# --- the real Claude Code traffic, in OpenAI chat form ------------------------------------------


def claude_code_chat() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The fixture's last request (plus the scripted reply) as OpenAI-style messages and tools."""
    exchange = fixtures.load(fixtures.CLAUDE_CODE)["exchanges"][-1]
    request = exchange["request"]
    system = "".join(block["text"] for block in request["system"])
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for message in [
        *request["messages"],
        {"role": "assistant", "content": exchange["reply_content"]},
    ]:
        blocks = message["content"]
        if isinstance(blocks, str):
            messages.append({"role": message["role"], "content": blocks})
            continue
        texts = [b["text"] for b in blocks if b["type"] == "text"]
        calls = [
            {"type": "function", "function": {"name": b["name"], "arguments": b["input"]}}
            for b in blocks
            if b["type"] == "tool_use"
        ]
        for block in blocks:
            if block["type"] == "tool_result":
                messages.append({"role": "tool", "content": block["content"]})
        if texts or calls:
            entry: dict[str, Any] = {"role": message["role"], "content": "".join(texts)}
            if calls:
                entry["tool_calls"] = calls
            messages.append(entry)
    tools = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description", ""),
                "parameters": t["input_schema"],
            },
        }
        for t in request["tools"]
    ]
    return messages, tools


def test_claude_code_session_renders(template: str) -> None:
    messages, tools = claude_code_chat()
    text = render(template, messages, tools=tools, add_generation_prompt=False)
    assert text.count("<tool_call>\n") == sum(len(m.get("tool_calls", ())) for m in messages) + 1
    assert (
        '<tool_call>\n{"name": "Edit", "arguments": {"replace_all": false, '
        '"file_path": "/repo/calc.py", "old_string": "    return a+b   \\n", '
        '"new_string": "    # sum\\n    return a + b\\n"}}\n</tool_call>'
    ) in text
    assert text.endswith("<|im_start|>assistant\nDone.  \nAll good.  <|im_end|>\n")


# --- agreement with transformers ----------------------------------------------------------------


def conversations() -> list[
    tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]
]:
    call = {
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Zürich"}},
    }
    chats: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]] = [
        ([{"role": "user", "content": "hi"}], None, {}),
        ([{"role": "user", "content": "hi"}], None, {"enable_thinking": False}),
        (
            [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "w?"},
                {
                    "role": "assistant",
                    "content": "",
                    "reasoning_content": "r",
                    "tool_calls": [call],
                },
                {"role": "tool", "content": "12"},
                {"role": "system", "content": "late"},
                {"role": "assistant", "content": "12 it is", "reasoning": "ok"},
            ],
            [WEATHER],
            {},
        ),
    ]
    messages, tools = claude_code_chat()
    chats.append((messages, tools, {}))
    return chats


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_matches_transformers(qwen3: LoadedTokenizer, generation_prompt: bool) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=qwen3.tokenizer,
        chat_template=qwen3.chat_template,
        eos_token=qwen3.eos_token,
        pad_token=qwen3.pad_token,
    )
    for messages, tools, kwargs in conversations():
        ours = qwen3.render_chat(
            messages, tools=tools, add_generation_prompt=generation_prompt, **kwargs
        )
        theirs = hf.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt, **kwargs
        )
        assert ours == theirs
        assert qwen3.encode(ours) == hf.encode(theirs, add_special_tokens=False)
