"""Getting samples to a trainer: sample files (.npz, .jsonl, .parquet) and packed batches.

`write_samples`/`read_samples` round-trip `Sample`s exactly (dtypes, values, metadata through
JSON, replay rows with their shape); `pack_samples` flattens samples into one `PackedBatch` for
variable-length attention.
"""

from __future__ import annotations

import json
import logging
import os
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tokentrail.compat import StrEnum
from tokentrail.core.backend import load_backend
from tokentrail.core.packed import PackedBatch
from tokentrail.errors import ExportError, PackError
from tokentrail.trajectory.sample import REPLAY_FIELDS, Sample

logger = logging.getLogger(__name__)

__all__ = [
    "ExportError",
    "Format",
    "arrow_table",
    "columns_of_arrow",
    "PackError",
    "PackedBatch",
    "pack_samples",
    "read_samples",
    "sample_columns",
    "samples_from_columns",
    "write_samples",
]


class Format(StrEnum):
    """The sample file formats, named by their suffixes."""

    NPZ = "npz"
    JSONL = "jsonl"
    PARQUET = "parquet"


# Bumped when the file layout changes; read_samples refuses .npz layouts it does not know.
_SCHEMA = 1
_PARQUET_HINT = "pip install tokentrail[parquet]"
# Each per-token array with its dtype; one offsets array per field, since nothing forces a
# hand-built Sample's mask and logprobs to be as long as its response.
_ARRAYS: dict[str, type[np.generic]] = {
    "tokens": np.uint32,
    "loss_mask": np.uint8,
    "rollout_log_probs": np.float32,
}
# Replay rows (`[tokens, layers, k]` per sample) keep the store's compact type.
_ROW_TYPES = tuple(np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.int32))


# --- Files ---------------------------------------------------------------------------------------


def write_samples(
    path: str | os.PathLike[str], samples: Iterable[Sample], format: str | None = None
) -> None:
    """Write `samples` to `path` as .npz, .jsonl or .parquet; `format` defaults to the suffix.

    Arrays keep their dtypes: tokens uint32, loss_mask uint8, rollout_log_probs float32 (other
    integer dtypes are converted when no value changes, other floats rounded). Metadata goes
    through JSON, so its keys come back as strings and its tuples as lists. Parquet needs
    pyarrow; its token lists are `large_list<uint32>` (int64 offsets, so a file may hold more
    than 2**31 tokens).
    """
    path = Path(path)
    fmt = _format(path, format)
    samples = list(samples)
    if fmt is Format.JSONL:
        # Every line is made before the file is opened: a bad sample leaves no partial file.
        lines = [_dumps(_canonical(s, i).to_dict(), i) + "\n" for i, s in enumerate(samples)]
        with path.open("w", encoding="utf-8", newline="\n") as f:
            f.writelines(lines)
        return
    columns = _columns(samples)
    if fmt is Format.NPZ:
        with path.open("wb") as f:
            np.savez(f, schema=np.array(_SCHEMA), **columns)  # type: ignore[arg-type]
    else:
        pa, pq = _pyarrow("writing")
        pq.write_table(_table(pa, columns), path)


def read_samples(path: str | os.PathLike[str], format: str | None = None) -> list[Sample]:
    """Read the samples `write_samples` wrote to `path`; `format` defaults to the suffix."""
    path = Path(path)
    fmt = _format(path, format)
    if fmt is Format.JSONL:
        return _read_jsonl(path)
    if fmt is Format.NPZ:
        return _samples(_read_npz(path), path)
    return _samples(_read_parquet(path), path)


def _format(path: Path, format: str | None) -> Format:
    name = format if format is not None else path.suffix.lstrip(".").lower()
    try:
        return Format(name)
    except ValueError:
        known = ", ".join(f.value for f in Format)
        what = f"format {format!r}" if format is not None else f"suffix {path.suffix!r} of {path}"
        raise ExportError(f"unknown sample file {what}; expected one of {known}") from None


def _canonical(sample: Sample, i: int) -> Sample:
    """`sample` with its arrays in the file dtypes; refuses values those dtypes cannot hold."""
    arrays = {
        name: _as_dtype(getattr(sample, name), dtype, i, name) for name, dtype in _ARRAYS.items()
    }
    for name in REPLAY_FIELDS:
        rows = getattr(sample, name)
        if rows is None:
            continue
        rows = np.asarray(rows)
        if rows.dtype not in _ROW_TYPES or rows.ndim != 3 or len(rows) != len(arrays["tokens"]):
            raise ExportError(
                f"sample {i}: {name} ({rows.dtype}{rows.shape}) is not one row of uint8, uint16, "
                f"uint32 or int32 per token ({len(arrays['tokens'])})"
            )
        arrays[name] = rows
    return Sample(
        **arrays,
        response_length=int(sample.response_length),
        reward=float(sample.reward),
        metadata=sample.metadata,
    )


