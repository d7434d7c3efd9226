"""The internal message format: what chat templates render and the routing tree records.

Every wire protocol translates its request into a `Conversation` of `Message`s (OpenAI-style
chat-template messages: tool-call arguments as dicts, no ids, no wire-only keys) and its tools
into `ToolSchema`s; everything below the adapter speaks only this.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, TypedDict

from tokentrail.kinds import ToolChoice

Role = Literal["system", "user", "assistant", "tool"]


class FunctionCall(TypedDict):
    name: str
    # A dict inside. `{"_raw_arguments": text}` in turns journaled before arguments that are
    # not a JSON object were refused (they still render as that text).
    arguments: dict[str, Any]


class ToolCall(TypedDict):
    type: Literal["function"]
    function: FunctionCall


class Message(TypedDict, total=False):
    role: Role
    content: str
    reasoning_content: str
    tool_calls: list[ToolCall]
    # On tool messages: the result reports a failure.
    is_error: bool
    # The digests of the images whose placeholder tokens `content` holds, in order.
    images: list[str]


class _RequiredFunctionSchema(TypedDict):
    name: str
    parameters: dict[str, Any]


class FunctionSchema(_RequiredFunctionSchema, total=False):
    # Optional (`NotRequired` is 3.11+; a total=False subclass says the same on 3.10).
    description: str


class ToolSchema(TypedDict):
    type: Literal["function"]
    function: FunctionSchema


@dataclass(frozen=True)
class ImageSource:
    """An image part as the request gave it, not yet decoded: base64 data with its declared
    type, or a URL (refused for vision: the adapter fetches nothing). `digest` is the SHA-256
    of the base64 text (or of the URL): two parts are the same image when their digests are."""

    digest: str
    media_type: str | None
    data: str | None = None
    url: str | None = None

    @staticmethod
    def of_base64(data: str, media_type: str | None) -> ImageSource:
        return ImageSource(_sha256_text(data), media_type, data=data)

    @staticmethod
    def of_url(url: str) -> ImageSource:
        """A URL part; a `data:` URL is base64 data with its type."""
        comma = url.find(",") if url.startswith("data:") else -1
        if comma >= 0 and url[5:comma].endswith(";base64"):
            # One copy of the payload, not two: it may be 27 MB, copied holding the interpreter.
            head = url[5 : comma - len(";base64")]
            return ImageSource.of_base64(url[comma + 1 :], head.lower() or None)
        return ImageSource(_sha256(url.encode()), None, url=url)

    @staticmethod
    def unreadable(part: str) -> ImageSource:
        """A part that names no data or URL (a `file_id`): `part` is its JSON."""
        return ImageSource(_sha256(part.encode()), None)


@dataclass(frozen=True)
class ImageInput:
    """A decoded image as a trainer needs it: its bytes (content-addressed by `digest`), its
    size, and the processor's grid (`image_grid_thw`) and token count for it."""

    digest: str
    media_type: str
    data: bytes
    width: int
    height: int
    grid_thw: tuple[int, int, int]
    tokens: int

    @cached_property
    def base64_data(self) -> str:
        """The bytes as base64, made once: every later prompt of a session holds the image
        again (the same object, from `ImageCache`), and each turn's tags share this text."""
        return b64encode_in_pieces(self.data)

    def data_url(self) -> str:
        return f"data:{self.media_type};base64,{self.base64_data}"

    def described(self) -> dict[str, Any]:
        """Everything but the bytes, as JSON."""
        return {
            "digest": self.digest,
            "media_type": self.media_type,
            "width": self.width,
            "height": self.height,
            "image_grid_thw": list(self.grid_thw),
            "tokens": self.tokens,
        }


@dataclass
class Conversation:
    """A request in tokentrail's terms: chat-template messages and OpenAI-style tools, what it
    lets the model do with them, and what translation could not keep."""

    messages: list[Message]
    tools: list[ToolSchema] | None
    tool_choice: ToolChoice = ToolChoice.AUTO
    # With `ToolChoice.REQUIRED`: the one tool the model must call (None: any of them).
    forced_tool: str | None = None
    # Typed tools the harness does not run itself (server tools such as `web_search`): not
    # offered to the model, named here.
    withheld_tools: list[str] = field(default_factory=list)
    # Images, documents and other media rendered as a placeholder, by kind.
    dropped_media: dict[str, int] = field(default_factory=dict)
    # The first this-many messages are the very objects of the session's previous
    # conversation, unchanged since (the adapter's reusing parse vouches for it): what the
    # pipeline worked out for them last turn holds. 0: nothing is assumed.
    unchanged: int = 0
    # The images the messages' placeholder tokens stand for, in the order they occur
    # (`text.vision.resolve_images`); empty for a family without a vision encoder.
    images: list[ImageInput] = field(default_factory=list)
    # The image parts translation found, by digest, where `content` holds their marks.
    image_sources: dict[str, ImageSource] = field(default_factory=dict)
    # The ids the harness sent with an assistant message's tool calls (Anthropic `tool_use.id`,
    # Chat `tool_calls[].id`, Responses `call_id`), by the message's index, in call order;
    # only for messages whose every call had one. Messages do not carry them: templates mint
    # their own, and routing keys must not see them. The restore stage reads them
    # (`trajectory.restore`: an echo of a call whose id we minted is our call).
    call_ids: dict[int, tuple[str, ...]] = field(default_factory=dict)


def function_tool(name: str, description: object, parameters: dict[str, Any]) -> ToolSchema:
    """A tool in the shape tokentrail uses inside, whichever protocol declared it."""
    function: FunctionSchema = {"name": name, "parameters": parameters}
    if isinstance(description, str):
        function["description"] = description
    return {"type": "function", "function": function}


def tool_names(message: Message | dict[str, Any] | None) -> list[str]:
    """The names of a message's tool calls, in order."""
    if not message:
        return []
    names = []
    for call in message.get("tool_calls") or ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# Text of an image's size is hashed in pieces: encoding 27 MB of base64 at once holds the
# interpreter (and every other thread, the event loop's too) for tens of milliseconds.
_PIECE = 1 << 18


# Bytes base64-encoded at a time (a multiple of 3, so the pieces join into the whole's text).
_B64_PIECE = 3 << 16


def b64encode_in_pieces(data: bytes) -> str:
    """`base64.b64encode(data).decode()`, a piece at a time: one call over a 20 MB image holds
    the interpreter for tens of milliseconds, and `bytes.join` lets go of it while it copies."""
    if len(data) <= _B64_PIECE:
        return base64.b64encode(data).decode("ascii")
    view = memoryview(data)
    starts = range(0, len(data), _B64_PIECE)
    pieces = [base64.b64encode(view[at : at + _B64_PIECE]) for at in starts]
    return b"".join(pieces).decode("ascii")


def _sha256_text(text: str) -> str:
    """`_sha256(text.encode())`, a piece at a time."""
    digest = hashlib.sha256()
    for start in range(0, len(text), _PIECE):
        digest.update(text[start : start + _PIECE].encode())
    return digest.hexdigest()
