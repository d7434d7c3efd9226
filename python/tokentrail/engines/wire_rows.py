"""Replay rows off the wire, decoded straight into the element type the store keeps.

SGLang sends rows as standard base64 of little-endian int32, vLLM as base64 of a `.npy` file.
A 128K-token turn at 48 layers x top-8 is ~260 MB of SGLang base64 for ~50 MB of uint8 rows:
the base64 is decoded a slice at a time into one array of the store's type, each slice's values
checked to fit that type before they are narrowed, so no int32 copy of the turn is ever held.
A `.npy` is decoded once and read in place (`np.frombuffer` past its header).
"""

from __future__ import annotations

import binascii
import io

import numpy as np

__all__ = ["CHUNK_CHARS", "decode_int32_base64", "decode_npy_base64"]

# Base64 characters decoded at a time: 4 MiB of text, 3 MiB of int32 (a multiple of 16, so
# every slice decodes to whole int32 values).
CHUNK_CHARS = 4 * 1024 * 1024


def decode_int32_base64(
    text: str, dtype: np.dtype, chunk_chars: int = CHUNK_CHARS
) -> np.ndarray | str:
    """`text`, standard padded base64 of little-endian int32, as a flat array of `dtype`; or
    what is wrong with it (not base64, not whole int32 values, a value `dtype` cannot hold).
    `chunk_chars` (a multiple of 16) are decoded at a time."""
    if chunk_chars <= 0 or chunk_chars % 16:
        raise ValueError(f"chunk_chars must be a positive multiple of 16, got {chunk_chars}")
    if len(text) % 4:
        return "not base64 (its length is not a multiple of 4)"
    pad = len(text) - len(text.rstrip("=")) if text else 0
    size = len(text) // 4 * 3 - min(pad, 2)
    if size % 4:
        return f"{size} bytes, not whole int32 values"
    out = np.empty(size // 4, dtype=dtype)
    low, high = _limits(out.dtype)
    at = 0
    for begin in range(0, len(text), chunk_chars):
        try:
            chunk = binascii.a2b_base64(text[begin : begin + chunk_chars], strict_mode=True)
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


def decode_npy_base64(text: str, dtype: np.dtype) -> np.ndarray | str:
    """`text`, base64 of a `.npy` file of integers, as an array of `dtype` (the file's own
    buffer when it already is one); or what is wrong with it."""
    try:
        data = binascii.a2b_base64(text, strict_mode=True)
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
