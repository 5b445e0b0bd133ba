import sys

import pytest

from mlxspec import runtime
from mlxspec.errors import MlxspecError


@pytest.mark.skipif(sys.platform != "linux", reason="OpenBLAS preload is Linux-only")
def test_fast_blas_loaded_before_mlx():
    assert runtime.BLAS.library is not None, runtime.BLAS.note


def test_matmul_throughput_is_measured():
    """A timed 1024^2 fp32 matmul gives a throughput, and the right product. How fast it is says
    which BLAS this machine runs (the reference one ~3-6 GFLOP/s here, OpenBLAS > 50) but also how
    loaded the machine is, so it is no test's bound: test_fast_blas_loaded_before_mlx checks the
    library, and `mlxspec profile` times the target passes that BLAS does (per L = 1..K+1)."""
    import math
    import time

    import mlx.core as mx
    import numpy as np

    a = mx.random.normal((1024, 1024))
    mx.eval(a @ a)
    t = time.perf_counter()
    for _ in range(5):
        product = a @ a
        mx.eval(product)
    gflops = 5 * 2 * 1024**3 / (time.perf_counter() - t) / 1e9
    print(f"{gflops:.1f} GFLOP/s ({runtime.BLAS.library})")
    assert math.isfinite(gflops) and gflops > 0
    ref = np.array(a, dtype=np.float64) @ np.array(a, dtype=np.float64)
    np.testing.assert_allclose(np.array(product), ref, rtol=1e-3, atol=1e-3)


def test_dtype_choice():
    assert runtime.resolve_dtype("auto") in ("float32", "quantized")
    assert runtime.resolve_dtype("bfloat16") == "bfloat16"
    with pytest.raises(MlxspecError, match="unknown dtype 'int3'"):
        runtime.resolve_dtype("int3")
