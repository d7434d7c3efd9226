"""A resumed translation is the full one, on every request.

The request memo (`adapter.request.memo`, `adapter.request.translate`) translates only the wire
messages after the last unchanged one, from a mark the previous translation left
(`protocols.resume`). Here: the reported case (a mid-list `system` note that changes between
requests), then a property test over request sequences where earlier messages are edited, replaced,
removed, re-typed, have `cache_control` moved, and notes appear, change and disappear, for
Anthropic, Chat Completions and Responses.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass, replace
from functools import cache, partial
from typing import Any

import anthropic
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from support.serve import resume_checks
from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.adapter.protocols.anthropic import AnthropicMessages
from tokentrail.adapter.protocols.openai import OpenAIChat
from tokentrail.adapter.protocols.options import WireOptions
from tokentrail.adapter.protocols.responses import OpenAIResponses
from tokentrail.adapter.protocols.resume import Fold, Translated
from tokentrail.adapter.request.memo import KnownRequest
from tokentrail.adapter.request.parse import parse_body, parse_reusing
from tokentrail.adapter.request.translate import translate_reusing
from tokentrail.engines.base import GenerateRequest, Generation
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.errors import RequestError
from tokentrail.messages import Conversation
from tokentrail.text.tokenizer import load_tokenizer

SCRIPT = [[{"type": "text", "text": "Hello."}]]
_tokenizer = cache(load_tokenizer)


class _Recording(ScriptedEngine):
    """The scripted engine, keeping every prompt it is sent."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.prompts: list[list[int]] = []

    async def generate(self, req: GenerateRequest) -> Generation:
        self.prompts.append([int(i) for i in req.input_ids])
        return await super().generate(req)


def _decoded_prompts(bodies: list[dict[str, Any]], **config: Any) -> list[str]:
    """Each request's prompt as the engine saw it, decoded, sent with the anthropic SDK to an
    adapter on a real socket."""
    return _session(bodies, **config)[0]


def _session(bodies: list[dict[str, Any]], **config: Any) -> tuple[list[str], dict[str, float]]:
    """`_decoded_prompts`, and the adapter's `tokentrail_resume_checks_total` by result."""
    tokenizer = _tokenizer()
    engine = _Recording(tokenizer, SCRIPT)
    adapter = Adapter(engine=engine, tokenizer=tokenizer, config=AdapterConfig(**config))

    async def play() -> None:
        runner, url = await start_server(adapter)
        try:
            client = anthropic.AsyncAnthropic(base_url=url, api_key="s", max_retries=0)
            for body in bodies:
                await client.messages.create(model="m", max_tokens=64, **body)
        finally:
            await runner.cleanup()

    asyncio.run(play())
    checks = resume_checks(adapter.metrics.render()[0].decode())
    return [tokenizer.decode(ids) for ids in engine.prompts], checks


NOTES = [
    {"messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": note}]}
    for note in ("NOTE-A", "NOTE-B")
]


def test_a_system_note_that_changes_is_rendered_as_it_is_now() -> None:
    for memo in (256, 0):
        first, second = _decoded_prompts(NOTES, request_memo=memo)
        assert first.count("NOTE-A") == 1 and "NOTE-B" not in first
        assert second.count("NOTE-B") == 1 and "NOTE-A" not in second, memo


def _resume_past_the_mark(self: Fold, previous: Translated, at: int) -> None:
    """The resume this module fixed: the output list as it ended, not as it stood at the mark
    (a note joined into the last message there stays joined)."""
    mark = previous.marks[at - 1]
    self.messages = previous.conversation.messages[: mark.messages]
    self.results.restore(mark.open_calls, mark.answered)
    self.reader.media = Counter(mark.media)
    self.marks = list(previous.marks[:at])


def test_verify_resume_counts_a_mismatch_and_serves_the_full_translation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, checks = _session(NOTES, verify_resume=True)
    assert checks == {"same": 2.0, "mismatch": 0.0}
    monkeypatch.setattr(Fold, "resume", _resume_past_the_mark)
    assert "NOTE-A" in _decoded_prompts(NOTES)[1]  # the broken resume, unchecked
    (first, second), checks = _session(NOTES, verify_resume=True)
    assert checks == {"same": 1.0, "mismatch": 1.0}
    assert second.count("NOTE-B") == 1 and "NOTE-A" not in second


