"""`/finish` answers as typed arrays: the samples as the flat columns of a `.npz` sample file
(`application/x-npz`) or as an Arrow IPC stream of one row per sample
(`application/vnd.apache.arrow.stream`), chosen by the request's `Accept`; JSON stays the
default. The ledger and what the session lost travel as JSON beside the arrays (an array of
the archive; the Arrow schema's metadata). `read_finish` turns any of the three back into
samples, so a trainer reads routed experts without a nested JSON list per token.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tokentrail.compat import StrEnum
from tokentrail.errors import ExportError
from tokentrail.storage.export import (
    arrow_table,
    columns_of_arrow,
    sample_columns,
    samples_from_columns,
)
from tokentrail.trajectory.sample import Sample

__all__ = ["FinishAnswer", "FinishFormat", "pick_format", "read_finish", "write_finish"]


class FinishFormat(StrEnum):
    """The media types `/finish` answers in."""

    JSON = "application/json"
    NPZ = "application/x-npz"
    ARROW = "application/vnd.apache.arrow.stream"


def pick_format(accept: str | None) -> FinishFormat:
    """The format an `Accept` header asks for: the binary one it ranks highest, else JSON."""
    best, best_q = FinishFormat.JSON, 0.0
    for part in (accept or "").split(","):
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if media.lower() in (FinishFormat.NPZ, FinishFormat.ARROW) and q > best_q:
            best, best_q = FinishFormat(media.lower()), q
    return best


class Sink(Protocol):
    """Where a binary answer is written: a file, or a writer that sends each piece it gets."""

    def write(self, data: Any, /) -> Any: ...


@dataclass
class FinishAnswer:
    """A `/finish` answer read back: the samples, the ledger and what the session lost."""

    samples: list[Sample]
    ledger: dict[str, Any]
    lost: dict[str, Any] | None


def write_finish(
    sink: Sink,
    fmt: FinishFormat,
    samples: list[Sample],
    ledger: Mapping[str, object],
    lost: Mapping[str, object] | None,
) -> None:
    """Write a binary `/finish` answer to `sink` (a file, or a writer that streams what it is
    given: the arrays go out in pieces as they are written)."""
    columns = sample_columns(samples)
    ledger_json = json.dumps(ledger, ensure_ascii=False)
    lost_json = json.dumps(lost, ensure_ascii=False)
    if fmt is FinishFormat.NPZ:
        extra = {"ledger": np.array(ledger_json), "lost": np.array(lost_json)}
        np.savez(sink, **columns, **extra)  # type: ignore[arg-type]
        return
    if fmt is not FinishFormat.ARROW:
        raise ExportError(f"{fmt} is not a binary /finish format")
    import pyarrow as pa

    table = arrow_table(columns)
    meta = {**(table.schema.metadata or {}), b"ledger": ledger_json, b"lost": lost_json}
    table = table.replace_schema_metadata(meta)
    with pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), table.schema) as writer:
        # One sample per record batch: a reader holds one at a time.
        writer.write_table(table, max_chunksize=1)


def read_finish(data: bytes, media_type: str) -> FinishAnswer:
    """A `/finish` answer in any of its formats (by its `Content-Type`), as samples."""
    media = media_type.split(";")[0].strip().lower()
    if media == FinishFormat.JSON:
        body = json.loads(data)
        samples = [Sample.from_dict(s) for s in body["samples"]]
        return FinishAnswer(samples, body["ledger"], body.get("lost"))
    if media == FinishFormat.NPZ:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            columns = {name: npz[name] for name in npz.files}
        ledger, lost = str(columns.pop("ledger")), str(columns.pop("lost"))
        samples = samples_from_columns(columns, "the /finish answer")
        return FinishAnswer(samples, json.loads(ledger), json.loads(lost))
    if media == FinishFormat.ARROW:
        import pyarrow as pa

        table = pa.ipc.open_stream(data).read_all()
        meta = table.schema.metadata or {}
        columns = columns_of_arrow(table, "the /finish answer")
        samples = samples_from_columns(columns, "the /finish answer")
        return FinishAnswer(samples, json.loads(meta[b"ledger"]), json.loads(meta[b"lost"]))
    raise ExportError(f"not a /finish answer: {media_type!r}")
