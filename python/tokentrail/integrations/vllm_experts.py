"""An MoE model's experts into vLLM's CPU build exactly, where `reload_weights` alone does not.

vLLM 0.32's CPU build prepacks an MoE layer's experts once, at load: `w13_weight` (every
expert's gate and up projections) and `w2_weight` (their down projections) are reordered
into the layout of its grouped GEMM (`CPUUnquantizedExperts.process_weights_after_loading`).
A `reload_weights` writes a new checkpoint's experts into that storage in checkpoint order and
does not pack them again (`UnquantizedFusedMoEMethod._setup_kernel` skips the experts'
processing on a weight update), so the kernel reads them in the wrong order. The cause, with
the lines, is in docs/integrations/closed-loop.md.

The packing is a fixed reordering of each tensor's elements (the same for any values), and
vLLM's own routes can both read and write it:

- `ExpertLayout.probe(checkpoint, out)`: a copy of the model whose expert weights are all
  distinct (exact float32 multiples of 2**-24). Start vLLM from it (float32).
- `ExpertLayout.learn(weights, probe)`, on that server before any reload: vLLM saves its
  parameters as they are (`collective_rpc` `save_sharded_state`), and the order of each packed
  expert tensor is read off against the probe's expert tensors by value.
- `layout.write(checkpoint, out)`: a checkpoint's experts in that packed order, under vLLM's
  parameter names. `VLLMWeights.push(checkpoint, version, kernel=out)` reloads them as they
  are (`reload_weights` with `is_checkpoint_format: false`) after the checkpoint itself; the
  first push, of the real start weights, replaces the probe's.

Needs torch and safetensors (the `model` extra); the server's filesystem is this process's,
as `VLLMWeights.push` already assumes.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tokentrail.errors import EngineError

if TYPE_CHECKING:
    import torch

    from tokentrail.integrations.weights import VLLMWeights

__all__ = ["ExpertLayout", "PackedTensor"]

# The parameters of vLLM's fused MoE layer that its CPU build prepacks.
PACKED_PARAMETERS = ("w13_weight", "w2_weight")
KERNEL_FILE = "model.safetensors"
WEIGHT_FILES = (".safetensors", ".safetensors.index.json")
# Distinct float32 values in (0, 1]: multiples of 2**-24.
DISTINCT = 2**24


@dataclass(frozen=True)
class PackedTensor:
    """One packed vLLM parameter: element `i` of it (flattened) is element `index[i]` of its
    checkpoint tensors `sources`, flattened and concatenated in that order."""

    name: str
    sources: tuple[str, ...]
    shape: tuple[int, ...]
    index: torch.Tensor

    def pack(self, checkpoint: Mapping[str, torch.Tensor]) -> torch.Tensor:
        import torch

        flat = torch.cat([checkpoint[s].reshape(-1) for s in self.sources])
        return flat[self.index].reshape(self.shape).contiguous()


class ExpertLayout:
    """Where each element of vLLM's packed expert tensors comes from in a checkpoint."""

    def __init__(self, tensors: Sequence[PackedTensor]) -> None:
        self.tensors = tuple(tensors)

    @staticmethod
    def probe(checkpoint: str | Path, out: str | Path) -> Path:
        """A copy of model directory `checkpoint` in directory `out` (created) whose expert
        tensors (`.experts.` in their names) hold distinct values: `(i + 1) * 2**-24` over each
        MoE layer's experts, exact in float32. Returns `out`."""
        import torch
        from safetensors.torch import save_file

        checkpoint, out = Path(checkpoint), Path(out)
        out.mkdir(parents=True, exist_ok=True)
        for path in checkpoint.iterdir():
            if path.is_file() and not path.name.endswith(WEIGHT_FILES):
                shutil.copyfile(path, out / path.name)
        tensors = _read(checkpoint)
        counters: dict[str, int] = {}
        for name in sorted(tensors):
            if ".experts." not in name:
                continue
            layer = name.partition(".experts.")[0]
            start = counters.get(layer, 0)
            counters[layer] = start + tensors[name].numel()
            if counters[layer] > DISTINCT:
                raise EngineError(f"{layer}: more expert weights than float32 tells apart")
            coded = torch.arange(start + 1, counters[layer] + 1, dtype=torch.float64) / DISTINCT
            tensors[name] = coded.to(torch.float32).reshape(tensors[name].shape)
        if not counters:
            raise EngineError(f"{checkpoint}: no expert tensor (`.experts.` in its name)")
        save_file(tensors, str(out / KERNEL_FILE))
        return out

    @classmethod
    def learn(cls, weights: VLLMWeights, probe: str | Path) -> ExpertLayout:
        """The layout of the server behind `weights`, started from `probe` (what
        `ExpertLayout.probe` wrote) and not reloaded since. vLLM saves its parameters in
        `probe`'s directory `served/`, on the server's filesystem."""
        scratch = Path(probe) / "served"
        scratch.mkdir(parents=True, exist_ok=True)
        weights.rpc("save_sharded_state", path=str(scratch))
        served = _read(scratch)
        source = _read(Path(probe))
        tensors = []
        for name in sorted(served):
            prefix, _, parameter = name.rpartition(".")
            if parameter not in PACKED_PARAMETERS:
                continue
            tensors.append(_match(name, served[name], _sources(name, source), source))
        return cls(tensors)

    def write(self, checkpoint: str | Path, out: str | Path) -> Path:
        """`checkpoint`'s experts in vLLM's packed layout, under its parameter names, as the
        one file of directory `out` (created); returns `out`."""
        from safetensors.torch import save_file

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        source = _read(Path(checkpoint))
        save_file({t.name: t.pack(source) for t in self.tensors}, str(out / KERNEL_FILE))
        return out


def _read(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    if not tensors:
        raise EngineError(f"no safetensors file in {directory}")
    return tensors


def _sources(name: str, checkpoint: Mapping[str, torch.Tensor]) -> tuple[str, ...]:
    """The checkpoint tensors under the closest module above vLLM parameter `name`
    (`model.layers.0.mlp.experts.routed_experts.w13_weight`: those under
    `model.layers.0.mlp.experts.`, every expert's), in name order."""
    prefix = name
    while "." in prefix:
        prefix = prefix.rpartition(".")[0]
        sources = tuple(sorted(k for k in checkpoint if k.startswith(prefix + ".")))
        if sources:
            return sources
    raise EngineError(f"vllm parameter {name}: no checkpoint tensor under any module above it")


def _match(
    name: str,
    packed: torch.Tensor,
    sources: tuple[str, ...],
    checkpoint: Mapping[str, torch.Tensor],
) -> PackedTensor:
    """The gather index that takes `sources` (concatenated) to `packed`, read off by value."""
    import torch

    flat = torch.cat([checkpoint[s].reshape(-1).to(packed.dtype) for s in sources])
    target = packed.reshape(-1)
    values, order = torch.sort(flat)
    if bool((values[1:] == values[:-1]).any()):
        raise EngineError(
            f"vllm parameter {name}: the checkpoint's values under it repeat, so where each "
            "packed element comes from cannot be read off (start vLLM from ExpertLayout.probe)"
        )
    position = torch.searchsorted(values, target).clamp(max=values.numel() - 1)
    if not bool((values[position] == target).all()):
        raise EngineError(
            f"vllm parameter {name}: holds values the probe's tensors do not (was the server "
            "started from another directory, or reloaded since, or not in float32?)"
        )
    index = order[position]
    if index.unique().numel() != index.numel():
        raise EngineError(f"vllm parameter {name}: not a reordering of its checkpoint tensors")
    return PackedTensor(name, sources, tuple(packed.shape), index)
