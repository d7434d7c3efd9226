"""A closed RL loop on CPU with real parts only: a harness on the official OpenAI SDK talks to
`tokentrail serve`, which samples from a real vLLM (its CPU build) serving a tiny real model;
sessions are finished into samples, a policy-gradient step in torch trains on them, and the new
weights go into the running vLLM through its own routes while the next sessions are in flight.

    python examples/closed_loop.py --steps 12

needs vLLM's CPU build (`.ci/vllm-env` installs it; `--vllm-python` or
`$TOKENTRAIL_VLLM_PYTHON` points at another). Three arms run on one vLLM with the same seeds:

- `trained`: the samples as tokentrail recorded them;
- `frozen`: no training (the weights never change);
- `shifted`: the loss mask and the rollout logprobs one token late, what a splice one token off
  would hand a trainer.

The task can be checked from the replies alone and learned from random weights in a few steps:
the share of the words in a session's replies that are lowercase English-letter words. Per step
the loop prints the sessions, the generated and trained tokens, the mean reward, the weight
version served after the push, the tokens of turns sampled across the push, and the largest
deviation from 1 of the importance ratio (the trainer's logprob against the one tokentrail
recorded) over tokens the trainer's current weights sampled.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import openai
import torch
from transformers import AutoModelForCausalLM

from tokentrail.engines.vllm_process import VLLMServer, free_port, metric_sum
from tokentrail.integrations.finish_http import finish_over_http
from tokentrail.integrations.vllm_experts import ExpertLayout
from tokentrail.integrations.weights import VLLMWeights
from tokentrail.kinds import PauseMode, StalenessPolicy
from tokentrail.model.tiny import tiny_model
from tokentrail.trajectory.sample import Sample
from tokentrail.trajectory.staleness import limit_staleness, token_steps

REPO = Path(__file__).resolve().parents[1]
ARMS = ("trained", "frozen", "shifted")
PROMPTS = (
    "Write a few words about the sea.",
    "Say something about trees.",
    "Describe a city at night.",
    "Tell me about your day.",
)
FOLLOW_UP = "Go on."
WORD = re.compile(r"[a-z]+")
ADMIN_TOKEN = "closed-loop"
# Above this |ratio - 1| on tokens the trainer's current weights sampled, the engine and the
# trainer disagree about the policy (float32 on both sides agrees within about 1e-5).
MATCH_TOLERANCE = 1e-3


@dataclass
class Config:
    steps: int = 14
    model: str = "qwen3"
    prompts: int = 2
    group: int = 8
    turns: int = 2
    max_tokens: int = 32
    lr: float = 0.2
    body_lr: float = 0.2
    clip: float = 0.2
    max_staleness: int = 1
    seed: int = 0
    pause_mode: str = str(PauseMode.KEEP)
    arms: tuple[str, ...] = ARMS


@dataclass
class StepRow:
    arm: str
    step: int
    sessions: int
    generated: int
    trained: int
    reward: float
    version: str
    across_update_turns: int
    across_update_tokens: int
    # Turns vLLM aborted at the push (`--pause-mode abort`) and tokentrail generated again, and
    # the tokens the aborted attempts had sampled (recorded, never trained).
    retried_turns: int
    discarded_tokens: int
    stale_masked: int
    ratio_dev_same_version: float
    ratio_dev_stale: float
    seconds: float


# -- the harness ------------------------------------------------------------------------------


def reward(replies: Sequence[str]) -> float:
    """The share of whitespace-separated words in `replies` that are lowercase ASCII words."""
    words = [w for text in replies for w in text.split()]
    return sum(1 for w in words if WORD.fullmatch(w)) / len(words) if words else 0.0


async def play(url: str, sid: str, prompt: str, cfg: Config, seed: int) -> list[str]:
    """One session through the official SDK: the prompt, then `Go on.` after each reply."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=sid, max_retries=0, timeout=600)
    messages: list[Any] = [{"role": "user", "content": prompt}]
    replies = []
    try:
        for turn in range(cfg.turns):
            answer = await client.chat.completions.create(
                model="tiny",
                messages=messages,
                max_tokens=cfg.max_tokens,
                temperature=1.0,
                top_p=1.0,
                seed=seed * 16 + turn,
            )
            text = answer.choices[0].message.content or ""
            replies.append(text)
            messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": FOLLOW_UP},
            ]
    finally:
        await client.close()
    return replies


