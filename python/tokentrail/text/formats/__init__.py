"""Model output formats, one module per family's markup, each registered by name.

Importing the package registers every format: `tool_format("kimi_k2")`,
`reasoning_format("glm45")`; `parsing.parse_output` and `parsing.format_output` use them.
"""

from __future__ import annotations

from tokentrail.text.formats import (  # noqa: F401 - importing a module registers its formats
    deepseek,
    glm,
    harmony,
    hermes,
    kimi,
    llama3,
    minimax,
    qwen3_coder,
    reasoning,
)
from tokentrail.text.formats.base import (
    Malformed,
    MessageFormat,
    ReasoningFormat,
    ToolFormat,
    reasoning_format,
    reasoning_format_names,
    register_reasoning_format,
    register_tool_format,
    tool_format,
    tool_format_names,
)

__all__ = [
    "Malformed",
    "MessageFormat",
    "ReasoningFormat",
    "ToolFormat",
    "reasoning_format",
    "reasoning_format_names",
    "register_reasoning_format",
    "register_tool_format",
    "tool_format",
    "tool_format_names",
]