# -- the property: request sequences with earlier messages changed ------------------------------
#
# A conversation is a list of protocol-neutral events, rendered to each protocol's wire format;
# an unchanged event renders to the same bytes, so the memo resumes after it. Each request of a
# sequence is the previous one with a few changes, then (usually) a few new events.

DEPTH = 64
PROTOCOLS = {p.name: p for p in (AnthropicMessages(), OpenAIChat(), OpenAIResponses())}
# slime's readings (the slime drop-in's): `<system-reminder>` notes, results by position for
# calls sent without an id.
SLIME = WireOptions(system_reminder=True, results_by_position=True)
PROTOCOLS["anthropic-slime"] = AnthropicMessages().configured(SLIME)
TOOLS = [{"name": "Read", "description": "Read a file", "schema": {"type": "object"}}]
WORDS = ["hi", "fix the bug", "NOTE-A", "NOTE-B", "two\nlines", " padded ", "é ✓", ""]
IDS = ["c1", "c2", "c3"]


@dataclass(frozen=True)
class User:
    text: str
    blocks: bool = False


@dataclass(frozen=True)
class Note:
    """A `system` (or `developer`) message after the start."""

    text: str
    blocks: bool = False
    developer: bool = False


@dataclass(frozen=True)
class Assistant:
    text: str
    reasoning: str = ""
    calls: tuple[str, ...] = ()
    blocks: bool = True


@dataclass(frozen=True)
class Results:
    # (call id, output, failed), in the order the harness sends them.
    answers: tuple[tuple[str, str, bool], ...]
    text: str = ""


Event = User | Note | Assistant | Results


@dataclass(frozen=True)
class Request:
    events: tuple[Event, ...]
    system: str = "You are a coding agent."
    cache_at: int | None = None  # the event whose last block carries `cache_control`


texts = st.sampled_from(WORDS) | st.text(alphabet="ab \n", min_size=1, max_size=6)
events: st.SearchStrategy[Event] = st.one_of(
    st.builds(User, texts, st.booleans()),
    st.builds(Note, texts, st.booleans(), st.booleans()),
    st.builds(
        Assistant,
        texts,
        st.sampled_from(["", "think"]),
        st.lists(st.sampled_from(IDS), max_size=2, unique=True).map(tuple),
        st.booleans(),
    ),
    st.builds(
        Results,
        st.lists(st.tuples(st.sampled_from(IDS), texts, st.booleans()), max_size=2).map(tuple),
        st.sampled_from(["", "NOTE-A"]),
    ),
)


def _follow(last: Event | None, data: st.DataObject) -> Event:
    """A new event that usually makes sense after `last` (results for its calls)."""
    if isinstance(last, Assistant) and last.calls and data.draw(st.integers(0, 4)):
        order = data.draw(st.permutations(last.calls))
        return Results(tuple((i, f"out {i}", i == order[0]) for i in order))
    if isinstance(last, (User, Results, Note)) and data.draw(st.integers(0, 3)):
        calls = data.draw(st.lists(st.sampled_from(IDS), max_size=2, unique=True))
        return Assistant(data.draw(texts), data.draw(st.sampled_from(["", "r"])), tuple(calls))
    return data.draw(events)


