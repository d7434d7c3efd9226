"""The engine clients against fake SGLang and vLLM servers, and the scripted engine.

The fakes speak the real wire formats (tests/support/fake_engines.py); the scripted engine is
checked against the real Qwen3 tokenizer and `format_output`.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from support.fake_engines import IM_END, FakeSGLang, FakeVLLM
from tokentrail.engines import (
    Engine,
    EngineError,
    EngineSpecError,
    GenerateRequest,
    Generation,
    SamplingParams,
    SamplingParamsError,
    ScriptedEngine,
    ScriptError,
    SGLangEngine,
    VLLMEngine,
    create_engine,
)
from tokentrail.engines.base import ROUTING_HEADER, SESSION_HEADER
from tokentrail.engines.http import error_message
from tokentrail.engines.scripted import CALC_PY, blocks_to_message, scripted_logprob
from tokentrail.engines.sglang import parse_generate_response
from tokentrail.errors import EngineLimit
from tokentrail.text.constraints import forced_tool_call
from tokentrail.text.parsing import format_output
from tokentrail.text.tokenizer import LoadedTokenizer, load_tokenizer

# Readable token fixtures: a prompt, and what the fake engine samples for it.
SYSTEM, USER, HELLO, WORLD = 151644, 872, 9707, 1879
PROMPT = [SYSTEM, USER, HELLO, WORLD]
OUT_A, OUT_B = 40, 1079
SAMPLED = [OUT_A, OUT_B, IM_END]
SAMPLED_LOGPROBS = [-0.25, -1.5, -0.0625]


def fixed_reply(input_ids: list[int]) -> tuple[list[int], list[float], str]:
    return list(SAMPLED), list(SAMPLED_LOGPROBS), "stop"


def request(
    rid: str = "req-1", max_new_tokens: int = 64, messages: list[dict[str, Any]] | None = None
) -> GenerateRequest:
    return GenerateRequest(
        input_ids=list(PROMPT),
        sampling=SamplingParams(
            max_new_tokens=max_new_tokens, temperature=0.7, top_p=0.9, top_k=20, stop=["</x>"]
        ),
        session_id="session-42",
        request_id=rid,
        messages=messages or [],
    )


async def until(check: Callable[[], bool], limit: float = 5.0) -> None:
    """Wait for `check()`, polling; fail after `limit` seconds."""

    async def poll() -> None:
        while not check():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), limit)


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tokenizer() -> LoadedTokenizer:
    return load_tokenizer("builtin:qwen3")


# --- SGLang -------------------------------------------------------------------------------------


def test_sglang_generate_reads_ids_and_logprobs_from_output_token_logprobs() -> None:
    async def go() -> tuple[Generation, FakeSGLang]:
        async with FakeSGLang(fixed_reply) as srv:
            engine = SGLangEngine(srv.url)
            try:
                return await engine.generate(request()), srv
            finally:
                await engine.close()

    gen, srv = run(go())
    assert gen.output_ids == SAMPLED
    assert gen.logprobs == SAMPLED_LOGPROBS
    assert gen.finish_reason == "stop"
    assert gen.prompt_tokens == len(PROMPT)

    (sent,) = [r for r in srv.requests if r.path == "/generate"]
    assert sent.body["input_ids"] == PROMPT
    assert sent.body["rid"] == "req-1"
    assert sent.body["return_logprob"] is True
    assert sent.body["logprob_start_len"] == -1
    assert sent.body["stream"] is False
    params = sent.body["sampling_params"]
    assert params["max_new_tokens"] == 64
    assert (params["temperature"], params["top_p"], params["top_k"]) == (0.7, 0.9, 20)
    assert params["stop"] == ["</x>"]
    assert params["skip_special_tokens"] is False
    assert params["no_stop_trim"] is True
    assert "sampling_seed" not in params
    assert sent.headers[ROUTING_HEADER] == "session-42"
    assert sent.headers[SESSION_HEADER] == "session-42"


def test_sglang_sends_the_seed_and_reports_length() -> None:
    async def go() -> tuple[Generation, FakeSGLang]:
        async with FakeSGLang(fixed_reply) as srv:
            engine = SGLangEngine(srv.url)
            req = request(max_new_tokens=2)
            req.sampling.seed = 7
            try:
                return await engine.generate(req), srv
            finally:
                await engine.close()

    gen, srv = run(go())
    assert gen.output_ids == SAMPLED[:2]
    assert gen.finish_reason == "length"
    assert srv.bodies("/generate")[0]["sampling_params"]["sampling_seed"] == 7


def test_sglang_error_carries_the_engines_message_and_status() -> None:
    async def go() -> None:
        async with FakeSGLang(fixed_reply, mode="fail") as srv:
            engine = SGLangEngine(srv.url)
            try:
                await engine.generate(request())
            finally:
                await engine.close()

    with pytest.raises(EngineError) as info:
        run(go())
    assert info.value.engine_status == 500
    assert "CUDA out of memory (fake)" in info.value.message


def test_sglang_cancelled_generate_sends_abort_request_with_the_rid() -> None:
    async def go() -> FakeSGLang:
        async with FakeSGLang(fixed_reply, mode="hang") as srv:
            engine = SGLangEngine(srv.url)
            task = asyncio.create_task(engine.generate(request(rid="req-cancel")))
            await until(lambda: bool(srv.bodies("/generate")))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await engine.close()
            return srv

    srv = run(go())
    assert srv.aborted == ["req-cancel"]


def test_sglang_abort_ends_the_request_with_finish_abort() -> None:
    async def go() -> tuple[Generation, FakeSGLang]:
        async with FakeSGLang(fixed_reply, mode="hang") as srv:
            engine = SGLangEngine(srv.url)
            task = asyncio.create_task(engine.generate(request(rid="req-abort")))
            await until(lambda: bool(srv.bodies("/generate")))
            await engine.abort("req-abort")
            gen = await asyncio.wait_for(task, 5)
            await engine.close()
            return gen, srv

    gen, srv = run(go())
    assert srv.aborted == ["req-abort"]
    assert (gen.output_ids, gen.logprobs, gen.finish_reason) == ([], [], "abort")


def test_sglang_abort_of_an_unreachable_engine_does_not_raise() -> None:
    async def go() -> None:
        engine = SGLangEngine("http://127.0.0.1:9", timeout=2)
        await engine.abort("nobody")
        await engine.close()

    run(go())


def test_sglang_unreachable_engine_is_an_engine_error() -> None:
    async def go() -> None:
        engine = SGLangEngine("http://127.0.0.1:9", timeout=2)
        try:
            await engine.generate(request())
        finally:
            await engine.close()

    with pytest.raises(EngineError, match="cannot reach sglang"):
        run(go())


def test_sglang_answers_that_cannot_be_read_are_engine_errors() -> None:
    req = request()
    meta = {"finish_reason": {"type": "stop", "matched": IM_END}, "prompt_tokens": 4}
    good = {"output_ids": [1, 2], "meta_info": {**meta, "output_token_logprobs": [[-1.0, 1, None]]}}
    with pytest.raises(EngineError, match="disagree"):
        parse_generate_response(good, req, 0.0)
    with pytest.raises(EngineError, match="no meta_info"):
        parse_generate_response({"text": "hi"}, req, 0.0)
    with pytest.raises(EngineError, match="output_token_logprobs"):
        parse_generate_response({"meta_info": meta}, req, 0.0)
    bad_entry = {"meta_info": {**meta, "output_token_logprobs": [[None, 1, None]]}}
    with pytest.raises(EngineError, match="malformed"):
        parse_generate_response(bad_entry, req, 0.0)
    # An abort with an error status is the engine refusing the prompt, not a cancel.
    refused = {
        "type": "abort",
        "message": "Input length exceeds the context length",
        "status_code": 400,
    }
    body = {"meta_info": {"finish_reason": refused, "output_token_logprobs": []}}
    with pytest.raises(EngineError, match="context length") as info:
        parse_generate_response(body, req, 0.0)
    assert info.value.engine_status == 400


def test_one_engine_serves_successive_event_loops() -> None:
    async def serve_twice() -> list[Generation]:
        async with FakeSGLang(fixed_reply) as srv:
            engine = SGLangEngine(srv.url)

            async def once(rid: str) -> Generation:
                try:
                    return await engine.generate(request(rid=rid))
                finally:
                    await engine.close()

            # Each worker thread runs its own loop, as `asyncio.run` does per test.
            first = await asyncio.to_thread(asyncio.run, once("a"))
            second = await asyncio.to_thread(asyncio.run, once("b"))
            return [first, second]

    assert [g.output_ids for g in run(serve_twice())] == [SAMPLED, SAMPLED]


# --- vLLM ---------------------------------------------------------------------------------------


def test_vllm_generate_reads_token_ids_and_token_logprobs() -> None:
    async def go() -> tuple[list[Generation], FakeVLLM]:
        async with FakeVLLM(fixed_reply) as srv:
            engine = VLLMEngine(srv.url)
            try:
                gens = [await engine.generate(request(rid=rid)) for rid in ("r1", "r2")]
            finally:
                await engine.close()
            return gens, srv

    gens, srv = run(go())
    for gen in gens:
        assert gen.output_ids == SAMPLED
        assert gen.logprobs == SAMPLED_LOGPROBS
        assert gen.finish_reason == "stop"
        assert gen.prompt_tokens == len(PROMPT)
    # The model name is looked up once and cached.
    assert len([r for r in srv.requests if r.path == "/v1/models"]) == 1
    sent = [r for r in srv.requests if r.path == "/v1/completions"][0]
    body = sent.body
    assert body["model"] == "Qwen/Qwen3-8B"
    assert body["prompt"] == PROMPT
    assert body["max_tokens"] == 64
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.7, 0.9, 20)
    assert body["stop"] == ["</x>"]
    assert body["logprobs"] == 0
    assert body["return_token_ids"] is True
    assert body["skip_special_tokens"] is False
    assert body["include_stop_str_in_output"] is True
    assert body["stream"] is False
    assert "seed" not in body
    assert sent.headers[ROUTING_HEADER] == "session-42"
    assert sent.headers[SESSION_HEADER] == "session-42"


def test_vllm_given_model_skips_the_lookup_and_length_is_reported() -> None:
    async def go() -> tuple[Generation, FakeVLLM]:
        async with FakeVLLM(fixed_reply) as srv:
            engine = VLLMEngine(srv.url, model="my-model")
            req = request(max_new_tokens=1)
            req.sampling.seed = 3
            try:
                return await engine.generate(req), srv
            finally:
                await engine.close()

    gen, srv = run(go())
    assert (gen.output_ids, gen.finish_reason) == (SAMPLED[:1], "length")
    assert [r.path for r in srv.requests] == ["/v1/completions"]
    assert srv.requests[0].body["model"] == "my-model"
    assert srv.requests[0].body["seed"] == 3


def test_vllm_error_carries_the_engines_message_and_status() -> None:
    async def go() -> None:
        async with FakeVLLM(fixed_reply, mode="fail", fail_message="prompt too long") as srv:
            engine = VLLMEngine(srv.url, model="m")
            try:
                await engine.generate(request())
            finally:
                await engine.close()

    with pytest.raises(EngineError, match="prompt too long") as info:
        run(go())
    assert info.value.engine_status == 500


def test_vllm_cancelled_generate_closes_the_connection() -> None:
    async def go() -> FakeVLLM:
        async with FakeVLLM(fixed_reply, mode="hang") as srv:
            engine = VLLMEngine(srv.url, model="m")
            task = asyncio.create_task(engine.generate(request(rid="v-cancel")))
            await until(lambda: bool(srv.bodies("/v1/completions")))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The server-side handler is cancelled once it sees the disconnect.
            await until(lambda: bool(srv.disconnected))
            await engine.close()
            return srv

    srv = run(go())
    assert srv.disconnected == ["v-cancel"]


def test_vllm_abort_cancels_the_call_and_reports_abort() -> None:
    async def go() -> tuple[Generation, FakeVLLM]:
        async with FakeVLLM(fixed_reply, mode="hang") as srv:
            engine = VLLMEngine(srv.url, model="m")
            task = asyncio.create_task(engine.generate(request(rid="v-abort")))
            await until(lambda: bool(srv.bodies("/v1/completions")))
            await engine.abort("v-abort")
            gen = await asyncio.wait_for(task, 5)
            await until(lambda: bool(srv.disconnected))
            await engine.abort("v-abort")  # no longer in flight: a no-op
            await engine.close()
            return gen, srv

    gen, srv = run(go())
    assert (gen.output_ids, gen.finish_reason) == ([], "abort")
    assert srv.disconnected == ["v-abort"]


def test_error_bodies_of_both_engines_and_fastapi() -> None:
    assert error_message(b'{"error": {"message": "boom"}}') == "boom"
    assert error_message(b'{"object": "error", "message": "old vllm", "code": 400}') == "old vllm"
    assert error_message(b'{"detail": "Not Found"}') == "Not Found"
    assert error_message(b"<html>bad gateway</html>") == "<html>bad gateway</html>"
    assert error_message(b"") == "empty error response"


# --- scripted -----------------------------------------------------------------------------------


def conversation(assistant_turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Tidy calc.py"}]
    for _ in range(assistant_turns):
        messages.append({"role": "assistant", "content": ""})
        messages.append({"role": "tool", "content": "ok"})
    return messages


_SCRIPTED_IN_A_FRESH_PROCESS = """
import asyncio, json, sys
from tokentrail.engines.base import GenerateRequest, SamplingParams
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.text.tokenizer import load_tokenizer
messages = json.loads(sys.argv[1])
req = GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=4096), "s", "r", messages=messages)
gen = asyncio.run(ScriptedEngine(load_tokenizer()).generate(req))
print(json.dumps([gen.output_ids, gen.logprobs, gen.finish_reason]))
"""


def test_scripted_is_deterministic_across_processes(tokenizer: LoadedTokenizer) -> None:
    # Replays and recovery rely on it: another process (another hash seed) gives the same turn.
    import os
    import subprocess
    import sys

    messages = conversation(1)
    ours = run(ScriptedEngine(tokenizer).generate(request(max_new_tokens=4096, messages=messages)))
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPTED_IN_A_FRESH_PROCESS, json.dumps(messages)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    ids, logprobs, finish = json.loads(out)
    assert (ours.output_ids, ours.logprobs, ours.finish_reason) == (ids, logprobs, finish)
    assert finish == "stop" and len(ids) > 1


def test_scripted_output_is_format_output_then_im_end(tokenizer: LoadedTokenizer) -> None:
    engine = ScriptedEngine(tokenizer)
    for index in range(len(engine.replies) + 2):
        gen = run(engine.generate(request(max_new_tokens=4096, messages=conversation(index))))
        message = blocks_to_message(engine.reply_blocks(index))
        expected = format_output(message, tool_format="hermes")
        assert gen.output_ids[-1] == tokenizer.token_id("<|im_end|>")
        assert tokenizer.decode(gen.output_ids) == expected + "<|im_end|>"
        assert gen.output_ids[:-1] == tokenizer.encode(expected)
        assert len(gen.logprobs) == len(gen.output_ids)
        for lp in gen.logprobs:
            assert -3.0 <= lp < 0
            assert struct.unpack("<f", struct.pack("<f", lp))[0] == lp


def test_default_script_is_a_claude_code_session_over_calc_py(tokenizer: LoadedTokenizer) -> None:
    engine = ScriptedEngine(tokenizer)
    calls = [
        [(b["name"], b["input"]) for b in reply if b["type"] == "tool_use"]
        for reply in engine.replies
    ]
    assert [[name for name, _ in reply] for reply in calls] == [
        ["Read"],
        ["Edit"],
        ["Write"],
        ["Bash"],
        ["Write"],
        [],
    ]
    (read,), (edit,), (write_py,), (bash,), (write_md,), () = calls
    assert read[1] == {"file_path": "calc.py"}
    assert set(edit[1]) == {"file_path", "old_string", "new_string"}
    assert edit[1]["file_path"] == "calc.py"
    assert CALC_PY.count(edit[1]["old_string"]) == 1
    assert any(line != line.rstrip() for line in edit[1]["new_string"].splitlines())
    assert write_py[1]["file_path"].endswith(".py")
    assert any(line != line.rstrip() for line in write_py[1]["content"].splitlines())
    assert set(bash[1]) == {"command", "description"}
    assert write_md[1]["file_path"].endswith(".md")
    assert engine.replies[-1] and all(b["type"] != "tool_use" for b in engine.replies[-1])
    for _, args in [read, edit, write_py, write_md]:
        assert not Path(args["file_path"]).is_absolute()
    # Past the end, a short final text.
    assert engine.reply_text(len(engine.replies)) == "Done."


def test_scripted_truncates_at_max_new_tokens(tokenizer: LoadedTokenizer) -> None:
    engine = ScriptedEngine(tokenizer)
    full = run(engine.generate(request(max_new_tokens=4096)))
    cut = run(engine.generate(request(max_new_tokens=5)))
    assert cut.finish_reason == "length"
    assert cut.output_ids == full.output_ids[:5]
    assert cut.logprobs == full.logprobs[:5]
    exact = run(engine.generate(request(max_new_tokens=len(full.output_ids))))
    assert exact.finish_reason == "stop"


def test_scripted_stops_on_a_stop_string(tokenizer: LoadedTokenizer) -> None:
    script = [[{"type": "text", "text": "alpha beta STOP gamma"}]]
    engine = ScriptedEngine(tokenizer, script)
    req = request(max_new_tokens=100)
    req.sampling.stop = ["STOP"]
    gen = run(engine.generate(req))
    assert gen.finish_reason == "stop"
    text = tokenizer.decode(gen.output_ids)
    assert text.endswith("STOP") and "gamma" not in text


def test_scripted_reads_a_script_file(tokenizer: LoadedTokenizer, tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    reply = [{"type": "tool_use", "name": "Bash", "input": {"command": "ls", "description": "l"}}]
    path.write_text(json.dumps([reply]))
    engine = create_engine(f"scripted:{path}", tokenizer)
    gen = run(engine.generate(request(max_new_tokens=4096)))
    assert '"name": "Bash"' in tokenizer.decode(gen.output_ids)

    path.write_text(json.dumps([[{"type": "image"}]]))
    with pytest.raises(ScriptError, match="type must be one of"):
        ScriptedEngine(tokenizer, path)
    with pytest.raises(ScriptError, match="cannot read"):
        ScriptedEngine(tokenizer, tmp_path / "missing.json")


def test_scripted_logprob_is_stable() -> None:
    assert scripted_logprob(OUT_A, 0) == scripted_logprob(OUT_A, 0)
    assert scripted_logprob(OUT_A, 0) != scripted_logprob(OUT_A, 1)


# --- the contract -------------------------------------------------------------------------------


def test_create_engine_parses_specs(tokenizer: LoadedTokenizer) -> None:
    sglang = create_engine("sglang://10.0.0.5:30000", tokenizer)
    assert isinstance(sglang, SGLangEngine) and sglang.base_url == "http://10.0.0.5:30000"
    vllm = create_engine("vllm://localhost:8000/", tokenizer)
    assert isinstance(vllm, VLLMEngine) and vllm.base_url == "http://localhost:8000"
    https = create_engine("sglang://https://gpu.example:443", tokenizer)
    assert isinstance(https, SGLangEngine) and https.base_url == "https://gpu.example:443"
    scripted = create_engine("scripted", tokenizer)
    assert isinstance(scripted, ScriptedEngine)
    for engine in (sglang, vllm, scripted):
        assert isinstance(engine, Engine)
    assert {sglang.name, vllm.name, scripted.name} == {"sglang", "vllm", "scripted"}


@pytest.mark.parametrize(
    "spec", ["", "openai://h:1", "http://127.0.0.1:30000", "sglang://", "vllm://:8000", "scripted:"]
)
def test_create_engine_rejects_bad_specs(tokenizer: LoadedTokenizer, spec: str) -> None:
    with pytest.raises(EngineSpecError) as info:
        create_engine(spec, tokenizer)
    assert isinstance(info.value, ValueError)


def test_sampling_params_merged() -> None:
    base = SamplingParams(max_new_tokens=100)
    merged = base.merged({"temperature": 0, "stop": "END", "seed": None, "top_k": 5})
    assert merged == SamplingParams(100, temperature=0.0, top_k=5, stop=["END"])
    assert base == SamplingParams(100)  # unchanged
    with pytest.raises(SamplingParamsError, match="unknown sampling parameter"):
        base.merged({"max_tokens": 5})
    with pytest.raises(SamplingParamsError, match="integer"):
        base.merged({"max_new_tokens": 1.5})
    with pytest.raises(SamplingParamsError, match="number"):
        base.merged({"temperature": "hot"})


def test_generation_holds_one_logprob_per_token() -> None:
    with pytest.raises(EngineError, match="2 tokens but 1 logprobs"):
        Generation([1, 2], [-0.1], "stop", 3, 0.0)
    with pytest.raises(EngineError, match="finish reason"):
        Generation([1], [-0.1], "eos", 3, 0.0)


def test_request_ids_are_unique_by_default() -> None:
    a = GenerateRequest([1], SamplingParams(1), "s")
    b = GenerateRequest([1], SamplingParams(1), "s")
    assert a.request_id != b.request_id


# --- forced tool calls: structured-output constraints ------------------------------------------

FORCED = forced_tool_call("hermes", ["Read", "Bash"], reasoning="qwen3")


def test_sglang_sends_a_forced_call_as_one_regex_string() -> None:
    async def go() -> FakeSGLang:
        async with FakeSGLang(fixed_reply) as srv:
            engine = SGLangEngine(srv.url)
            req = request()
            req.constraint = FORCED
            try:
                await engine.generate(req)
            finally:
                await engine.close()
            return srv

    params = run(go()).bodies("/generate")[0]["sampling_params"]
    assert params["regex"] == FORCED.regex
    assert not {"json_schema", "ebnf", "structural_tag"} & params.keys()


def test_vllm_sends_a_forced_call_as_structured_outputs() -> None:
    async def go() -> FakeVLLM:
        async with FakeVLLM(fixed_reply) as srv:
            engine = VLLMEngine(srv.url, model="m")
            req = request()
            req.constraint = FORCED
            try:
                await engine.generate(req)
            finally:
                await engine.close()
            return srv

    body = run(go()).bodies("/v1/completions")[0]
    # Not `guided_regex`: vLLM >= 0.12 ignores it and samples unconstrained.
    assert body["structured_outputs"] == {"regex": FORCED.regex}
    assert not [k for k in body if k.startswith("guided_")]


def test_the_constraint_is_the_models_own_call_markup(tokenizer: LoadedTokenizer) -> None:
    import re

    def text(message: dict[str, Any]) -> str:
        return format_output(message, tool_format="hermes")

    read = {"type": "function", "function": {"name": "Read", "arguments": {"file_path": "a"}}}
    other = {"type": "function", "function": {"name": "Write", "arguments": {}}}
    assert re.fullmatch(FORCED.regex, text({"content": "", "tool_calls": [read]}))
    assert re.fullmatch(
        FORCED.regex, text({"content": "", "reasoning_content": "hm", "tool_calls": [read] * 2})
    )
    assert not re.fullmatch(FORCED.regex, text({"content": "Sure.", "tool_calls": [read]}))
    assert not re.fullmatch(FORCED.regex, text({"content": "", "tool_calls": [other]}))
    assert not re.fullmatch(FORCED.regex, text({"content": "No call."}))


def test_scripted_honours_a_constraint_only_where_its_script_does(
    tokenizer: LoadedTokenizer,
) -> None:
    script = [
        [{"type": "tool_use", "name": "Read", "input": {"file_path": "a"}}],
        [{"type": "text", "text": "Done."}],
    ]
    engine = ScriptedEngine(tokenizer, script)
    req = request(max_new_tokens=4096, messages=[{"role": "user", "content": "go"}])
    req.constraint = FORCED
    assert run(engine.generate(req)).finish_reason == "stop"
    req.messages = conversation(1)
    with pytest.raises(EngineLimit, match="cannot constrain it: reply 1 is not a call to one of"):
        run(engine.generate(req))