def _as_dtype(values: object, dtype: type[np.generic], i: int, name: str) -> np.ndarray:
    """`values` as a 1-D array of `dtype`: integers only if no value changes, floats rounded."""
    array = np.asarray(values)
    if array.dtype == dtype and array.ndim == 1:
        return array
    try:
        converted = np.asarray(values, dtype=dtype)
    except (OverflowError, ValueError, TypeError) as err:
        raise ExportError(f"sample {i}: {name} is not {np.dtype(dtype)}: {err}") from None
    exact = np.dtype(dtype).kind == "f" or np.array_equal(converted, array)
    if converted.ndim != 1 or not exact:
        raise ExportError(
            f"sample {i}: {name} ({array.dtype}{array.shape}) does not fit a 1-D "
            f"{np.dtype(dtype)} array"
        )
    return converted


def _dumps(value: object, i: int) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError) as err:
        raise ExportError(f"sample {i}: not JSON-able: {err}") from None


def _columns(samples: list[Sample]) -> dict[str, np.ndarray]:
    """Samples as flat columns: each array field concatenated with its offsets (n + 1 from 0),
    then `response_length`, `reward` and `metadata` as JSON strings."""
    canonical = [_canonical(sample, i) for i, sample in enumerate(samples)]
    columns: dict[str, np.ndarray] = {}
    for name, dtype in _ARRAYS.items():
        parts = [getattr(sample, name) for sample in canonical]
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(part) for part in parts], out=offsets[1:])
        columns[name] = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
        columns[f"{name}_offsets"] = offsets
    columns |= _replay_columns(canonical)
    columns["response_length"] = np.array([s.response_length for s in canonical], dtype=np.int64)
    columns["reward"] = np.array([s.reward for s in canonical], dtype=np.float64)
    # A unicode array, not an object array, so the .npz loads with allow_pickle=False.
    columns["metadata"] = np.array(
        [_dumps(s.metadata, i) for i, s in enumerate(canonical)], dtype=np.str_
    )
    return columns


def _replay_columns(samples: list[Sample]) -> dict[str, np.ndarray]:
    """Each replay field every sample has, concatenated `[tokens, layers, k]`; its offsets are
    the tokens'. A field some samples have and others not, or of two row shapes, is refused."""
    columns: dict[str, np.ndarray] = {}
    for name in REPLAY_FIELDS:
        parts = [getattr(s, name) for s in samples]
        held = [p for p in parts if p is not None]
        if not held:
            continue
        if len(held) != len(parts):
            raise ExportError(f"{name}: some samples have it and some do not")
        if len({(p.dtype, p.shape[1:]) for p in held}) != 1:
            raise ExportError(f"{name}: samples hold rows of more than one type or shape")
        columns[name] = np.concatenate(held)
    return columns


def _samples(columns: dict[str, np.ndarray], path: Path) -> list[Sample]:
    """The samples of checked columns. Each sample's arrays are views of one column array."""
    n = len(columns["response_length"])
    metadata = []
    for i, text in enumerate(columns["metadata"].tolist()):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            raise ExportError(f"{path}: sample {i}: metadata is not JSON: {err}") from None
        if not isinstance(value, dict):
            raise ExportError(f"{path}: sample {i}: metadata is not a JSON object")
        metadata.append(value)
    bounds = {name: columns[f"{name}_offsets"].tolist() for name in _ARRAYS}
    bounds |= {name: bounds["tokens"] for name in REPLAY_FIELDS if name in columns}
    return [
        Sample(
            **{name: columns[name][bounds[name][i] : bounds[name][i + 1]] for name in bounds},
            response_length=int(columns["response_length"][i]),
            reward=float(columns["reward"][i]),
            metadata=metadata[i],
        )
        for i in range(n)
    ]


