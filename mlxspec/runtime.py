"""Backend set-up. Imported by ``mlxspec/__init__`` so it runs before anything imports ``mlx``.

The Linux ``mlx[cpu]`` wheel links a reference BLAS (about 3 GFLOP/s on a 2048^2 matmul here).
Loading the system OpenBLAS with RTLD_GLOBAL *before* ``mlx`` is imported makes MLX resolve its
BLAS symbols to it instead (about 130-200 GFLOP/s). Once ``mlx`` is loaded it is too late.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

# Debian/Ubuntu (libopenblas0-pthread / -openmp), Fedora, then whatever the loader finds.
_OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)


@dataclass(frozen=True)
class BlasStatus:
    library: str | None  # path of the fast BLAS we loaded, None if none
    note: str


def _keep_torch_blas() -> None:
    """PyTorch's CPU library carries its own BLAS (MKL) under the same symbol names as
    OpenBLAS. Loaded after OpenBLAS went global, its float32 matmuls bind to OpenBLAS, whose
    threads then fight torch's and decoding slows several-fold. Loading it first,
    privately, keeps its own; MLX still finds OpenBLAS. About 0.15 s, only where torch is
    installed."""
    if "torch" in sys.modules:
        return
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return
    lib = Path(list(spec.submodule_search_locations)[0]) / "lib" / "libtorch_cpu.so"
    if lib.exists():
        try:
            ctypes.CDLL(str(lib), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError:
            pass  # torch then loads as usual; only its speed beside MLX suffers


def _load_fast_blas() -> BlasStatus:
    if sys.platform == "darwin":
        return BlasStatus(None, "macOS: MLX uses Accelerate/Metal")
    if os.environ.get("MLXSPEC_NO_BLAS") == "1":
        return BlasStatus(None, "fast BLAS disabled by MLXSPEC_NO_BLAS=1")
    if "mlx.core" in sys.modules:
        return BlasStatus(None, "mlx was imported before mlxspec; fast BLAS could not be installed")
    _keep_torch_blas()
    found = ctypes.util.find_library("openblas")
    for path in (*_OPENBLAS_CANDIDATES, found):
        if path and (not os.path.isabs(path) or os.path.exists(path)):  # bare sonames go to the loader
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
            return BlasStatus(path, f"OpenBLAS loaded from {path}")
    return BlasStatus(None, "no system OpenBLAS found")


BLAS = _load_fast_blas()

if BLAS.library is None and sys.platform.startswith("linux"):
    warnings.warn(
        f"mlxspec: {BLAS.note}; MLX on CPU will be ~40x slower. "
        "Install it with `apt-get install libopenblas0-pthread` (Debian/Ubuntu) "
        "or `dnf install openblas` (Fedora).",
        RuntimeWarning,
        stacklevel=2,
    )


def device_name() -> str:
    """'gpu' (Metal or CUDA) or 'cpu': the device MLX computes on by default."""
    import mlx.core as mx

    return "gpu" if mx.default_device().type == mx.DeviceType.gpu else "cpu"


def backend_description() -> str:
    import mlx.core as mx

    dev = device_name()
    if dev == "gpu":
        kind = "Metal" if sys.platform == "darwin" else "CUDA"
        return f"MLX {mx.__version__} on {kind} GPU"
    blas = "OpenBLAS" if BLAS.library else "reference BLAS"
    return f"MLX {mx.__version__} on CPU ({blas}, {os.cpu_count()} cores)"


def torch_description(backend: str) -> str:
    """The torch side of a "torch:DEVICE" backend, as ``backend_description`` words MLX's."""
    import torch

    device = backend.partition(":")[2] or "cpu"
    if device == "cpu":
        n = torch.get_num_threads()
        return f"PyTorch {torch.__version__} on CPU ({n} thread{'s' if n != 1 else ''})"
    name = torch.cuda.get_device_name() if device == "cuda" else "Apple GPU"
    return f"PyTorch {torch.__version__} on {device.upper()} ({name})"


DTYPES = ("auto", "float32", "float16", "bfloat16", "quantized")


def resolve_dtype(dtype: str) -> str:
    """Per-device weight format: measured fastest is fp32 on CPU, the GGUF's own 4-bit on GPU."""
    from mlxspec.errors import MlxspecError

    if dtype not in DTYPES:
        raise MlxspecError(f"unknown dtype {dtype!r}; choose one of: {', '.join(DTYPES)}")
    if dtype != "auto":
        return dtype
    return "quantized" if device_name() == "gpu" else "float32"


# Leaving a process whose worker thread ran MLX, without aborting it.
def wait_for_thread_exit(native_id: int | None, timeout: float = 2.0) -> None:
    """Wait until the OS thread ``native_id`` is gone.

    A worker thread can have ended as far as Python knows while its OS thread still runs MLX's
    thread-local destructors, which take the GIL; if the interpreter is already finalising by
    then, the process aborts ("terminate called without an active exception", exit status 134;
    MLX 0.32 on CPython 3.11, about one exit in three after a chat turn). Linux shows the
    thread in /proc; elsewhere, wait briefly."""
    if native_id is None:
        return
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        time.sleep(0.2)
        return
    deadline = time.monotonic() + timeout
    while (tasks / str(native_id)).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
