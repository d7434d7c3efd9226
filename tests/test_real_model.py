"""A real model in the loop: tiny Qwen3 / Qwen3-MoE (seeded random weights, the real Qwen3
vocabulary) answer real Claude Code and Codex sessions and the simulated harness behaviours
through tokentrail, teacher-forced on their scripts, and the recompute audit holds every trained
token's logprob and every position's routed experts to what one uncached forward pass over the
sample computes. The audit must also fail where a sample is wrong: a context token altered,
routing shifted by one position, history re-rendered over what was sampled.

torch runs on one thread here (the CI machine has two cores).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from support.claude_code import CLAUDE_CODE_VERSION, install_claude_code, run_claude
from support.codex import install_codex, run_codex, write_home
from support.serve import resume_checks, serving, serving_in_thread
from support.threads import one_torch_thread
from tokentrail.cli import main as cli_main
from tokentrail.engines.base import GenerateRequest, ReplayRequest, SamplingParams
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.engines.transformers_lm import TransformersEngine
from tokentrail.kinds import History, Restore
from tokentrail.model.audit import DEFAULT_TOLERANCE, recompute_samples
from tokentrail.model.forward import CausalLM, crop
from tokentrail.model.tiny import tiny_model, tiny_names
from tokentrail.sim.codex import CALC as CODEX_CALC
from tokentrail.sim.codex import CODEX_SCRIPT, TEST
from tokentrail.sim.harness import Behaviour, SessionSpec, simulate
from tokentrail.sim.model import SimulatedEngine
from tokentrail.storage.export import write_samples
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.trajectory.sample import Sample

MODELS = ("qwen3", "qwen3-moe")


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def model_dirs() -> dict[str, Path]:
    return {name: tiny_model(name) for name in MODELS}


@pytest.fixture(scope="module")
def lms(model_dirs: dict[str, Path]) -> dict[str, CausalLM]:
    return {name: CausalLM(path) for name, path in model_dirs.items()}


def engine_for(path: Path, inner_script=None, *, simulated: bool = False) -> TransformersEngine:
    tokenizer = load_tokenizer(str(path))
    inner = SimulatedEngine(tokenizer) if simulated else ScriptedEngine(tokenizer, inner_script)
    return TransformersEngine(path, tokenizer, inner=inner)


def assert_audit_passes(report, what: str) -> None:
    print(f"\n{what}\n{report.table()}")
    assert report.trained > 0
    assert report.within_tolerance == report.trained, report.table()
    assert report.max_error <= DEFAULT_TOLERANCE
    assert report.routing_share == 1.0
    assert report.ok


# --- the tiny models and the forward pass ----------------------------------------------------


@pytest.mark.parametrize("name", tiny_names())
def test_tiny_models_load_with_their_builtin_vocabulary(name: str) -> None:
    from tokentrail.core.routing import model_shapes, read_model_config
    from tokentrail.model.tiny import TINY_MODELS

    path = tiny_model(name)
    assert tiny_model(name) == path  # built once, then read from the cache
    builtin = load_tokenizer(TINY_MODELS[name].tokenizer)
    tokenizer = load_tokenizer(str(path))
    assert tokenizer.family == builtin.family
    assert tokenizer.vocab_size == builtin.vocab_size
    assert tokenizer.end_token_ids == builtin.end_token_ids
    text = "def add(a, b):\n    return a + b  # the sum\n"
    assert tokenizer.encode(text) == builtin.encode(text)
    lm = CausalLM(path)
    assert lm.vocab_size == builtin.vocab_size
    routing = model_shapes(read_model_config(path))[0]
    assert lm.routing == routing
    assert lm.is_moe == (routing is not None)


@pytest.mark.parametrize("name", ["qwen3-moe", "deepseek-v3", "llama3"])
def test_a_cached_forward_in_chunks_equals_one_pass(name: str, monkeypatch) -> None:
    """The engine's fast path (KV cache, chunks, a crop and a re-feed) against one forward pass
    over the whole sequence, on generated splits; prefill chunks of 64 positions."""
    import tokentrail.model.forward

    monkeypatch.setattr(tokentrail.model.forward, "PREFILL_CHUNK", 64)
    lm = CausalLM(tiny_model(name))
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 120000, 600).tolist()
    hidden, rows = lm.forward(ids)
    reference = lm.logprobs(hidden[:-1], ids[1:])
    for _ in range(3):
        cuts = sorted(rng.choice(np.arange(1, len(ids)), size=3, replace=False).tolist())
        cache, parts, part_rows = lm.new_cache(), [], []
        start = 0
        for cut in [*cuts, len(ids)]:
            h, r = lm.forward(ids[start:cut], cache)
            parts.append(h)
            part_rows.append(r)
            start = cut
        # Cut back and feed the tail again, as a divergent turn does.
        back = cuts[1]
        crop(cache, back)
        h, r = lm.forward(ids[back:], cache)
        import torch

        chunked = torch.cat([*parts[:2], h])
        assert len(chunked) == len(ids)
        again = lm.logprobs(chunked[:-1], ids[1:])
        assert np.abs(again - reference).max() < 1e-5
        if rows is not None:
            joined = np.concatenate([*part_rows[:2], r])
            assert np.array_equal(np.sort(joined, -1), np.sort(rows, -1))
    if name == "deepseek-v3":
        assert rows is not None and not rows[:, 0].any()  # the dense first layer: zeros


# --- the engine ------------------------------------------------------------------------------


def test_sampling_is_seeded_and_its_logprobs_are_the_models(model_dirs) -> None:
    path = model_dirs["qwen3-moe"]
    tokenizer = load_tokenizer(str(path))
    engine = TransformersEngine(path, tokenizer)
    prompt = tokenizer.encode(tokenizer.render_chat([{"role": "user", "content": "Hello"}]))
    routing = engine.routing
    replay = ReplayRequest(routed_start=0, routing=routing)

    def turn(session: str, **sampling):
        params = SamplingParams(max_new_tokens=12, **sampling)
        req = GenerateRequest(prompt, params, session_id=session, replay=replay)
        return asyncio.run(engine.generate(req))

    a = turn("a", temperature=0.8, top_p=0.9, top_k=40, seed=3)
    b = turn("b", temperature=0.8, top_p=0.9, top_k=40, seed=3)
    c = turn("c", temperature=0.8, top_p=0.9, top_k=40, seed=4)
    assert a.output_ids == b.output_ids and a.logprobs == b.logprobs
    assert a.output_ids != c.output_ids
    assert a.finish_reason in ("stop", "length") and len(a.output_ids) <= 12
    # top_k=1 is greedy whatever the temperature; greedy logprobs are the unscaled ones.
    greedy = turn("d", temperature=0.0)
    assert turn("e", temperature=1.3, top_k=1, seed=9).output_ids == greedy.output_ids
    for gen, temperature in ((a, 0.8), (greedy, 0.0)):
        n = len(prompt) + len(gen.output_ids)
        rows = np.zeros((n, routing.layers, routing.top_k), dtype=np.int32)
        assert gen.routed_experts is not None and gen.routed_experts.rows is not None
        rows[: n - 1] = gen.routed_experts.rows
        sample = Sample(
            tokens=np.asarray(prompt + gen.output_ids, dtype=np.uint32),
            loss_mask=np.ones(len(gen.output_ids), dtype=np.uint8),
            rollout_log_probs=np.asarray(gen.logprobs, dtype=np.float32),
            response_length=len(gen.output_ids),
            routed_experts=rows,
        )
        assert_audit_passes(
            recompute_samples(engine.lm, [sample], temperature=temperature), "sampled"
        )


def test_each_session_keeps_its_prefix_between_turns(model_dirs) -> None:
    path = model_dirs["qwen3"]
    tokenizer = load_tokenizer(str(path))
    engine = TransformersEngine(path, tokenizer, inner=ScriptedEngine(tokenizer, [[]] * 4))
    rng = np.random.default_rng(1)
    first = rng.integers(0, 150000, 300).tolist()

    def turn(prompt: list[int], session: str = "s"):
        before = engine.computed_positions
        gen = asyncio.run(
            engine.generate(GenerateRequest(prompt, SamplingParams(64), session_id=session))
        )
        return gen, engine.computed_positions - before

    gen, computed = turn(first)
    assert computed == len(first) + len(gen.output_ids) - 1
    second = [*first, *gen.output_ids, *rng.integers(0, 150000, 40).tolist()]
    gen2, computed = turn(second)
    # Only what the second prompt adds (and the reply) is fed forward.
    assert computed == 40 + len(gen2.output_ids)
    # A prompt that leaves the line (an edited history) starts a branch; the old line stays.
    edited = [*first[:200], *rng.integers(0, 150000, 30).tolist()]
    _, computed = turn(edited)
    assert computed == 30 + len(gen.output_ids) - 1
    third = [*second, *gen2.output_ids, 11]
    _, computed = turn(third)
    assert computed == 1 + len(gen.output_ids)
    # Another session shares nothing.
    _, computed = turn(first, session="other")
    assert computed == len(first) + len(gen.output_ids) - 1


# --- real harnesses --------------------------------------------------------------------------

CALC = "def add(a, b):\n    return a+b   \n\nprint(add(1, 2))\n"


def ten_turns(repo: Path) -> list:
    """Ten model turns of Claude Code: nine tool calls, then the answer."""
    calc, util, notes = (str(repo / n) for n in ("calc.py", "util.py", "NOTES.md"))
    return [
        [{"type": "text", "text": "Let me read calc.py."},
         {"type": "tool_use", "name": "Read", "input": {"file_path": calc}}],
        [{"type": "thinking", "thinking": "The sum needs spaces."},
         {"type": "tool_use", "name": "Edit", "input": {
             "file_path": calc, "old_string": "    return a+b   \n",
             "new_string": "    return a + b\n"}}],
        [{"type": "tool_use", "name": "Write", "input": {
            "file_path": util, "content": "def mul(a, b):\n    return a * b\n"}}],
        [{"type": "tool_use", "name": "Bash", "input": {
            "command": "python3 calc.py", "description": "Run calc.py"}}],
        [{"type": "tool_use", "name": "Read", "input": {"file_path": util}}],
        [{"type": "tool_use", "name": "Edit", "input": {
            "file_path": util, "old_string": "    return a * b\n",
            "new_string": "    return b * a\n"}}],
        [{"type": "tool_use", "name": "Bash", "input": {
            "command": "python3 -c 'import util; print(util.mul(2, 3))'",
            "description": "Check mul"}}],
        [{"type": "tool_use", "name": "Write", "input": {
            "file_path": notes, "content": "calc.py sums, util.py multiplies.\n"}}],
        [{"type": "tool_use", "name": "Read", "input": {"file_path": notes}}],
        [{"type": "text", "text": "Done: calc.py is spaced and util.py has mul()."}],
    ]  # fmt: skip


@pytest.fixture(scope="module")
def claude_exe() -> Path:
    if shutil.which("npm") is None:
        reason = f"npm is missing: cannot install @anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    exe = install_claude_code()
    assert exe is not None
    return exe


@pytest.fixture(scope="module")
def codex_exe() -> Path:
    if shutil.which("npm") is None:
        if os.environ.get("CI"):
            pytest.fail("npm is missing: cannot install the Codex CLI")
        pytest.skip("npm is missing: cannot install the Codex CLI")
    exe = install_codex()
    assert exe is not None
    return exe


@pytest.mark.parametrize("name", MODELS)
def test_real_claude_code_session_on_a_real_model_passes_the_audit(
    name: str, claude_exe: Path, model_dirs, lms, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text(CALC)
    script = tmp_path / "script.json"
    script.write_text(json.dumps(ten_turns(repo)))
    path = model_dirs[name]
    routing = ["--routed-experts"] if lms[name].is_moe else []
    engine = f"transformers:{path}+scripted:{script}"
    with serving(script, "--tokenizer", str(path), *routing, engine=engine) as served:
        start = time.perf_counter()
        run = run_claude(
            claude_exe,
            "Space the sum in calc.py, add util.py with mul(), and write NOTES.md.",
            base_url=served.url,
            session_id=f"cc-{name}",
            cwd=repo,
            timeout=240,
        )
        elapsed = time.perf_counter() - start
        assert run.returncode == 0, run.stderr[-2000:]
        finished = served.finish(f"cc-{name}")
        checks = served.resume_checks()
    assert checks["mismatch"] == 0 and checks["same"] >= len(finished["ledger"]["turns"])
    assert (repo / "util.py").read_text() == "def mul(a, b):\n    return b * a\n"
    ledger = finished["ledger"]
    assert len(ledger["turns"]) >= 10
    assert ledger["trained_tokens"] == ledger["generated_tokens"] > 0
    samples = [Sample.from_dict(s) for s in finished["samples"]]
    if lms[name].is_moe:
        assert all(s.routed_experts is not None for s in samples)
    report = recompute_samples(lms[name], samples)
    assert_audit_passes(
        report, f"Claude Code {CLAUDE_CODE_VERSION}, 10 turns, tiny {name}: {elapsed:.1f} s"
    )
    assert report.trained == ledger["trained_tokens"]


@pytest.mark.parametrize("name", MODELS)
def test_real_codex_session_on_a_real_model_passes_the_audit(
    name: str, codex_exe: Path, model_dirs, tmp_path: Path
) -> None:
    from tokentrail.adapter import Adapter, AdapterConfig
    from tokentrail.trajectory.manager import TrajectoryManager

    work = tmp_path / "work"
    work.mkdir()
    (work / "calc.py").write_text(CODEX_CALC)
    (work / "test_calc.py").write_text(TEST)
    engine = engine_for(model_dirs[name], CODEX_SCRIPT)
    adapter = Adapter(
        engine=engine,
        tokenizer=engine.tokenizer,
        manager=TrajectoryManager(routing=engine.routing),
        config=AdapterConfig(routed_experts=engine.routing is not None, verify_resume=True),
    )
    with serving_in_thread(adapter) as (url, loop):
        home = write_home(tmp_path / "codex-home", url)
        start = time.perf_counter()
        first = run_codex(
            codex_exe, "Space the sum in calc.py.", home=home, session_id="cx", cwd=work
        )
        assert first.returncode == 0, first.stderr[-3000:]
        second = run_codex(
            codex_exe, "Check calc.py once more.", home=home, session_id="cx", cwd=work,
            resume=first.thread_id,
        )  # fmt: skip
        assert second.returncode == 0, second.stderr[-3000:]
        elapsed = time.perf_counter() - start
        trajectory = asyncio.run_coroutine_threadsafe(
            adapter.finish_trajectory("cx", reward=1.0), loop
        ).result(60)
    checks = resume_checks(adapter.metrics.render()[0].decode())
    assert checks["mismatch"] == 0 and checks["same"] >= len(trajectory.ledger.turns)
    assert (work / "calc.py").read_text() == "def add(a, b):\n    return a + b  \n"
    ledger = trajectory.ledger
    assert ledger.trained_tokens == ledger.generated_tokens > 0
    report = recompute_samples(engine.lm, trajectory.samples)
    assert_audit_passes(
        report, f"Codex, {len(ledger.turns)} turns + resume, tiny {name}: {elapsed:.1f} s"
    )
    assert report.trained == ledger.trained_tokens


# --- simulated harness behaviours ------------------------------------------------------------

BEHAVIOURS = {
    "sub-agents": Behaviour(subagents=True),
    "compaction": Behaviour(compaction=True),
    "verify-on-stop": Behaviour(verify_on_stop=True, strip_nudge=True),
    "retries": Behaviour(retries=True),
    "fresh retries": Behaviour(retries=True, fresh_retries=True),
}


@pytest.mark.parametrize("behaviour", list(BEHAVIOURS))
def test_simulated_harness_behaviours_on_a_real_moe_pass_the_audit(
    behaviour: str, model_dirs
) -> None:
    engine = engine_for(model_dirs["qwen3-moe"], simulated=True)
    run = asyncio.run(
        simulate(
            engine.tokenizer,
            engine=engine,
            behaviour=BEHAVIOURS[behaviour],
            spec=SessionSpec(seed=4, steps=5, context_tokens=2000),
            routing=engine.routing,
        )
    )
    ledger = run.trajectory.ledger
    assert ledger.trained_tokens > 0
    report = recompute_samples(engine.lm, run.trajectory.samples)
    assert_audit_passes(report, f"simulated {behaviour}, tiny qwen3-moe")
    assert report.trained == ledger.trained_tokens


# --- the audit fails where it should ---------------------------------------------------------


@pytest.fixture(scope="module")
def recorded(model_dirs, tmp_path_factory) -> tuple[TransformersEngine, Path, list[Sample]]:
    """A simulated Claude Code session over the tiny Qwen3-MoE, journaled: the engine, the
    journal and the samples as recorded."""
    from tokentrail.storage.journal import Journal

    engine = engine_for(model_dirs["qwen3-moe"], simulated=True)
    path = tmp_path_factory.mktemp("journal") / "run.db"
    journal = Journal(str(path))
    run = asyncio.run(
        simulate(
            engine.tokenizer,
            engine=engine,
            spec=SessionSpec(seed=1, steps=5, context_tokens=2000),
            routing=engine.routing,
            journal=journal,
        )
    )
    journal.close()
    return engine, path, run.trajectory.samples


def test_a_context_token_altered_by_one_fails_the_audit(recorded) -> None:
    engine, _, samples = recorded
    assert recompute_samples(engine.lm, samples).ok
    sample = max(samples, key=lambda s: s.trained_tokens)
    # The token just before the response: a newline of the template, re-tokenized as another id.
    at = sample.prompt_length - 3
    tokens = sample.tokens.copy()
    tokens[at] = (int(tokens[at]) + 1) % engine.lm.vocab_size
    altered = dataclasses.replace(sample, tokens=tokens)
    report = recompute_samples(engine.lm, [altered])
    print(report.table())
    assert not report.ok
    assert report.max_error > 100 * DEFAULT_TOLERANCE
    (audit,) = report.samples
    assert audit.routing_mismatches[0] == at  # the altered token routes elsewhere
    # Without its routing rows the logprobs alone catch it.
    report = recompute_samples(engine.lm, [dataclasses.replace(altered, routed_experts=None)])
    assert not report.ok and report.routed_positions == 0


def test_routing_shifted_by_one_position_fails_the_audit(recorded) -> None:
    engine, _, samples = recorded
    for sample in samples:
        assert sample.routed_experts is not None
        shifted = dataclasses.replace(
            sample, routed_experts=np.roll(sample.routed_experts, 1, axis=0)
        )
        report = recompute_samples(engine.lm, [shifted])
        assert report.max_error <= DEFAULT_TOLERANCE  # the logprobs are still right
        assert report.routing_share < 0.5 and not report.ok


def test_constrained_tokens_are_audited_apart(recorded) -> None:
    """A grammar's renormalized logprobs (a forced call's) are not the model's: marked, they
    are reported on their own and held to no tolerance; unmarked, they fail the audit."""
    engine, _, samples = recorded
    sample = max(samples, key=lambda s: s.trained_tokens)
    (trained,) = np.nonzero(sample.loss_mask)
    lo, hi = int(trained[0]), int(trained[0]) + 8
    rollout = sample.rollout_log_probs.copy()
    rollout[lo:hi] += 0.5  # what a mask over the other tokens does to a logprob
    shifted = dataclasses.replace(sample, rollout_log_probs=rollout)
    assert not recompute_samples(engine.lm, [shifted]).ok
    marked = dataclasses.replace(shifted, metadata={**sample.metadata, "constrained": [[lo, hi]]})
    report = recompute_samples(engine.lm, [marked])
    assert report.ok and report.max_error <= DEFAULT_TOLERANCE
    (audit,) = report.samples
    assert audit.constrained == 8 and audit.trained == sample.trained_tokens - 8
    assert abs(report.constrained_max_error - 0.5) < 1e-3
    assert "constrained tokens" in report.table()


def test_a_replay_with_rendered_history_fails_the_audit(recorded, tmp_path: Path, capsys) -> None:
    """The journal replayed under `--history render --restore off`: the history is rendered from
    the harness's re-rendered echoes, not what the model sampled, so the trained tokens sit in a
    context the engine never saw; `tokentrail audit --recompute` says so and exits 1, and
    passes the samples as recorded."""
    from tokentrail.storage.journal.read import read_journal
    from tokentrail.storage.replay import Settings, as_recorded, replay

    engine, journal, _ = recorded
    contents = read_journal(str(journal))
    as_run = [s for t in as_recorded(contents).values() for s in t.samples]
    settings = dataclasses.replace(
        Settings.recorded(contents.meta), history=History.RENDER, restore=Restore.OFF
    )
    rendered = [s for t in replay(contents, settings, engine.tokenizer).values() for s in t.samples]
    good, bad = tmp_path / "recorded.npz", tmp_path / "rendered.jsonl"
    write_samples(good, as_run)
    write_samples(bad, rendered)
    model = str(engine.lm.path)
    assert cli_main(["audit", "--recompute", model, str(good)]) == 0
    assert "ok: every trained token" in capsys.readouterr().out
    assert cli_main(["audit", "--recompute", model, str(bad)]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "worst positions" in out
    report = recompute_samples(engine.lm, rendered)
    assert report.max_error > 100 * DEFAULT_TOLERANCE
    # A bad argument is a clear message, not a traceback.
    assert cli_main(["audit", "--recompute", "tiny:nope", str(good)]) == 2


def test_the_demo_on_a_real_moe_ends_with_a_passing_audit(tmp_path: Path, capsys) -> None:
    out = tmp_path / "samples.jsonl"
    code = cli_main(["demo", "--engine", "transformers:tiny:qwen3-moe", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "recompute audit against" in printed and "routing match" in printed
    assert out.is_file()
    # The samples it wrote pass `tokentrail audit --recompute` too.
    assert cli_main(["audit", "--recompute", "tiny:qwen3-moe", str(out)]) == 0


def test_engine_specs_that_cannot_work_are_refused_by_name(model_dirs, tmp_path: Path) -> None:
    from tokentrail.engines import create_engine
    from tokentrail.errors import EngineSpecError

    qwen3 = load_tokenizer(str(model_dirs["qwen3"]))
    with pytest.raises(EngineSpecError, match="needs a model directory"):
        create_engine("transformers:", qwen3)
    with pytest.raises(EngineSpecError, match="is not a model directory"):
        create_engine(f"transformers:{tmp_path}", qwen3)
    with pytest.raises(EngineSpecError, match="no tiny model 'nope'"):
        create_engine("transformers:tiny:nope", qwen3)
    # Qwen3's 151,669 ids over Llama 3's 128,256: they do not belong together.
    with pytest.raises(EngineSpecError, match="do not belong together"):
        create_engine("transformers:tiny:llama3", qwen3)
    engine = create_engine(f"transformers:{model_dirs['qwen3']}+scripted", qwen3)
    assert isinstance(engine, TransformersEngine) and engine.supports_constraints
