"""What both benchmarks share: the progress callback, the baseline's column keys and their
names in tables and progress lines, and a ratio of numbers that may be missing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Progress = Callable[[int, int, str], Any] | None

IMPLEMENTATIONS = ("mlxspec", "mlx_lm")
LABELS = {"mlxspec": "mlxspec generate_plain", "mlx_lm": "mlx-lm stream_generate"}
# torchpath.model.DTYPES and "quantized" (torchpath.int4), named without importing torch
TORCH_DTYPES = ("float32", "bfloat16", "float16", "quantized")
TORCH_PREFIX = "torch_"  # a torch column's key: "torch_float32", or "torch_float32_1t" (1 thread)


def torch_key(dtype: str, threads: int | None = None) -> str:
    """The key of a torch column; ``threads`` only when a run compares several settings."""
    return TORCH_PREFIX + dtype + ("" if threads is None else f"_{threads}t")


def label(key: str) -> str:
    """A column's name in tables and progress lines."""
    if key.startswith(TORCH_PREFIX):
        dtype, _, threads = key[len(TORCH_PREFIX):].partition("_")
        n = threads.removesuffix("t")
        return f"torch {dtype}" + (f", {n} thread{'' if n == '1' else 's'}" if n else "")
    return LABELS.get(key, key)


def fmt_t(t: float) -> str:
    return f"T={t:g}"


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is zero."""
    return a / b if a is not None and b else None
