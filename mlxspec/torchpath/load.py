"""A loaded model and its drafter's weights, moved onto torch: the project's one loader reads the
weights (as MLX arrays, float32), ``from_mlx`` copies them into the torch twins."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from mlxspec.core.drafters import ModelDrafter
from mlxspec.core.drafters.eagle import EagleDrafter, EagleHead
from mlxspec.core.drafters.eagle3 import Eagle3Head
from mlxspec.core.model import Llama as MlxLlama
from mlxspec.errors import MlxspecError
from mlxspec.torchpath import default_dtype, pick_device, vnni
from mlxspec.torchpath.int4 import Int4Linear
from mlxspec.torchpath.invariant import bf16_native, make_batch_invariant, pack_linears
from mlxspec.torchpath.model import DTYPES, DraftModel, Eagle3Head as TorchEagle3Head, EagleHead as TorchEagleHead, Llama
from mlxspec.torchpath.threads import ThreadGovernor


def torch_dtype(dtype: str, device: str) -> str:
    if dtype == "auto":
        return default_dtype(device)
    if dtype == "quantized" and device == "cpu":  # the file's 4-bit weights in torch's int4 kernel (torchpath.int4)
        return dtype
    if dtype not in DTYPES:
        choices = ", ".join(("auto", *DTYPES, *(("quantized",) if device == "cpu" else ())))
        raise MlxspecError(f"--dtype {dtype} is not available on the torch backend ({device}); choose {choices}")
    return dtype


def to_torch(source: Any, dtype: str = "auto", device: str | None = None) -> Any:
    """A ``LoadedModel`` read by ``loading.load`` in float32 (or "quantized", for dtype
    "quantized": its 4-bit layers as stored, ``int4``), moved onto torch: the same weights, on
    ``device`` (None: the best here), in ``dtype`` (auto: per device). On the CPU the target
    runs ``invariant``'s kernels: a verify pass's rows have the bits of
    the one-token passes, its cost grows less with the tokens, and the one-token pass costs no
    more (benchmarks/notes/2026-12-01-verify-routes.md)."""
    device = pick_device(device)
    requested, dtype = dtype, torch_dtype(dtype, device)
    if dtype == "quantized" and source.dtype != "quantized" and requested == "auto":
        dtype = "float32"  # auto takes the weights as they were read
    if (dtype == "quantized") != (source.dtype == "quantized"):
        raise MlxspecError(f"a {source.dtype} model cannot become a {dtype} one on torch: load it as "
                           + ("quantized" if dtype == "quantized" else "float32"))
    governor = ThreadGovernor(torch) if device == "cpu" else None  # it watches the load while the weights copy
    model = Llama.from_mlx(source.model, device, dtype)
    model.threads = governor
    make_batch_invariant(model)
    if dtype == "quantized" and not any(isinstance(m, Int4Linear) for m in model.modules()):
        dtype = "float32"  # nothing stored in 4 bits the kernel takes: every layer became float32
    return replace(source, model=model, dtype=dtype, backend=f"torch:{device}", source=source)


def head_on_torch(drafter: EagleDrafter, target: Any) -> EagleDrafter:
    """The torch twin of an eagle or EAGLE-3 head made for ``target.source`` (the MLX model
    ``target`` was copied from): the same weights, drafting from the torch target's states; on
    the CPU its products rounded to ``HEAD_BITS`` on the VNNI kernel where it runs, else packed
    for oneDNN (``invariant.pack_linears``), in bfloat16 where oneDNN has it."""
    twins = {EagleHead: TorchEagleHead, Eagle3Head: TorchEagle3Head}
    twin = twins.get(type(drafter.head))
    if twin is None:
        raise MlxspecError(f"cannot move drafter {drafter.name!r} to torch")
    moved = EagleDrafter(twin.from_mlx(drafter.head, target.model), drafter.name)
    pack_linears(moved.head, draft_dtype(), head_bits())
    if target.model.compiled is not None:
        moved.draft_prior_ratio = COMPILED_HEAD_RATIO
    return moved


# The head's weights on the VNNI kernel: its step costs its bytes, read cold after the target's
# pass. Held out (benchmarks/results/head-bits.json) a greedy K = 1 step drafted in 0.54 ms in 4 bits,
# 0.68 in 8, 1.05 in bfloat16, and at K = 3 kept its first draft 0.321 / 0.329 / 0.332 of the time
# (at T = 1 0.322 / 0.332 / 0.316): the time saved outweighs the drafts lost.
HEAD_BITS = 4


def head_bits() -> int | None:
    """The bits a head's weights are rounded to here: ``HEAD_BITS`` where the kernel runs, else
    None (packed as ``draft_dtype`` says)."""
    return HEAD_BITS if vnni.active() else None


# A head step's cost beside the compiled target pass, as --k auto assumes it until it has timed
# one: in 4 bits 0.54 ms a drafted token greedy and 0.69 at T=1 (drawn within its 8,192 columns)
# beside plain steps of 3.6-3.9 ms (2.3 and 3.2-3.5 ms in bfloat16 with the whole row, beside 12.5).
COMPILED_HEAD_RATIO = 0.15


def draft_model_on_torch(drafter: ModelDrafter, target: Any) -> ModelDrafter:
    """The torch twin of a draft model (a trained draft, or another model) made beside
    ``target.source``: the same weights and cache discipline, packed as ``head_on_torch``'s."""
    model, draft = target.model, drafter.model
    if isinstance(draft, MlxLlama):
        dtype = next(iter(model.parameters())).dtype
        moved = ModelDrafter(Llama.from_mlx(draft, str(model.device), _dtype_name(dtype)), drafter.name)
    else:
        moved = ModelDrafter(DraftModel.from_mlx(draft, model), drafter.name)
    pack_linears(moved.model, draft_dtype())
    return moved


def draft_dtype() -> torch.dtype:
    """A draft's numbers need not be the target's: bfloat16 halves the bytes a head step reads
    (0.69 ms against 1.68 for the eagle head here), where oneDNN runs it natively."""
    return torch.bfloat16 if bf16_native() else torch.float32


def _dtype_name(dtype: Any) -> str:
    return next(name for name, d in DTYPES.items() if d == dtype)
