"""The PyTorch path: the same engine on PyTorch (CPU, CUDA, MPS).

The parts that touch arrays are written again for torch, one file per concern as in
``mlxspec/core``: the llama module with masks and per-token positions (``model``), a trimmable
KV cache (``cache``), the sampling transforms (``sampling``), every acceptance rule
(``verify``). ``ops`` names them for the engine and the drafters, which are shared: a module
says which backend it runs on by its ``ops`` attribute. Weights come from the project's one
loaders (``targets.loading``) and are copied into torch tensors (``from_mlx``).

torch is an optional extra (``pip install 'mlxspec[torch]'``); nothing here is imported unless
``--backend torch`` asks for it, or ``auto`` finds it installed on a Linux or Windows CPU.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from mlxspec.errors import MlxspecError

BACKENDS = ("auto", "mlx", "torch")
DEVICES = ("cpu", "cuda", "mps")
INSTALL_HINT = "pip install 'mlxspec[torch]' (or `make setup`, which installs it)"


def backend_spec(backend: str, device: str | None) -> str:
    """``--backend`` and ``--device`` as one string: "auto" (chosen at load time, ``prefer_torch``),
    "mlx", or "torch:DEVICE" ("torch" alone: the best device here, chosen at load time). A
    device with ``auto`` names a torch device."""
    if backend not in BACKENDS:
        raise MlxspecError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
    if backend == "auto" and device in (None, "auto"):
        return "auto"
    if backend == "mlx":
        if device not in (None, "auto"):
            raise MlxspecError("--device chooses a torch device; MLX picks its own (add --backend torch)")
        return "mlx"
    if device not in (None, "auto", *DEVICES):
        raise MlxspecError(f"unknown device {device!r}; choose one of: {', '.join(DEVICES)}")
    return "torch" if device in (None, "auto") else f"torch:{device}"


def torch_may_run(dtype: str = "auto") -> bool:
    """What ``prefer_torch`` can tell without the model: not on a Mac, MLX on its CPU, torch
    installed, a dtype the torch CPU target takes."""
    if sys.platform == "darwin" or dtype not in ("auto", "float32", "quantized"):
        return False
    if importlib.util.find_spec("torch") is None:
        return False
    import mlx.core as mx

    return mx.default_device() == mx.cpu


def missing_torch_hint() -> str | None:
    """On a Linux or Windows CPU without the torch extra, the line that says what it costs."""
    if sys.platform == "darwin" or importlib.util.find_spec("torch") is not None:
        return None
    return ("note: the torch extra is not installed, so this runs on MLX's CPU backend at about a third of the "
            f"default's speed here; {INSTALL_HINT}")


def prefer_torch(model: Any, dtype: str) -> bool:
    """``--backend auto``: torch on the CPU of a Linux or Windows machine where it is installed
    and implements the model (llama-type blocks), MLX everywhere else. On this kind of CPU torch
    runs the file's 4-bit layers on its int4 kernel, which MLX's CPU backend cannot do fast, and
    its verify pass is batch-invariant (BENCHMARKS, "The default configuration"); on Apple
    silicon MLX runs on the GPU."""
    if not torch_may_run(dtype):
        return False
    from mlxspec.core.model import Llama

    if not isinstance(model, Llama):  # not one mlx-lm's class runs
        return False
    from mlxspec.torchpath.model import check_supported

    try:
        check_supported(model.cfg)
    except MlxspecError:
        return False
    return True


def split_backend(spec: str) -> str | None:
    """The device of a "torch[:DEVICE]" backend string (None: the best here)."""
    if spec != "torch" and not spec.startswith("torch:"):
        raise MlxspecError(f"unknown backend {spec!r}; choose mlx or torch")
    return spec.partition(":")[2] or None


def require_torch():
    """The torch module, or one clear error saying how to install it."""
    try:
        import torch
    except ImportError:
        raise MlxspecError(f"--backend torch needs PyTorch, which is not installed: {INSTALL_HINT}") from None
    return torch


def available_devices() -> list[str]:
    """The torch devices this machine has, best first."""
    torch = require_torch()
    found = []
    if torch.cuda.is_available():
        found.append("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        found.append("mps")
    return found + ["cpu"]


def pick_device(device: str | None) -> str:
    """``device`` if this machine has it (None: the best one it has), else one error naming
    the devices that are available."""
    have = available_devices()
    if device is None or device == "auto":
        return have[0]
    if device not in DEVICES:
        raise MlxspecError(f"unknown device {device!r}; choose one of: {', '.join(DEVICES)}")
    if device not in have:
        why = " (MPS is Apple silicon only)" if device == "mps" and sys.platform != "darwin" else ""
        raise MlxspecError(f"device {device!r} is not available here{why}; available: {', '.join(have)}")
    return device


def default_dtype(device: str) -> str:
    """On the CPU the file's weights as stored ("quantized": 4-bit layers on torch's int4 kernel,
    ``torchpath.int4``; a file without them runs float32): about 1.6x float32's decode on the
    default model (BENCHMARKS). Half precision on accelerators, bfloat16 where the device has
    it, as the MLX path runs half or 4-bit on the GPU."""
    if device == "cpu":
        return "quantized"
    return "bfloat16" if device == "cuda" else "float16"