def _check_columns(columns: dict[str, np.ndarray], path: Path) -> dict[str, np.ndarray]:
    """Refuse columns that are not what `_columns` writes: dtypes, offsets, lengths."""
    n = len(columns["response_length"])
    expected = {name: np.dtype(dtype) for name, dtype in _ARRAYS.items()}
    expected |= {f"{name}_offsets": np.dtype(np.int64) for name in _ARRAYS}
    expected |= {"response_length": np.dtype(np.int64), "reward": np.dtype(np.float64)}
    for name, dtype in expected.items():
        if columns[name].dtype != dtype or columns[name].ndim != 1:
            got = f"{columns[name].dtype}{columns[name].shape}"
            raise ExportError(f"{path}: column {name} is {got}, expected 1-D {dtype}")
    if columns["metadata"].dtype.kind != "U" or columns["metadata"].shape != (n,):
        raise ExportError(f"{path}: column metadata is not {n} strings")
    for name in _ARRAYS:
        offsets = columns[f"{name}_offsets"]
        if (
            len(offsets) != n + 1
            or offsets[0] != 0
            or offsets[-1] != len(columns[name])
            or np.any(np.diff(offsets) < 0)
        ):
            raise ExportError(f"{path}: {name}_offsets do not split {name} into {n} samples")
    for name in REPLAY_FIELDS:
        rows = columns.get(name)
        tokens = len(columns["tokens"])
        if rows is not None and (
            rows.dtype not in _ROW_TYPES or rows.ndim != 3 or len(rows) != tokens
        ):
            raise ExportError(
                f"{path}: column {name} is {rows.dtype}{rows.shape}, not a row per token ({tokens})"
            )
    return columns


def sample_columns(samples: Iterable[Sample]) -> dict[str, np.ndarray]:
    """Samples as the flat numpy columns a .npz file holds (each array field concatenated, with
    `<field>_offsets`): a few large arrays, for shipping through shared memory (Ray's object
    store) without a copy or a per-sample object."""
    return _columns(list(samples))


def samples_from_columns(columns: dict[str, np.ndarray], where: str = "columns") -> list[Sample]:
    """The samples of `sample_columns`, checked; each sample's arrays are views of the column
    arrays (read-only ones stay read-only). `where` names the source in errors."""
    return _samples(_check_columns(columns, Path(where)), Path(where))


# --- .npz ----------------------------------------------------------------------------------------


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise ValueError("a single array, not an archive of arrays")
        with loaded as npz:
            columns = {name: npz[name] for name in npz.files}
    except FileNotFoundError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise ExportError(f"{path}: not a tokentrail .npz sample file: {err}") from None
    schema = columns.pop("schema", None)
    if schema is None or schema.shape != () or int(schema) != _SCHEMA:
        raise ExportError(f"{path}: not a tokentrail .npz sample file (schema {schema})")
    missing = sorted(set(_column_names()) - set(columns))
    if missing:
        raise ExportError(f"{path}: missing arrays {missing}")
    return _check_columns(columns, path)


def _column_names() -> list[str]:
    names = [*_ARRAYS, *(f"{name}_offsets" for name in _ARRAYS)]
    return [*names, "response_length", "reward", "metadata"]


# --- .jsonl --------------------------------------------------------------------------------------


def _read_jsonl(path: Path) -> list[Sample]:
    samples = []
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                samples.append(Sample.from_dict(json.loads(raw.decode("utf-8"))))
            except (KeyError, TypeError, ValueError, OverflowError) as err:
                # ValueError covers bad JSON and bad UTF-8.
                raise ExportError(f"{path}:{line_no}: not a sample: {err!r}") from None
    return samples


# --- .parquet ------------------------------------------------------------------------------------


