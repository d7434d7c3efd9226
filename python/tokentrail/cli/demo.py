"""`tokentrail demo`: the main job on built-in defaults (the scripted engine, the Qwen3
vocabulary, a harness that re-renders echoes as Claude Code does; no GPU, no network), and
`tokentrail check-template`."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from tokentrail.kinds import Restore, parse_kind

DEMO_TASK = "Fix the spacing in calc.py, add util.py with mul(), and write NOTES.md."
DEMO_OUT = "tokentrail-demo-samples.jsonl"
DEMO_CONFIGS = (
    ("restore on", "on", "fork"),
    ("restore off", "off", "fork"),
    ("restore off, upstream merge", "off", "merge"),
)


def add_command(sub: Any) -> None:
    from tokentrail.text.families import families

    demo = sub.add_parser("demo", help="run a scripted coding session end to end")
    demo.add_argument("--out", default=DEMO_OUT)
    demo.add_argument("--tokenizer", default="builtin:qwen3")
    demo.add_argument(
        "--family",
        default=None,
        choices=[f.name for f in families()],
        help="run the demo for this model family (its vocabulary, or a stand-in, and format)",
    )
    demo.add_argument(
        "--engine",
        default="scripted",
        help="scripted (default), or transformers:DIR / transformers:tiny:NAME: a real model "
        "on CPU teacher-forced on the script (its vocabulary replaces --tokenizer); the demo "
        "then recomputes every sample with it and prints the audit",
    )
    demo.set_defaults(func=_demo)

    check = sub.add_parser("check-template", help="can turns be spliced with this template?")
    check.add_argument("target", help="a Hugging Face model dir, or a Jinja template file")
    check.add_argument("--tokenizer", default="builtin:qwen3", help="for a template file")
    check.set_defaults(func=_check_template)


async def _demo_run(
    restore: str, rewrite_policy: str, tokenizer: Any, engine: Any = None
) -> tuple[dict, Any]:
    import secrets

    import aiohttp

    from tokentrail.adapter import Adapter, AdapterConfig, start_server
    from tokentrail.engines.scripted import ScriptedEngine
    from tokentrail.sim.harness import HarnessSim, Workspace
    from tokentrail.trajectory.manager import TrajectoryManager

    admin = secrets.token_hex(16)
    routing = None if engine is None else engine.routing
    adapter = Adapter(
        engine=engine or ScriptedEngine(tokenizer),
        tokenizer=tokenizer,
        manager=TrajectoryManager(rewrite_policy=rewrite_policy, routing=routing),
        config=AdapterConfig(
            restore=parse_kind(Restore, restore, "restore mode"),
            admin_token=admin,
            routed_experts=routing is not None,
        ),
    )
    runner, url = await start_server(adapter)
    try:
        async with aiohttp.ClientSession() as http:
            sim = await HarnessSim(url, "demo", workspace=Workspace()).run(DEMO_TASK, http)
            async with http.post(
                f"{url}/tokentrail/sessions/demo/finish",
                json={"reward": 1.0},
                headers={"Authorization": f"Bearer {admin}"},
            ) as resp:
                finished = await resp.json()
    finally:
        await runner.cleanup()
    return finished, sim


async def _demo_codex(tokenizer: Any, engine: Any = None) -> tuple[Any, Any]:
    """A Codex-shaped session (exec_command, the free-form apply_patch) over the Responses API."""
    import aiohttp

    from tokentrail.adapter import Adapter, AdapterConfig, start_server
    from tokentrail.engines.scripted import ScriptedEngine
    from tokentrail.sim.codex import CODEX_FILES, CODEX_SCRIPT, CODEX_TOOLS, CodexWorkspace
    from tokentrail.sim.harness import Behaviour, HarnessSim
    from tokentrail.trajectory.manager import TrajectoryManager

    # One user turn of the script: read, two parallel commands, a failed and a good patch, the
    # test run, the answer. Codex sends every item back as it got it, so nothing is rewritten.
    script = CODEX_SCRIPT[:6]
    scripted = ScriptedEngine(tokenizer, script)
    routing = None
    if engine is not None:
        engine.inner = scripted
        routing = engine.routing
    adapter = Adapter(
        engine=engine or scripted,
        tokenizer=tokenizer,
        manager=TrajectoryManager(routing=routing),
        config=AdapterConfig(routed_experts=routing is not None),
    )
    runner, url = await start_server(adapter)
    try:
        async with aiohttp.ClientSession() as http:
            sim = await HarnessSim(
                url,
                "demo-codex",
                protocol="responses",
                tools=CODEX_TOOLS,
                workspace=CodexWorkspace(dict(CODEX_FILES)),
                behaviour=Behaviour(
                    rerender_echoes=False, move_cache_control=False, system_notes=False
                ),
            ).run("Space the sum in calc.py.", http)
        trajectory = await adapter.finish_trajectory("demo-codex", reward=1.0)
    finally:
        await runner.cleanup()
    return trajectory, sim


def _demo_table(runs: list[tuple[str, dict[str, Any]]]) -> str:
    """Per tool: trained turns and tokens under each configuration."""
    width = max(len(name) for name, _ in runs) + 2
    tools = sorted({tool for _, r in runs for tool in r["ledger"]["by_tool"]})
    lines = [f"{'':<{width}}" + "".join(f"{tool:>14}" for tool in tools) + f"{'samples':>9}"]
    for name, run in runs:
        by_tool = run["ledger"]["by_tool"]
        cells = []
        for tool in tools:
            row = by_tool.get(tool, {})
            cells.append(f"{row.get('turns_trained', 0)}/{row.get('turns', 0)} turns")
        lines.append(
            f"{name:<{width}}" + "".join(f"{c:>14}" for c in cells) + f"{len(run['samples']):>9}"
        )
    lines.append("")
    for name, run in runs:
        ledger = run["ledger"]
        gen, trained = ledger["generated_tokens"], ledger["trained_tokens"]
        share = 100.0 * trained / gen if gen else 0.0
        masked = ", ".join(f"{k}={v}" for k, v in ledger["masked_tokens"].items()) or "none"
        lines.append(
            f"{name:<{width}}{trained}/{gen} generated tokens trained ({share:.1f}%); "
            f"masked: {masked}; echoes restored: {ledger['restored_echoes']}"
        )
    return "\n".join(lines)


def _demo_tokenizer(args: argparse.Namespace) -> Any:
    from tokentrail.text.families import family
    from tokentrail.text.tokenizer import load_tokenizer

    if args.family is None:
        return load_tokenizer(args.tokenizer)
    fam = family(args.family)
    # The family's own vocabulary where a package ships it, else Qwen3's ranks with its tokens.
    return load_tokenizer(f"builtin:{fam.name}" if fam.vocabulary else f"stand-in:{fam.name}")


def _demo_engine(args: argparse.Namespace) -> tuple[Any, Any]:
    """The real model the demo runs (None: the scripted engine) and the tokenizer."""
    if args.engine == "scripted":
        return None, _demo_tokenizer(args)
    scheme, _, where = args.engine.partition(":")
    if scheme != "transformers" or not where or "+" in where:
        raise SystemExit(
            "tokentrail demo: --engine is scripted, transformers:DIR or transformers:tiny:NAME"
        )
    from tokentrail.engines.scripted import ScriptedEngine
    from tokentrail.engines.transformers_lm import TransformersEngine, model_dir
    from tokentrail.text.tokenizer import load_tokenizer

    path = model_dir(where)
    tokenizer = load_tokenizer(str(path))
    return TransformersEngine(path, tokenizer, inner=ScriptedEngine(tokenizer)), tokenizer


def _demo(args: argparse.Namespace) -> int:
    engine, tokenizer = _demo_engine(args)
    runs = []
    for name, restore, policy in DEMO_CONFIGS:
        finished, sim = asyncio.run(_demo_run(restore, policy, tokenizer, engine))
        runs.append((name, finished))
        if name == DEMO_CONFIGS[0][0]:
            first, first_sim = finished, sim
    codex, codex_sim = asyncio.run(_demo_codex(tokenizer, engine))
    out = Path(args.out)
    with out.open("w") as f:
        for sample in first["samples"]:
            f.write(json.dumps(sample) + "\n")
    calls = ", ".join(f"{k}={v}" for k, v in sorted(first_sim.tool_calls.items()))
    what = (
        "scripted engine" if engine is None else f"{engine.weight_version} on CPU, teacher-forced"
    )
    print(
        f"tokentrail demo: {what}, family {tokenizer.family or 'qwen3'} "
        f"({tokenizer.name}), Claude Code 2.1.197-style harness"
    )
    print(
        f"session: {first_sim.requests} requests, tool calls {calls}; "
        f"{first_sim.rewritten_echoes} tool calls re-rendered by the harness"
    )
    print()
    print(_demo_table(runs))
    print()
    ledger = codex.ledger
    codex_calls = ", ".join(f"{k}={v}" for k, v in sorted(codex_sim.tool_calls.items()))
    print("Codex CLI 0.169-style session over the OpenAI Responses API (custom apply_patch tool):")
    print(
        f"session: {codex_sim.requests} requests, tool calls {codex_calls}; "
        f"{ledger.trained_tokens}/{ledger.generated_tokens} generated tokens trained, "
        f"{len(codex.samples)} sample, echoes restored: {ledger.restored_echoes}"
    )
    print()
    print(
        f"wrote {len(first['samples'])} samples ({DEMO_CONFIGS[0][0]}) to {out}: one JSON object "
        "per line with tokens, loss_mask, rollout_log_probs, response_length, reward, metadata"
    )
    if engine is None:
        return 0
    from tokentrail.model.audit import recompute_samples
    from tokentrail.trajectory.sample import Sample

    samples = [Sample.from_dict(s) for _, run in runs for s in run["samples"]]
    report = recompute_samples(engine.lm, [*samples, *codex.samples])
    print()
    print("every sample above recomputed in one forward pass (tokentrail audit --recompute):")
    print(report.table())
    return 0 if report.ok else 1


def _check_template(args: argparse.Namespace) -> int:
    from tokentrail.errors import TemplateError
    from tokentrail.text.families import resolve_family
    from tokentrail.text.template_check import check_within_budget
    from tokentrail.text.tokenizer import load_tokenizer
    from tokentrail.trajectory.splice import check_template

    target = Path(args.target)
    if target.is_dir():
        tokenizer, template = load_tokenizer(str(target)), None
    else:
        tokenizer, template = load_tokenizer(args.tokenizer), target.read_text()
    fam = resolve_family(tokenizer, template)
    try:
        check_within_budget(
            template or tokenizer.chat_template,
            str(target),
            call_id=fam.call_id,
            variables=tokenizer.special_tokens_map,
        )
    except TemplateError as exc:
        print(f"tokentrail check-template: {exc}", file=sys.stderr)
        return 2
    reports = check_template(tokenizer, template, fam)
    ends = sorted({fam.end_after_calls, fam.end_after_text})
    print(
        f"template: {target}  (family {fam.name}; assistant turns end with "
        f"{', '.join(repr(e) for e in ends)})"
    )
    print(f"{'boundary':<28}{'prefix-preserving':>18}{'splice':>8}  glue / reason")
    for r in reports:
        detail = repr(r.glue) if r.splice else f"fallback: {r.fallback}"
        print(
            f"{r.name:<28}{'yes' if r.prefix_preserving else 'no':>18}"
            f"{'yes' if r.splice else 'no':>8}  {detail}"
        )
    ok = all(r.splice for r in reports)
    print("splicing is possible" if ok else "splicing is NOT possible: turns fall back to render")
    return 0 if ok else 1
