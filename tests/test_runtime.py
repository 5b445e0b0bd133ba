import sys

import pytest

from mlxspec import runtime
from mlxspec.errors import MlxspecError


@pytest.mark.skipif(sys.platform != "linux", reason="OpenBLAS preload is Linux-only")
def test_fast_blas_loaded_before_mlx():
    assert runtime.BLAS.library is not None, runtime.BLAS.note


def test_matmul_uses_fast_blas():
    """A 1024^2 fp32 matmul: the reference BLAS manages ~3-6 GFLOP/s here, OpenBLAS > 50."""
    import time

    import mlx.core as mx

    a = mx.random.normal((1024, 1024))
    mx.eval(a @ a)
    t = time.perf_counter()
    for _ in range(5):
        mx.eval(a @ a)
    gflops = 5 * 2 * 1024**3 / (time.perf_counter() - t) / 1e9
    assert gflops > 20, f"{gflops:.1f} GFLOP/s: fast BLAS not in use"


def test_dtype_choice():
    assert runtime.resolve_dtype("auto") in ("float32", "quantized")
    assert runtime.resolve_dtype("bfloat16") == "bfloat16"
    with pytest.raises(MlxspecError, match="unknown dtype 'int3'"):
        runtime.resolve_dtype("int3")
