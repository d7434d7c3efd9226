"""How fast the viewer opens a large session: a 128-turn session whose last prompt holds 64K
tokens (a 16K-token system prompt, then per turn a tool call and a tool result).

    python benches/viewer_open.py [--turns 128] [--context 65536] [--no-browser]

The journal is written with the journal's own API; `tokentrail view`'s app serves it. Measured:
reading the journal (replay and linearization of the session), the API's answers (server time
and bytes), and, in headless Chromium when it is installed, the time from navigation until
the session page's tree and the first turn's tokens are on screen. The first turn shows its
whole prompt (the 16K system prompt): it is rendered lazily (2,000 tokens, the rest as the
reader scrolls) and, for the ratio, eagerly (every token at once, `?chunk=all`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from aiohttp import web

from tokentrail.storage.journal import Journal
from tokentrail.storage.journal.record import JournaledTurn
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.view.app import standalone_app
from tokentrail.view.sources import JournalSource

SID = "big"


def write_journal(path: Path, turns: int, context: int, seed: int = 0) -> tuple[int, int]:
    """One session of `turns` turns growing to `context` prompt tokens; (generated, context)."""
    rng = np.random.default_rng(seed)
    system_tokens = context // 4
    per_turn = (context - system_tokens) // turns
    out_len, tool_len = per_turn // 2, per_turn - per_turn // 2
    journal = Journal(path)
    journal.set_meta(tokenizer="builtin:qwen3")
    messages: list[dict] = [
        {"role": "system", "content": "You are a coding agent. " * 10},
        {"role": "user", "content": "Fix the tests."},
    ]
    prompt = rng.integers(1000, 140000, system_tokens, dtype=np.uint32)
    generated = 0
    for k in range(turns):
        output = rng.integers(1000, 140000, out_len, dtype=np.uint32)
        call = {
            "id": f"call_{k}",
            "type": "function",
            "function": {"name": "Bash", "arguments": {"n": k}},
        }
        reply = {"role": "assistant", "content": f"step {k}", "tool_calls": [call]}
        journal.turn(
            JournaledTurn(
                SID,
                translated=list(messages),
                response_message=reply,
                tools=None,
                prompt_ids=prompt,
                output_ids=output,
                logprobs=np.full(out_len, -0.25, dtype=np.float32),
                finish_reason="tool_calls",
                ill_formed=False,
                metadata={},
            )
        )
        generated += out_len
        messages += [reply, {"role": "tool", "tool_call_id": f"call_{k}", "content": f"ok {k}"}]
        tool_ids = rng.integers(1000, 140000, tool_len, dtype=np.uint32)
        prompt = np.concatenate([prompt, output, tool_ids])
    journal.close()
    return generated, len(prompt) - tool_len


def serve(app: web.Application) -> tuple[str, threading.Event]:
    """The app on a free port in a thread of its own; set the event to stop it."""
    ready: list[str] = []
    stop = threading.Event()

    def run() -> None:
        async def main() -> None:
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            ready.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
            while not stop.is_set():
                await asyncio.sleep(0.05)
            await runner.cleanup()

        asyncio.run(main())

    threading.Thread(target=run, daemon=True).start()
    while not ready:
        time.sleep(0.01)
    return ready[0], stop


def timed_get(url: str, repeats: int) -> tuple[float, int]:
    import urllib.request

    times, size = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        with urllib.request.urlopen(url) as resp:
            size = len(resp.read())
        times.append(time.perf_counter() - start)
    return statistics.median(times), size


def browser_times(url: str, repeats: int, turns: int) -> dict[str, float] | None:
    """Navigation to on-screen, median seconds: the session page, the first turn lazily and
    eagerly rendered. None without Debian's chromium."""
    if not (os.path.exists("/usr/bin/chromium") and os.path.exists("/usr/bin/chromedriver")):
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1400,1000")
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    out: dict[str, list[float]] = {"session": [], "turn_lazy": [], "turn_eager": []}
    try:
        pages = [
            ("session", f"{url}/#/s/{SID}", f"#tree .node[data-turn='{turns}']"),
            ("turn_lazy", f"{url}/#/s/{SID}/t/1", "#tokens"),
            ("turn_eager", f"{url}/?chunk=all#/s/{SID}/t/1", "#tokens"),
        ]
        for _ in range(repeats):
            for name, address, css in pages:
                driver.get("about:blank")
                start = time.perf_counter()
                driver.get(address)
                WebDriverWait(driver, 60).until(
                    ec.presence_of_element_located((By.CSS_SELECTOR, css))
                )
                # Until the browser has laid out and painted what it rendered.
                driver.execute_async_script(
                    "const done = arguments[0]; requestAnimationFrame(() => setTimeout(done, 0));"
                )
                out[name].append(time.perf_counter() - start)
    finally:
        driver.quit()
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=128)
    parser.add_argument("--context", type=int, default=65536)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    tokenizer = load_tokenizer("builtin:qwen3")
    tokenizer_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="tokentrail-viewer-") as tmp:
        path = Path(tmp) / "big.db"
        generated, context = write_journal(path, args.turns, args.context)
        system_tokens = args.context // 4
        start = time.perf_counter()
        source = JournalSource(path, tokenizer)
        read_s = time.perf_counter() - start
        url, stop = serve(standalone_app(source))
        try:
            rows = [
                ("sessions list", timed_get(f"{url}/api/sessions", args.repeats)),
                ("session (ledger, tree)", timed_get(f"{url}/api/sessions/{SID}", args.repeats)),
                (
                    f"turn 1 ({system_tokens:,}-token prompt)",
                    timed_get(f"{url}/api/sessions/{SID}/turns/1", args.repeats),
                ),
                (
                    f"turn {args.turns}",
                    timed_get(f"{url}/api/sessions/{SID}/turns/{args.turns}", args.repeats),
                ),
            ]
            browser = None if args.no_browser else browser_times(url, args.repeats, args.turns)
        finally:
            stop.set()
    print(f"viewer: one session, {args.turns} turns, last prompt {context:,} tokens, "
          f"{generated:,} generated; machine: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'load the tokenizer (builtin:qwen3)':<44}{tokenizer_s * 1000:>10.0f} ms")
    print(f"{'read the journal (replay + linearize)':<44}{read_s * 1000:>10.0f} ms")
    print(f"{'API answer':<44}{'median':>10}{'bytes':>12}")
    for name, (seconds, size) in rows:
        print(f"  {name:<42}{seconds * 1000:>7.1f} ms{size:>12,}")
    if browser is None:
        print("browser: not measured (no /usr/bin/chromium, or --no-browser)")
    else:
        print(f"{'headless Chromium, navigation to painted':<44}{'median':>10}")
        page = f"session page (tree of {args.turns} turns)"
        print(f"  {page:<42}{browser['session'] * 1000:>7.0f} ms")
        lazy, eager = browser["turn_lazy"], browser["turn_eager"]
        print(f"  {'turn 1, lazy (2,000 tokens, then on scroll)':<42}{lazy * 1000:>7.0f} ms")
        print(f"  {'turn 1, eager (every token)':<42}{eager * 1000:>7.0f} ms")
        print(f"  {'eager / lazy':<42}{eager / lazy:>9.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