def _pyarrow(doing: str) -> tuple[Any, Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ExportError(f"{doing} parquet needs pyarrow: {_PARQUET_HINT}") from err
    return pa, pq


def _table(pa: Any, columns: dict[str, np.ndarray]) -> Any:
    """One row per sample: list columns over the flat arrays, without a per-sample loop."""
    data = {
        name: pa.LargeListArray.from_arrays(columns[f"{name}_offsets"], columns[name])
        for name in _ARRAYS
    }
    schema = {"tokentrail": f"samples/{_SCHEMA}"}
    for name in REPLAY_FIELDS:
        if name in columns:
            rows = columns[name]
            per_row = pa.FixedSizeListArray.from_arrays(
                rows.reshape(-1), rows.shape[1] * rows.shape[2]
            )
            data[name] = pa.LargeListArray.from_arrays(columns["tokens_offsets"], per_row)
            schema[f"tokentrail.{name}"] = f"{rows.shape[1]},{rows.shape[2]}"
    data["response_length"] = pa.array(columns["response_length"])
    data["reward"] = pa.array(columns["reward"])
    data["metadata"] = pa.array(columns["metadata"].tolist(), type=pa.large_string())
    return pa.table(data).replace_schema_metadata(schema)


def arrow_table(columns: dict[str, np.ndarray]) -> Any:
    """`sample_columns` as an Arrow table of one row per sample (what a .parquet holds)."""
    pa, _ = _pyarrow("writing")
    return _table(pa, columns)


def columns_of_arrow(table: Any, where: str) -> dict[str, np.ndarray]:
    """The checked columns of an `arrow_table`; `where` names its source in errors."""
    pa, _ = _pyarrow("reading")
    return _arrow_columns(pa, table, Path(where))


def _read_parquet(path: Path) -> dict[str, np.ndarray]:
    pa, pq = _pyarrow("reading")
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise ExportError(f"{path}: not a parquet file: {err}") from None
    return _arrow_columns(pa, table, path)


def _arrow_columns(pa: Any, table: Any, path: Path) -> dict[str, np.ndarray]:
    missing = sorted({*_ARRAYS, "response_length", "reward", "metadata"} - set(table.column_names))
    if missing:
        raise ExportError(f"{path}: missing columns {missing}")
    columns: dict[str, np.ndarray] = {}
    for name, dtype in _ARRAYS.items():
        column = table.column(name).combine_chunks()
        value_type = getattr(column.type, "value_type", None)
        if column.null_count or value_type != pa.from_numpy_dtype(dtype):
            raise ExportError(f"{path}: column {name} is {column.type}, expected lists of {dtype}")
        offsets = column.offsets.to_numpy().astype(np.int64)
        # `values` ignores the array's own offset, so start from the first list's offset.
        values = column.values.to_numpy(zero_copy_only=False)
        start, end = int(offsets[0]), int(offsets[-1])
        # A writable copy: arrow buffers are read-only.
        columns[name] = np.array(values[start:end], dtype=dtype)
        columns[f"{name}_offsets"] = offsets - start
    for name in ("response_length", "reward", "metadata"):
        column = table.column(name)
        if column.null_count:
            raise ExportError(f"{path}: column {name} has nulls")
        columns[name] = column.to_numpy()
    metadata = table.column("metadata")
    if not (pa.types.is_string(metadata.type) or pa.types.is_large_string(metadata.type)):
        raise ExportError(f"{path}: column metadata is {metadata.type}, expected JSON strings")
    columns["metadata"] = np.array(metadata.to_pylist(), dtype=np.str_)
    for name in REPLAY_FIELDS:
        if name in table.column_names:
            columns[name] = _parquet_rows(table, name, path)
    return _check_columns(columns, path)


def _parquet_rows(table: Any, name: str, path: Path) -> np.ndarray:
    """A replay column: lists of fixed-size rows, their `layers,k` in the schema metadata."""
    shape = (table.schema.metadata or {}).get(f"tokentrail.{name}".encode(), b"").decode()
    column = table.column(name).combine_chunks()
    try:
        layers, width = (int(d) for d in shape.split(","))
        offsets = column.offsets.to_numpy()
        rows = column.values.values.to_numpy(zero_copy_only=False)
        start, end = int(offsets[0]) * layers * width, int(offsets[-1]) * layers * width
        return np.array(rows[start:end]).reshape(-1, layers, width)
    except (AttributeError, ValueError) as err:
        raise ExportError(f"{path}: column {name} is not replay rows: {err}") from None


# --- Packing -------------------------------------------------------------------------------------


def pack_samples(samples: Sequence[Sample], backend: str | None = None) -> PackedBatch:
    """Pack `samples` into one `PackedBatch`, with the Rust core or the Python reference.

    `backend` is "rust" or "python" (default: `TOKENTRAIL_BACKEND`, else "rust"). Raises
    `PackError` when a sample's `loss_mask` or `rollout_log_probs` is not `response_length` long
    or its `response_length` exceeds its tokens, or when replay rows are carried by some samples
    only, or are not one per token.
    """
    core = load_backend(backend)
    replay: dict[str, list[np.ndarray] | None] = {}
    for name in REPLAY_FIELDS:
        rows = [getattr(s, name) for s in samples]
        missing = [i for i, r in enumerate(rows) if r is None]
        if missing and len(missing) != len(rows):
            raise PackError(f"{name}: sample {missing[0]} has none, others have")
        replay[name] = None if missing or not rows else rows
    packed = core.pack(
        [s.tokens for s in samples],
        [s.loss_mask for s in samples],
        [s.rollout_log_probs for s in samples],
        [s.response_length for s in samples],
        [s.reward for s in samples],
        **replay,
    )
    batch = PackedBatch.of(packed)
    logger.debug("packed %d samples into %d tokens", batch.num_samples, batch.num_tokens)
    return batch
