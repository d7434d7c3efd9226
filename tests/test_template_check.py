"""A chat template's first renders run under a CPU and memory budget: bombs are refused at
startup with their name and the limit, real templates start as before."""

from __future__ import annotations

import resource
import time

import pytest

from tokentrail.adapter import Adapter
from tokentrail.cli import main as cli_main
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.errors import TemplateBudgetExceeded, TemplateError
from tokentrail.text.template_check import DEFAULT_BUDGET, TemplateBudget, check_within_budget

MEMORY_BOMB = "{{ 'x' * 10**10 }}"
LOOP_BOMB = (
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{{ messages[0]['content'] }}"
)
# Explodes only on the tool-call probe (three messages), which `ChatTemplate` renders first.
PROBE_BOMB = (
    "{% if messages|length > 2 %}{{ 'x' * 10**10 }}{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_memory_bomb_is_refused_at_startup_with_its_name_and_the_limit(tmp_path, capsys):
    bomb = tmp_path / "bomb.jinja"
    bomb.write_text(MEMORY_BOMB)
    assert cli_main(["serve", "--chat-template", str(bomb), "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert f"--chat-template {bomb} was refused" in err
    # Refused by the address-space limit (a MemoryError in the child), not after filling it.
    assert f"more than {DEFAULT_BUDGET.memory_mib} MiB of memory" in err


def test_check_template_refuses_a_bomb_before_rendering_it(tmp_path, capsys):
    bomb = tmp_path / "bomb.jinja"
    bomb.write_text(MEMORY_BOMB)
    assert cli_main(["check-template", str(bomb)]) == 2
    assert f"{bomb} was refused" in capsys.readouterr().err


def test_two_nested_loops_are_stopped_by_the_cpu_limit(tokenizer):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with pytest.raises(
        TemplateBudgetExceeded, match=r"--chat-template was refused.*more than 2 s of CPU"
    ):
        Adapter(engine=ScriptedEngine(tokenizer), tokenizer=tokenizer, chat_template=LOOP_BOMB)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    # The interpreter's start, then at most the budget rounded up to a whole second.
    assert DEFAULT_BUDGET.cpu_s <= spent < DEFAULT_BUDGET.cpu_s + 1 + 3


def test_a_bomb_in_the_tool_call_probe_alone_is_refused(tokenizer):
    with pytest.raises(TemplateBudgetExceeded, match="probe.jinja was refused.*MiB of memory"):
        check_within_budget(PROBE_BOMB, "probe.jinja")


def test_the_wall_clock_backs_up_the_cpu_limit():
    with pytest.raises(TemplateBudgetExceeded, match="did not finish within 0.01 s"):
        check_within_budget(LOOP_BOMB, "slow.jinja", budget=TemplateBudget(wall_s=0.01))


def test_a_template_within_the_budget_serves_and_renders_as_before(tokenizer):
    own = tokenizer.chat_template + "\n"  # not the shipped file: checked in a child
    started = time.monotonic()
    adapter = Adapter(engine=ScriptedEngine(tokenizer), tokenizer=tokenizer, chat_template=own)
    assert time.monotonic() - started < DEFAULT_BUDGET.wall_s
    assert adapter.pipeline.chat_template == own
    text = adapter.pipeline.render([{"role": "user", "content": "hi"}], None)
    assert text.startswith("<|im_start|>user\nhi<|im_end|>")


def test_a_template_refusing_every_conversation_is_still_its_own_error(tokenizer):
    # range(10**9) is past the sandbox's range limit: a plain failure, not a budget one.
    template = "{% for i in range(10**9) %}{% endfor %}{{ messages[0]['content'] }}"
    with pytest.raises(TemplateError, match="cannot render a one-message conversation") as info:
        Adapter(engine=ScriptedEngine(tokenizer), tokenizer=tokenizer, chat_template=template)
    assert not isinstance(info.value, TemplateBudgetExceeded)
