"""Every model family through the adapter: spliced prompts equal the full render outside the
assistant's spans, a simulated Claude-Code-style session gives one sample trained in full,
`check-template` passes, the scripted engine speaks the family's format and stops on its end
token, and a model directory's template picks its family's parsers."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokentrail.cli import main as cli_main
from tokentrail.engines.base import GenerateRequest, SamplingParams
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.sim.harness import Behaviour, SessionSpec, simulate
from tokentrail.text.families import families, family
from tokentrail.text.parsing import parse_output
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.trajectory.manager import TrajectoryManager
from tokentrail.trajectory.pipeline import TurnPipeline
from tokentrail.trajectory.splice import BOUNDARIES, Splicer, check_template

# Qwen3-VL and Qwen2.5-VL are Qwen3's template and parsers with a vision encoder: Qwen3's runs
# cover them.
FAMILIES = [f.name for f in families() if f.name not in ("qwen3-vl", "qwen2.5-vl")]
TEMPLATES = Path(__file__).resolve().parents[1] / "python" / "tokentrail" / "text" / "templates"

# Where each family's rendered assistant turns are: a splice keeps the sampled tokens there, so
# only the rest of the prompt must equal the full render.
_IM = re.compile(r"(<\|im_start\|>assistant\n).*?(<\|im_end\|>)", re.S)
_KIMI = re.compile(r"(<\|im_assistant\|>assistant<\|im_middle\|>).*?(<\|im_end\|>)", re.S)
ASSISTANT_SPAN: dict[str, tuple[re.Pattern[str], str]] = {
    "qwen3": (_IM, r"\1\2"),
    "qwen3.6": (_IM, r"\1\2"),
    "nemotron3": (_IM, r"\1\2"),
    "deepseek-v3.1": (
        re.compile(
            r"(<｜Assistant｜>|<｜tool▁output▁end｜>)(?:(?!<｜tool▁output▁begin｜>|<｜User｜>).)*?"
            r"(<｜end▁of▁sentence｜>)",
            re.S,
        ),
        r"\1\2",
    ),
    "deepseek-v3.2": (
        re.compile(r"(<｜Assistant｜>|</function_results>\n\n).*?(<｜end▁of▁sentence｜>)", re.S),
        r"\1\2",
    ),
    "glm4.5": (re.compile(r"(<\|assistant\|>).*?(?=<\|user\|>|<\|observation\|>|\Z)", re.S), r"\1"),
    "glm4.7": (re.compile(r"(<\|assistant\|>).*?(?=<\|user\|>|<\|observation\|>|\Z)", re.S), r"\1"),
    "kimi-k2": (_KIMI, r"\1\2"),
    "kimi-k2.5": (_KIMI, r"\1\2"),
    "minimax-m2": (re.compile(r"(\]~b\]ai\n).*?(\[e~\[)", re.S), r"\1\2"),
    "gpt-oss": (
        re.compile(r"(<\|start\|>assistant).*?(?=<\|start\|>(?!assistant)|\Z)", re.S),
        r"\1",
    ),
    "llama3": (
        re.compile(
            r"(<\|start_header_id\|>assistant<\|end_header_id\|>\n\n).*?(<\|eot_id\|>)", re.S
        ),
        r"\1\2",
    ),
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}},
                "required": ["path"],
            },
        },
    }
    for name in ("Read", "Edit")
]


def call(name: str, path: str, lines: int | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"path": path}
    if lines is not None:
        args["lines"] = lines
    return {"type": "function", "function": {"name": name, "arguments": args}}


REPLIES = st.sampled_from(
    [
        {"role": "assistant", "content": "Done."},
        {"role": "assistant", "content": "Sure, here.", "reasoning_content": "plan it"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [call("Read", "a.py")]},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "both files",
            "tool_calls": [call("Read", "a.py", 3), call("Edit", "b.py")],
        },
        {"role": "assistant", "content": "unicode: ✓ 日本語 🙂"},
    ]
)


def follow_ups(reply: dict[str, Any], choice: int) -> list[dict[str, Any]]:
    """What a harness sends next: one result per call, or a user turn (or three messages)."""
    if reply.get("tool_calls"):
        return [{"role": "tool", "content": f"result {i}"} for i in range(len(reply["tool_calls"]))]
    if choice == 0:
        return [{"role": "user", "content": "next"}]
    return [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "injected"},
        {"role": "user", "content": "b"},
    ]


@pytest.mark.parametrize("name", FAMILIES)
@settings(max_examples=8, deadline=None)
@given(turns=st.lists(st.tuples(REPLIES, st.integers(0, 1), st.booleans()), min_size=1, max_size=4))
def test_spliced_prompt_equals_full_render_outside_assistant_spans(
    family_tokenizer, name: str, turns: list[tuple[dict[str, Any], int, bool]]
) -> None:
    tokenizer = family_tokenizer(name)
    fam = family(name)
    splicer = Splicer(tokenizer, None, fam)
    pattern, keep = ASSISTANT_SPAN[name]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "go"},
    ]
    prompt = tokenizer.encode(splicer.render(messages, TOOLS, True))
    for reply, choice, compact in turns:
        reply = fam.representable(reply)
        calls_before = sum(len(m.get("tool_calls") or ()) for m in messages)
        text = fam.format_output(reply, call_index=calls_before, compact=compact)
        output = tokenizer.encode(text) + [tokenizer.added_tokens[fam.end_token(reply)]]
        parsed = parse_output(text, fam.tool_parser, fam.reasoning_parser, TOOLS)
        assert not parsed.ill_formed, parsed.reason
        anchor = len(messages)
        new = follow_ups(reply, choice)
        messages = [*messages, fam.canonical(parsed.message), *new]
        full = splicer.render(messages, TOOLS, True)
        spliced = splicer.splice(
            held_prompt=prompt,
            held_output=output,
            finish_reason="stop",
            last_assistant=messages[anchor],
            new_messages=new,
            tools=TOOLS,
            full_text=full,
            calls_before=calls_before,
        )
        assert spliced.fallback is None
        assert spliced.prompt_ids is not None
        prompt = spliced.prompt_ids.tolist()
        assert pattern.sub(keep, tokenizer.decode(prompt)) == pattern.sub(keep, full)
        # the sampled tokens stand right after the previous prompt, exactly
        tail = len(tokenizer.encode(spliced.glue + spliced.tail))
        assert prompt[len(prompt) - tail - len(output) :][: len(output)] == output


# Half the families through Claude Code's echoes over the Anthropic protocol, half through a
# verify-on-stop loop with a system nudge over the OpenAI one.
LINEAR = [
    (Behaviour(), "anthropic"),
    (Behaviour(verify_on_stop=True, nudge_role="system"), "openai"),
]


@pytest.mark.parametrize("index", range(len(FAMILIES)), ids=FAMILIES)
def test_a_linear_session_gives_one_sample_trained_in_full(family_tokenizer, index: int) -> None:
    behaviour, protocol = LINEAR[index % 2]
    run = asyncio.run(
        simulate(
            family_tokenizer(FAMILIES[index]),
            behaviour=behaviour,
            spec=SessionSpec(seed=3, steps=4, tasks=2, think=0.7),
            protocol=protocol,
        )
    )
    ledger = run.trajectory.ledger
    assert len(run.trajectory.samples) == 1
    assert ledger.trained_tokens == ledger.generated_tokens > 0
    assert ledger.splice_fallbacks == {}
    assert set(run.trajectory.drift_counts) == {"clean"}
    assert [t.history for t in ledger.turns][1:] == ["splice"] * (len(ledger.turns) - 1)


@pytest.mark.parametrize("name", FAMILIES)
def test_check_template_passes_for_every_family(family_tokenizer, name: str) -> None:
    reports = check_template(family_tokenizer(name), family(name).template())
    assert [(r.name, r.splice, r.fallback) for r in reports] == [
        (boundary, True, None) for boundary in BOUNDARIES
    ]


def test_check_template_cli_names_the_family_and_its_end_tokens(capsys) -> None:
    template = str(TEMPLATES / family("glm4.5").template_file)
    assert cli_main(["check-template", template, "--tokenizer", "stand-in:glm4.5"]) == 0
    out = capsys.readouterr().out
    assert "family glm4.5; assistant turns end with '<|observation|>', '<|user|>'" in out
    assert "splicing is possible" in out


@pytest.mark.parametrize("name", FAMILIES)
def test_the_scripted_engine_speaks_the_family(family_tokenizer, name: str) -> None:
    tokenizer = family_tokenizer(name)
    fam = family(name)
    engine = ScriptedEngine(tokenizer)
    assert engine.family is fam
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for _ in range(3):
        req = GenerateRequest(
            input_ids=[1, 2],
            sampling=SamplingParams(max_new_tokens=4096),
            session_id="s",
            messages=messages,
        )
        out = asyncio.run(engine.generate(req)).output_ids
        expected = engine.message_for(req)
        assert out[-1] == tokenizer.added_tokens[fam.end_token(expected)]
        text = tokenizer.decode(out[:-1])
        parsed = parse_output(text, fam.tool_parser, fam.reasoning_parser)
        assert fam.canonical(parsed.message) == expected
        messages = [*messages, parsed.message, {"role": "tool", "content": "ok"}]


def model_dir(path: Path, tokenizer: Any, template: str) -> Path:
    tokenizer.tokenizer.save(str(path / "tokenizer.json"))
    config = {"eos_token": tokenizer.eos_token, "chat_template": template}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def test_a_model_dir_whose_template_matches_a_family_gets_its_parsers(
    family_tokenizer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    glm = family_tokenizer("glm4.5")
    with caplog.at_level(logging.INFO, logger="tokentrail.text.tokenizer"):
        loaded = load_tokenizer(str(model_dir(tmp_path, glm, family("glm4.5").template())))
    assert loaded.family == "glm4.5"
    assert "the chat template is glm4.5's: tool parser glm45" in caplog.text
    # its stop tokens: the role tokens that start the next message end a turn
    assert {glm.added_tokens[t] for t in ("<|user|>", "<|observation|>")} <= loaded.end_token_ids
    pipeline = TurnPipeline(TrajectoryManager(), loaded)
    assert (pipeline.tool_parser, pipeline.reasoning_parser) == ("glm45", "glm45")


def test_explicit_parsers_and_templates_override_the_family(family_tokenizer) -> None:
    kimi = family_tokenizer("kimi-k2")
    assert TurnPipeline(TrajectoryManager(), kimi).tool_parser == "kimi_k2"
    chosen = TurnPipeline(TrajectoryManager(), kimi, tool_parser="hermes", reasoning_parser=None)
    assert (chosen.tool_parser, chosen.reasoning_parser) == ("hermes", None)
    # A template override of another family brings that family's parsers.
    other = TurnPipeline(TrajectoryManager(), kimi, family("glm4.7").template())
    assert other.family is family("glm4.7") and other.tool_parser == "glm47"


def test_builtin_names_pick_vocabulary_template_and_family(family_tokenizer) -> None:
    v31 = family_tokenizer("deepseek-v3.1")
    assert (v31.name, v31.family) == ("builtin:deepseek-v3.1", "deepseek-v3.1")
    assert v31.chat_template == family("deepseek-v3.1").template()
    assert v31.vocab_size == family_tokenizer("deepseek-v3.2").vocab_size == 129280
    from tokentrail.errors import TokenizerError

    with pytest.raises(TokenizerError, match="stand-in:glm4.5"):
        load_tokenizer("builtin:glm4.5")
    with pytest.raises(TokenizerError, match="families: gpt-oss"):
        load_tokenizer("builtin:gemini")


@pytest.mark.parametrize("name", ["gpt-oss"])
def test_demo_runs_a_family(name: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "samples.jsonl"
    assert cli_main(["demo", "--family", name, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"family {name}" in printed
    samples = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(samples) == 1 and sum(samples[0]["loss_mask"]) > 0


def test_serve_takes_the_familys_parsers_unless_told_otherwise() -> None:
    from tokentrail.cli import build_parser
    from tokentrail.cli.serve import resolve_settings

    args = resolve_settings(build_parser().parse_args(["serve"]), environ={})
    assert (args.config.tool_parser, args.config.reasoning_parser) == ("auto", "auto")
    chosen = resolve_settings(
        build_parser().parse_args(
            ["serve", "--tool-parser", "kimi_k2", "--reasoning-parser", "none"]
        ),
        environ={},
    )
    # "none" on the command line is the adapter's None: off.
    assert (chosen.config.tool_parser, chosen.config.reasoning_parser) == ("kimi_k2", None)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--tool-parser", "glm5"])
