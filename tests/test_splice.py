"""Token-exact history: spliced prompts, their fallbacks, and `tokentrail check-template`."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from tokentrail.cli import main as cli_main
from tokentrail.kinds import Fallback
from tokentrail.sim.harness import Behaviour, SessionSpec, simulate
from tokentrail.text.parsing import parse_output
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.trajectory.splice import Splicer

TEMPLATES = Path(__file__).parent / "templates"
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
# Behaviours that keep one linear conversation: each must give one sample, all trained.
LINEAR = {
    "claude code echoes": Behaviour(),
    "verify-on-stop, user nudge": Behaviour(verify_on_stop=True),
    "verify-on-stop, system nudge": Behaviour(verify_on_stop=True, nudge_role="system"),
    "plain": Behaviour(rerender_echoes=False, move_cache_control=False, system_notes=False),
}


@pytest.fixture(scope="module")
def qwen():
    return load_tokenizer()


@pytest.fixture(scope="module")
def llama(qwen, tmp_path_factory):
    """A model dir with Llama-3 header tokens and template over the Qwen vocabulary."""
    path = tmp_path_factory.mktemp("llama3")
    tok = Tokenizer.from_str(qwen.tokenizer.to_str())
    tok.add_special_tokens(LLAMA_SPECIALS)
    tok.save(str(path / "tokenizer.json"))
    config = {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "chat_template": (TEMPLATES / "llama3.jinja").read_text(),
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


CASES = ["qwen3", "qwen3_strip_think", "llama3", "extra_after_end"]


def setup(case: str, qwen, llama):
    if case == "qwen3":
        return qwen, None
    if case == "llama3":
        return load_tokenizer(str(llama)), None
    return qwen, template(case)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("behaviour", list(LINEAR), ids=list(LINEAR))
def test_linear_conversations_give_one_sample_all_trained(qwen, llama, case, behaviour) -> None:
    tokenizer, chat_template = setup(case, qwen, llama)
    for seed in range(2):
        run = asyncio.run(
            simulate(
                tokenizer,
                behaviour=LINEAR[behaviour],
                spec=SessionSpec(seed=seed, steps=5, tasks=2, think=0.7),
                chat_template=chat_template,
                protocol="anthropic" if seed % 2 == 0 else "openai",
            )
        )
        ledger = run.trajectory.ledger
        assert len(run.trajectory.samples) == 1
        assert ledger.trained_tokens == ledger.generated_tokens
        assert set(run.trajectory.drift_counts) == {"clean"}
        assert [t.history for t in ledger.turns] == ["render"] + ["splice"] * (
            len(ledger.turns) - 1
        )
        assert run.trajectory.ledger.splice_fallbacks == {}


@pytest.mark.parametrize("case", ["qwen3_strip_think", "llama3", "extra_after_end"])
def test_render_history_drifts_where_splice_does_not(qwen, llama, case) -> None:
    tokenizer, chat_template = setup(case, qwen, llama)
    spec = SessionSpec(seed=3, steps=6, tasks=2, think=1.0)
    render = asyncio.run(
        simulate(tokenizer, spec=spec, chat_template=chat_template, history="render")
    )
    assert set(render.trajectory.drift_counts) - {"clean"}
    ledger = render.trajectory.ledger
    # A re-render breaks the rollout: it forks into more samples or masks sampled tokens.
    broken = len(render.trajectory.samples) > 1 or ledger.trained_tokens < ledger.generated_tokens
    assert broken
    assert all(t.history == "render" for t in ledger.turns)


def test_position_dependent_template_falls_back_visibly(qwen) -> None:
    run = asyncio.run(
        simulate(
            qwen, spec=SessionSpec(seed=1, steps=4), chat_template=template("position_dependent")
        )
    )
    ledger = run.trajectory.ledger
    later = ledger.turns[1:]
    assert later and all(t.fallback is Fallback.NOT_PREFIX for t in later)
    assert all(t.to_dict()["history"] == "splice_fallback:not_prefix" for t in later)
    assert ledger.to_dict()["splice_fallbacks"] == {"not_prefix": len(later)}
    assert ledger.trained_tokens == ledger.generated_tokens  # a fallback is not a loss


CUT_OUTPUTS = [
    "Hello there, wor",  # mid-word
    '<tool_call>\n{"name": "Read", "argu',  # mid-call
    "<think>\nI need to",  # mid-thought
    "Trailing space ",
]


@pytest.mark.parametrize("text", CUT_OUTPUTS)
def test_output_cut_by_the_length_limit_is_spliced_as_sampled(qwen, text) -> None:
    splicer = Splicer(qwen)
    msgs = [{"role": "user", "content": "hi"}]
    last = {"role": "assistant", "content": text}
    new = [{"role": "user", "content": "more"}]
    prompt = qwen.encode(splicer.render(msgs, None, True))
    full = splicer.render([*msgs, last, *new], None, True)
    # Sampled in pieces, as a model may: the same text, not the ids encoding it gives.
    sampled = [t for i in range(0, len(text), 3) for t in qwen.encode(text[i : i + 3])]
    for output in (qwen.encode(text), sampled):
        result = splicer.splice(
            held_prompt=prompt,
            held_output=output,
            finish_reason="length",
            last_assistant=last,
            new_messages=new,
            tools=None,
            full_text=full,
        )
        assert result.fallback is None and result.end == "<|im_end|>"
        ids = result.prompt_ids.tolist()
        # The sampled ids as sampled, then the template's end of the turn and the new messages.
        assert ids[: len(prompt) + len(output)] == [*prompt, *output]
        assert qwen.decode(ids) == full
        assert ids[len(prompt) + len(output)] == qwen.added_tokens["<|im_end|>"]
    # The slow path agrees where it can: ids that re-encode as sampled give the full render's.
    exact = splicer.splice(
        held_prompt=prompt,
        held_output=qwen.encode(text),
        finish_reason="length",
        last_assistant=last,
        new_messages=new,
        tools=None,
        full_text=full,
    )
    assert exact.prompt_ids.tolist() == qwen.encode(full)


def test_a_cut_output_that_ends_on_its_end_token_is_not_closed_twice(qwen) -> None:
    splicer = Splicer(qwen)
    msgs = [{"role": "user", "content": "hi"}]
    last = {"role": "assistant", "content": "Done."}
    new = [{"role": "user", "content": "more"}]
    prompt = qwen.encode(splicer.render(msgs, None, True))
    output = [*qwen.encode("Done."), qwen.added_tokens["<|im_end|>"]]
    full = splicer.render([*msgs, last, *new], None, True)
    result = splicer.splice(
        held_prompt=prompt,
        held_output=output,
        finish_reason="length",
        last_assistant=last,
        new_messages=new,
        tools=None,
        full_text=full,
    )
    assert result.prompt_ids.tolist() == qwen.encode(full)


def test_a_cut_output_falls_back_only_without_an_added_end_token(qwen) -> None:
    # A family whose end of a text turn is plain text: tokenization would not split there.
    family = dataclasses.replace(Splicer(qwen).family, end_after_text="END")
    splicer = Splicer(qwen, family=family)
    result = splicer.splice(
        held_prompt=[1],
        held_output=qwen.encode("Hello there"),
        finish_reason="length",
        last_assistant={"role": "assistant", "content": "Hello there"},
        new_messages=[{"role": "user", "content": "more"}],
        tools=None,
        full_text=None,
    )
    assert result.prompt_ids is None and result.fallback is Fallback.LENGTH
    no_end = Splicer(qwen).splice(
        held_prompt=[1],
        held_output=qwen.encode("Hello there"),
        finish_reason="stop",
        last_assistant={"role": "assistant", "content": "Hello there"},
        new_messages=[],
        tools=None,
        full_text="",
    )
    assert no_end.fallback is Fallback.NO_END_TOKEN


# -- the property: spliced == full render outside assistant spans ------------------------------

ASSISTANT_SPAN = {
    "qwen3": re.compile(r"(<\|im_start\|>assistant\n).*?(<\|im_end\|>)", re.S),
    "qwen3_strip_think": re.compile(r"(<\|im_start\|>assistant\n).*?(<\|im_end\|>)", re.S),
    "llama3": re.compile(
        r"(<\|start_header_id\|>assistant<\|end_header_id\|>\n\n).*?(<\|eot_id\|>)", re.S
    ),
}

outputs = st.sampled_from(
    [
        "Done.",
        'Looking.\n<tool_call>\n{"name": "Read", "arguments": {"path": "a.py"}}\n</tool_call>',
        '<tool_call>\n{"name":"Bash","arguments":{"command":"ls","flag":true}}\n</tool_call>',
        "<think>\nplan it\n</think>\n\nSure, here.",
        "<think>\nhmm\n</think>\n\n"
        '<tool_call>\n{"name": "Edit", "arguments": {"x": 1}}\n</tool_call>',
        "  trailing spaces  ",
        "unicode: ✓ 日本語 🙂",
    ]
)
followups = st.sampled_from(
    [
        [{"role": "user", "content": "next"}],
        [{"role": "tool", "content": "ok"}],
        [{"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}],
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "injected"},
            {"role": "user", "content": "b"},
        ],
    ]
)


@settings(max_examples=60, deadline=None)
@given(
    case=st.sampled_from(list(ASSISTANT_SPAN)),
    turns=st.lists(st.tuples(outputs, followups), min_size=1, max_size=5),
)
def test_spliced_prompt_equals_full_render_outside_assistant_spans(qwen, llama, case, turns):
    tokenizer, chat_template = setup(case, qwen, llama)
    splicer = Splicer(tokenizer, chat_template)
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    prompt = tokenizer.encode(splicer.render(messages, None, True))
    for text, new in turns:
        output = tokenizer.encode(text) + [tokenizer.eos_token_id]
        reply = parse_output(text).message
        messages = [*messages, reply, *new]
        full = splicer.render(messages, None, True)
        spliced = splicer.splice(
            held_prompt=prompt,
            held_output=output,
            finish_reason="stop",
            last_assistant=reply,
            new_messages=new,
            tools=None,
            full_text=full,
        )
        assert spliced.fallback is None
        prompt = spliced.prompt_ids.tolist()
        pattern = ASSISTANT_SPAN[case]
        skeleton = pattern.sub(r"\1\2", tokenizer.decode(prompt))
        assert skeleton == pattern.sub(r"\1\2", full)
        # the sampled tokens stand inside the spans, exactly
        assert (
            prompt[
                len(prompt) - len(tokenizer.encode(spliced.glue + spliced.tail)) - len(output) :
            ][: len(output)]
            == output
        )


# -- check-template ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target, code",
    [
        ("qwen3_strip_think", 0),
        ("extra_after_end", 0),
        ("position_dependent", 1),
    ],
)
def test_check_template_cli(target: str, code: int, capsys) -> None:
    assert cli_main(["check-template", str(TEMPLATES / f"{target}.jinja")]) == code
    out = capsys.readouterr().out
    assert ("splicing is possible" in out) == (code == 0)
    if target == "extra_after_end":
        assert "'<|endoftext|>\\n\\n'" in out
    if target == "qwen3_strip_think":
        assert re.search(r"reasoning\s+no\s+yes", out)


def test_check_template_on_a_model_dir(llama, capsys) -> None:
    assert cli_main(["check-template", str(llama)]) == 0
    assert "<|eot_id|>" in capsys.readouterr().out
