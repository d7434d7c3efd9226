"""How the protocols read and write the wire where slime's adapters read it otherwise:
`WireOptions`, tokentrail's reading by default, which `AdapterConfig.wire` sets for an adapter's
protocols (`WireProtocol.configured`) and slime's drop-in turns on."""

from __future__ import annotations

from dataclasses import dataclass

# slime's wrapper of a mid-list `system` message (`WireOptions.system_reminder`).
REMINDER_OPEN = "<system-reminder>\n"
REMINDER_CLOSE = "\n</system-reminder>\n"


@dataclass(frozen=True)
class WireOptions:
    """Where a protocol can read or write the wire as slime's adapters do instead of as
    tokentrail does; tokentrail's reading by default. `AdapterConfig.wire` sets them for an
    adapter's protocols; slime's drop-in (`integrations.slime`) turns all three on."""

    # An Anthropic `system` message in the message list becomes a user message of its own,
    # wrapped in `<system-reminder>` tags, where slime's adapter renders it; off: its text
    # joins the user message before it (`append_system_note`).
    system_reminder: bool = False
    # An Anthropic `tool_use` without an `id` is answered by the next `tool_result` that names
    # none of its message's calls, in the order they come, as slime pairs them; off: such a
    # result is refused (the Messages API requires the id).
    results_by_position: bool = False
    # A Chat Completions stream opens with the delta `{"role": "assistant"}`, as slime's does;
    # off: `{"role": "assistant", "content": ""}`, as OpenAI's API does.
    bare_role_chunk: bool = False


# tokentrail's own reading of the wire.
DEFAULT_WIRE = WireOptions()


def system_reminder(text: str) -> str:
    """A `system` message's text wrapped as slime wraps it (`WireOptions.system_reminder`)."""
    return f"{REMINDER_OPEN}{text}{REMINDER_CLOSE}"


__all__ = ["DEFAULT_WIRE", "REMINDER_CLOSE", "REMINDER_OPEN", "WireOptions", "system_reminder"]
