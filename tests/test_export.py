"""Samples out to a trainer: sample files that round-trip exactly, and packed batches.

Files: .npz, .jsonl and .parquet give back the samples written, dtypes and metadata included;
bad formats, missing pyarrow and corrupt files raise `ExportError`. Packing: readable fixtures
pin the layout (cu_seqlens, restarting positions, mask and logprobs on responses only), and
hypothesis holds the Rust core to the Python reference.
"""

from __future__ import annotations

import json
import sys
import zipfile

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokentrail import Sample, TokenIdError, TokentrailError, _core
from tokentrail.core import reference
from tokentrail.storage.export import (
    ExportError,
    Format,
    PackedBatch,
    PackError,
    pack_samples,
    read_samples,
    write_samples,
)

# Named tokens: system S, user turns U1 U2, answers A1-A3 and B1 B2, the largest id TOP.
S, U1, U2 = 100, 201, 202
A1, A2, A3 = 301, 302, 303
B1, B2 = 311, 312
TOP = 2**32 - 1

FORMATS = [f.value for f in Format]


def sample(prompt, response, mask, logprobs, reward=0.0, metadata=None) -> Sample:
    return Sample(
        tokens=np.array(prompt + response, dtype=np.uint32),
        loss_mask=np.array(mask, dtype=np.uint8),
        rollout_log_probs=np.array(logprobs, dtype=np.float32),
        response_length=len(response),
        reward=reward,
        metadata=metadata if metadata is not None else {},
    )


def fixtures() -> list[Sample]:
    return [
        # A prompt, then a response with one token left untrained.
        sample(
            [S, U1],
            [A1, A2, A3],
            [1, 1, 0],
            [-0.5, -1.25, 0.0],
            reward=1.0,
            metadata={"session_id": "s0", "turns": [0, 1], "truncated": False},
        ),
        # No response at all.
        sample([S, U2], [], [], [], reward=0.1, metadata={"note": "ünïcödé ✓ 日本語 🚀"}),
        # No prompt; a logprob of -inf and a float32 that is not a short decimal.
        sample(
            [],
            [B1, B2, TOP],
            [1, 1, 1],
            [float("-inf"), -3.0, -1e-7],
            reward=-2.5,
            metadata={"nested": {"a": [1, 2.5, None, True]}, "empty": {}, "quote": 'say "hi"\n'},
        ),
        # Nothing.
        sample([], [], [], [], reward=0.0),
    ]


