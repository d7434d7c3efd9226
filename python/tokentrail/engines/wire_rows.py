"""Replay rows off the wire, decoded straight from the answer's bytes into the element type
the store keeps.

SGLang sends rows as standard base64 of little-endian int32, vLLM as base64 of a `.npy` file.
A 128K-token turn at 48 layers x top-8 is ~260 MB of SGLang base64 for ~50 MB of uint8 rows.
`lift_base64` takes the base64 values of the replay keys out of the answer before it is parsed
(the rest is parsed as usual; each value is left as a view into the answer's bytes, never a
`str`); the base64 is then decoded a slice at a time into one array of the store's type, each
slice's values checked to fit that type before they are narrowed, so no copy of the text and no
int32 copy of the turn is ever held. A `.npy` is decoded once and read in place.
"""

from __future__ import annotations

import binascii
import io
import re
import secrets

import numpy as np

from tokentrail.compat import a2b_base64_strict

__all__ = ["CHUNK_CHARS", "decode_int32_base64", "decode_npy_base64", "lift_base64"]

# Base64 as a JSON string holds: a text, or a view of the bytes of the answer it came in.
Base64 = str | memoryview

# The value of a replay key: `"KEY": "` opening a string (the key itself cannot be inside a
# string, where its quotes would be escaped).
_REPLAY_KEY = re.compile(rb'"(routed_experts|indexer_topk)"[ \t\r\n]*:[ \t\r\n]*"')
# What a lifted value is replaced by: a string no engine sends (an escaped NUL first, then a
# nonce of the answer's own, so not even an engine echoing text can forge one).
PLACEHOLDER = "\\u0000tokentrail-base64-{}-{}"

# Base64 characters decoded at a time: 4 MiB of text, 3 MiB of int32 (a multiple of 16, so
# every slice decodes to whole int32 values).
CHUNK_CHARS = 4 * 1024 * 1024


def lift_base64(raw: bytes | bytearray) -> tuple[bytes | bytearray, dict[str, memoryview]]:
    """`raw` (a JSON answer) with the string values of its `routed_experts` and `indexer_topk`
    keys replaced by placeholders; and, by placeholder as `json.loads` reads it, those values as
    views into `raw`. A value with an escape in it stays where it is, for the parser."""
    nonce = secrets.token_hex(8)
    view = memoryview(raw)
    lifted: dict[str, memoryview] = {}
    pieces: list[bytes | memoryview] = []
    kept = 0
    for match in _REPLAY_KEY.finditer(raw):
        if match.start() and raw[match.start() - 1] == ord("\\"):
            continue  # inside a key or a string, whatever it is: left to the parser
        begin = match.end()
        end = raw.find(b'"', begin)
        if end < 0 or raw.find(b"\\", begin, end) >= 0 or begin < kept:
            continue
        placeholder = PLACEHOLDER.format(nonce, len(lifted))
        lifted[placeholder.replace("\\u0000", "\0")] = view[begin:end]
        pieces += [view[kept:begin], placeholder.encode()]
        kept = end
    if not lifted:
        return raw, lifted
    pieces.append(view[kept:])
    return b"".join(pieces), lifted


def decode_int32_base64(
    text: Base64, dtype: np.dtype, chunk_chars: int = CHUNK_CHARS
) -> np.ndarray | str:
    """`text`, standard padded base64 of little-endian int32, as a flat array of `dtype`; or
    what is wrong with it (not base64, not whole int32 values, a value `dtype` cannot hold).
    `chunk_chars` (a multiple of 16) are decoded at a time."""
    if chunk_chars <= 0 or chunk_chars % 16:
        raise ValueError(f"chunk_chars must be a positive multiple of 16, got {chunk_chars}")
    if len(text) % 4:
        return "not base64 (its length is not a multiple of 4)"
    tail = text[-2:]
    tail = tail if isinstance(tail, str) else tail.tobytes().decode("latin-1")
    pad = len(tail) - len(tail.rstrip("="))
    size = len(text) // 4 * 3 - min(pad, 2)
    if size % 4:
        return f"{size} bytes, not whole int32 values"
    out = np.empty(size // 4, dtype=dtype)
    low, high = _limits(out.dtype)
    at = 0
    for begin in range(0, len(text), chunk_chars):
        try:
            chunk = a2b_base64_strict(text[begin : begin + chunk_chars])
        except (binascii.Error, ValueError):
            return "not base64"
        if len(chunk) % 4 or at + len(chunk) // 4 > out.size:
            return "not base64 (padding inside the text)"
        values = np.frombuffer(chunk, dtype="<i4")
        if values.size and (int(values.min()) < low or int(values.max()) > high):
            where = int(np.flatnonzero((values < low) | (values > high))[0])
            return f"value {int(values[where])} at {at + where} does not fit {out.dtype}"
        out[at : at + values.size] = values
        at += values.size
    if at != out.size:
        return "not base64 (padding inside the text)"
    return out


def decode_npy_base64(text: Base64, dtype: np.dtype) -> np.ndarray | str:
    """`text`, base64 of a `.npy` file of integers, as an array of `dtype` (the file's own
    buffer when it already is one); or what is wrong with it."""
    try:
        data = a2b_base64_strict(text)
    except (binascii.Error, ValueError):
        return "not base64"
    header = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(header)
        read = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        shape, fortran, stored = read(header)
    except (ValueError, OSError, EOFError) as exc:
        return f"not a .npy ({exc})"
    if stored.kind not in "iu" or stored.hasobject:
        return f"a .npy of {stored}, not of integers"
    count = int(np.prod(shape))
    if len(data) - header.tell() != count * stored.itemsize:
        return f"a .npy of {len(data) - header.tell()} bytes of data for shape {shape}"
    rows = np.frombuffer(data, dtype=stored, count=count, offset=header.tell())
    rows = rows.reshape(shape, order="F" if fortran else "C")
    if rows.dtype == dtype:
        return rows
    low, high = _limits(np.dtype(dtype))
    if rows.size and (int(rows.min()) < low or int(rows.max()) > high):
        return f"values in [{int(rows.min())}, {int(rows.max())}], outside {np.dtype(dtype)}"
    return rows.astype(dtype)


def _limits(dtype: np.dtype) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)