def _changed(request: Request, data: st.DataObject) -> Request:
    """The next request: some earlier events edited, replaced, removed or re-typed, notes
    added, changed or dropped, `cache_control` moved, then new events at the end."""
    evs = list(request.events)
    system, cache_at = request.system, request.cache_at
    for _ in range(data.draw(st.integers(0, 2))):
        change = data.draw(
            st.sampled_from(["edit", "replace", "remove", "retype", "note", "cache", "system"])
        )
        pos = data.draw(st.integers(0, max(len(evs) - 1, 0)))
        if change == "note":
            evs.insert(pos, Note(data.draw(texts), data.draw(st.booleans())))
        elif change == "cache":
            cache_at = len(evs) - 1 if evs else None
        elif change == "system":
            system = data.draw(st.sampled_from(["You are a coding agent.", "Be brief."]))
        elif not evs:
            continue
        elif change == "edit" and hasattr(evs[pos], "text"):
            evs[pos] = replace(evs[pos], text=data.draw(texts))  # type: ignore[type-var]
        elif change == "replace":
            evs[pos] = data.draw(events)
        elif change == "remove":
            del evs[pos]
        elif change == "retype" and hasattr(evs[pos], "blocks"):
            evs[pos] = replace(evs[pos], blocks=not evs[pos].blocks)  # type: ignore[type-var]
    for _ in range(data.draw(st.integers(0, 3))):
        evs.append(_follow(evs[-1] if evs else None, data))
    if data.draw(st.booleans()):
        cache_at = len(evs) - 1 if evs else None  # Claude Code moves it to the newest message
    return Request(tuple(evs), system, cache_at)


def _text(text: str, blocks: bool, cache: bool, kind: str = "text") -> Any:
    if not blocks and not cache:
        return text
    block: dict[str, Any] = {"type": kind, "text": text}
    if cache:
        block["cache_control"] = {"type": "ephemeral"}
    return [block]


def _anthropic(request: Request) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for pos, ev in enumerate(request.events):
        cache = pos == request.cache_at
        if isinstance(ev, User):
            messages.append({"role": "user", "content": _text(ev.text, ev.blocks, cache)})
        elif isinstance(ev, Note):
            messages.append({"role": "system", "content": _text(ev.text, ev.blocks, cache)})
        elif isinstance(ev, Assistant):
            content: list[dict[str, Any]] = []
            if ev.reasoning:
                content.append({"type": "thinking", "thinking": ev.reasoning, "signature": ""})
            if ev.text:
                content.append({"type": "text", "text": ev.text})
            content += [
                {"type": "tool_use", "id": i, "name": "Read", "input": {"path": i}}
                for i in ev.calls
            ]
            plain = not ev.blocks and not ev.calls and not ev.reasoning
            messages.append({"role": "assistant", "content": ev.text if plain else content})
        else:
            blocks: list[dict[str, Any]] = [
                {"type": "tool_result", "tool_use_id": i, "content": out, "is_error": failed}
                for i, out, failed in ev.answers
            ]
            if ev.text:
                blocks.append({"type": "text", "text": ev.text})
            if cache and blocks:
                blocks[-1] = {**blocks[-1], "cache_control": {"type": "ephemeral"}}
            messages.append({"role": "user", "content": blocks})
    tools = [{"name": t["name"], "description": t["description"], "input_schema": t["schema"]}
             for t in TOOLS]  # fmt: skip
    return {"model": "m", "max_tokens": 64, "system": request.system, "tools": tools,
            "messages": messages}  # fmt: skip


def _openai(request: Request) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": request.system}]
    for pos, ev in enumerate(request.events):
        cache = pos == request.cache_at
        if isinstance(ev, User):
            messages.append({"role": "user", "content": _text(ev.text, ev.blocks, cache)})
        elif isinstance(ev, Note):
            role = "developer" if ev.developer else "system"
            messages.append({"role": role, "content": _text(ev.text, ev.blocks, cache)})
        elif isinstance(ev, Assistant):
            msg: dict[str, Any] = {"role": "assistant", "content": ev.text or None}
            if ev.reasoning:
                msg["reasoning_content"] = ev.reasoning
            if ev.calls:
                msg["tool_calls"] = [
                    {"id": i, "type": "function",
                     "function": {"name": "Read", "arguments": json.dumps({"path": i})}}
                    for i in ev.calls
                ]  # fmt: skip
            messages.append(msg)
        else:
            messages += [
                {"role": "tool", "tool_call_id": i, "content": _text(out, failed, cache)}
                for i, out, failed in ev.answers
            ]
            if ev.text:
                messages.append({"role": "user", "content": ev.text})
    tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
              "parameters": t["schema"]}} for t in TOOLS]  # fmt: skip
    return {"model": "m", "messages": messages, "tools": tools}