# -- the trainer ------------------------------------------------------------------------------


class Trainer:
    """A GRPO step in torch: group-normalized rewards, the clipped importance ratio against the
    rollout logprobs the samples carry, a token-level mean over trained tokens."""

    def __init__(self, model_dir: Path, cfg: Config, device: str = "cpu") -> None:
        torch.manual_seed(cfg.seed)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.to(device)
        # The output layer's rate and the body's, apart (`--body-lr`); the same by default.
        head = list(self.model.get_output_embeddings().parameters())
        body = [p for p in self.model.parameters() if all(p is not h for h in head)]
        self.optimizer = torch.optim.Adam(
            [{"params": head, "lr": cfg.lr}, {"params": body, "lr": cfg.body_lr}]
        )
        self.cfg = cfg
        self.device = device

    def logprobs(self, sample: Sample) -> torch.Tensor:
        tokens = torch.as_tensor(sample.tokens, dtype=torch.long, device=self.device)[None]
        logits = self.model(tokens).logits[0, sample.prompt_length - 1 : -1]
        targets = tokens[0, sample.prompt_length :]
        return torch.log_softmax(logits.float(), -1).gather(-1, targets[:, None])[:, 0]

    def step(self, batch: Sequence[tuple[Sample, float]], version: int) -> tuple[float, float]:
        """One optimizer step on `batch` (sample, advantage); returns the largest |ratio - 1|
        over trained tokens the current weights (`version`) sampled, and over older ones."""
        self.model.train()
        self.optimizer.zero_grad()
        total = sum(int(s.loss_mask.sum()) for s, _ in batch) or 1
        same, stale = 0.0, 0.0
        for sample, advantage in batch:
            mask = torch.as_tensor(sample.loss_mask, dtype=torch.float32, device=self.device)
            if not mask.any():
                continue
            new = self.logprobs(sample)
            old = torch.as_tensor(sample.rollout_log_probs, dtype=torch.float32, device=self.device)
            ratio = torch.exp(new - old)
            steps = token_steps(sample)
            dev = (ratio.detach() - 1).abs().cpu().numpy()
            trained = sample.loss_mask.astype(bool)
            if (trained & (steps == version)).any():
                same = max(same, float(dev[trained & (steps == version)].max()))
            if (trained & (steps != version)).any():
                stale = max(stale, float(dev[trained & (steps != version)].max()))
            clipped = torch.clamp(ratio, 1 - self.cfg.clip, 1 + self.cfg.clip)
            objective = torch.minimum(ratio * advantage, clipped * advantage)
            (-(objective * mask).sum() / total).backward()
        self.optimizer.step()
        return same, stale

    def save(self, path: Path) -> None:
        if path.exists():
            shutil.rmtree(path)
        self.model.save_pretrained(path)


def advantages(rewards: Sequence[float], groups: Sequence[int]) -> list[float]:
    """GRPO's: each reward against its group's mean, over the group's standard deviation."""
    out = []
    for r, g in zip(rewards, groups, strict=True):
        members = [x for x, h in zip(rewards, groups, strict=True) if h == g]
        mean = sum(members) / len(members)
        std = math.sqrt(sum((x - mean) ** 2 for x in members) / len(members))
        out.append((r - mean) / (std + 1e-6))
    return out


def shifted(sample: Sample) -> Sample:
    """The sample as a splice one token off would hand it over: the loss mask and the rollout
    logprobs one position late against the tokens."""
    mask = np.concatenate([[0], sample.loss_mask[:-1]]).astype(sample.loss_mask.dtype)
    logprobs = np.concatenate([[0.0], sample.rollout_log_probs[:-1]]).astype(
        sample.rollout_log_probs.dtype
    )
    return Sample(
        sample.tokens, mask, logprobs, sample.response_length, sample.reward, sample.metadata
    )


