"""Image bytes kept once per journal, by digest, instead of in every turn's tags.

A harness resends every earlier image with each later prompt, so tags holding the bytes grew
the journal by turns x images. A turn's stored tags keep each image's description and offset
(digest, type, size, grid, token count) without its `data`; the bytes go into `images` in the
transaction of the first turn that holds them (`Journal._append`), so a turn is never readable
without its images. Reading joins them back (`ImageReader`): the tags come back as the
pipeline made them, base64 `data` included, so replayed and exported samples are unchanged.
Tags that still carry `data` (schema 2, or an image without a digest) are read as they are.
"""

from __future__ import annotations

import binascii
import sqlite3
import zlib
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokentrail.errors import JournalError
from tokentrail.messages import b64encode_in_pieces
from tokentrail.text.vision import b64decode_in_pieces

_INSERT = "INSERT OR IGNORE INTO images VALUES (?, ?, ?, ?)"


@dataclass(frozen=True)
class StoredImage:
    """One row of `images`: what a turn's tags name by `digest`."""

    digest: str
    media_type: str
    data: bytes

    def row(self) -> tuple[str, str, bytes, int]:
        return self.digest, self.media_type, self.data, zlib.crc32(self.data)


def _addressable(tag: Any) -> bool:
    """An image tag whose bytes can be stored by digest (as `PreparedTurn.image_tags` makes
    them); anything else stays in the tags as given."""
    return (
        isinstance(tag, Mapping)
        and isinstance(tag.get("digest"), str)
        and isinstance(tag.get("media_type"), str)
        and isinstance(tag.get("data"), str)
    )


def split_images(
    metadata: dict[str, Any], stored: Container[str]
) -> tuple[dict[str, Any], list[StoredImage]]:
    """`metadata` as a turn stores it (its images named by digest, without bytes), and the
    images it holds that are not in `stored` yet (their bytes decoded). `metadata` itself is
    left as it is: the tree keeps it."""
    images = metadata.get("images")
    if not isinstance(images, list) or not any(_addressable(t) for t in images):
        return metadata, []
    tags: list[Any] = []
    new: dict[str, StoredImage] = {}
    for tag in images:
        if not _addressable(tag):
            tags.append(tag)
            continue
        digest = tag["digest"]
        if digest not in stored and digest not in new:
            try:
                # In pieces: one call over a 20 MB image's text holds the interpreter (and
                # the event loop waiting for it) for tens of milliseconds.
                data = b64decode_in_pieces(tag["data"])
            except (binascii.Error, ValueError):
                tags.append(tag)  # Not base64: kept as given, not silently changed.
                continue
            new[digest] = StoredImage(digest, tag["media_type"], data)
        tags.append({k: v for k, v in tag.items() if k != "data"})
    return {**metadata, "images": tags}, list(new.values())


class StoredImages:
    """A writer's view of `images`: the digests it holds. A turn inserts, in its own
    transaction, the images it holds that are not among them; a digest joins them only once
    that transaction committed, so a turn naming an image never commits without it."""

    def __init__(self) -> None:
        self.digests: set[str] = set()

    def load(self, db: sqlite3.Connection) -> None:
        self.digests = {digest for (digest,) in db.execute("SELECT digest FROM images")}

    def split(self, metadata: dict[str, Any]) -> tuple[dict[str, Any], list[StoredImage]]:
        """`split_images` against what is stored."""
        return split_images(metadata, self.digests)

    def insert(self, db: sqlite3.Connection, images: Sequence[StoredImage]) -> None:
        """Within the caller's transaction (a concurrent turn may have stored one already)."""
        if not images:
            return  # no statement for a turn without new images (most turns)
        db.executemany(_INSERT, [i.row() for i in images])
        # SQLite keeps its own copy of a bound blob in the cached statement until the next
        # binding: the last image's bytes would stay in memory for good. Bound again with
        # nulls, a row `media_type NOT NULL` makes the insert ignore, the copy is freed.
        db.execute(_INSERT, (None, None, None, None))

    def committed(self, images: Iterable[StoredImage]) -> None:
        self.digests.update(i.digest for i in images)


def named_images(metadata: Mapping[str, Any]) -> Iterable[str]:
    """The digests of the images a stored turn's tags name without their bytes."""
    images = metadata.get("images")
    if not isinstance(images, list):
        return ()
    return (
        t["digest"]
        for t in images
        if isinstance(t, Mapping) and "data" not in t and isinstance(t.get("digest"), str)
    )


class ImageReader:
    """Joins image bytes back into stored tags, reading each image from `images` once and
    checking it. Every turn of a session names its earlier images again: they all get the
    one base64 text, so a session read back holds each image's bytes once."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._texts: dict[str, str] = {}

    def __call__(self, metadata: dict[str, Any]) -> dict[str, Any]:
        """`metadata` with every image it names by digest given its base64 `data` back."""
        images = metadata.get("images")
        if not isinstance(images, list) or not any(
            isinstance(t, Mapping) and "data" not in t for t in images
        ):
            return metadata
        joined = [
            {**t, "data": self.text(t.get("digest"))}
            if isinstance(t, Mapping) and "data" not in t
            else t
            for t in images
        ]
        return {**metadata, "images": joined}

    def text(self, digest: object) -> str:
        if not isinstance(digest, str):
            raise JournalError("an image of the turn's tags has neither bytes nor a digest")
        text = self._texts.get(digest)
        if text is None:
            try:
                row = self._db.execute(
                    "SELECT data, crc FROM images WHERE digest = ?", (digest,)
                ).fetchone()
            except sqlite3.OperationalError:
                row = None  # A file without an `images` table (schema 2).
            if row is None:
                raise JournalError(f"image {digest[:16]} is missing")
            if zlib.crc32(row[0]) != row[1]:
                raise JournalError(f"image {digest[:16]}: checksum mismatch")
            text = self._texts[digest] = b64encode_in_pieces(row[0])
        return text