def assert_same_samples(got: list[Sample], want: list[Sample]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for name in ("tokens", "loss_mask", "rollout_log_probs"):
            a, b = getattr(g, name), getattr(w, name)
            assert a.dtype == b.dtype and a.shape == b.shape, name
            assert a.tobytes() == b.tobytes(), name
        assert type(g.response_length) is int and g.response_length == w.response_length
        assert type(g.reward) is float and g.reward == w.reward
        assert g.metadata == w.metadata


def needs(fmt: str) -> None:
    if fmt == "parquet":
        pytest.importorskip("pyarrow")


# --- Files ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_samples_round_trip_exactly(tmp_path, fmt: str) -> None:
    needs(fmt)
    path = tmp_path / f"samples.{fmt}"
    write_samples(path, fixtures())
    got = read_samples(path)
    assert_same_samples(got, fixtures())
    # The arrays read back are ordinary writable arrays a trainer may edit.
    assert all(s.loss_mask.flags.writeable for s in got)


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_samples_round_trip(tmp_path, fmt: str) -> None:
    needs(fmt)
    path = tmp_path / f"none.{fmt}"
    write_samples(path, [])
    assert read_samples(path) == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_explicit_format_beats_the_suffix_and_the_path_is_kept(tmp_path, fmt: str) -> None:
    needs(fmt)
    path = tmp_path / "samples.bin"
    write_samples(path, fixtures(), format=fmt)
    assert [p.name for p in tmp_path.iterdir()] == ["samples.bin"]
    assert_same_samples(read_samples(path, format=fmt), fixtures())


def test_hand_built_arrays_are_stored_in_the_sample_dtypes(tmp_path) -> None:
    loose = Sample(
        tokens=np.array([S, U1, A1], dtype=np.int64),
        loss_mask=np.array([True]),
        rollout_log_probs=np.array([-0.5], dtype=np.float64),
        response_length=1,
        reward=1,
    )
    write_samples(tmp_path / "s.npz", [loose])
    (got,) = read_samples(tmp_path / "s.npz")
    assert got.tokens.dtype == np.uint32 and got.tokens.tolist() == [S, U1, A1]
    assert got.loss_mask.dtype == np.uint8 and got.loss_mask.tolist() == [1]
    assert got.rollout_log_probs.dtype == np.float32 and got.reward == 1.0


def test_jsonl_is_one_sample_dict_per_line(tmp_path) -> None:
    path = tmp_path / "samples.jsonl"
    write_samples(path, fixtures())
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(fixtures())
    assert json.loads(lines[0]) == fixtures()[0].to_dict()
    assert "日本語" in lines[1]


def test_npz_loads_without_pickle(tmp_path) -> None:
    path = tmp_path / "samples.npz"
    write_samples(path, fixtures())
    with np.load(path, allow_pickle=False) as npz:
        assert npz["tokens"].dtype == np.uint32
        assert npz["tokens_offsets"].tolist() == [0, 5, 7, 10, 10]
        assert json.loads(npz["metadata"][1]) == {"note": "ünïcödé ✓ 日本語 🚀"}


def test_parquet_has_typed_list_columns(tmp_path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "samples.parquet"
    write_samples(path, fixtures())
    table = pq.read_table(path)
    assert table.num_rows == len(fixtures())
    assert table.schema.field("tokens").type.value_type == pa.uint32()
    assert table.schema.field("loss_mask").type.value_type == pa.uint8()
    assert table.schema.field("rollout_log_probs").type.value_type == pa.float32()
    assert table.schema.field("response_length").type == pa.int64()
    assert table.schema.field("reward").type == pa.float64()
    assert table.column("tokens").to_pylist()[2] == [B1, B2, TOP]
    assert json.loads(table.column("metadata")[0].as_py())["session_id"] == "s0"


def test_parquet_written_by_pyarrow_itself_reads(tmp_path) -> None:
    """Plain `list` columns (int32 offsets) read as well as the `large_list` we write."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [s.to_dict() for s in fixtures()]
    table = pa.table(
        {
            "tokens": pa.array([r["tokens"] for r in rows], pa.list_(pa.uint32())),
            "loss_mask": pa.array([r["loss_mask"] for r in rows], pa.list_(pa.uint8())),
            "rollout_log_probs": pa.array(
                [r["rollout_log_probs"] for r in rows], pa.list_(pa.float32())
            ),
            "response_length": pa.array([r["response_length"] for r in rows], pa.int64()),
            "reward": pa.array([r["reward"] for r in rows], pa.float64()),
            "metadata": pa.array([json.dumps(r["metadata"]) for r in rows], pa.string()),
        }
    )
    pq.write_table(table.slice(1), tmp_path / "foreign.parquet")
    assert_same_samples(read_samples(tmp_path / "foreign.parquet"), fixtures()[1:])


# --- File errors ---------------------------------------------------------------------------------


def test_an_unknown_format_is_named(tmp_path) -> None:
    with pytest.raises(ExportError, match=r"suffix '\.csv'.*npz, jsonl, parquet"):
        write_samples(tmp_path / "samples.csv", fixtures())
    with pytest.raises(ExportError, match="format 'arrow'"):
        read_samples(tmp_path / "samples.npz", format="arrow")
    assert issubclass(ExportError, TokentrailError) and issubclass(ExportError, ValueError)


@pytest.mark.parametrize("doing", ["write", "read"])
def test_parquet_without_pyarrow_says_what_to_install(tmp_path, monkeypatch, doing) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    path = tmp_path / "samples.parquet"
    with pytest.raises(ExportError, match=r"pip install tokentrail\[parquet\]"):
        if doing == "write":
            write_samples(path, fixtures())
        else:
            read_samples(path)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_corrupt_file_is_an_export_error(tmp_path, fmt: str) -> None:
    needs(fmt)
    path = tmp_path / f"samples.{fmt}"
    path.write_bytes(b"\x00\x01 not samples {")
    with pytest.raises(ExportError, match="samples"):
        read_samples(path)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_truncated_file_is_an_export_error(tmp_path, fmt: str) -> None:
    needs(fmt)
    path = tmp_path / f"samples.{fmt}"
    write_samples(path, fixtures())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ExportError):
        read_samples(path)


def test_a_missing_file_is_not_found(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        read_samples(tmp_path / "absent.npz")


def test_an_npz_of_other_arrays_is_refused(tmp_path) -> None:
    path = tmp_path / "other.npz"
    np.savez(path, tokens=np.arange(3))
    with pytest.raises(ExportError, match="not a tokentrail .npz"):
        read_samples(path)
    np.save(tmp_path / "single.npy", np.arange(3))
    (tmp_path / "single.npy").rename(tmp_path / "single.npz")
    with pytest.raises(ExportError, match="single array"):
        read_samples(tmp_path / "single.npz")


def test_npz_offsets_that_do_not_split_the_arrays_are_refused(tmp_path) -> None:
    path = tmp_path / "samples.npz"
    write_samples(path, fixtures())
    with np.load(path) as npz:
        arrays = dict(npz)
    arrays["loss_mask_offsets"][2] = 99
    np.savez(path, **arrays)
    with pytest.raises(ExportError, match="loss_mask_offsets"):
        read_samples(path)


def test_npz_with_a_wrong_dtype_is_refused(tmp_path) -> None:
    path = tmp_path / "samples.npz"
    write_samples(path, fixtures())
    with np.load(path) as npz:
        arrays = dict(npz)
    arrays["tokens"] = arrays["tokens"].astype(np.int64)
    np.savez(path, **arrays)
    with pytest.raises(ExportError, match="column tokens is int64"):
        read_samples(path)


def test_a_bad_jsonl_line_is_named_by_number(tmp_path) -> None:
    path = tmp_path / "samples.jsonl"
    good = json.dumps(fixtures()[0].to_dict())
    path.write_text(f"{good}\n\n{{not json\n", encoding="utf-8")
    with pytest.raises(ExportError, match=r"samples\.jsonl:3:"):
        read_samples(path)
    path.write_text(json.dumps({"tokens": [1]}) + "\n", encoding="utf-8")
    with pytest.raises(ExportError, match=r":1: not a sample"):
        read_samples(path)
    path.write_bytes(good.encode() + b"\n\xff\xfe{}\n")
    with pytest.raises(ExportError, match=r":2: not a sample.*utf-8"):
        read_samples(path)


def test_ids_that_do_not_fit_uint32_are_refused_on_write(tmp_path) -> None:
    bad = fixtures()[0]
    bad.tokens = np.array([S, -1, A1], dtype=np.int64)
    with pytest.raises(ExportError, match="sample 0: tokens"):
        write_samples(tmp_path / "s.npz", [bad])


def test_metadata_that_is_not_json_is_refused_on_write(tmp_path) -> None:
    bad = fixtures()[0]
    bad.metadata = {"tools": {"bash"}}
    for fmt in ("npz", "jsonl"):
        with pytest.raises(ExportError, match="sample 1: not JSON-able"):
            write_samples(tmp_path / f"s.{fmt}", [fixtures()[1], bad])
        assert not (tmp_path / f"s.{fmt}").exists()


# --- Packing -------------------------------------------------------------------------------------


def test_packing_lays_samples_end_to_end(backend: str) -> None:
    batch = pack_samples(fixtures(), backend=backend)
    assert isinstance(batch, PackedBatch)
    assert batch.tokens.tolist() == [S, U1, A1, A2, A3, S, U2, B1, B2, TOP]
    assert batch.cu_seqlens.tolist() == [0, 5, 7, 10, 10]
    assert batch.max_seqlen == 5
    assert (batch.num_samples, batch.num_tokens) == (4, 10)


def test_positions_restart_in_every_sample(backend: str) -> None:
    batch = pack_samples(fixtures(), backend=backend)
    assert batch.position_ids.tolist() == [0, 1, 2, 3, 4, 0, 1, 0, 1, 2]
    assert batch.sample_index.tolist() == [0, 0, 0, 0, 0, 1, 1, 2, 2, 2]


def test_mask_and_logprobs_sit_on_responses_and_prompts_are_zero(backend: str) -> None:
    batch = pack_samples(fixtures(), backend=backend)
    assert batch.loss_mask.tolist() == [0, 0, 1, 1, 0, 0, 0, 1, 1, 1]
    want = np.array([0, 0, -0.5, -1.25, 0, 0, 0, -np.inf, -3.0, -1e-7], dtype=np.float32)
    assert batch.logprobs.tobytes() == want.tobytes()


def test_rewards_per_sample_and_advantages_zero_for_the_trainer(backend: str) -> None:
    batch = pack_samples(fixtures(), backend=backend)
    assert batch.rewards.tolist() == np.array([1.0, 0.1, -2.5, 0.0], dtype=np.float32).tolist()
    assert batch.advantages.tolist() == [0.0] * 4
    batch.advantages[:] = batch.rewards - batch.rewards.mean()
    assert batch.advantages[batch.sample_index].shape == batch.tokens.shape


def test_packed_dtypes(backend: str) -> None:
    batch = pack_samples(fixtures(), backend=backend)
    dtypes = {name: getattr(batch, name).dtype for name in DTYPES}
    assert dtypes == DTYPES


def test_packing_nothing_gives_one_offset(backend: str) -> None:
    batch = pack_samples([], backend=backend)
    assert batch.cu_seqlens.tolist() == [0]
    assert batch.max_seqlen == 0 and batch.num_tokens == 0 and batch.num_samples == 0
    assert {name: getattr(batch, name).dtype for name in DTYPES} == DTYPES


def test_samples_read_back_from_a_file_pack(tmp_path, backend: str) -> None:
    write_samples(tmp_path / "s.npz", fixtures())
    from_file = pack_samples(read_samples(tmp_path / "s.npz"), backend=backend)
    assert_same_batch(from_file, pack_samples(fixtures(), backend=backend))


DTYPES = {
    "tokens": np.dtype(np.uint32),
    "cu_seqlens": np.dtype(np.int32),
    "position_ids": np.dtype(np.int32),
    "sample_index": np.dtype(np.int32),
    "loss_mask": np.dtype(np.uint8),
    "logprobs": np.dtype(np.float32),
    "rewards": np.dtype(np.float32),
    "advantages": np.dtype(np.float32),
}


# --- Packing errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([[S, A1]], [[1], [1]], [[-1.0]], [1], [0.0]), "loss_masks: 2 entries for 1 samples"),
        (([[S, A1]], [[1]], [[-1.0]], [1], []), "rewards: 0 entries for 1 samples"),
        (
            ([[S, A1]], [[1, 1, 1]], [[0.0] * 3], [3], [0.0]),
            r"sample 0: response_length 3 is outside \[0, 2\], its token count",
        ),
        (
            ([[S], [S, A1]], [[], [1]], [[], [-1.0]], [0, -1], [0.0, 0.0]),
            r"sample 1: response_length -1 is outside \[0, 2\]",
        ),
        (
            ([[S, A1, A2]], [[1]], [[-1.0, -2.0]], [2], [0.0]),
            "sample 0: 1 loss_mask entries for response_length 2",
        ),
        (
            ([[S, A1, A2]], [[1, 1]], [[-1.0]], [2], [0.0]),
            "sample 0: 1 logprobs entries for response_length 2",
        ),
    ],
    ids=["masks", "rewards", "too-long", "negative", "mask-length", "logprob-length"],
)
def test_samples_that_do_not_hold_together_raise_pack_error(args, message, backend) -> None:
    core = _core if backend == "rust" else reference
    with pytest.raises(PackError, match=message):
        core.pack(*args)
    assert issubclass(PackError, TokentrailError) and issubclass(PackError, ValueError)


def test_a_sample_whose_mask_does_not_fit_is_refused(backend: str) -> None:
    bad = fixtures()
    bad[2].loss_mask = bad[2].loss_mask[:2]
    with pytest.raises(PackError, match="sample 2: 2 loss_mask entries for response_length 3"):
        pack_samples(bad, backend=backend)


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([S, -1], r"tokens\[1\]\[1\]: id -1 is outside"),
        ([S, "x"], r"tokens\[1\]\[1\]: expected an int, got str"),
        (np.array([S, -1]), r"tokens\[1\]: ids must lie in \[0, 2\*\*32\)"),
    ],
)
def test_bad_token_ids_raise_token_id_error(ids, message, backend: str) -> None:
    core = _core if backend == "rust" else reference
    with pytest.raises(TokenIdError, match=message):
        core.pack([[S], ids], [[], []], [[], []], [0, 0], [0.0, 0.0])


# --- Rust against the reference ------------------------------------------------------------------


def assert_same_batch(a, b) -> None:
    for name in DTYPES:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        assert x.tobytes() == y.tobytes(), name
    assert a.max_seqlen == b.max_seqlen


def shaped(draw: st.DrawFn, values: list, dtype) -> object:
    """`values` as a list, an array of `dtype`, an array of a wider dtype, or a strided view."""
    form = draw(st.sampled_from(["list", "array", "wide", "strided"]))
    if form == "list":
        return values
    if form == "array":
        return np.array(values, dtype=dtype)
    if form == "wide":
        return np.array(values, dtype=np.float64 if np.dtype(dtype).kind == "f" else np.int64)
    padded = np.zeros(2 * len(values), dtype=dtype)
    padded[::2] = values
    return padded[::2]


@st.composite
def pack_inputs(draw: st.DrawFn) -> tuple:
    n = draw(st.integers(0, 6))
    tokens, masks, logprobs, lengths = [], [], [], []
    for _ in range(n):
        ids = draw(st.lists(st.integers(0, TOP), max_size=12))
        length = draw(st.integers(0, len(ids)))
        mask = draw(st.lists(st.integers(0, 1), min_size=length, max_size=length))
        lps = draw(st.lists(st.floats(-30, 0, width=32), min_size=length, max_size=length))
        tokens.append(shaped(draw, ids, np.uint32))
        masks.append(shaped(draw, mask, np.uint8))
        logprobs.append(shaped(draw, lps, np.float32))
        lengths.append(length)
    rewards = draw(st.lists(st.floats(-10, 10, width=32), min_size=n, max_size=n))
    return tokens, masks, logprobs, lengths, rewards


@given(pack_inputs())
def test_rust_packs_as_the_reference_does(args: tuple) -> None:
    assert_same_batch(_core.pack(*args), reference.pack(*args))


@given(pack_inputs(), st.data())
def test_rust_refuses_as_the_reference_does(args: tuple, data: st.DataObject) -> None:
    tokens, masks, logprobs, lengths, rewards = args
    lengths = [n + data.draw(st.sampled_from([-1, 0, 0, 1])) for n in lengths]
    outcomes = []
    for core in (_core, reference):
        try:
            outcomes.append(("ok", core.pack(tokens, masks, logprobs, lengths, rewards)))
        except PackError as err:
            outcomes.append(("error", str(err)))
    (kind_rust, rust), (kind_ref, ref) = outcomes
    assert kind_rust == kind_ref
    if kind_rust == "ok":
        assert_same_batch(rust, ref)
    else:
        assert rust == ref


# --- Replay rows ---------------------------------------------------------------------------------


def with_replay(samples: list[Sample]) -> list[Sample]:
    """`samples` carrying routed experts (uint16: 300 experts) and indexer top-k rows."""
    for k, s in enumerate(samples):
        n = len(s.tokens)
        s.routed_experts = (np.arange(n * 6).reshape(n, 3, 2) * 7 + k).astype(np.uint16) % 300
        s.indexer_topk = np.full((n, 1, 2), -1, dtype=np.int32)
        s.indexer_topk[:, 0, 0] = np.arange(n)
    return samples


@pytest.mark.parametrize("fmt", FORMATS)
def test_replay_rows_round_trip_exactly(tmp_path, fmt: str) -> None:
    needs(fmt)
    path = tmp_path / f"replay.{fmt}"
    write_samples(path, with_replay(fixtures()))
    got = read_samples(path)
    for g, w in zip(got, with_replay(fixtures()), strict=True):
        for name in ("routed_experts", "indexer_topk"):
            a, b = getattr(g, name), getattr(w, name)
            assert (a.dtype, a.shape) == (b.dtype, b.shape), name
            assert a.tobytes() == b.tobytes(), name
    assert_same_samples(got, fixtures())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: setattr(s[1], "routed_experts", None), "some samples have it and some do not"),
        (lambda s: setattr(s[0], "routed_experts", s[0].routed_experts[:2]), "not one row"),
        (lambda s: setattr(s[0], "indexer_topk", s[0].indexer_topk.astype(np.int64)),
         "not one row"),
        (lambda s: setattr(s[2], "routed_experts", s[2].routed_experts.astype(np.uint8)),
         "more than one type or shape"),
    ],
)  # fmt: skip
def test_replay_rows_that_do_not_fit_are_refused_on_write(tmp_path, edit, message) -> None:
    samples = with_replay(fixtures())
    edit(samples)
    for fmt in ("npz", "parquet"):
        with pytest.raises(ExportError, match=message):
            write_samples(tmp_path / f"bad.{fmt}", samples)


def test_packing_carries_the_replay_rows_token_for_token(backend: str) -> None:
    samples = with_replay(fixtures())
    batch = pack_samples(samples, backend=backend)
    assert batch.routed_experts.dtype == np.uint16
    assert batch.routed_experts.shape == (batch.num_tokens, 3, 2)
    for i, s in enumerate(samples):
        start, end = batch.cu_seqlens[i], batch.cu_seqlens[i + 1]
        assert batch.routed_experts[start:end].tobytes() == s.routed_experts.tobytes()
        assert batch.indexer_topk[start:end].tobytes() == s.indexer_topk.tobytes()
    assert pack_samples(fixtures(), backend=backend).routed_experts is None
    samples[3].routed_experts = None
    with pytest.raises(PackError, match="routed_experts: sample 3 has none, others have"):
        pack_samples(samples, backend=backend)


# --- Memory --------------------------------------------------------------------------------------


def test_packed_arrays_are_fresh_contiguous_and_writable(backend: str) -> None:
    samples = fixtures()
    batch = pack_samples(samples, backend=backend)
    for name in DTYPES:
        array = getattr(batch, name)
        assert array.flags.c_contiguous and array.flags.writeable, name
        for s in samples:
            for given_array in (s.tokens, s.loss_mask, s.rollout_log_probs):
                assert not np.shares_memory(array, given_array), name


def test_rust_hands_its_vectors_to_numpy_without_copying() -> None:
    # `into_pyarray` makes the Rust Vec the array's memory, owned by rust-numpy's container;
    # a copy (`from_slice`) would give an array that owns its data instead.
    s = fixtures()[0]
    packed = _core.pack(
        [s.tokens], [s.loss_mask], [s.rollout_log_probs], [s.response_length], [s.reward]
    )
    for name in DTYPES:
        array = getattr(packed, name)
        assert not array.flags.owndata, name
        assert type(array.base).__name__ == "PySliceContainer", name


def test_to_torch_shares_memory_except_for_tokens(backend: str) -> None:
    torch = pytest.importorskip("torch")
    batch = pack_samples(fixtures(), backend=backend)
    tensors = batch.to_torch()
    for name in DTYPES.keys() - {"tokens"}:
        assert tensors[name].data_ptr() == getattr(batch, name).ctypes.data, name
    assert tensors["tokens"].dtype == torch.int64
    assert tensors["tokens"].tolist() == batch.tokens.tolist()
    assert tensors["cu_seqlens"].dtype == torch.int32
    assert tensors["max_seqlen"] == batch.max_seqlen
    tensors["advantages"] += 1.0
    assert batch.advantages.tolist() == [1.0] * batch.num_samples


def test_zipfile_is_what_npz_is(tmp_path) -> None:
    # Readers without numpy can list the arrays: the .npz is a plain zip of .npy files.
    write_samples(tmp_path / "s.npz", fixtures())
    with zipfile.ZipFile(tmp_path / "s.npz") as archive:
        names = set(archive.namelist())
    assert {"tokens.npy", "metadata.npy", "schema.npy"} <= names
