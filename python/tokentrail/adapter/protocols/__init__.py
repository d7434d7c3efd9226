"""The wire protocols the adapter speaks; each module registers itself on import.

A new protocol is a module with a registered `WireProtocol` subclass, plus its import here.
"""

from __future__ import annotations

from tokentrail.adapter.protocols import anthropic as anthropic
from tokentrail.adapter.protocols import openai as openai
from tokentrail.adapter.protocols import responses as responses
from tokentrail.adapter.protocols.base import WireProtocol
from tokentrail.adapter.protocols.registry import protocol_for_path, protocols, register_protocol

__all__ = ["WireProtocol", "protocol_for_path", "protocols", "register_protocol"]
