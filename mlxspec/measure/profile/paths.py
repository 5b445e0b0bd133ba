"""The target's forward paths side by side (``--compare``): ``plain`` (the blocks' own per-layer
path), ``tables`` (the CPU path of ``core.model.CpuPath``, RoPE tables and mask built once per
pass, without ``mx.compile``) and ``tables+compile`` (what float models run on the CPU), in
rotating order round by round, one ``time_verify`` call per path a round; ratios are medians of
the per-round ratios to ``plain``."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from mlxspec.core.model import COMPILE_MAX_TOKENS
from mlxspec.measure.profile.records import PathTiming
from mlxspec.measure.sweep import verify_slope
from mlxspec.measure.verdict import median_ratio
from mlxspec.targets.costcurve import time_verify

PATHS = ("plain", "tables", "tables+compile")


def _use_path(model: Any, path: str) -> None:
    """Switch ``model`` to one forward path (``PATHS``)."""
    model.use_cpu_path = path != "plain"
    cpu = model.cpu_path()
    if cpu is not None:
        cpu.compile_max_tokens = 0 if path == "tables" else COMPILE_MAX_TOKENS


def compare_paths(model: Any, prompt: list[int], sizes: list[int], rounds: int,
                  tick: Callable[[str], None]) -> list[PathTiming] | None:
    """Target passes over each L in ``sizes`` for every forward path, side by side (module
    docstring); None when the model has no CPU path (quantized weights, not on the CPU)."""
    if model.cpu_path() is None:
        return None
    times: dict[str, dict[int, list[float]]] = {p: {n: [] for n in sizes} for p in PATHS}
    try:
        for r in range(rounds):
            for path in PATHS[r % len(PATHS):] + PATHS[: r % len(PATHS)]:
                _use_path(model, path)
                for n, ms in time_verify(model, prompt, sizes, reps=1).items():
                    times[path][n] += ms
            tick(f"paths {r + 1}/{rounds}")
    finally:
        _use_path(model, "tables+compile")

    def total(path: str) -> list[float]:  # per round, summed over every L
        return [sum(t) for t in zip(*(times[path][n] for n in sizes))]

    out = []
    for path in PATHS:
        ms = [statistics.median(times[path][n]) for n in sizes]
        vs = [statistics.median(a / b for a, b in zip(times[path][n], times["plain"][n])) for n in sizes]
        slope = verify_slope([n - 1 for n in sizes[1:]], [m / ms[0] for m in ms[1:]])
        speedup = median_ratio([p / x for p, x in zip(total("plain"), total(path))])
        out.append(PathTiming(path, ms, vs, slope, speedup, total(path)))
    return out
