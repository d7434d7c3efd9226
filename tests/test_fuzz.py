"""Random and mutated requests against a live adapter while a healthy session runs: never a 5xx
or a hang, `/healthz` answers throughout, and the healthy session's samples are those of a run
nobody disturbed.

Both protocols, count_tokens and the admin routes are fuzzed, with random headers (keys,
admin tokens, content types) and bodies that are random JSON, valid requests with a field
replaced or removed, lone surrogates, deep nesting, truncated or garbled bytes, and attempts
to write into the healthy session through body fields.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.adapter.request.limits import Limits
from tokentrail.engines.scripted import ScriptedEngine

ADMIN = "fuzz-admin"
HEALTHY = "healthy"
READ_TOOL = {
    "name": "Read",
    "description": "Read a file",
    "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}},
}
SCRIPT = [
    [
        {"type": "text", "text": "Reading it."},
        {"type": "tool_use", "name": "Read", "input": {"file_path": "/repo/a.py"}},
    ],
    [{"type": "text", "text": "It says x = 1."}],
    [{"type": "text", "text": "Done."}],
]
ANTHROPIC = {
    "model": "m",
    "max_tokens": 64,
    "system": "be brief",
    "tools": [READ_TOOL],
    "messages": [
        {"role": "user", "content": "read a.py"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Reading it."},
                {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "a"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x = 1"}],
        },
    ],
}
OPENAI = {
    "model": "m",
    "max_tokens": 64,
    "tools": [
        {
            "type": "function",
            "function": {"name": "Read", "parameters": READ_TOOL["input_schema"]},
        }
    ],
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "read a.py"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "Read", "arguments": '{"file_path": "a"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "x = 1"},
    ],
}
ROUTES = {
    "/v1/messages": ANTHROPIC,
    "/v1/messages/count_tokens": ANTHROPIC,
    "/v1/chat/completions": OPENAI,
}


class Server:
    """An adapter served from a thread of its own, so hypothesis can drive it synchronously."""

    def __init__(self, adapter: Adapter) -> None:
        self.adapter = adapter
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.port = 0

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.runner, url = self.loop.run_until_complete(start_server(self.adapter))
        self.port = int(url.rsplit(":", 1)[1])
        self._ready.set()
        self.loop.run_forever()

    def __enter__(self) -> Server:
        self._thread.start()
        self._ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)

    def request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()


def make_adapter(tokenizer) -> Adapter:
    return Adapter(
        engine=ScriptedEngine(tokenizer, SCRIPT),
        tokenizer=tokenizer,
        config=AdapterConfig(
            admin_token=ADMIN, limits=Limits(max_body_bytes=256 * 1024, body_timeout_s=2.0)
        ),
    )


class Healthy:
    """Drives the healthy session one turn at a time: a tool call, its result, a follow-up."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": "what is in a.py?"}]
        self.done = 0

    def turn(self) -> None:
        body = {"model": "m", "max_tokens": 256, "tools": [READ_TOOL], "messages": self.messages}
        status, raw = self.server.request(
            "POST",
            "/v1/messages",
            json.dumps(body).encode(),
            {"Authorization": f"Bearer {HEALTHY}", "Content-Type": "application/json"},
        )
        assert status == 200, raw[:300]
        content = json.loads(raw)["content"]
        self.messages.append({"role": "assistant", "content": content})
        calls = [b for b in content if b["type"] == "tool_use"]
        if calls:
            result = {"type": "tool_result", "tool_use_id": calls[0]["id"], "content": "x = 1"}
            self.messages.append({"role": "user", "content": [result]})
        else:
            self.messages.append({"role": "user", "content": "and then?"})
        self.done += 1

    def finish(self) -> list[dict[str, Any]]:
        status, raw = self.server.request(
            "POST",
            f"/tokentrail/sessions/{HEALTHY}/finish",
            b'{"reward": 1.0}',
            {"Authorization": f"Bearer {ADMIN}"},
        )
        assert status == 200, raw[:300]
        return [
            {k: v for k, v in sample.items() if k != "metadata"}
            for sample in json.loads(raw)["samples"]
        ]


# -- strategies ---------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
visible = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=16)
sids = st.sampled_from(["a", "carol", "mallory", ADMIN]) | visible.filter(lambda s: s != HEALTHY)


def _paths(body: Any) -> list[tuple[Any, Any]]:
    """(container, key) of every value inside `body`."""
    out: list[tuple[Any, Any]] = []
    stack = [body]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            out.append((node, key))
            if isinstance(value, dict | list):
                stack.append(value)
    return out


