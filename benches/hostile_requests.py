"""`tokentrail serve` attacked as an attacker would: malformed and hostile requests, engine
faults, huge bodies, slow and half-open connections, other sessions' data, the admin routes.

Every request is sent to a served adapter (its own process) whose engine is a fake SGLang in
this process that misbehaves on request (a NaN logprob, a logprob of +5, a token id of 10M or
-1, no tokens, a million tokens for `max_tokens` 16, an unknown finish reason, HTTP 500, no
answer). Reported per kind of request: how many were tried, answered 2xx, answered a clean 4xx
(JSON in the protocol's error shape), 502 (the engine's fault), another 5xx, or not at all
within 30 s (a hang). Then: cross-session attempts refused, admin attempts refused (served
without and with `--admin-token`), sessions left after 10k rejected requests, healthy turns
while 20k half-open connections are held (the server's fd limit set to 16384, so they exceed
it), and the RSS after finishing 32 sessions at ~64K tokens.

    python benches/hostile_requests.py [--before /path/to/old/python] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import platform
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from served import Served  # noqa: E402

from support.field_shapes import REFUSED  # noqa: E402
from tokentrail.text.tokenizer import load_tokenizer  # noqa: E402

ADMIN = "bench-admin"
TIMEOUT_S = 30.0
GOOD_A = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
GOOD_O = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
TOOL = {"name": "Read", "description": "read", "input_schema": {"type": "object"}}
ROUTES = {"anthropic": "/v1/messages", "count": "/v1/messages/count_tokens"}
OPENAI = "/v1/chat/completions"


# -- the fake engine ------------------------------------------------------------------------------


class FakeEngine:
    """SGLang's /generate and /abort_request; the session id (X-Session-Id) picks a fault."""

    def __init__(self, sure_ids: list[int]) -> None:
        self.sure_ids = sure_ids
        self.aborts = 0
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=2**30)
        app.add_routes(
            [web.post("/generate", self.generate), web.post("/abort_request", self.abort)]
        )
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"{host}:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def abort(self, request: web.Request) -> web.Response:
        self.aborts += 1
        return web.json_response({})

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        fault = request.headers.get("X-Session-Id", "").removeprefix("engine-")
        ids, lps = list(self.sure_ids), [-0.5] * len(self.sure_ids)
        finish: dict[str, Any] = {"type": "stop", "matched": ids[-1]}
        if fault == "nan":
            lps[0] = math.nan
        elif fault == "positive":
            lps[0] = 5.0
        elif fault == "bigid":
            ids[0] = 10_000_000
        elif fault == "negid":
            ids[0] = -1
        elif fault == "empty":
            ids, lps, finish = [], [], {"type": "length", "length": 0}
        elif fault == "million":
            ids, lps = [ids[0]] * 1_000_000, [-0.1] * 1_000_000
            finish = {"type": "length", "length": len(ids)}
        elif fault == "finish":
            finish = {"type": "exploded"}
        elif fault == "500":
            return web.json_response({"error": {"message": "CUDA error (fake)"}}, status=500)
        elif fault == "hang":
            await asyncio.sleep(60)
        meta = {
            "id": body.get("rid"),
            "finish_reason": finish,
            "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": len(ids),
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids, strict=True)],
        }
        text = json.dumps({"text": "", "output_ids": ids, "meta_info": meta})
        return web.Response(text=text, content_type="application/json")


# -- requests -------------------------------------------------------------------------------------


class Tally:
    def __init__(self) -> None:
        self.rows: dict[str, Counter[str]] = {}

    def add(self, category: str, outcome: str) -> None:
        self.rows.setdefault(category, Counter())[outcome] += 1


def outcome(status: int | None, raw: bytes) -> str:
    if status is None:
        return "hang"
    if 200 <= status < 300:
        return "2xx"
    if status == 502:
        return "502"
    if status >= 500:
        return "5xx"
    try:
        body = json.loads(raw)
        error = body["error"]
        ok = isinstance(error, dict) and isinstance(error.get("message"), str)
    except (ValueError, KeyError, TypeError):
        ok = False
    return "clean 4xx" if ok else "other 4xx"


