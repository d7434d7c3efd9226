"""What a session's images cost the journal and the turns' tags: before (every turn's tags carry
base64 bytes of every image its prompt holds) and after (bytes stored once per digest).

One Claude-Code-like session of 20 turns through the real adapter, Anthropic SDK and Qwen3-VL
vocabulary: turn 1 sends a 500 KB PNG, turn 10 a second one (180 KB), and every prompt sends
the whole conversation again, images included, as harnesses do. Each side runs in its own
process against a tokentrail tree: this one (after) and `--before` (a checkout of the release
before schema 3). Measured: the journal's bytes on disk once closed, the stored turn payloads,
and the memory the turns' tags take in the session tree (serving) and read back (recovery,
replay, export), counting each object once however many tags hold it. Bytes, not times: the
numbers do not depend on the machine's load. Without `--before`, this tree's side alone.

    python benches/journal_images.py [--before /path/to/old/checkout/python] [--turns 20]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


def png(width: int, height: int, seed: int) -> bytes:
    """Noise, so the PNG is as large as its pixels (a screenshot's worst case)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def unique_bytes(roots: list[Any]) -> int:
    """Memory of everything `roots` reach (dicts, lists, strings, numbers), each object once."""
    seen: set[int] = set()
    total = 0
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    return total


def child(turns: int, out: Path) -> None:
    """One side: serve the session into a fresh journal and measure it."""
    import anthropic

    from tokentrail.adapter import Adapter, start_server
    from tokentrail.engines.scripted import ScriptedEngine
    from tokentrail.storage.journal import Journal
    from tokentrail.storage.journal.read import read_journal
    from tokentrail.text.tokenizer import load_tokenizer
    from tokentrail.trajectory.tree import iter_nodes

    first, second = png(416, 400, seed=1), png(300, 200, seed=2)
    at = {0: first, min(9, turns - 1): second}
    tokenizer = load_tokenizer("builtin:qwen3-vl")
    path = out / "run.db"
    journal = Journal(path)
    script = [[{"type": "text", "text": f"looked at it, step {k}"}] for k in range(turns)]
    adapter = Adapter(
        engine=ScriptedEngine(tokenizer, script), tokenizer=tokenizer, journal=journal
    )

    async def go() -> list[Any]:
        runner, url = await start_server(adapter)
        try:
            client = anthropic.AsyncAnthropic(base_url=url, api_key="s", max_retries=0)
            messages: list[dict[str, Any]] = []
            for k in range(turns):
                content: list[dict[str, Any]] = [{"type": "text", "text": f"step {k}"}]
                if k in at:
                    data = base64.b64encode(at[k]).decode()
                    source = {"type": "base64", "media_type": "image/png", "data": data}
                    content.append({"type": "image", "source": source})
                messages.append({"role": "user", "content": content})
                reply = await client.messages.create(
                    model="m", max_tokens=16, messages=messages, extra_headers={"X-Session-Id": "s"}
                )
                messages.append(
                    {"role": "assistant", "content": [b.model_dump() for b in reply.content]}
                )
            root = adapter.manager.root("s")
            return [n.metadata for n in iter_nodes(root) if n.turn is not None]
        finally:
            await runner.cleanup()

    tree_tags = asyncio.run(go())
    journal.close()
    files = sum(p.stat().st_size for p in out.iterdir() if p.name.startswith("run.db"))
    db = sqlite3.connect(path)
    payloads = db.execute("SELECT coalesce(sum(length(payload)), 0) FROM events").fetchone()[0]
    tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    images = (0, 0)
    if "images" in tables:
        images = db.execute(
            "SELECT count(*), coalesce(sum(length(data)), 0) FROM images"
        ).fetchone()
    db.close()
    (record,) = read_journal(path).records()
    read_tags = [t.metadata for t in record.turns]
    result = {
        "turns": len(tree_tags),
        "image_bytes": len(first) + len(second),
        "journal_bytes": files,
        "payload_bytes": payloads,
        "image_rows": images[0],
        "image_row_bytes": images[1],
        "tree_tags_bytes": unique_bytes(tree_tags),
        "read_tags_bytes": unique_bytes(read_tags),
        "json_tags_bytes": sum(len(json.dumps(t)) for t in tree_tags),
    }
    print(json.dumps(result))


def side(python_dir: Path, turns: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(python_dir)}
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run(
            [sys.executable, str(HERE), "--child", tmp, "--turns", str(turns)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    if run.returncode:
        raise SystemExit(f"{python_dir}: {run.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="the python/ folder of the older tree")
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.turns, args.child)
        return
    after = side(HERE.parents[1] / "python", args.turns)
    before = side(args.before, args.turns) if args.before is not None else None
    n = after["turns"]
    print(
        f"one session, {n} turns, images {after['image_bytes']:,} bytes in all (a 500 KB PNG "
        "at turn 1, a second at turn 10), every prompt resending them"
    )
    rows = [
        ("journal on disk (db+wal+receipts)", "journal_bytes", 1),
        ("stored turn payloads", "payload_bytes", 1),
        ("stored turn payloads, per turn", "payload_bytes", n),
        ("image rows (count)", "image_rows", 0),
        ("image rows (bytes)", "image_row_bytes", 1),
        ("tags in the tree, per turn", "tree_tags_bytes", n),
        ("tags read back, per turn", "read_tags_bytes", n),
        ("tags' JSON text, per turn (unshared)", "json_tags_bytes", n),
    ]
    if before is None:
        print(f"{'measure':<40}{'this tree':>14}")
        for label, key, per in rows:
            print(f"{label:<40}{after[key] / (per or 1):>14,.0f}")
    else:
        print(f"{'measure':<40}{'before':>14}{'after':>14}{'before/after':>14}")
        for label, key, per in rows:
            b, a = before[key] / (per or 1), after[key] / (per or 1)
            ratio = f"{b / a:.1f}x" if a and b else "-"
            print(f"{label:<40}{b:>14,.0f}{a:>14,.0f}{ratio:>14}")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()} (bytes only: load does not change them)"
    )


if __name__ == "__main__":
    main()
