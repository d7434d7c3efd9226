"""The `tokentrail` command: `serve` the adapter, run the `demo`.

`tokentrail demo` is the main job on built-in defaults: the scripted engine, the Qwen3
vocabulary and a harness that re-renders echoes as Claude Code does; no GPU, no network.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

DEMO_TASK = "Fix the spacing in calc.py, add util.py with mul(), and write NOTES.md."
DEMO_OUT = "tokentrail-demo-samples.jsonl"


def _serve(args: argparse.Namespace) -> int:
    from tokentrail.engines.base import create_engine
    from tokentrail.manager import TrajectoryManager
    from tokentrail.pipeline import Restore
    from tokentrail.server import Adapter, AdapterConfig
    from tokentrail.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    template = Path(args.chat_template).read_text() if args.chat_template else None
    config = AdapterConfig(
        model_name=args.model_name,
        tool_parser=None if args.tool_parser == "none" else args.tool_parser,
        reasoning_parser=None if args.reasoning_parser == "none" else args.reasoning_parser,
        max_turns_per_session=args.max_turns_per_session,
        max_context_tokens=args.max_context_tokens,
        admin_token=args.admin_token,
        restore=Restore(args.restore),
    )
    manager = TrajectoryManager(
        fork_threshold_tokens=args.fork_threshold,
        drift_policy=args.drift_policy,
        backend=args.backend,
    )
    adapter = Adapter(
        engine=create_engine(args.engine, tokenizer),
        tokenizer=tokenizer,
        chat_template=template,
        manager=manager,
        config=config,
    )
    web.run_app(
        adapter.app,
        host=args.host,
        port=args.port,
        handler_cancellation=True,
        print=lambda msg: print(f"tokentrail serving on http://{args.host}:{args.port}"),
    )
    return 0


async def _demo_run(restore: str, tokenizer: Any) -> tuple[dict[str, Any], Any]:
    import aiohttp

    from tokentrail.engines.scripted import ScriptedEngine
    from tokentrail.pipeline import Restore
    from tokentrail.server import Adapter, AdapterConfig, start_server
    from tokentrail.sim import HarnessSim

    adapter = Adapter(
        engine=ScriptedEngine(tokenizer),
        tokenizer=tokenizer,
        config=AdapterConfig(restore=Restore(restore)),
    )
    runner, url = await start_server(adapter)
    try:
        async with aiohttp.ClientSession() as http:
            sim = await HarnessSim(url, "demo").run(DEMO_TASK, http)
            async with http.post(
                f"{url}/tokentrail/sessions/demo/finish", json={"reward": 1.0}
            ) as resp:
                finished = await resp.json()
    finally:
        await runner.cleanup()
    return finished, sim


def _fraction(a: int, b: int) -> str:
    return f"{a}/{b}"


def _demo_table(on: dict[str, Any], off: dict[str, Any]) -> str:
    lines = [
        f"{'tool':<8}{'turns':>6}  {'trained turns':>15}  {'trained tokens':>17}  "
        "masked (restore off)",
        f"{'':<8}{'':>6}  {'on':>7} {'off':>7}  {'on':>8} {'off':>8}",
    ]
    tools = sorted(set(on["by_tool"]) | set(off["by_tool"]))
    masked_off: dict[str, dict[str, int]] = {}
    for turn in off["turns"]:
        for tool in turn["tools"]:
            for reason, n in turn["masked"].items():
                masked_off.setdefault(tool, {}).setdefault(reason, 0)
                masked_off[tool][reason] += n
    for tool in tools:
        a, b = on["by_tool"].get(tool, {}), off["by_tool"].get(tool, {})
        reasons = ", ".join(f"{r}={n}" for r, n in sorted(masked_off.get(tool, {}).items()))
        lines.append(
            f"{tool:<8}{a.get('turns', 0):>6}  "
            f"{_fraction(a.get('turns_trained', 0), a.get('turns', 0)):>7} "
            f"{_fraction(b.get('turns_trained', 0), b.get('turns', 0)):>7}  "
            f"{a.get('tokens_trained', 0):>8} {b.get('tokens_trained', 0):>8}  {reasons or '-'}"
        )
    for name, ledger in (("on", on), ("off", off)):
        gen, trained = ledger["generated_tokens"], ledger["trained_tokens"]
        share = 100.0 * trained / gen if gen else 0.0
        lines.append(
            f"restore {name:<3}: {trained}/{gen} generated tokens trained ({share:.1f}%), "
            f"masked {ledger['masked_tokens'] or '{}'}, echoes restored {ledger['restored_echoes']}"
        )
    return "\n".join(lines)


def _demo(args: argparse.Namespace) -> int:
    from tokentrail.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    on, sim = asyncio.run(_demo_run("on", tokenizer))
    off, _ = asyncio.run(_demo_run("off", tokenizer))
    out = Path(args.out)
    with out.open("w") as f:
        for sample in on["samples"]:
            f.write(json.dumps(sample) + "\n")
    calls = ", ".join(f"{k}={v}" for k, v in sorted(sim.tool_calls.items()))
    print("tokentrail demo: scripted engine, Qwen3 vocabulary, Claude Code 2.1.197-style harness")
    print(
        f"session: {sim.requests} requests, tool calls {calls}; "
        f"{sim.rewritten_echoes} tool calls re-rendered by the harness"
    )
    print()
    print(_demo_table(on["ledger"], off["ledger"]))
    print()
    print(
        f"wrote {len(on['samples'])} samples (restore on) to {out}: one JSON object per line, "
        "fields tokens, loss_mask, rollout_log_probs, response_length, reward, metadata"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokentrail", description=__doc__)
    parser.add_argument("--log-level", default="WARNING")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve the Anthropic/OpenAI adapter")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8300)
    serve.add_argument(
        "--engine", default="scripted", help="sglang://H:P, vllm://H:P, scripted[:FILE]"
    )
    serve.add_argument("--tokenizer", default="builtin:qwen3", help="builtin:qwen3 or a model dir")
    serve.add_argument("--chat-template", default=None, help="a Jinja file overriding the model's")
    serve.add_argument("--tool-parser", default="hermes", choices=["hermes", "qwen3_coder", "none"])
    serve.add_argument("--reasoning-parser", default="qwen3", choices=["qwen3", "none"])
    serve.add_argument("--fork-threshold", type=int, default=1024)
    serve.add_argument("--drift-policy", default="minimal", choices=["minimal", "slime"])
    serve.add_argument("--max-turns-per-session", type=int, default=0)
    serve.add_argument("--max-context-tokens", type=int, default=0)
    serve.add_argument("--admin-token", default=None)
    serve.add_argument("--model-name", default="tokentrail")
    serve.add_argument("--backend", default=None, choices=["rust", "python"])
    serve.add_argument(
        "--restore",
        default="on",
        choices=["on", "tree_only", "off"],
        help="restore harness-re-rendered echoes before rendering (on), in the tree only, or off",
    )
    serve.set_defaults(func=_serve)

    demo = sub.add_parser("demo", help="run a scripted coding session end to end")
    demo.add_argument("--out", default=DEMO_OUT)
    demo.add_argument("--tokenizer", default="builtin:qwen3")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