# -- the weights into the engine -------------------------------------------------------------

VLLM_GENERATED = "vllm:generation_tokens_total"


class WeightSync(Protocol):
    """How the trainer's weights reach the running engine at `url`, whose `/metrics` counts
    the tokens it generated under the name `generated_metric`."""

    url: str
    generated_metric: str

    def start(self, model_dir: Path) -> None:
        """Serve the weights in `model_dir` as version 0 (each arm starts from them)."""

    def stage(self, trainer: Trainer, arm: str, step: int) -> None:
        """Before the step's sessions: make the trainer's weights ready to push."""

    def push(self, version: str, mode: PauseMode) -> None:
        """While the step's sessions are sampling: serve the staged weights as `version`."""

    def version(self) -> str:
        """The weight version the engine samples with now."""


class ReloadWeights:
    """The CPU path: the trainer's weights saved to a directory that vLLM reloads through its
    own routes (`VLLMWeights`). An MoE's experts (`layout`) are also written in the packed
    order of vLLM's CPU build and reloaded as they are, which `reload_weights` alone gets
    wrong (`tokentrail.integrations.vllm_experts`)."""

    generated_metric = VLLM_GENERATED

    def __init__(self, url: str, scratch: Path, layout: ExpertLayout | None = None) -> None:
        self.url = url
        self.scratch = scratch
        self.weights = VLLMWeights(url)
        self.layout = layout
        self.staged: Path | None = None

    def start(self, model_dir: Path) -> None:
        self._push(model_dir, "0", PauseMode.WAIT)

    def stage(self, trainer: Trainer, arm: str, step: int) -> None:
        self.staged = self.scratch / f"{arm}-{step % 2}"
        trainer.save(self.staged)

    def push(self, version: str, mode: PauseMode) -> None:
        assert self.staged is not None, "stage() comes before push()"
        self._push(self.staged, version, mode)

    def _push(self, weights: Path, version: str, mode: PauseMode) -> None:
        kernel = None
        if self.layout is not None:
            kernel = self.layout.write(weights, self.scratch / f"experts-{version}")
        self.weights.push(weights, version, mode=mode, kernel=kernel)
        if kernel is not None:
            shutil.rmtree(kernel)

    def version(self) -> str:
        return self.weights.version()


# -- the loop ---------------------------------------------------------------------------------