async def send(
    http: aiohttp.ClientSession,
    url: str,
    path: str,
    body: bytes | str | None,
    sid: str | None = "attacker",
    method: str = "POST",
    headers: dict[str, str] | None = None,
) -> tuple[int | None, bytes]:
    h = {"Content-Type": "application/json", **(headers or {})}
    if sid is not None:
        h.setdefault("Authorization", f"Bearer {sid}")
    try:
        async with http.request(
            method, url + path, data=body, headers=h, timeout=aiohttp.ClientTimeout(TIMEOUT_S)
        ) as resp:
            return resp.status, await resp.read()
    except TimeoutError:
        return None, b""
    except aiohttp.ClientError as exc:
        return 0, str(exc).encode()  # the server closed on us: counted under "other 4xx"


async def raw_send(
    url: str, data: bytes, wait_s: float = TIMEOUT_S, *, half_close: bool = False
) -> tuple[int | None, bytes]:
    """`data` over a fresh connection (then `shutdown(SHUT_WR)` when `half_close`, as `nc -N`
    does); the final answer's status and body, 1xx interim answers skipped."""
    host, port = url.removeprefix("http://").split(":")
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
    except OSError:
        return 0, b""
    try:
        writer.write(data)
        if half_close:
            writer.write_eof()
        status = 100
        while 100 <= status < 200:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), wait_s)
            status = int(head.split(b" ", 2)[1])
        rest = b""
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                rest = await asyncio.wait_for(reader.readexactly(int(line.split(b":")[1])), 5)
        return status, rest
    except TimeoutError:
        return None, b""
    except (asyncio.IncompleteReadError, ConnectionError, ValueError, IndexError):
        return 0, b""
    finally:
        writer.close()


def dumps(value: Any) -> str:
    return json.dumps(value)


BAD_VALUES: list[Any] = [None, "x", -1, 0, 1e308, 10**30, [], {}, [1, "a"], True, "\u0000"]


def malformed() -> list[tuple[str, str | bytes]]:
    out: list[tuple[str, str | bytes]] = []
    for path, base in ((ROUTES["anthropic"], GOOD_A), (ROUTES["count"], GOOD_A), (OPENAI, GOOD_O)):
        for raw in (b"", b"{", b"[1,2]", b'"x"', b"\xff\xfe", b"\xef\xbb\xbf{}", b"null", b"{}"):
            out.append((path, raw))
        keys = ["model", "max_tokens", "messages", "tools", "stream", "temperature", "top_p"]
        keys += ["top_k", "stop", "system" if path != OPENAI else "user", "seed"]
        for key in keys:
            for value in BAD_VALUES:
                out.append((path, dumps({**base, key: value})))
        for message in (
            {"role": "robot", "content": "x"},
            {"role": "user"},
            {"role": "user", "content": [{"type": "nope"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]},
            {"role": "tool", "tool_call_id": "x", "content": "y"},
            {"role": "assistant", "content": [{"type": "tool_use", "name": 5}]},
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]},
            "just a string",
        ):
            out.append((path, dumps({**base, "messages": [message]})))
    return out


