"""The real Codex CLI (the release `support.harness_versions` pins, from npm) driven headless
against the adapter's Responses API.

The scripted model reads a file, runs two commands in parallel, sends an `apply_patch` that does
not apply, then one that does, runs the test and answers; a second `codex exec resume` process
continues the same thread. Codex replays every item it was sent, so the session must stay one
tree: one sample, every generated token trained.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

import pytest

from support.codex import CODEX_VERSION, install_codex, run_codex, write_home
from support.engine_thread import engine_in_thread
from support.fake_engines import FakeSGLang, FakeVLLM
from support.serve import resume_checks, serving_in_thread
from support.stand_in import scripted_reply
from support.tap import tapped
from tokentrail.adapter import Adapter, AdapterConfig
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.engines.sglang import SGLangEngine
from tokentrail.engines.vllm import VLLMEngine
from tokentrail.sim.codex import CALC, CODEX_SCRIPT, TEST

SCRIPT = CODEX_SCRIPT


@pytest.fixture(scope="module")
def codex_exe() -> Path:
    if shutil.which("npm") is None:
        reason = f"npm is missing: cannot install @openai/codex@{CODEX_VERSION}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        print(f"\n*** SKIPPING the real Codex test: {reason} ***", file=sys.stderr)
        pytest.skip(reason)
    exe = install_codex()
    assert exe is not None
    return exe


def test_real_codex_session_and_its_resume_train_every_token(
    codex_exe: Path, tokenizer, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "calc.py").write_text(CALC)
    (work / "test_calc.py").write_text(TEST)
    adapter = Adapter(
        engine=ScriptedEngine(tokenizer, SCRIPT),
        tokenizer=tokenizer,
        config=AdapterConfig(verify_resume=True),
    )
    with serving_in_thread(adapter) as (url, loop):
        home = write_home(tmp_path / "codex-home", url)
        first = run_codex(
            codex_exe, "Space the sum in calc.py.", home=home, session_id="cx", cwd=work
        )
        assert first.returncode == 0, first.stderr[-3000:]
        assert first.thread_id
        second = run_codex(
            codex_exe,
            "Check calc.py once more.",
            home=home,
            session_id="cx",
            cwd=work,
            resume=first.thread_id,
        )
        assert second.returncode == 0, second.stderr[-3000:]
        trajectory = asyncio.run_coroutine_threadsafe(
            adapter.finish_trajectory("cx", reward=1.0), loop
        ).result(60)

    # What Codex ran: the failed patch did not apply, the good one did, byte for byte.
    assert (work / "calc.py").read_text() == "def add(a, b):\n    return a + b  \n"
    commands = [c["command"] for c in first.items("command_execution")]
    assert any("test_calc.py" in c for c in commands)
    assert "calc.py is as it should be." in [m["text"] for m in second.items("agent_message")]

    ledger = trajectory.ledger
    assert len(ledger.turns) == len(SCRIPT)
    assert ledger.generated_tokens > 0
    assert ledger.trained_tokens == ledger.generated_tokens
    assert sum(t.trained + t.masked_total for t in ledger.turns) == ledger.generated_tokens
    # Codex sends every item back as it got it: nothing to restore, nothing forks, and the
    # resumed process continues the same tree.
    assert ledger.restored_echoes == 0
    assert len(trajectory.samples) == 1
    assert set(trajectory.drift_counts) == {"clean"}
    assert [t.history for t in ledger.turns[1:]] == ["splice"] * (len(SCRIPT) - 1)
    by_tool = ledger.by_tool
    assert by_tool["apply_patch"]["turns"] == by_tool["apply_patch"]["turns_trained"] == 2
    # Every request was translated resumed and in full, and the two were the same.
    checks = resume_checks(adapter.metrics.render()[0].decode())
    assert checks["mismatch"] == 0 and checks["same"] >= len(ledger.turns)


# The Responses events that carry an item's text as it is sampled.
DELTAS = {
    "response.reasoning_text.delta",
    "response.output_text.delta",
    "response.function_call_arguments.delta",
    "response.custom_tool_call_input.delta",
}


@pytest.mark.parametrize("wire", ["sglang", "vllm"])
def test_real_codex_over_a_streaming_engine(
    codex_exe: Path, tokenizer, tmp_path: Path, wire: str
) -> None:
    """The first process above with the engine streamed (`--engine-stream`) from a stand-in
    that waits 1 s before each first token and streams two tokens an event, 30 ms apart (at 10
    ms, a loaded machine once took a whole short reply in two of the proxy's reads): the
    Responses stream keeps Codex waiting with keepalives (0.3 s), then its reasoning, text and
    tool-call deltas reach Codex as they are sampled, read apart before `response.completed`
    (a proxy between the two records what arrived when); Codex takes every reply without a
    retry, and what is recorded is what was streamed."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "calc.py").write_text(CALC)
    (work / "test_calc.py").write_text(TEST)
    fake_cls = FakeSGLang if wire == "sglang" else FakeVLLM
    fake = fake_cls(
        scripted_reply(SCRIPT), first_token_s=1.0, tokens_per_event=2, token_delay_s=0.03
    )
    with engine_in_thread(fake) as stand_in:
        client = (SGLangEngine if wire == "sglang" else VLLMEngine)(stand_in.url, stream=True)
        adapter = Adapter(
            engine=client,
            tokenizer=tokenizer,
            config=AdapterConfig(live_stream=True, keepalive_s=0.3),
        )
        with serving_in_thread(adapter) as (url, loop), tapped(url) as tap:
            home = write_home(tmp_path / "codex-home", tap.url)
            first = run_codex(
                codex_exe, "Space the sum in calc.py.", home=home, session_id="cxs", cwd=work
            )
            assert first.returncode == 0, first.stderr[-3000:]
            trajectory = asyncio.run_coroutine_threadsafe(
                adapter.finish_trajectory("cxs", reward=1.0), loop
            ).result(60)

    assert (work / "calc.py").read_text() == "def add(a, b):\n    return a + b  \n"
    ledger = trajectory.ledger
    assert len(fake.streamed) == len(ledger.turns) >= 4  # every streamed answer was taken
    assert all(len(events) > 3 for events in fake.streamed.values())
    assert ledger.trained_tokens == ledger.generated_tokens > 0
    assert len(trajectory.samples) == 1

    replies: list[list[tuple[int, str]]] = []
    for events in tap.events():
        while any(name == "response.completed" for _, name in events):
            end = next(i for i, (_, name) in enumerate(events) if name == "response.completed")
            replies.append(events[: end + 1])
            events = events[end + 1 :]
    assert len(replies) == len(ledger.turns)
    seen: set[str] = set()
    for reply in replies:
        done = reply[-1][0]
        early = {(read, name) for read, name in reply if name in DELTAS and read < done}
        # Deltas in several reads apart, before the read that completed the reply.
        assert len({read for read, _ in early}) >= 3, reply
        assert reply[0] == (reply[0][0], "response.created") and reply[0][0] < min(early)[0]
        seen |= {name for _, name in early}
    assert seen == DELTAS  # Codex's free-form apply_patch streams its input too


@pytest.mark.parametrize("keepalive_s", [0.5, 400.0], ids=["keepalive", "none"])
def test_real_codex_waits_through_an_engine_stall_only_while_kept_alive(
    codex_exe: Path, tokenizer, tmp_path: Path, keepalive_s: float
) -> None:
    """`benches/keepalive_stall.py` scaled down: the engine waits 4 s before its first token,
    Codex's stream idle timeout is 2 s and it may not retry. Kept alive (every 0.5 s, as
    Responses events: Codex's timeout counts events, not bytes) it takes the reply on its one
    request and the turn is trained; with no keepalive before the first token (an interval
    longer than the stall) it gives up at its idle timeout."""
    reply = "The plan is sound."
    fake = FakeSGLang(scripted_reply([[{"type": "text", "text": reply}]]), first_token_s=4.0)
    with engine_in_thread(fake) as stand_in:
        client = SGLangEngine(stand_in.url, stream=True)
        adapter = Adapter(
            engine=client,
            tokenizer=tokenizer,
            config=AdapterConfig(live_stream=True, keepalive_s=keepalive_s),
        )
        with serving_in_thread(adapter) as (url, loop):
            home = write_home(tmp_path / "codex-home", url)
            config = (home / "config.toml").read_text()
            assert "stream_idle_timeout_ms = 30000" in config
            config = config.replace(
                "stream_idle_timeout_ms = 30000", "stream_idle_timeout_ms = 2000"
            )
            (home / "config.toml").write_text(config)
            run = run_codex(codex_exe, "Check the plan.", home=home, session_id="cxk", cwd=tmp_path)
            if keepalive_s < 4.0:
                assert run.returncode == 0, run.stderr[-3000:]
                trajectory = asyncio.run_coroutine_threadsafe(
                    adapter.finish_trajectory("cxk", reward=1.0), loop
                ).result(60)

    assert len(fake.bodies("/generate")) == 1  # no retry either way
    if keepalive_s < 4.0:
        assert [m["text"] for m in run.items("agent_message")] == [reply]
        assert trajectory.ledger.trained_tokens == trajectory.ledger.generated_tokens > 0
    else:
        assert run.returncode != 0
        (failed,) = [e for e in run.events if e.get("type") == "turn.failed"]
        assert "idle timeout" in failed["error"]["message"]
        assert not run.items("agent_message")


def test_real_codex_view_image_becomes_vision_tokens(codex_exe: Path, tmp_path: Path) -> None:
    """Codex's `view_image` answers with the file as an `input_image` data URL; for Qwen3-VL
    the prompt holds its vision tokens and the sample carries the image."""
    from PIL import Image

    from tokentrail.text.tokenizer import load_tokenizer

    work = tmp_path / "work"
    work.mkdir()
    Image.new("RGB", (256, 160), (20, 160, 40)).save(work / "plot.png")
    script = [
        [{"type": "tool_use", "name": "view_image", "input": {"path": str(work / "plot.png")}}],
        [{"type": "text", "text": "A green rectangle."}],
    ]
    vl = load_tokenizer("builtin:qwen3-vl")
    adapter = Adapter(engine=ScriptedEngine(vl, script), tokenizer=vl)
    with serving_in_thread(adapter) as (url, loop):
        home = write_home(tmp_path / "codex-home", url)
        run = run_codex(codex_exe, "Look at plot.png.", home=home, session_id="cv", cwd=work)
        assert run.returncode == 0, run.stderr[-3000:]
        trajectory = asyncio.run_coroutine_threadsafe(
            adapter.finish_trajectory("cv", reward=1.0), loop
        ).result(60)

    assert "A green rectangle." in [m["text"] for m in run.items("agent_message")]
    (sample,) = trajectory.samples
    (image,) = sample.metadata["images"]
    pad = vl.token_id("<|image_pad|>")
    tokens = sample.tokens.tolist()
    assert tokens.count(pad) == image["tokens"] > 0
    assert tokens[image["offset"] : image["offset"] + image["tokens"]] == [pad] * image["tokens"]
    inputs = sample.multimodal_inputs()
    assert inputs is not None and len(inputs["images"]) == 1
    assert trajectory.ledger.trained_tokens == trajectory.ledger.generated_tokens > 0


def test_real_codex_reports_the_engine_error_of_a_failed_stream(
    codex_exe: Path, tokenizer, tmp_path: Path
) -> None:
    """An engine that fails after the 200 went out (`--engine-stream`): the Responses stream
    ends with `response.failed`, and Codex reports the engine's error message, not that the
    stream closed before `response.completed`."""
    fake = FakeSGLang(scripted_reply([[{"type": "text", "text": "The plan is sound."}]]))
    original = fake._stream

    async def failing(request, rid, n, event, *rest):  # type: ignore[no-untyped-def]
        def broken(a, b, last):  # type: ignore[no-untyped-def]
            if a >= 2:
                return {"error": {"message": "CUDA error: device-side assert"}}
            return event(a, b, last)

        return await original(request, rid, n, broken, *rest)

    fake._stream = failing  # type: ignore[method-assign]
    with engine_in_thread(fake) as stand_in:
        client = SGLangEngine(stand_in.url, stream=True)
        adapter = Adapter(
            engine=client, tokenizer=tokenizer, config=AdapterConfig(live_stream=True)
        )
        with serving_in_thread(adapter) as (url, _loop):
            home = write_home(tmp_path / "codex-home", url)
            run = run_codex(codex_exe, "Check the plan.", home=home, session_id="cxf", cwd=tmp_path)

    assert run.returncode != 0
    (failed,) = [e for e in run.events if e.get("type") == "turn.failed"]
    assert "device-side assert" in failed["error"]["message"], failed
    assert "stream closed" not in failed["error"]["message"]
