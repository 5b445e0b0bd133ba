"""Speed side by side: target-only greedy decoding of one prompt on each backend, a warm-up run
each, then the median decode tokens/s of several timed runs, alternating which goes first."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from mlxspec.core.sampling import SamplingParams
from mlxspec.measure.parity.records import SPEED_REPEATS, BackendSpeed, Speed
from mlxspec.measure.runs import WARMUP_TOKENS, engine_run


def _backend_speed(name: str, runs: list) -> BackendSpeed:
    dec = [r.decode_tps or 0.0 for r in runs]
    return BackendSpeed(name, statistics.median(dec), min(dec), max(dec), statistics.median([r.tps for r in runs]),
                        runs[0].generated_tokens, len(runs))


def speed(lm, tl, ids: list[int], key: Any, max_tokens: int, repeats: int = SPEED_REPEATS,
          tick: Callable[[str], None] = lambda _: None) -> Speed:
    """Target-only greedy decoding of one prompt on each backend: a warm-up run each, then
    ``repeats`` timed runs each, alternating which backend goes first."""
    params = SamplingParams()
    n = min(max_tokens, lm.context_length - len(ids) - 1)
    models = {"mlx": lm, "torch": tl}
    for name, model in models.items():
        engine_run(model, ids, params, min(n, WARMUP_TOKENS), set())
        tick(f"speed warm-up {name}")
    runs: dict[str, list] = {"mlx": [], "torch": []}
    for r in range(repeats):
        for name in (("mlx", "torch") if r % 2 == 0 else ("torch", "mlx")):
            runs[name].append(engine_run(models[name], ids, params, n, set()))
            tick(f"speed {name} {r + 1}/{repeats}")
    return Speed(key, len(ids), n, 1, _backend_speed("mlx", runs["mlx"]), _backend_speed("torch", runs["torch"]))