@contextlib.contextmanager
def tokentrail_serve(engine: str, model_dir: Path) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokentrail", "serve", "--port", str(port), "--engine", engine,
         "--tokenizer", str(model_dir), "--admin-token", ADMIN_TOKEN, "--model-name", "tiny"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("tokentrail serve did not come up") from None
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def generated_tokens(sync: WeightSync, within_s: float = 120.0) -> float:
    """The tokens the engine has generated, from its `/metrics`, read off the event loop (the
    step's sessions go on meanwhile). A read that times out or is refused is made again until
    `within_s` has passed: a busy engine on two cores can leave `/metrics` unanswered for tens
    of seconds."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await asyncio.to_thread(metric_sum, sync.url, sync.generated_metric)
        except OSError:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.5)


async def rollouts(url: str, cfg: Config, arm: str, step: int) -> list[tuple[str, int, float]]:
    """Every session of a step: `group` per prompt, the same seeds in every arm. Returns
    (session id, group, reward) per session."""
    jobs = []
    for p in range(cfg.prompts):
        prompt = PROMPTS[p % len(PROMPTS)]
        for i in range(cfg.group):
            sid = f"{arm}-{step}-{p}-{i}"
            seed = (cfg.seed * 1000 + step) * 1000 + p * cfg.group + i
            jobs.append((sid, p, play(url, sid, prompt, cfg, seed)))
    replies = await asyncio.gather(*(job for _, _, job in jobs))
    return [(sid, p, reward(r)) for (sid, p, _), r in zip(jobs, replies, strict=True)]


async def push_while_in_flight(sync: WeightSync, version: str, cfg: Config, before: float) -> None:
    """Push once the step's sessions are sampling (the engine has generated some of their
    tokens), so turns are in flight across the update."""
    wanted = before + cfg.prompts * cfg.group * 2
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if await generated_tokens(sync, within_s=deadline - time.monotonic()) >= wanted:
                break
        await asyncio.sleep(0.01)
    await asyncio.to_thread(sync.push, version, PauseMode(cfg.pause_mode))


async def run_arm(
    arm: str, cfg: Config, sync: WeightSync, url: str, model_dir: Path, device: str = "cpu"
) -> list[StepRow]:
    # Every arm starts from the same weights, served as version 0.
    await asyncio.to_thread(sync.start, model_dir)
    trainer = None if arm == "frozen" else Trainer(model_dir, cfg, device)
    rows = []
    version = 0
    push: asyncio.Task[None] | None = None
    for step in range(cfg.steps):
        start = time.perf_counter()
        if trainer is not None and step > 0:
            sync.stage(trainer, arm, step)
            version = step
            before = await generated_tokens(sync)
            push = asyncio.ensure_future(push_while_in_flight(sync, str(version), cfg, before))
        sessions = await rollouts(url, cfg, arm, step)
        if push is not None:
            await push
            push = None
        answers = [
            await asyncio.to_thread(finish_over_http, url, sid, admin_token=ADMIN_TOKEN, reward=r)
            for sid, _, r in sessions
        ]
        samples = [a.samples[0] for a in answers]
        rewards = [r for _, _, r in sessions]
        groups = [g for _, g, _ in sessions]
        generated = sum(a.ledger["generated_tokens"] for a in answers)
        across = [
            t for a in answers for t in a.ledger["turns"] if len(t.get("weight_versions", ())) > 1
        ]
        kept, report = limit_staleness(samples, version, cfg.max_staleness, StalenessPolicy.MASK)
        trained = sum(int(s.loss_mask.sum()) for s in kept)
        dev_same = dev_stale = float("nan")
        if trainer is not None:
            batch = kept if arm == "trained" else [shifted(s) for s in kept]
            adv = advantages(rewards, groups)
            dev_same, dev_stale = await asyncio.to_thread(
                trainer.step, list(zip(batch, adv, strict=True)), version
            )
        rows.append(
            StepRow(
                arm=arm,
                step=step,
                sessions=len(sessions),
                generated=generated,
                trained=trained,
                reward=sum(rewards) / len(rewards),
                version=await asyncio.to_thread(sync.version),
                across_update_turns=len(across),
                across_update_tokens=sum(t["generated"] for t in across),
                retried_turns=sum(a.ledger["turns_retried"] for a in answers),
                discarded_tokens=sum(a.ledger["tokens_discarded"] for a in answers),
                stale_masked=report.tokens_masked,
                ratio_dev_same_version=dev_same,
                ratio_dev_stale=dev_stale,
                seconds=time.perf_counter() - start,
            )
        )
        print(format_row(rows[-1]), flush=True)
        if dev_same > MATCH_TOLERANCE:
            print(
                f"  the engine's logprobs are not the trainer's: |ratio - 1| = {dev_same:.2e} "
                "on tokens its current weights sampled",
                flush=True,
            )
    return rows


HEADER = (
    f"{'arm':8} {'step':>4} {'sessions':>8} {'generated':>9} {'trained':>7} {'reward':>6} "
    f"{'version':>7} {'across':>11} {'retried':>9} {'stale':>5} {'ratio dev':>9} {'(stale)':>8} "
    f"{'s':>5}"
)


def format_row(r: StepRow) -> str:
    across = f"{r.across_update_turns}/{r.across_update_tokens}"
    retried = f"{r.retried_turns}/{r.discarded_tokens}"
    return (
        f"{r.arm:8} {r.step:>4} {r.sessions:>8} {r.generated:>9} {r.trained:>7} "
        f"{r.reward:>6.3f} {r.version:>7} {across:>11} {retried:>9} {r.stale_masked:>5} "
        f"{r.ratio_dev_same_version:>9.2e} {r.ratio_dev_stale:>8.2f} {r.seconds:>5.1f}"
    )


def summary(rows: Sequence[StepRow], cfg: Config) -> dict[str, Any]:
    """Per arm: the mean reward of the first and of the last third of the steps."""
    tail = max(1, cfg.steps // 3)
    out: dict[str, Any] = {"config": asdict(cfg), "arms": {}}
    for arm in cfg.arms:
        curve = [r.reward for r in rows if r.arm == arm]
        same = [r.ratio_dev_same_version for r in rows if r.arm == arm]
        out["arms"][arm] = {
            "curve": curve,
            "first": sum(curve[:tail]) / tail,
            "last": sum(curve[-tail:]) / tail,
            "max_ratio_dev_same_version": max((d for d in same if d == d), default=None),
            "across_update_turns": sum(r.across_update_turns for r in rows if r.arm == arm),
            "across_update_tokens": sum(r.across_update_tokens for r in rows if r.arm == arm),
            "retried_turns": sum(r.retried_turns for r in rows if r.arm == arm),
            "discarded_tokens": sum(r.discarded_tokens for r in rows if r.arm == arm),
        }
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    """The reward curves of `result` (what `--json` writes) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = result["config"]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    for arm, values in result["arms"].items():
        ax.plot(range(len(values["curve"])), values["curve"], marker="o", label=arm)
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.set_ylim(0, 1.05)
    ax.set_title(
        f"tiny {cfg['model']}, {cfg['prompts']}x{cfg['group']} sessions of {cfg['turns']} turns"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def markdown(result: dict[str, Any]) -> str:
    """`result` (what `--json` writes) as the docs' tables: per arm, per step."""
    cfg = result["config"]
    lines = [
        f"`python examples/closed_loop.py --steps {cfg['steps']} --model {cfg['model']}`: "
        f"{result['seconds']:.0f} s, {result['when']}, commit `{result['commit']}`, "
        f"on {result['machine']}, "
        f"{cfg['prompts']}x{cfg['group']} sessions of {cfg['turns']} turns per step, "
        f"{cfg['max_tokens']} tokens per turn, lr {cfg['lr']} (output layer) and "
        f"{cfg['body_lr']} (the rest), pause mode {cfg['pause_mode']}.",
        "",
        r"| arm | reward, first third | reward, last third | max \|ratio - 1\|, current "
        "weights' tokens | turns across a push |",
        "|---|---|---|---|---|",
    ]
    for arm, v in result["arms"].items():
        dev = v["max_ratio_dev_same_version"]
        lines.append(
            f"| {arm} | {v['first']:.3f} | {v['last']:.3f} | "
            f"{'-' if dev is None else f'{dev:.2e}'} | {v['across_update_turns']} |"
        )
    lines += [
        "",
        "| arm | step | generated | trained | reward | version | turns/tokens across a push "
        "| turns retried/tokens discarded | stale masked | ratio dev (current) "
        "| ratio dev (one step old) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        same, stale = r["ratio_dev_same_version"], r["ratio_dev_stale"]
        lines.append(
            f"| {r['arm']} | {r['step']} | {r['generated']} | {r['trained']} | "
            f"{r['reward']:.3f} | {r['version']} | {r['across_update_turns']}/"
            f"{r['across_update_tokens']} | {r.get('retried_turns', 0)}/"
            f"{r.get('discarded_tokens', 0)} | {r['stale_masked']} | "
            f"{'-' if same != same else f'{same:.2e}'} | "
            f"{'-' if stale != stale else f'{stale:.2f}'} |"
        )
    return "\n".join(lines) + "\n"


def machine() -> str:
    import platform

    return (
        f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}, "
        f"CPython {platform.python_version()}, load average {os.getloadavg()[0]:.1f} at the end"
    )


def vllm_python(given: str | None) -> Path:
    path = given or os.environ.get("TOKENTRAIL_VLLM_PYTHON")
    found = Path(path) if path else REPO / ".ci" / "venv-vllm" / "bin" / "python"
    if not found.exists():
        sys.exit(f"no vLLM at {found}: run .ci/vllm-env, or pass --vllm-python")
    return found


def arguments(description: str) -> argparse.ArgumentParser:
    """The loop's options (the GPU script adds its own to them)."""
    parser = argparse.ArgumentParser(description=description)
    defaults = Config()
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--model", default=defaults.model, help="a tiny model: qwen3, qwen3-moe")
    parser.add_argument("--prompts", type=int, default=defaults.prompts)
    parser.add_argument("--group", type=int, default=defaults.group)
    parser.add_argument("--turns", type=int, default=defaults.turns)
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens)
    parser.add_argument("--lr", type=float, default=defaults.lr, help="the output layer's")
    parser.add_argument("--body-lr", type=float, default=defaults.body_lr, help="the rest's")
    parser.add_argument("--max-staleness", type=int, default=defaults.max_staleness)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--pause-mode", choices=[str(m) for m in PauseMode], default=defaults.pause_mode,
        help="keep: turns in flight carry on under the new weights; wait: they finish under "
        "the old; abort: vLLM aborts them and tokentrail generates them again",
    )  # fmt: skip
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--json", type=Path, help="write the rows and the summary here")
    parser.add_argument("--plot", type=Path, help="write the reward curves here (a PNG)")
    parser.add_argument("--markdown", type=Path, help="write the tables here (Markdown)")
    return parser


