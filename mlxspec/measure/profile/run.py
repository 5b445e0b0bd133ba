"""``profile_step(ProfileOptions(...))``: where one speculative step's time goes, on one prompt
after warm-up, as medians over steps (``stepper``); beside it the target pass over L = 1..K+1
tokens (``costcurve.time_verify``, cache holding the prompt, trimmed back after each pass) with
the per-extra-token slope in one-token passes (``sweep.verify_slope``), the engine's own step
time, one host sync's round trip (MLX), and with ``compare`` every forward path (``paths``, MLX). On
either backend: a loaded model (``measured_target``) runs where it was loaded."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError
from mlxspec.measure.profile.paths import compare_paths
from mlxspec.measure.profile.records import NO_DRAFTER, PHASES, Phase, ProfileOptions, ProfileSettings, StepProfile, VerifyPass
from mlxspec.measure.profile.stepper import eager, engine_step_ms, profile_steps, sync_round_trip_ms
from mlxspec.measure.runs import encode_prompts, progress_ticker, run_header, spec_bench_prompts
from mlxspec.measure.sweep import verify_slope
from mlxspec.targets import loading, store
from mlxspec.targets.costcurve import time_verify
from mlxspec.targets.drafts import DEFAULT_FALLBACK, make_drafter

COMPARE_ON_TORCH = "--compare times MLX's forward paths; this target runs on torch (add --backend mlx)"


def profiled_draft(draft: str, model_spec: Any) -> str:
    """The drafter ``--draft`` names. ``default`` is the registry's default for the target; where
    that is ``none`` (target-only decoding is the default) it is the target's first shipped draft
    that is present, else ``ngram:3``: a step that drafts nothing has nothing to break down."""
    if draft != "default":
        return draft
    target = model_spec.name if hasattr(model_spec, "name") else loading.resolve(model_spec)[0]
    name = store.default_draft(target, getattr(model_spec, "backend", "mlx"))
    if name and name != "none":
        return name
    shipped = [d["name"] for d in store.drafts() if d["target"] == target and d["present"]]
    return shipped[0] if shipped else DEFAULT_FALLBACK


def _verify_passes(model: Any, prompt: list[int], k: int, repeats: int,
                   tick: Callable[[str], None]) -> tuple[list[VerifyPass], float]:
    """Target passes over L = 1..K+1 tokens (medians of ``repeats``), and the slope."""
    sizes = list(range(1, k + 2))
    vt = time_verify(model, prompt, sizes, reps=repeats, progress=lambda r: tick(f"target passes {r}/{repeats}"))
    med = {n: statistics.median(v) for n, v in vt.items()}
    verify = [VerifyPass(n, med[n], med[n] / med[1], vt[n]) for n in sizes]
    return verify, verify_slope([n - 1 for n in sizes[1:]], [v.ratio for v in verify[1:]])


def profile_step(options: ProfileOptions, progress: Callable[[int, int, str], Any] | None = None) -> StepProfile:
    """Profile one speculative step of ``options.draft`` on ``options.model`` at K =
    ``options.k``: ``steps`` instrumented steps (after ``warmup``), ``repeats`` rounds of
    target passes (and, with ``compare``, of every forward path)."""
    o = options
    o = o.checked()
    draft = profiled_draft(o.draft, o.model)
    params = SamplingParams(o.temp)
    lm = loading.as_loaded(o.model, o.dtype)
    eager_target = eager(lm.model)
    if o.compare and eager_target:
        raise MlxspecError(COMPARE_ON_TORCH)
    drafter = make_drafter(draft, lm, lm.dtype)
    if drafter is None:
        raise MlxspecError(NO_DRAFTER)
    items, _ = spec_bench_prompts(per_category=1)
    item = items[0]
    prompt = encode_prompts(lm, [item], o.steps * (o.k + 1))[0]
    tick = progress_ticker(progress, o.steps + o.repeats * (2 if o.compare else 1) + 1)

    verify, slope = _verify_passes(lm.model, prompt, o.k, o.repeats, tick)
    times, accepted = profile_steps(lm, drafter, prompt, params, o, tick)
    phases = [Phase(name, statistics.median(times[name]), times[name]) for name in PHASES]
    engine_ms = engine_step_ms(lm, drafter, prompt, params, o.k, o.steps, o.seed)
    tick("engine")
    paths = compare_paths(lm.model, prompt, list(range(1, o.k + 2)), o.repeats, tick) if o.compare else None
    settings = ProfileSettings(lm.name, drafter.name, o.k, o.temp, o.steps, o.warmup, o.repeats, item["id"],
                               len(prompt))
    return StepProfile(run_header(lm), settings, phases, verify, slope, None if eager_target else sync_round_trip_ms(),
                       engine_ms, sum(accepted) / len(accepted), paths, eager_target)
