"""The two backends behind one surface: the reference has every name the stub `_core.pyi`
declares, with the same parameters; and `TOKENTRAIL_BACKEND=python` runs the reference
everywhere: a whole session through the adapter (request reuse, prompt encoding, the journal,
the turn store), its linearization and its packing, in a process where the Rust extension
cannot even be imported."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tokentrail import _core
from tokentrail.core import reference
from tokentrail.core.backend import ENV_VAR, load_backend
from tokentrail.kinds import Backend
from tokentrail.text.tokenizer import load_tokenizer

# Run in a fresh interpreter: `tokentrail._core` is made unimportable before tokentrail loads,
# and the reference's entry points count their calls.
SESSION = textwrap.dedent(
    """
    import asyncio, json, sys, threading, urllib.request
    from collections import Counter

    sys.modules["tokentrail._core"] = None  # any import of the extension now fails

    from tokentrail.core import reference

    calls = Counter()

    def count(owner, name):
        original = getattr(owner, name)

        def counted(*args, **kwargs):
            calls[name] += 1
            return original(*args, **kwargs)

        setattr(owner, name, counted)

    for name in ("index_body", "diff_bodies", "common_prefix_len", "pack"):
        count(reference, name)
    for name in ("encode", "encode_full"):
        count(reference.IncrementalTokenizer, name)
    for name in ("push", "linearize"):
        count(reference.TurnStore, name)

    from tokentrail import pack_samples
    from tokentrail.adapter import Adapter, start_server
    from tokentrail.engines.scripted import ScriptedEngine
    from tokentrail.storage.journal import Journal
    from tokentrail.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    replies = [[{"type": "text", "text": f"Reply {i}."}] for i in range(3)]
    adapter = Adapter(
        engine=ScriptedEngine(tokenizer, replies),
        tokenizer=tokenizer,
        journal=Journal(sys.argv[1]),
    )
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box = {}

    def serve():
        asyncio.set_event_loop(loop)
        box["runner"], box["url"] = loop.run_until_complete(start_server(adapter))
        started.set()
        loop.run_forever()

    threading.Thread(target=serve, daemon=True).start()
    assert started.wait(30)
    messages = []
    for turn in range(3):
        messages.append({"role": "user", "content": f"Step {turn}: fix calc.py"})
        body = {"model": "m", "max_tokens": 64, "messages": messages}
        request = urllib.request.Request(
            box["url"] + "/v1/messages",
            json.dumps(body).encode(),
            {"Content-Type": "application/json", "Authorization": "Bearer s1"},
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            content = json.loads(reply.read())["content"]
        messages.append({"role": "assistant", "content": content})
    trajectory = adapter.manager.finish("s1", reward=1.0)
    batch = pack_samples(trajectory.samples)
    asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(30)
    print(json.dumps({
        "extension_loaded": sys.modules.get("tokentrail._core") is not None,
        "backend": repr(adapter.manager.core),
        "turns": len(trajectory.ledger.turns),
        "packed_tokens": batch.num_tokens,
        "calls": calls,
    }))
    """
)


def test_the_python_backend_runs_a_session_without_the_extension(tmp_path: Path) -> None:
    env = {**os.environ, ENV_VAR: "python"}
    done = subprocess.run(
        [sys.executable, "-c", SESSION, str(tmp_path / "journal.db")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["extension_loaded"] is False
    assert result["backend"] == "Core('python')"
    assert result["turns"] == 3
    assert result["packed_tokens"] > 0
    calls = result["calls"]
    # The request index and diff (adapter), the prompt encoder (pipeline and engine), the
    # journal's base search, the store and its linearization, and the packing: all reference.
    for name in ("index_body", "diff_bodies", "encode", "push", "linearize", "pack"):
        assert calls.get(name, 0) > 0, (name, calls)
    assert calls.get("common_prefix_len", 0) > 0, calls


@pytest.mark.parametrize("name", [None, "python", Backend.PYTHON, "rust"])
def test_load_backend_reads_the_switch(monkeypatch: pytest.MonkeyPatch, name) -> None:
    monkeypatch.setenv(ENV_VAR, "python")
    expected = Backend.RUST if name == "rust" else Backend.PYTHON
    core = load_backend(name)
    assert core.backend is expected
    # One `Core` per backend, whichever way it is named.
    assert load_backend(expected.value) is core


def instances(core: ModuleType, tokenizer_json: str) -> dict[str, Any]:
    """One object of each class the core declares, made by `core`."""
    lin = core.linearize([([1], [2], None)], [[0]])
    return {
        "Drift": core.Drift("clean", 0, 0),
        "Span": core.Span(0, 0, 0),
        "DriftEvent": core.DriftEvent(0, 0, "clean", 0, 0),
        "SampleBuilder": core.SampleBuilder(),
        "Linearized": lin,
        "BuiltSample": lin.samples[0],
        "Packed": core.pack([[1, 2]], [[1]], [[0.0]], [1], [1.0]),
        "TurnStore": core.TurnStore(),
        "IncrementalTokenizer": core.IncrementalTokenizer(tokenizer_json),
        "Detokenizer": core.Detokenizer(tokenizer_json),
        "BodyIndex": core.index_body(b'{"messages": []}', "messages"),
    }


def parameters(obj: Any) -> list[tuple[str, Any, bool]] | None:
    """Each parameter's name, kind and whether it has a default; None for no signature."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [
        (p.name, p.kind, p.default is not inspect.Parameter.empty)
        for p in signature.parameters.values()
    ]


def test_the_reference_has_the_stub_surface() -> None:
    rust = instances(_core, load_tokenizer().tokenizer.to_str())
    py = instances(reference, load_tokenizer().tokenizer.to_str())
    declared = [name for name in _core.__all__ if name != "__version__"]
    assert set(rust) == {name for name in declared if isinstance(getattr(_core, name), type)}
    wrong = []
    for name in declared:
        ours, theirs = getattr(reference, name, None), getattr(_core, name)
        if ours is None:
            wrong.append(f"{name}: missing")
        elif callable(theirs) and parameters(theirs) not in (None, [], parameters(ours)):
            wrong.append(f"{name}: {parameters(ours)} for {parameters(theirs)}")
        elif not callable(theirs) and ours != theirs:
            wrong.append(f"{name} = {ours!r}, the core's is {theirs!r}")
    for name, obj in rust.items():
        for attr in (a for a in dir(obj) if not a.startswith("_")):
            if not hasattr(py[name], attr):
                wrong.append(f"{name}.{attr}: missing")
            elif callable(getattr(obj, attr)) and parameters(getattr(obj, attr)) != parameters(
                getattr(py[name], attr)
            ):
                wrong.append(f"{name}.{attr}: other parameters")
    assert wrong == []