def _responses(request: Request) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for ev in request.events:
        if isinstance(ev, (User, Note)):
            role = "user" if isinstance(ev, User) else "developer" if ev.developer else "system"
            content = _text(ev.text, ev.blocks, False, "input_text")
            items.append({"type": "message", "role": role, "content": content})
        elif isinstance(ev, Assistant):
            if ev.reasoning:
                items.append({"type": "reasoning", "summary": [],
                              "encrypted_content": ev.reasoning})  # fmt: skip
            if ev.text:
                part = {"type": "output_text", "text": ev.text, "annotations": []}
                items.append({"type": "message", "role": "assistant", "content": [part]})
            for i in ev.calls:
                if ev.blocks:
                    items.append({"type": "function_call", "name": "Read", "call_id": i,
                                  "arguments": json.dumps({"path": i})})  # fmt: skip
                else:
                    items.append({"type": "custom_tool_call", "name": "apply_patch",
                                  "call_id": i, "input": f"*** {i}"})  # fmt: skip
        else:
            items += [
                {"type": "function_call_output", "call_id": i, "output": out}
                for i, out, _ in ev.answers
            ]
            if ev.text:
                items.append({"type": "message", "role": "user", "content": ev.text})
    tools = [{"type": "function", "name": t["name"], "description": t["description"],
              "parameters": t["schema"]} for t in TOOLS]  # fmt: skip
    tools.append({"type": "custom", "name": "apply_patch", "description": "Patch files"})
    return {"model": "m", "instructions": request.system, "input": items, "tools": tools}


def _anthropic_unnamed(request: Request) -> dict[str, Any]:
    """`_anthropic`, the calls `c3` sent without an id (their results still name `c3`)."""
    body = _anthropic(request)
    for m in body["messages"]:
        for block in m["content"] if isinstance(m["content"], list) else ():
            if block.get("type") == "tool_use" and block["id"] == "c3":
                del block["id"]
    return body


WIRE = {
    "anthropic": _anthropic,
    "anthropic-slime": _anthropic_unnamed,
    "openai": _openai,
    "responses": _responses,
}


def _outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except RequestError as e:
        return "refused", str(e)


def _prompt_ids(conversation: Conversation) -> tuple[str, Any]:
    tokenizer = _tokenizer()
    messages, tools = conversation.messages, conversation.tools
    return _outcome(lambda: tokenizer.encode(tokenizer.render_chat(messages, tools)))


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_resumed_translation_is_the_full_one(protocol: str, data: st.DataObject) -> None:
    proto = PROTOCOLS[protocol]
    request = Request(())
    known: KnownRequest | None = None
    for _ in range(data.draw(st.integers(2, 6), label="requests")):
        request = _changed(request, data)
        raw = json.dumps(WIRE[protocol](request)).encode()
        full = _outcome(proto.translate, parse_body(raw, DEPTH))
        parsed = parse_reusing(raw, proto, known, DEPTH)
        whole_again = partial(proto.translate, parsed.body)
        resumed = _outcome(translate_reusing, proto, parsed, whole_again, DEPTH)
        if resumed[0] == "refused" or full[0] == "refused":
            assert resumed == full
            event("refused")
            continue  # a refused request is not remembered (`RequestReader.request`)
        if known is not None and known.translated is not None:
            if known.translated.resumable(parsed.first_changed) and parsed.unchanged(
                proto.context_fields
            ):
                event("resumed")
        translated, whole = resumed[1], full[1]
        conversation = translated.conversation
        assert json.dumps(conversation.messages) == json.dumps(whole.messages)
        assert conversation.tools == whole.tools
        assert (conversation.tool_choice, conversation.forced_tool) == (
            whole.tool_choice,
            whole.forced_tool,
        )
        assert conversation.withheld_tools == whole.withheld_tools
        assert conversation.dropped_media == whole.dropped_media
        assert _prompt_ids(conversation) == _prompt_ids(whole)
        assert parsed.index is not None
        known = KnownRequest(proto.name, raw, parsed.index, parsed.body, translated)