def surrogates() -> list[tuple[str, str | bytes]]:
    s = "\\ud800"
    user = {"role": "user", "content": s}
    bodies = [
        (ROUTES["anthropic"], {**GOOD_A, "messages": [user]}),
        (ROUTES["anthropic"], {**GOOD_A, "system": s}),
        (ROUTES["anthropic"], {**GOOD_A, "tools": [{**TOOL, "name": s}]}),
        (ROUTES["anthropic"], {**GOOD_A, "tools": [{**TOOL, "description": s}]}),
        (ROUTES["anthropic"], {**GOOD_A, "tools": [{**TOOL, "input_schema": {s: 1}}]}),
        (ROUTES["anthropic"], {**GOOD_A, "stop_sequences": [s]}),
        (ROUTES["count"], {**GOOD_A, "messages": [user]}),
        (OPENAI, {**GOOD_O, "messages": [user]}),
        (OPENAI, {**GOOD_O, "user": s}),
        (OPENAI, {**GOOD_O, "metadata": {"session_id": s}}),
        (
            OPENAI,
            {
                **GOOD_O,
                "messages": [
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": '{"a": "\\\\ud800"}'},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c", "content": "r"},
                ],
            },
        ),
    ]
    return [(p, dumps(b).replace("\\\\ud800", "\\ud800")) for p, b in bodies]


def nesting() -> list[tuple[str, str | bytes]]:
    deep = "[" * 100_000 + "]" * 100_000
    # A schema 800 levels deep, written as text (no encoder recurses that far).
    schema = '{"type": "object", "properties": {"a": ' * 800 + '{"type": "string"}' + "}}" * 800
    tools = dumps({**GOOD_A, "tools": [{**TOOL, "input_schema": "SCHEMA"}]})
    with_schema = tools.replace('"SCHEMA"', schema)
    args = '{"a": ' * 900 + "1" + "}" * 900  # arguments: an object 900 levels deep
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": args}}
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "r"},
    ]
    out: list[tuple[str, str | bytes]] = [(p, deep) for p in (*ROUTES.values(), OPENAI)]
    out += [(ROUTES["anthropic"], with_schema), (ROUTES["count"], with_schema)]
    out.append((OPENAI, dumps({**GOOD_O, "messages": messages})))
    out.append(("/tokentrail/sessions/x/finish", deep))
    return out


