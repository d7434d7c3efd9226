"""A session's request parsed and translated only where it differs from the previous one.

The core's body index against its pure-Python reference; the reusing parse against the full
parse (same values, same JSON types, same key order, same errors); the resumed translation
against a full one over simulated sessions of every harness behaviour; and whole sessions with
the reuse on and off giving the same samples.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from functools import partial
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from tokentrail import _core
from tokentrail.adapter import Adapter, start_server
from tokentrail.adapter.protocols.anthropic import AnthropicMessages
from tokentrail.adapter.protocols.base import WireProtocol
from tokentrail.adapter.protocols.openai import OpenAIChat
from tokentrail.adapter.protocols.responses import OpenAIResponses
from tokentrail.adapter.request.memo import KnownRequest, RequestMemo
from tokentrail.adapter.request.parse import parse_body, parse_reusing
from tokentrail.adapter.request.translate import translate_reusing
from tokentrail.core.backend import load_backend
from tokentrail.core.reference import body as reference
from tokentrail.errors import BodyShapeError, RequestError
from tokentrail.sim.harness import Behaviour, HarnessSim, SessionSpec, simulate
from tokentrail.sim.model import SimulatedEngine

DEPTH = 64
ANTHROPIC = AnthropicMessages()
OPENAI = OpenAIChat()
RESPONSES = OpenAIResponses()

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=12)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=20,
)
keys = st.sampled_from(["model", "system", "tools", "stream", "x", "é", 'q"', "a\\b"])
bodies = st.dictionaries(keys, values, max_size=5).flatmap(
    lambda fields: (
        st.lists(values, max_size=6).map(lambda msgs: {**fields, "messages": msgs})
        | st.just(fields)
    )
)
layouts = st.sampled_from(
    [
        {},
        {"ensure_ascii": False},
        {"separators": (",", ":")},
        {"indent": 2},
        {"indent": "\t", "ensure_ascii": False},
    ]
)


def _same_index(core: _core.BodyIndex, ref: reference.BodyIndex) -> None:
    assert core.fields == ref.fields
    assert core.array_field == ref.array_field
    assert core.elements == ref.elements
    assert (core.depth, core.structural, core.surrogate_escape) == (
        ref.depth,
        ref.structural,
        ref.surrogate_escape,
    )


def _index_both(raw: bytes) -> tuple[Any, Any]:
    results = []
    for index in (_core.index_body, reference.index_body):
        try:
            results.append(index(raw, "messages"))
        except BodyShapeError:
            results.append(None)
    return results[0], results[1]


@given(bodies, layouts)
def test_the_core_index_is_the_reference_index(
    body: dict[str, Any], layout: dict[str, Any]
) -> None:
    raw = json.dumps(body, **layout).encode()
    core, ref = _index_both(raw)
    assert (core is None) == (ref is None)
    if core is not None:
        _same_index(core, ref)
        for start in (0, 1, len(core), len(core) + 2):
            assert core.elements_from(start) == ref.elements_from(start) == core.elements[start:]
        for key, start, end in core.fields:
            assert json.loads(raw[start:end]) == body[key]
        if core.array_field is not None:
            assert [json.loads(raw[a:b]) for a, b in core.elements] == body["messages"]
    else:
        # Only keys written with escapes are refused in a well-formed body.
        assert any("\\" in json.dumps(k) for k in body)


# How the session's next body differs from its previous one: messages appended, the last
# ones changed or cut, a top-level field changed, bytes after the messages broken.
edits = st.sampled_from(["append", "replace_last", "cut", "field", "break_tail", "same"])


def _edited(body: dict[str, Any], edit: str, extra: list[Any]) -> dict[str, Any]:
    new = dict(body)
    messages = list(new.get("messages", []))
    if edit == "append":
        messages += extra
    elif edit == "replace_last" and messages:
        messages[-1:] = extra[:1]
    elif edit == "cut":
        messages = messages[: len(messages) // 2]
    elif edit == "field":
        new["system"] = extra
    if "messages" in new or edit in ("append", "replace_last"):
        new["messages"] = messages
    return new


def _index_or_none(raw: bytes, previous: tuple[bytes, Any] | None = None) -> Any:
    try:
        return _core.index_body(raw, "messages", previous)
    except BodyShapeError as exc:
        return str(exc)


@given(bodies, edits, st.lists(values, max_size=3), layouts, st.booleans())
def test_an_index_resumed_from_the_previous_body_is_a_full_index(
    body: dict[str, Any], edit: str, extra: list[Any], layout: dict[str, Any], broken: bool
) -> None:
    old = json.dumps(body, **layout).encode()
    new = json.dumps(_edited(body, edit, extra), **layout).encode()
    if broken or edit == "break_tail":
        new = new[:-1] + b",]}" if broken else new[: len(new) * 3 // 4]
    before = _index_or_none(old)
    if isinstance(before, str):
        return
    full, resumed = _index_or_none(new), _index_or_none(new, (old, before))
    if isinstance(full, str):
        assert resumed == full  # refused alike, with the same reason
    else:
        _same_index(resumed, full)


@pytest.fixture(autouse=True, scope="module")
def _resumed_indexes_are_checked() -> Iterator[None]:
    """Every index these tests' requests resume from a previous body is also made whole and
    compared: the fast path is held to the slow one on every request sent here."""
    core = load_backend()
    fast = core.index_body
    if fast is not _core.index_body:
        yield
        return

    def checked(raw: bytes, array: str, previous: Any = None) -> Any:
        try:
            whole = fast(raw, array)
        except BodyShapeError as exc:
            with pytest.raises(BodyShapeError) as again:
                fast(raw, array, previous)
            assert str(again.value) == str(exc)
            raise
        index = fast(raw, array, previous)
        for name in ("fields", "array_field", "elements", "depth", "structural"):
            assert getattr(index, name) == getattr(whole, name)
        assert index.surrogate_escape == whole.surrogate_escape
        RESUMED.append(previous is not None)
        return index

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(core, "index_body", checked)
        yield


# Whether each index the tests made had a previous body to resume from.
RESUMED: list[bool] = []


@given(bodies, st.data())
def test_broken_bodies_are_refused_alike(body: dict[str, Any], data: st.DataObject) -> None:
    raw = bytearray(json.dumps(body).encode())
    at = data.draw(st.integers(0, len(raw) - 1))
    if data.draw(st.booleans()):
        del raw[at]
    else:
        raw.insert(at, data.draw(st.sampled_from(b'{}[],:"\\ x1\xff')))
    core, ref = _index_both(bytes(raw))
    assert (core is None) == (ref is None)
    if core is not None:
        _same_index(core, ref)


@given(bodies, bodies, layouts)
def test_the_core_diff_is_the_reference_diff(
    old: dict[str, Any], new: dict[str, Any], layout: dict[str, Any]
) -> None:
    if isinstance(old.get("messages"), list) and isinstance(new.get("messages"), list):
        new["messages"] = old["messages"][: len(new["messages"])] + new["messages"]
    a, b = (json.dumps(x, **layout).encode() for x in (old, new))
    (ca, ra), (cb, rb) = _index_both(a), _index_both(b)
    if ca is None or cb is None:
        return
    assert _core.diff_bodies(a, ca, b, cb) == reference.diff_bodies(a, ra, b, rb)


def _typed(value: object) -> str:
    """JSON with types kept apart (1, 1.0 and true differ) and key order kept."""
    return json.dumps(value)


def _known(raw: bytes, proto: WireProtocol = ANTHROPIC) -> KnownRequest:
    parsed = parse_reusing(raw, proto, None, DEPTH)
    assert parsed.index is not None
    return KnownRequest(proto.name, raw, parsed.index, parsed.body)


@given(bodies, bodies, layouts)
def test_a_reusing_parse_equals_a_full_parse(
    old: dict[str, Any], new: dict[str, Any], layout: dict[str, Any]
) -> None:
    if isinstance(old.get("messages"), list) and isinstance(new.get("messages"), list):
        new["messages"] = old["messages"] + new["messages"]
    a, b = (json.dumps(x, **layout).encode() for x in (old, new))
    try:
        known = _known(a)
    except AssertionError:
        return  # the index does not take it: nothing would be kept
    parsed = parse_reusing(b, ANTHROPIC, known, DEPTH)
    assert _typed(parsed.body) == _typed(parse_body(b, DEPTH))
    both = all(isinstance(x.get("messages"), list) for x in (old, new))
    if parsed.previous is not None and both:
        kept = parsed.body["messages"][: parsed.first_changed]
        assert all(x is y for x, y in zip(kept, known.body["messages"], strict=False))


PREVIOUS = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}, NaN]}',
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}, 1e400]}',
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}, "\\ud800"]}',
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}, '
        + b"[" * 70
        + b"]" * 70
        + b"]}",
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}, 1,]}',
        b'{"model": "\xff", "messages": []}',
        b'["model"]',
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}, tru]}',
    ],
)
def test_bad_bodies_get_the_full_parses_error(raw: bytes) -> None:
    with pytest.raises(RequestError) as full:
        parse_body(raw, DEPTH)
    for known in (None, _known(PREVIOUS)):
        with pytest.raises(RequestError) as reused:
            parse_reusing(raw, ANTHROPIC, known, DEPTH)
        assert str(reused.value) == str(full.value)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "\\u006d": 1, "messages": []}',
        b'{"model": "m", "model": 1, "messages": []}',
    ],
)
def test_bodies_the_index_does_not_take_are_parsed_whole(raw: bytes) -> None:
    with pytest.raises(BodyShapeError):
        _core.index_body(raw, "messages")
    parsed = parse_reusing(raw, ANTHROPIC, _known(PREVIOUS), DEPTH)
    assert parsed.index is None and parsed.body == parse_body(raw, DEPTH)


def test_numbers_past_64_bits_stay_integers() -> None:
    big = 123456789012345678901234567890
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}, %d]}' % big
    parsed = parse_reusing(raw, ANTHROPIC, _known(PREVIOUS), DEPTH)
    assert parsed.body["messages"][1] == big


async def _bodies(protocol: str, behaviour: Behaviour, turns: int) -> list[bytes]:
    """The bodies a simulated harness sends over a session."""
    bodies: list[bytes] = []

    @web.middleware
    async def capture(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST" and request.path.startswith("/v1/"):
            bodies.append(await request.read())
        return await handler(request)

    from tokentrail.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    adapter = Adapter(engine=SimulatedEngine(tokenizer), tokenizer=tokenizer)
    adapter.app.middlewares.insert(0, capture)
    runner, url = await start_server(adapter)
    try:
        spec = SessionSpec(seed=3, steps=turns, context_tokens=4096)
        sim = HarnessSim(url, "s", behaviour=behaviour, spec=spec, protocol=protocol)
        await sim.run("Fix the bug.")
    finally:
        await runner.cleanup()
    return bodies


BEHAVIOURS = [
    Behaviour(),
    Behaviour(verify_on_stop=True, nudge_role="system", strip_nudge=True),
    Behaviour(subagents=True, compaction=True, strip_reasoning=True),
    Behaviour(retries=True, rerender_echoes=False, system_notes=False),
]


@pytest.mark.parametrize("protocol", [ANTHROPIC, OPENAI, RESPONSES], ids=lambda p: p.name)
@pytest.mark.parametrize("behaviour", BEHAVIOURS, ids=range(len(BEHAVIOURS)))
def test_a_resumed_translation_equals_a_full_one(
    protocol: WireProtocol, behaviour: Behaviour
) -> None:
    bodies = asyncio.run(_bodies(protocol.name, behaviour, 10))
    assert len(bodies) >= 8
    known: KnownRequest | None = None
    resumed = 0
    RESUMED.clear()
    for raw in bodies:
        parsed = parse_reusing(raw, protocol, known, DEPTH)
        translated = translate_reusing(
            protocol, parsed, partial(protocol.translate, parsed.body), DEPTH
        )
        full = protocol.translate(parse_body(raw, DEPTH))
        assert _typed(translated.conversation.messages) == _typed(full.messages)
        assert translated.conversation.tools == full.tools
        assert translated.conversation.dropped_media == full.dropped_media
        assert (translated.conversation.tool_choice, translated.conversation.forced_tool) == (
            full.tool_choice,
            full.forced_tool,
        )
        before = known.translated.conversation if known and known.translated else None
        if before is not None and translated.conversation.messages[:1] == before.messages[:1]:
            resumed += translated.conversation.messages[0] is before.messages[0]
        assert parsed.index is not None
        known = KnownRequest(protocol.name, raw, parsed.index, parsed.body, translated)
    # Most requests resume the one before (a compaction or a sub-agent starts over).
    assert resumed >= len(bodies) // 2
    # Every request after the first had its index resumed from the one before (and checked).
    assert RESUMED == [False] + [True] * (len(bodies) - 1)


@pytest.mark.parametrize("protocol", ["anthropic", "openai", "responses"])
def test_sessions_train_the_same_tokens_with_and_without_reuse(protocol: str) -> None:
    from tokentrail.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    behaviour = Behaviour(verify_on_stop=True, subagents=True)
    runs = [
        asyncio.run(
            simulate(
                tokenizer,
                behaviour=behaviour,
                spec=SessionSpec(seed=5, steps=10, context_tokens=4096),
                protocol=protocol,
                request_memo=memo,
            )
        )
        for memo in (0, 256)
    ]
    off, on = (run.trajectory for run in runs)
    assert len(on.samples) == len(off.samples) >= 1
    for a, b in zip(off.samples, on.samples, strict=True):
        assert list(a.tokens) == list(b.tokens)
        assert list(a.loss_mask) == list(b.loss_mask)
    assert on.ledger.trained_tokens == off.ledger.trained_tokens == on.ledger.generated_tokens


def test_the_memo_keeps_the_most_recent_sessions_and_forgets_closed_ones() -> None:
    memo = RequestMemo(2)
    known = _known(PREVIOUS)
    for sid in ("a", "b"):
        memo.put(sid, known)
    assert memo.get("a") is known  # "a" is now the most recent
    memo.put("c", known)
    assert memo.get("b") is None and memo.get("a") is known and len(memo) == 2
    memo.forget("a")
    assert memo.get("a") is None
    assert RequestMemo(0).get("a") is None


def test_a_finished_session_leaves_no_request_behind() -> None:
    from tokentrail.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    adapter = Adapter(engine=SimulatedEngine(tokenizer), tokenizer=tokenizer)

    async def play() -> None:
        runner, url = await start_server(adapter)
        try:
            spec = SessionSpec(seed=1, steps=3, context_tokens=2048)
            await HarnessSim(url, "s", spec=spec).run("Fix the bug.")
            assert adapter.sessions.memo.get("s") is not None
            await adapter.finish_trajectory("s")
            assert adapter.sessions.memo.get("s") is None
        finally:
            await runner.cleanup()

    asyncio.run(play())


def test_a_session_keeps_one_tool_list_while_the_harness_sends_the_same_one() -> None:
    from tokentrail.text.tokenizer import load_tokenizer
    from tokentrail.trajectory.tree import iter_nodes

    tokenizer = load_tokenizer()
    adapter = Adapter(engine=SimulatedEngine(tokenizer), tokenizer=tokenizer)

    async def play() -> list[Any]:
        runner, url = await start_server(adapter)
        try:
            spec = SessionSpec(seed=2, steps=6, context_tokens=4096)
            await HarnessSim(url, "s", spec=spec).run("Fix the bug.")
            return [n.tools for n in iter_nodes(adapter.manager.root("s")) if n.turn is not None]
        finally:
            await runner.cleanup()

    tools = asyncio.run(play())
    assert len(tools) >= 6 and tools[0]
    assert all(t is tools[0] for t in tools)


def test_a_tool_list_is_checked_until_a_request_carrying_it_is_accepted() -> None:
    """The field check skips a tool list that kept its bytes since the session's previous
    request; the memo only holds accepted requests, so a bad list is refused every time."""
    from tokentrail.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    adapter = Adapter(engine=SimulatedEngine(tokenizer), tokenizer=tokenizer)
    good_tools = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]
    bad_tools = [{**good_tools[0], "name": 5}]

    def body(tools: list[dict[str, Any]]) -> bytes:
        messages = [{"role": "user", "content": "Fix the bug."}]
        return json.dumps(
            {"model": "m", "max_tokens": 16, "messages": messages, "tools": tools}
        ).encode()

    async def play() -> list[tuple[int, str]]:
        runner, url = await start_server(adapter)
        statuses = []
        try:
            async with aiohttp.ClientSession() as http:
                for sid, tools in [
                    ("a", good_tools),
                    ("a", bad_tools),
                    ("a", bad_tools),
                    ("a", good_tools),
                    ("a", good_tools),  # kept: not checked again
                    ("b", bad_tools),
                    ("b", bad_tools),
                ]:
                    headers = {"x-api-key": sid, "Content-Type": "application/json"}
                    async with http.post(
                        url + "/v1/messages", data=body(tools), headers=headers
                    ) as resp:
                        payload = await resp.json()
                        message = payload.get("error", {}).get("message", "")
                        statuses.append((resp.status, message))
        finally:
            await runner.cleanup()
        return statuses

    statuses = asyncio.run(play())
    assert [s for s, _ in statuses] == [200, 400, 400, 200, 200, 400, 400]
    assert all("tools[0].name" in m for s, m in statuses if s == 400)
    assert adapter.sessions.memo.get("a") is not None and adapter.sessions.memo.get("b") is None
