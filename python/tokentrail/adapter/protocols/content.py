"""A request's messages as the protocols read them: the list checked (`wire_messages`), each
message's content parts to text, with media counted and images marked (`ContentReader`), and a
`system` note after the start joined to the user text (`append_system_note`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tokentrail.errors import RequestError
from tokentrail.messages import ImageSource, Message
from tokentrail.text.vision import IMAGE_PLACEHOLDER, image_mark, image_source

__all__ = ["ContentReader", "append_system_note", "wire_messages"]


@dataclass
class ContentReader:
    """Reads one request's content parts into text, counting what it cannot keep.

    Text parts give their text; media parts (images, documents, audio: `media_types` maps a
    part type to its kind) become `IMAGE_PLACEHOLDER`, and each one is counted in `media`, so
    a trainer sees how much of a prompt the model never saw. An image part becomes an image
    mark instead and its source is kept in `images` by digest: `text.vision.resolve_images`
    turns the mark into vision tokens for a family that takes images, and into
    `IMAGE_PLACEHOLDER` for the rest. Any other part is refused.
    """

    text_types: Collection[str]
    media_types: Mapping[str, str]
    media: Counter[str] = field(default_factory=Counter)
    images: dict[str, ImageSource] = field(default_factory=dict)

    def text(self, content: object, where: str, *, allow_null: bool = False) -> str:
        """Text of a string or of a list of content parts, the parts joined by newlines."""
        if content is None and allow_null:
            return ""
        if isinstance(content, str):
            return content
        if not isinstance(content, list):
            expected = "a string, null or a list" if allow_null else "a string or a list"
            raise RequestError(f"{where} must be {expected} of content blocks")
        return "\n".join(self.part(block, f"{where}[{pos}]") for pos, block in enumerate(content))

    def part(self, block: object, where: str) -> str:
        """The text of one content part."""
        if not isinstance(block, dict):
            raise RequestError(f"{where} must be a content block object")
        kind = block.get("type")
        if kind in self.text_types:
            if not isinstance(block.get("text"), str):
                raise RequestError(f"{where}.text must be a string")
            return str(block["text"])
        if isinstance(kind, str) and kind in self.media_types:
            self.media[self.media_types[kind]] += 1
            if self.media_types[kind] != "image":
                return IMAGE_PLACEHOLDER
            source = image_source(block)
            self.images[source.digest] = source
            return image_mark(source.digest)
        raise RequestError(f"{where}: unsupported block type {kind!r} here")


def wire_messages(
    body: Mapping[str, Any], roles: Collection[str], start: int = 0
) -> Iterator[tuple[str, dict[str, Any], str]]:
    """The request's `messages`, checked: a non-empty list of objects with a known role.
    Yields (where, message, role) from position `start` on, `where` naming the message in
    errors."""
    raw = body.get("messages")
    if not isinstance(raw, list):
        raise RequestError("messages must be a list")
    if not raw:
        raise RequestError("messages must not be empty")
    for pos in range(start, len(raw)):
        m = raw[pos]
        where = f"messages[{pos}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where} must be an object")
        role = m.get("role")
        if role not in roles:
            raise RequestError(f"{where}.role must be one of {tuple(roles)}, got {role!r}")
        yield where, m, str(role)


def append_system_note(messages: list[Message], text: str) -> None:
    """A `system` message after the start becomes user text.

    Every chat template renders user turns, not all render a system turn after the first, so
    the note joins the user message before it (or becomes one of its own).
    """
    if messages and messages[-1]["role"] == "user":
        prev = messages[-1]
        messages[-1] = {**prev, "content": f"{prev['content']}\n\n{text}"}
    else:
        messages.append({"role": "user", "content": text})
