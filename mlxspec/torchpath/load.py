"""A loaded model and its drafter, moved onto torch: the project's one loader reads the
weights (as MLX arrays, float32), ``from_mlx`` copies them into the torch twins."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from mlxspec.core.drafters import ModelDrafter, NgramDrafter
from mlxspec.core.drafters.eagle import EagleDrafter, EagleHead
from mlxspec.core.drafters.eagle3 import Eagle3Head
from mlxspec.core.drafters.suffix import SuffixDrafter
from mlxspec.core.model import Llama as MlxLlama
from mlxspec.errors import MlxspecError
from mlxspec.torchpath import default_dtype, pick_device
from mlxspec.torchpath import ops as torch_ops
from mlxspec.torchpath.invariant import make_batch_invariant
from mlxspec.torchpath.model import DTYPES, DraftModel, Eagle3Head as TorchEagle3Head, EagleHead as TorchEagleHead, Llama
from mlxspec.torchpath.threads import ThreadGovernor


def torch_dtype(dtype: str, device: str) -> str:
    if dtype == "auto":
        return default_dtype(device)
    if dtype not in DTYPES:
        raise MlxspecError(f"--dtype {dtype} is not available on the torch backend; choose auto, {', '.join(DTYPES)}")
    return dtype


def to_torch(source: Any, dtype: str = "auto", device: str | None = None) -> Any:
    """A ``LoadedModel`` read by ``loading.load`` in float32, moved onto torch: the same
    weights, on ``device`` (None: the best here), in ``dtype`` (auto: per device). In float32
    on the CPU the target runs ``invariant``'s kernels: a verify pass's rows have the bits of
    the one-token passes, its cost grows less with the tokens, and the one-token pass costs no
    more (benchmarks/notes/2026-12-01-verify-routes.md)."""
    device = pick_device(device)
    dtype = torch_dtype(dtype, device)
    governor = ThreadGovernor(torch) if device == "cpu" else None  # it watches the load while the weights copy
    model = Llama.from_mlx(source.model, device, dtype)
    model.threads = governor
    make_batch_invariant(model)
    return replace(source, model=model, dtype=dtype, backend=f"torch:{device}", source=source)


def drafter_on_torch(drafter: Any, target: Any) -> Any:
    """The torch twin of a drafter made for ``target.source`` (the MLX model ``target`` was
    copied from): the same weights, the same cache discipline, torch's arrays."""
    model = target.model
    if drafter is None:
        return None
    if isinstance(drafter, NgramDrafter):
        return NgramDrafter(drafter.n, drafter.min_n, ops=torch_ops)
    if isinstance(drafter, SuffixDrafter):
        return SuffixDrafter(drafter.n, drafter.min_n, drafter.max_tokens, drafter.min_prob, ops=torch_ops)
    if isinstance(drafter, EagleDrafter):
        twins = {EagleHead: TorchEagleHead, Eagle3Head: TorchEagle3Head}
        twin = twins.get(type(drafter.head))
        if twin is None:
            raise MlxspecError(f"cannot move drafter {drafter.name!r} to torch")
        return EagleDrafter(twin.from_mlx(drafter.head, model), drafter.name)
    if isinstance(drafter, ModelDrafter):
        draft = drafter.model
        if draft is target.source.model:  # self:L: the target's own first layers
            return ModelDrafter(model, drafter.name, drafter.num_layers)
        if isinstance(draft, MlxLlama):
            dtype = next(iter(model.parameters())).dtype
            return ModelDrafter(Llama.from_mlx(draft, str(model.device), _dtype_name(dtype)), drafter.name)
        return ModelDrafter(DraftModel.from_mlx(draft, model), drafter.name)
    raise MlxspecError(f"drafter {drafter.name!r} has no torch version")


def _dtype_name(dtype: Any) -> str:
    return next(name for name, d in DTYPES.items() if d == dtype)
