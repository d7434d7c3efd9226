"""The one place every real harness the tests install is pinned: the release each runs in CI,
its registry and package. `scripts/bump-harnesses` looks up the newest releases, rewrites the
`LATEST` pins here and reruns the harness tests, so a new release is one command to check.
"""

from __future__ import annotations

from typing import NamedTuple


class Pin(NamedTuple):
    registry: str  # "npm" or "pip"
    package: str
    version: str


# The releases the harness tests run, each in its default configuration (and in the quiet
# one where a test asks for it). `scripts/bump-harnesses` rewrites the versions.
LATEST: dict[str, Pin] = {
    "claude-code": Pin("npm", "@anthropic-ai/claude-code", "2.1.332"),
    "codex": Pin("npm", "@openai/codex", "0.171.0"),
    "qwen-code": Pin("npm", "@qwen-code/qwen-code", "0.24.4"),
    "hermes-agent": Pin("pip", "hermes-agent", "0.19.0"),
    "opencode": Pin("npm", "opencode-ai", "1.18.33"),
    "mini-swe-agent": Pin("pip", "mini-swe-agent", "2.4.6"),
}

# Older releases tests keep on purpose, which the bump leaves alone: Claude Code 2.1.197 is
# the release `tests/fixtures/claude_code_2.1.197_edit_write_bash.json` was recorded with, and
# the last to answer parallel tool calls in call order.
KEPT: dict[str, Pin] = {
    "claude-code": Pin("npm", "@anthropic-ai/claude-code", "2.1.197"),
}
