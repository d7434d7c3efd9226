from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent))

# Every decode by the core's byte-level table, in this process and in the servers the tests
# start, is checked against `tokenizers`' (`text.detokenize.VERIFY_DECODE`).
os.environ.setdefault("TOKENTRAIL_VERIFY_DECODE", "1")
# And every chunked body whose framing the core takes off is read by the reference too
# (`engines.streaming.VERIFY_CHUNKS`).
os.environ.setdefault("TOKENTRAIL_VERIFY_CHUNKS", "1")

# The run's peak memory, printed at the end and held to a budget (support/memory_budget.py).
from support.memory_budget import (  # noqa: E402, F401
    pytest_configure,
    pytest_runtest_setup,
    pytest_sessionfinish,
    pytest_terminal_summary,
)

settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(params=["rust", "python"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def tokenizer():
    """The built-in Qwen3 vocabulary and template, loaded once."""
    from tokentrail.text.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def family_tokenizer():
    """`load(name)`: a family's builtin vocabulary, or its stand-in when no package ships one,
    each loaded once per test session (from the default cache, like `tokenizer`)."""
    from tokentrail.text.families import family
    from tokentrail.text.tokenizer import load_tokenizer

    loaded: dict[str, object] = {}

    def load(name: str):
        if name not in loaded:
            fam = family(name)
            loaded[name] = load_tokenizer(
                f"builtin:{fam.name}" if fam.vocabulary else f"stand-in:{fam.name}"
            )
        return loaded[name]

    return load
