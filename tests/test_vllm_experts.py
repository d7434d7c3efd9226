"""`vllm_experts.ExpertLayout` without vLLM: the probe's expert weights are distinct, a packed
order is read off a probe's tensors by value, and a later checkpoint's experts are written in
that order. (`tests/real_engines/test_vllm_moe_reload.py` runs it against vLLM's CPU build.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from tokentrail.errors import EngineError  # noqa: E402
from tokentrail.integrations import vllm_experts  # noqa: E402
from tokentrail.integrations.vllm_experts import ExpertLayout, PackedTensor  # noqa: E402

EXPERTS, ROWS, COLS = 4, 32, 16
PREFIX = "model.layers.0.mlp.experts"
SERVED = f"{PREFIX}.routed_experts.w13_weight"


def checkpoint(directory: Path, seed: int) -> Path:
    """A Qwen3-MoE-like layer: per-expert gate, up and down projections, and a router."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {"model.layers.0.mlp.gate.weight": torch.randn(EXPERTS, COLS, generator=generator)}
    for e in range(EXPERTS):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            tensors[f"{PREFIX}.{e}.{proj}.weight"] = torch.randn(ROWS, COLS, generator=generator)
    directory.mkdir(parents=True)
    safetensors_torch.save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text("{}")
    return directory


def fused_w13(tensors: dict) -> torch.Tensor:
    """vLLM's w13 in checkpoint order: each expert's gate rows, then its up rows."""
    return torch.stack(
        [
            torch.cat(
                [tensors[f"{PREFIX}.{e}.gate_proj.weight"], tensors[f"{PREFIX}.{e}.up_proj.weight"]]
            )
            for e in range(EXPERTS)
        ]
    )


def packed(w13: torch.Tensor) -> torch.Tensor:
    """The CPU build's order for float32 (`vec`): per expert, blocks of 16 rows, each stored
    column by column (what `cpu_prepack_moe_weight` was seen to do)."""
    e, n, k = w13.shape
    return w13.reshape(e, n // 16, 16, k).transpose(2, 3).reshape(e, n, k).contiguous()


def test_the_probe_keeps_the_model_but_makes_every_expert_weight_distinct(tmp_path: Path) -> None:
    model = checkpoint(tmp_path / "model", seed=0)
    probe = ExpertLayout.probe(model, tmp_path / "probe")
    assert (probe / "config.json").read_text() == "{}"
    before = safetensors_torch.load_file(str(model / "model.safetensors"))
    after = safetensors_torch.load_file(str(probe / "model.safetensors"))
    router = "model.layers.0.mlp.gate.weight"
    assert torch.equal(after[router], before[router])
    experts = torch.cat([t.reshape(-1) for k, t in after.items() if ".experts." in k])
    assert experts.unique().numel() == experts.numel() == EXPERTS * 3 * ROWS * COLS


def test_a_packed_order_read_off_the_probe_packs_new_weights(tmp_path: Path) -> None:
    probe = ExpertLayout.probe(checkpoint(tmp_path / "model", seed=0), tmp_path / "probe")
    served = packed(fused_w13(safetensors_torch.load_file(str(probe / "model.safetensors"))))
    probe_tensors = vllm_experts._read(probe)
    sources = vllm_experts._sources(SERVED, probe_tensors)
    assert len(sources) == EXPERTS * 3 and all(s.startswith(PREFIX + ".") for s in sources)
    layout = ExpertLayout([vllm_experts._match(SERVED, served, sources, probe_tensors)])

    new = checkpoint(tmp_path / "step-1", seed=1)
    out = layout.write(new, tmp_path / "kernel")
    written = safetensors_torch.load_file(str(out / "model.safetensors"))
    assert list(written) == [SERVED]
    expected = packed(fused_w13(safetensors_torch.load_file(str(new / "model.safetensors"))))
    assert torch.equal(written[SERVED], expected)


def test_repeated_values_cannot_be_read_off(tmp_path: Path) -> None:
    tensors = vllm_experts._read(checkpoint(tmp_path / "model", seed=0))
    tensors[f"{PREFIX}.1.up_proj.weight"][0, 0] = tensors[f"{PREFIX}.0.gate_proj.weight"][0, 0]
    sources = vllm_experts._sources(SERVED, tensors)
    with pytest.raises(EngineError, match="repeat"):
        vllm_experts._match(SERVED, packed(fused_w13(tensors)), sources, tensors)


def test_values_the_probe_does_not_hold_are_refused(tmp_path: Path) -> None:
    probe = ExpertLayout.probe(checkpoint(tmp_path / "model", seed=0), tmp_path / "probe")
    tensors = vllm_experts._read(probe)
    sources = vllm_experts._sources(SERVED, tensors)
    served = packed(fused_w13(tensors))
    served[0, 0, 0] = 7.0
    with pytest.raises(EngineError, match="does not|do not"):
        vllm_experts._match(SERVED, served, sources, tensors)


def test_packed_tensor_gathers_in_source_order() -> None:
    tensor = PackedTensor("w", ("a", "b"), (2, 2), torch.tensor([3, 0, 2, 1]))
    out = tensor.pack({"a": torch.tensor([10.0, 11.0]), "b": torch.tensor([12.0, 13.0])})
    assert out.tolist() == [[13.0, 10.0], [12.0, 11.0]]