@st.composite
def bodies(draw: st.DrawFn, base: dict[str, Any]) -> bytes:
    body = json.loads(json.dumps(base))
    op = draw(
        st.sampled_from(
            ["random", "replace", "delete", "surrogate", "deep", "truncate", "garble", "hijack"]
        )
    )
    if op == "random":
        return json.dumps(draw(json_values)).encode()
    if op in ("replace", "delete"):
        container, key = draw(st.sampled_from(_paths(body)))
        if op == "delete" and isinstance(container, dict):
            del container[key]
        else:
            container[key] = draw(json_values)
        return json.dumps(body).encode()
    if op == "surrogate":
        container, key = draw(st.sampled_from(_paths(body)))
        container[key] = "SURROGATE"
        lone = draw(st.sampled_from(["\\ud800", "\\udfff", "x\\udc00y"]))
        return json.dumps(body).replace('"SURROGATE"', f'"{lone}"').encode()
    if op == "deep":
        depth = draw(st.sampled_from([70, 900, 50_000]))
        container, key = draw(st.sampled_from(_paths(body)))
        container[key] = "DEEP"
        return json.dumps(body).replace('"DEEP"', "[" * depth + "]" * depth).encode()
    raw = json.dumps(body).encode()
    if op == "truncate":
        return raw[: draw(st.integers(0, len(raw) - 1))]
    if op == "garble":
        at = draw(st.integers(0, len(raw) - 1))
        return raw[:at] + draw(st.binary(min_size=1, max_size=8)) + raw[at + 1 :]
    # hijack: name the healthy session in every body field a protocol might read
    body["user"] = HEALTHY
    body["metadata"] = {"session_id": HEALTHY, "user_id": HEALTHY}
    return json.dumps(body).encode()


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, bytes | None, dict[str, str]]:
    kind = draw(st.sampled_from(["turn", "turn", "turn", "admin", "other"]))
    headers: dict[str, str] = {}
    auth = draw(st.sampled_from(["bearer", "x-api-key", "none", "admin", "junk"]))
    sid = draw(sids)
    if auth == "bearer":
        headers["Authorization"] = f"Bearer {sid}"
    elif auth == "x-api-key":
        headers["x-api-key"] = sid
    elif auth == "admin":
        headers["Authorization"] = f"Bearer {ADMIN}"
    elif auth == "junk":
        headers["Authorization"] = draw(
            st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=30)
        )
    if draw(st.booleans()):
        headers["Content-Type"] = draw(st.sampled_from(["application/json", "text/plain", "x"]))
    if kind == "turn":
        path = draw(st.sampled_from(sorted(ROUTES)))
        return "POST", path, draw(bodies(ROUTES[path])), headers
    if kind == "admin":
        target = draw(sids)
        if draw(st.booleans()):
            finish = draw(
                st.sampled_from(
                    [b"", b"{}", b'{"reward": NaN}', b'{"reward": 1e999}', b'{"reward": "x"}']
                )
                | st.builds(
                    lambda v: json.dumps({"reward": 1, "metadata": v}).encode(), json_values
                )
                | st.just(b'{"metadata": {"n": "\\ud800"}}')
            )
            return "POST", f"/tokentrail/sessions/{target}/finish", finish, headers
        return "DELETE", f"/tokentrail/sessions/{target}", None, headers
    method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]))
    path = draw(st.sampled_from(["/", "/healthz", "/metrics", "/v1/models", "/v1/nope", "/x"]))
    return method, path, draw(st.none() | st.binary(max_size=64)), headers


@pytest.fixture(scope="module")
def live(tokenizer) -> Iterator[tuple[Server, Healthy, list[int]]]:
    with Server(make_adapter(tokenizer)) as server:
        healthy = Healthy(server)
        healthy.turn()
        yield server, healthy, []


@given(request=requests())
def test_fuzzed_requests_never_get_a_5xx_or_disturb_a_healthy_session(live, request) -> None:
    server, healthy, seen = live
    method, path, body, headers = request
    try:
        status, raw = server.request(method, path, body, headers)
    except (ValueError, http.client.InvalidURL):
        return  # a header or path no HTTP client can send
    assert status < 500, (method, path, body, headers, raw[:300])
    seen.append(status)
    assert server.request("GET", "/healthz", None, {})[0] == 200
    if len(seen) % 25 == 0 and healthy.done < 3:
        healthy.turn()


def test_the_healthy_session_matches_a_clean_run(live, tokenizer) -> None:
    server, healthy, seen = live
    while healthy.done < 3:
        healthy.turn()
    fuzzed = healthy.finish()
    assert seen and all(s < 500 for s in seen)
    with Server(make_adapter(tokenizer)) as clean_server:
        clean = Healthy(clean_server)
        for _ in range(3):
            clean.turn()
        assert fuzzed == clean.finish()
    assert len(fuzzed) >= 1
