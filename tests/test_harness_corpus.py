"""Every request body real harnesses sent, in every configuration the tests run them in, passes
the field check and translates: the field check must never refuse what a released harness
sends. The corpus is `tests/fixtures/requests/*.json` (written by the real-harness tests under
TOKENTRAIL_RECORD_CORPUS, `support.capture`) and the two recorded fixtures beside it. The side
requests a rule must tell apart are kept whole there, and each fires its named rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from support import fixtures
from support.capture import FIXTURES as CORPUS
from support.harness_versions import LATEST
from tokentrail.adapter import AdapterConfig
from tokentrail.adapter.protocols.registry import protocol_for_path
from tokentrail.trajectory.side import KNOWN_SIDE_REQUESTS

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


# Every Claude Code title rule, by the release it names.
TITLE_RULES = [
    rule.version
    for rule in KNOWN_SIDE_REQUESTS
    if rule.harness == "claude-code" and rule.what == "session title"
]


@pytest.mark.parametrize("version", TITLE_RULES)
def test_each_claude_code_title_rule_fires_on_the_real_request_of_its_release(version: str) -> None:
    # The bodies of a real interactive session of that release (`test_claude_code_title.py`),
    # the title request's texts whole: with the known side requests excluded, as `serve
    # --exclude-side-requests` runs, the release's own rule fires on the title request and no
    # rule on the agent's requests.
    file = CORPUS / f"claude_code_{version}_interactive_session_title.json"
    doc = json.loads(file.read_text("utf-8"))
    assert (doc["harness"], doc["version"], doc["configuration"]) == (
        "claude-code",
        version,
        "interactive",
    )
    rules = AdapterConfig(exclude_known_side_requests=True).side_rules()
    proto = protocol_for_path("/v1/messages")
    assert proto is not None
    fired = [rules.match(proto.translate(r["body"]).messages) for r in doc["requests"]]
    titles = [i for i, r in enumerate(doc["requests"]) if r["body"]["tools"] == []]
    assert len(titles) == 1 and len(fired) > 1
    assert fired == [
        f"known:claude-code {version} session title" if i in titles else None
        for i in range(len(fired))
    ]
