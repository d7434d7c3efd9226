"""Every request body real harnesses sent, in every configuration the tests run them in, passes
the field check and translates: the field check must never refuse what a released harness
sends. The corpus is `tests/fixtures/requests/*.json` (written by the real-harness tests under
TOKENTRAIL_RECORD_CORPUS, `support.capture`) and the two recorded fixtures beside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from support import fixtures
from support.capture import FIXTURES as CORPUS
from support.harness_versions import LATEST
from tokentrail.adapter.protocols.registry import protocol_for_path

# (name, path, body) of every body in the corpus.
Body = tuple[str, str, dict[str, Any]]


def corpus() -> list[Body]:
    bodies: list[Body] = []
    files = sorted(CORPUS.glob("*.json"))
    assert files, f"no corpus in {CORPUS}"
    for file in files:
        doc = json.loads(file.read_text("utf-8"))
        for i, request in enumerate(doc["requests"]):
            bodies.append((f"{file.stem}[{i}]", request["path"], request["body"]))
    claude = fixtures.load(fixtures.CLAUDE_CODE)
    for i, exchange in enumerate(claude["exchanges"]):
        path = exchange["path"].split("?", 1)[0]
        bodies.append((f"{Path(fixtures.CLAUDE_CODE).stem}[{i}]", path, exchange["request"]))
    codex = fixtures.load(fixtures.CODEX)
    bodies.append((Path(fixtures.CODEX).stem, "/v1/responses", codex["body"]))
    return bodies


BODIES = corpus()


@pytest.mark.parametrize(("name", "path", "body"), BODIES, ids=[b[0] for b in BODIES])
def test_every_body_a_harness_sent_passes_the_field_check_and_translates(
    name: str, path: str, body: dict[str, Any]
) -> None:
    proto = protocol_for_path(path)
    assert proto is not None and path == proto.turn_path, name
    proto.check_fields(body)
    conversation = proto.translate(body)
    assert conversation.messages


def test_the_corpus_holds_the_default_and_quiet_configurations_of_the_latest_claude_code() -> None:
    latest = LATEST["claude-code"].version
    held = set()
    for file in CORPUS.glob("*.json"):
        doc = json.loads(file.read_text("utf-8"))
        held.add((doc["harness"], doc["version"], doc["configuration"]))
        # The adapter served every body it recorded.
        assert {r["status"] for r in doc["requests"]} == {200}, file.name
    assert {("claude-code", latest, "default"), ("claude-code", latest, "quiet")} <= held
    # The default configuration sends the display preference the API's types did not list;
    # it is accepted and counted, never refused.
    default = CORPUS / f"claude_code_{latest}_default_cd_bash_subagent.json"
    requests = json.loads(default.read_text("utf-8"))["requests"]
    displays = {(r["body"].get("thinking") or {}).get("display") for r in requests}
    assert "updates" in displays
    proto = protocol_for_path("/v1/messages")
    assert proto is not None
    assert "thinking.display" in proto.check_fields(requests[0]["body"])


def test_the_corpus_holds_the_default_configuration_of_each_recording_harness() -> None:
    # The real-harness tests that write the corpus under TOKENTRAIL_RECORD_CORPUS run these
    # four in their default configuration, at the pinned releases.
    held = set()
    for file in CORPUS.glob("*.json"):
        doc = json.loads(file.read_text("utf-8"))
        held.add((doc["harness"], doc["version"], doc["configuration"]))
    for harness in ("claude-code", "opencode", "qwen-code", "hermes-agent"):
        assert (harness, LATEST[harness].version, "default") in held, harness