def config(args: argparse.Namespace) -> Config:
    return Config(
        steps=args.steps, model=args.model, prompts=args.prompts, group=args.group,
        turns=args.turns, max_tokens=args.max_tokens, lr=args.lr, body_lr=args.body_lr,
        max_staleness=args.max_staleness, seed=args.seed, pause_mode=args.pause_mode,
        arms=tuple(a for a in args.arms.split(",") if a),
    )  # fmt: skip


def report(rows: Sequence[StepRow], cfg: Config, started: float, args: argparse.Namespace) -> None:
    """Print the summary; write what `--json`, `--markdown` and `--plot` ask for."""
    result = summary(rows, cfg)
    result["seconds"] = time.perf_counter() - started
    result["machine"] = machine()
    result["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    result["commit"] = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
        capture_output=True, text=True, check=False,
    ).stdout.strip() or "unknown"  # fmt: skip
    print(json.dumps({k: v for k, v in result.items() if k != "config"}, indent=1))
    result["rows"] = [asdict(r) for r in rows]
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(result))
    if args.plot:
        plot(result, args.plot)


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python")
    args = parser.parse_args(argv)
    cfg = config(args)
    # Untied: vLLM 0.32's CPU build keeps a packed copy of a tied LM head that
    # `reload_weights` leaves stale (the new embeddings are read, the old head samples).
    model_dir = tiny_model(cfg.model, overrides={"tie_word_embeddings": False})
    python = vllm_python(args.vllm_python)
    started = time.perf_counter()
    rows: list[StepRow] = []
    with tempfile.TemporaryDirectory(prefix="closed-loop-") as scratch:
        # An MoE: vLLM starts from a probe of the model (distinct expert weights) to learn the
        # packed order of its experts; every arm's first push serves the real weights.
        moe = "moe" in json.loads((model_dir / "config.json").read_text())["model_type"]
        served = ExpertLayout.probe(model_dir, Path(scratch) / "probe") if moe else model_dir
        vllm = VLLMServer.start(python, served, max_model_len=4096)
        print(f"vLLM up in {vllm.startup_s:.0f} s at {vllm.url}; tiny {cfg.model}", flush=True)
        try:
            layout = ExpertLayout.learn(VLLMWeights(vllm.url), served) if moe else None
            engine = "vllm-tokens://" + vllm.url.removeprefix("http://")
            with tokentrail_serve(engine, model_dir) as url:
                print(HEADER, flush=True)
                sync = ReloadWeights(vllm.url, Path(scratch), layout)
                for arm in cfg.arms:
                    rows += asyncio.run(run_arm(arm, cfg, sync, url, model_dir))
        finally:
            vllm.stop()
    report(rows, cfg, started, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
