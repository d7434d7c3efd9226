"""The engine runs only for a turn that will be recorded: over random requests full of
translation edge cases (empty contents, prefills, media, server tools and their blocks, tool
results out of order or for no call, tool choices, prompts over the context limit), every 2xx
reply is a turn in the session's ledger, every turn the engine generated is in it, and nothing
else is; bad input is a 4xx, never a 5xx."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from itertools import count
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from tokentrail.adapter import Adapter, AdapterConfig, start_server
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.text.tokenizer import load_tokenizer

READ = {"name": "Read", "input_schema": {"type": "object", "properties": {}}}
WEB = {"type": "web_search_20250305", "name": "web_search"}
OAI_READ = {"type": "function", "function": {"name": "Read", "parameters": {"type": "object"}}}
IDS = ("t1", "t2", "t3")
SCRIPT = [
    [{"type": "text", "text": "Looking."}],
    [{"type": "tool_use", "name": "Read", "input": {"file_path": "a.py"}}],
    [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "Done."}],
]
# Small enough that long requests go over it.
CONTEXT_LIMIT = 400


class CountingEngine(ScriptedEngine):
    """The scripted engine, counting the turns it generated per session."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer, SCRIPT)
        self.generated: Counter[str] = Counter()

    async def generate(self, req):
        generation = await super().generate(req)
        self.generated[req.session_id] += 1
        return generation


ADMIN = "admin-token"


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, CountingEngine]]:
    tokenizer = load_tokenizer()
    engine = CountingEngine(tokenizer)
    adapter = Adapter(
        engine=engine,
        tokenizer=tokenizer,
        config=AdapterConfig(max_context_tokens=CONTEXT_LIMIT, admin_token=ADMIN),
    )
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict[str, Any] = {}

    def run() -> None:
        asyncio.set_event_loop(loop)
        box["runner"], box["url"] = loop.run_until_complete(start_server(adapter))
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(30)
    yield box["url"], engine
    loop.call_soon_threadsafe(loop.stop)
    thread.join(30)


def post(url: str, body: Any, sid: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if sid:
        headers["Authorization"] = f"Bearer {sid}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


# --- requests full of edge cases ---------------------------------------------------------------

texts = st.sampled_from(["", " ", "\n", "hi", "fix calc.py " * 60])
ids = st.sampled_from(IDS)
media = st.sampled_from(
    [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}},
        {"type": "document", "source": {"type": "text", "data": "d"}},
    ]
)
text_block = texts.map(lambda t: {"type": "text", "text": t})
tool_result = st.builds(
    lambda i, t, e: {"type": "tool_result", "tool_use_id": i, "content": t, "is_error": e},
    ids,
    st.one_of(texts, st.lists(st.one_of(text_block, media), max_size=2)),
    st.booleans(),
)
server_blocks = st.sampled_from(
    [
        {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {"q": "x"}},
        {"type": "web_search_tool_result", "tool_use_id": "s1", "content": []},
        {"type": "tool_reference", "tool_name": "Grep"},
    ]
)
user_content = st.one_of(
    texts, st.lists(st.one_of(text_block, media, tool_result, server_blocks), max_size=4)
)
tool_use = ids.map(lambda i: {"type": "tool_use", "id": i, "name": "Read", "input": {}})
assistant_content = st.one_of(
    texts,
    st.lists(
        st.one_of(
            text_block,
            texts.map(lambda t: {"type": "thinking", "thinking": t}),
            tool_use,
            server_blocks,
        ),
        max_size=3,
    ),
)
anthropic_message = st.one_of(
    user_content.map(lambda c: {"role": "user", "content": c}),
    assistant_content.map(lambda c: {"role": "assistant", "content": c}),
    texts.map(lambda c: {"role": "system", "content": c}),
)
anthropic_request = st.fixed_dictionaries(
    {"model": st.just("m"), "max_tokens": st.just(256), "messages": st.lists(anthropic_message)},
    optional={
        "system": texts,
        "tools": st.sampled_from([[], [READ], [READ, WEB], [WEB]]),
        "tool_choice": st.sampled_from(
            [{"type": "auto"}, {"type": "none"}, {"type": "any"}, {"type": "tool", "name": "Read"}]
        ),
    },
)


def openai_call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "Read", "arguments": "{}"}}


openai_message = st.one_of(
    st.builds(
        lambda c: {"role": "user", "content": c},
        st.one_of(
            texts,
            st.none(),
            st.lists(st.sampled_from([{"type": "text", "text": "x"}, {"type": "image_url"}])),
        ),
    ),
    st.builds(
        lambda c, calls, r: {
            "role": "assistant",
            "content": c,
            **({"tool_calls": [openai_call(i) for i in calls]} if calls else {}),
            **({"reasoning_content": r} if r is not None else {}),
        },
        st.one_of(texts, st.none()),
        st.lists(ids, max_size=2, unique=True),
        st.one_of(st.none(), texts),
    ),
    st.builds(lambda i, c: {"role": "tool", "tool_call_id": i, "content": c}, ids, texts),
    texts.map(lambda c: {"role": "system", "content": c}),
)
openai_request = st.fixed_dictionaries(
    {"model": st.just("m"), "messages": st.lists(openai_message)},
    optional={
        "tools": st.sampled_from([[], [OAI_READ], [OAI_READ, {"type": "custom"}]]),
        "tool_choice": st.sampled_from(["auto", "none", "required"]),
        "n": st.sampled_from([1, 2]),
        "logprobs": st.booleans(),
        "stream": st.booleans(),
    },
)

_sessions = count()


@given(
    st.one_of(
        anthropic_request.map(lambda b: ("/v1/messages", b)),
        openai_request.map(lambda b: ("/v1/chat/completions", b)),
    )
)
def test_every_2xx_turn_is_in_the_ledger_and_nothing_else_is(
    served: tuple[str, CountingEngine], request: tuple[str, dict[str, Any]]
) -> None:
    url, engine = served
    path, body = request
    sid = f"prop-{next(_sessions)}"
    status = post(url + path, body, sid)[0] if not body.get("stream") else stream(url, body, sid)
    event(f"status {status}")
    assert status < 500, (status, body)
    finished, result = post(f"{url}/tokentrail/sessions/{sid}/finish", {"reward": 1.0}, ADMIN)
    # A session whose only request was refused was never opened (404): it has no turns.
    assert finished in (200, 404), (finished, result)
    turns = len(result["ledger"]["turns"]) if finished == 200 else 0
    assert turns == (1 if 200 <= status < 300 else 0), (status, body)
    assert engine.generated[sid] == turns, (status, body)


def stream(url: str, body: dict[str, Any], sid: str) -> int:
    """Status of a streamed request, read to its end."""
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {sid}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