def header_attacks() -> list[bytes]:
    def req(extra: bytes, line: bytes = b"POST /v1/messages HTTP/1.1") -> bytes:
        body = json.dumps(GOOD_A).encode()
        return (
            line
            + b"\r\nHost: x\r\nContent-Type: application/json\r\n"
            + extra
            + b"Content-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )

    return [
        req(b"Authorization: Bearer a\rb\r\n"),
        req(b"Authorization: Bearer " + b"\xff\xfe" + b"\r\n"),
        req(b"Authorization: Bearer " + b"k" * 10_000 + b"\r\n"),
        req(b"Authorization: Bearer \r\n"),
        req(b"x-api-key: a b c\r\n"),
        req(b"Authorization: Bearer s\r\nX-Big: " + b"a" * 20_000 + b"\r\n"),
        req(b"Authorization: Bearer s\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(300))),
        req(b"Authorization: Bearer s\r\n", b"POST /v1/messages?" + b"q" * 20_000 + b" HTTP/1.1"),
        req(b"Authorization: Bearer s\r\n", b"BREW /v1/messages HTTP/1.1"),
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,  # a TLS hello
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    ]


def huge() -> list[tuple[str, Callable[[], bytes]]]:
    def text(n: int) -> str:
        return ("lorem ipsum dolor sit amet " * (n // 27 + 1))[:n]

    return [
        (
            "/v1/messages/count_tokens",
            lambda: dumps(
                {**GOOD_A, "messages": [{"role": "user", "content": text(20_000_000)}]}
            ).encode(),
        ),
        (
            "/v1/messages/count_tokens",
            lambda: dumps(
                {**GOOD_A, "messages": [{"role": "user", "content": text(60_000_000)}]}
            ).encode(),
        ),
        (
            "/v1/messages",
            lambda: dumps(
                {**GOOD_A, "messages": [{"role": "user", "content": text(10_000_000)}]}
            ).encode(),
        ),
        (
            "/v1/messages",
            lambda: dumps(
                {**GOOD_A, "tools": [{**TOOL, "name": f"t{i}"} for i in range(50_000)]}
            ).encode(),
        ),
        (
            "/v1/messages",
            lambda: dumps(
                {**GOOD_A, "tools": [{**TOOL, "description": text(100_000)} for _ in range(60)]}
            ).encode(),
        ),
        (
            "/v1/messages",
            lambda: dumps(
                {**GOOD_A, "messages": [{"role": "user", "content": "x"}] * 20_001}
            ).encode(),
        ),
        ("/v1/messages", lambda: dumps({**GOOD_A, "max_tokens": 1e40}).encode()),
        ("/v1/messages", lambda: dumps({**GOOD_A, "max_tokens": 10**40}).encode()),
    ]


ENGINE_FAULTS = ["nan", "positive", "bigid", "negid", "empty", "million", "finish", "500", "hang"]


async def attack(url: str, tally: Tally) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    async with aiohttp.ClientSession() as http:
        for path, body in malformed():
            tally.add("malformed bodies", outcome(*await send(http, url, path, body)))
        for path, body in surrogates():
            tally.add("lone surrogates", outcome(*await send(http, url, path, body)))
        for path, body in nesting():
            sid = ADMIN if path.endswith("/finish") else "attacker"
            tally.add("deep nesting", outcome(*await send(http, url, path, body, sid)))
        for data in header_attacks():
            tally.add("bad headers, bad HTTP", outcome(*await raw_send(url, data)))
        for fault in ENGINE_FAULTS:
            body = dumps({**GOOD_A, "max_tokens": 16})
            result = await send(http, url, "/v1/messages", body, sid=f"engine-{fault}")
            tally.add("engine faults", outcome(*result))
        short = (
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s\r\n"
            b'Content-Length: 1000\r\n\r\n{"model":'
        )
        for _ in range(3):
            tally.add("body shorter than its length", outcome(*await raw_send(url, short)))
        for path, make in huge():
            tally.add("huge requests", outcome(*await send(http, url, path, make())))
        for pos, (path, body, headers, _) in enumerate(REFUSED):
            result = await send(http, url, path, dumps(body), f"fields-{pos}", headers=headers)
            tally.add("fields the APIs refuse", outcome(*result))
        for version in (b"1.1", b"1.0"):
            body = json.dumps(GOOD_A).encode()
            data = (
                b"POST /v1/messages HTTP/" + version + b"\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nAuthorization: Bearer half-closed\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            for _ in range(3):
                result = await raw_send(url, data, half_close=True)
                tally.add("half-closed requests", outcome(*result))

        # Another session's data: body fields naming the victim, under other keys.
        await send(http, url, OPENAI, dumps(GOOD_O), sid="victim")
        hijacks = [
            {"user": "victim"},
            {"metadata": {"session_id": "victim"}},
            {"user": "victim", "metadata": {"session_id": "victim"}},
        ]
        tried = 0
        for k in range(10):
            for fields in hijacks:
                await send(http, url, OPENAI, dumps({**GOOD_O, **fields}), sid=f"mallory{k}")
                tried += 1
        status, raw = await send(http, url, "/tokentrail/sessions/victim/finish", b"{}", sid=ADMIN)
        landed = len(json.loads(raw)["ledger"]["turns"]) - 1 if status == 200 else tried
        facts["cross-session"] = (tried - landed, tried)

    return facts


async def admin_attempts(url: str) -> tuple[int, int]:
    """Finish and drop someone else's session without the admin token: how many refused."""
    async with aiohttp.ClientSession() as http:
        await send(http, url, OPENAI, dumps(GOOD_O), sid="victim2")
        tries = [
            ("POST", "/tokentrail/sessions/victim2/finish", None),
            ("POST", "/tokentrail/sessions/victim2/finish", "victim2"),
            ("POST", "/tokentrail/sessions/victim2/finish", "mallory"),
            ("POST", "/tokentrail/sessions/victim2/finish", ADMIN + "x"),
            ("DELETE", "/tokentrail/sessions/victim2", None),
            ("DELETE", "/tokentrail/sessions/victim2", "victim2"),
            ("DELETE", "/tokentrail/sessions/victim2", "mallory"),
        ] * 3
        refused = 0
        for method, path, token in tries:
            status, _ = await send(http, url, path, b"{}", sid=token, method=method)
            refused += status in (401, 403)
        return refused, len(tries)


# -- sessions, connections, memory ----------------------------------------------------------------


async def rejected(url: str, n: int) -> tuple[int, int]:
    """Open sessions before and after `n` rejected requests, each under its own key."""
    async with aiohttp.ClientSession() as http:
        before = await sessions_open(http, url)
        bad = dumps({"max_tokens": -1, "messages": []})
        sem = asyncio.Semaphore(16)

        async def one(k: int) -> None:
            async with sem:
                await send(http, url, "/v1/messages", bad, sid=f"rejected-{k}")

        await asyncio.gather(*(one(k) for k in range(n)))
        return before, await sessions_open(http, url)


async def sessions_open(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(f"{url}/healthz") as resp:
        return int((await resp.json())["sessions"])


HOLDER = """
import socket, sys, time
socks = []
for _ in range(int(sys.argv[2])):
    try:
        socks.append(socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5))
    except OSError:
        break
print(len(socks), flush=True)
time.sleep(600)
"""


async def half_open(url: str, total: int, turns: int) -> tuple[int, int, int]:
    """Hold `total` connections that never send a request (two processes), then try turns."""
    port = url.rsplit(":", 1)[1]
    per = total // 2
    holders = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER, port, str(per)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    try:
        held = 0
        for h in holders:
            assert h.stdout is not None
            held += int(await asyncio.to_thread(h.stdout.readline) or 0)
        ok = 0
        async with aiohttp.ClientSession() as http:
            for k in range(turns):
                status, _ = await send(http, url, "/v1/messages", dumps(GOOD_A), sid=f"live{k}")
                ok += status == 200
        return held, ok, turns
    finally:
        for h in holders:
            h.kill()
            h.wait()


async def memory(served: Served, sessions: int, context_words: int) -> tuple[float, float, float]:
    """RSS (MB) before, after `sessions` sessions at ~2 x `context_words` tokens, after finish."""
    rng = random.Random(7)
    vocab = ["ka", "lo", "mi", "ne", "ru", "ta", "vo", "zi"]
    rss_before = served.rss_mb()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(900)) as http:

        async def one(k: int) -> None:
            text = " ".join(rng.choice(vocab) + rng.choice(vocab) for _ in range(context_words))
            messages = [{"role": "user", "content": text}]
            body = {**GOOD_A, "messages": messages}
            await send(http, served.url, "/v1/messages", dumps(body), sid=f"mem{k}")

        sem = asyncio.Semaphore(8)

        async def bounded(k: int) -> None:
            async with sem:
                await one(k)

        await asyncio.gather(*(bounded(k) for k in range(sessions)))
        rss_loaded = served.rss_mb()
        for k in range(sessions):
            await send(http, served.url, f"/tokentrail/sessions/mem{k}/finish", b"{}", sid=ADMIN)
        await asyncio.sleep(2.0)
    return rss_before, rss_loaded, served.rss_mb()


# -- the run --------------------------------------------------------------------------------------


def run(name: str, python_dir: Path | None, extra: list[str], opts: Any) -> dict[str, Any]:
    tokenizer = load_tokenizer()
    sure = tokenizer.encode("Sure.") + [tokenizer.eos_token_id]

    async def go() -> dict[str, Any]:
        engine = FakeEngine(sure)
        await engine.start()
        args = ["--engine", f"sglang://{engine.url}", *extra]
        try:
            # The admin routes as served by default: no --admin-token given.
            with Served(args, python_dir) as plain:
                default_admin = await admin_attempts(plain.url)
            args += ["--admin-token", ADMIN]
            with Served(args, python_dir, fd_limit=opts.server_fds) as served:
                tally = Tally()
                facts = await attack(served.url, tally)
                facts["admin default"] = default_admin
                facts["admin"] = await admin_attempts(served.url)
                facts["alive"] = served.alive()
                facts["rejected"] = await rejected(served.url, opts.rejected)
                facts["half-open"] = await half_open(served.url, opts.half_open, 5)
                facts["memory"] = await memory(served, opts.sessions, opts.context_words)
                facts["alive"] = facts["alive"] and served.alive()
                facts["aborts"] = engine.aborts
                facts["tracebacks"] = served.logged("Traceback")
                return {"name": name, "tally": tally, "facts": facts}
        finally:
            await engine.stop()

    return asyncio.run(go())


def print_run(result: dict[str, Any]) -> None:
    tally: Tally = result["tally"]
    facts = result["facts"]
    print(f"\n### {result['name']}\n")
    columns = ["2xx", "clean 4xx", "other 4xx", "502", "5xx", "hang"]
    print("| requests | tried | 2xx | clean 4xx | other 4xx | 502 (engine) | other 5xx | hangs |")
    print("|---|---|---|---|---|---|---|---|")
    total: Counter[str] = Counter()
    for category, counts in tally.rows.items():
        total.update(counts)
        cells = " | ".join(str(counts.get(c, 0)) for c in columns)
        print(f"| {category} | {sum(counts.values())} | {cells} |")
    cells = " | ".join(str(total.get(c, 0)) for c in columns)
    print(f"| **all** | {sum(total.values())} | {cells} |")
    refused, tried = facts["cross-session"]
    print(f"\ncross-session attempts that did not land in the victim's session: {refused}/{tried}")
    refused, tried = facts["admin default"]
    print(f"admin attempts, served without --admin-token: {refused}/{tried} refused")
    refused, tried = facts["admin"]
    print(f"admin attempts without the token, served with --admin-token: {refused}/{tried} refused")
    before, after = facts["rejected"]
    print(f"open sessions before / after {OPTS.rejected} rejected requests: {before} / {after}")
    held, ok, turns = facts["half-open"]
    print(
        f"half-open connections held: {held} (server fd limit {OPTS.server_fds}); healthy "
        f"turns answered meanwhile: {ok}/{turns}"
    )
    rss0, rss1, rss2 = facts["memory"]
    print(
        f"RSS: {rss0:.0f} MB at start, {rss1:.0f} MB with {OPTS.sessions} sessions at "
        f"~{2 * OPTS.context_words // 1000}K tokens, {rss2:.0f} MB after finishing them all"
    )
    print(
        f"server process alive at the end: {facts['alive']}; aborts sent to the engine: "
        f"{facts['aborts']}; tracebacks in the server's log: {facts['tracebacks']}"
    )


OPTS: Any = None


def main() -> int:
    global OPTS
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", type=Path, default=None, help="an older tree's python/ dir")
    parser.add_argument("--rejected", type=int, default=10_000)
    parser.add_argument("--half-open", type=int, default=20_000)
    parser.add_argument("--server-fds", type=int, default=16_384, help="the server's fd limit")
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--context-words", type=int, default=32_000)
    parser.add_argument("--quick", action="store_true")
    OPTS = opts = parser.parse_args()
    if opts.quick:
        opts.rejected, opts.half_open, opts.sessions, opts.context_words = 200, 400, 4, 2000
        opts.server_fds = 300
    # Shorter than the defaults (60 s, 600 s) so the slow cases finish within the run.
    after_flags = ["--body-timeout", "5", "--engine-timeout", "5"]
    results = []
    if opts.before is not None:
        results.append(run("before (--before tree)", opts.before, [], opts))
    results.append(
        run("after (this tree; --body-timeout 5 --engine-timeout 5)", None, after_flags, opts)
    )
    for result in results:
        print_run(result)
    print(
        f"\nmachine: {platform.machine()}, {multiprocessing.cpu_count()} cores, "
        f"CPython {platform.python_version()}; a hang is no answer within {TIMEOUT_S:g} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
