"""The sampling settings a model is best chatted with, where they are known: the registry's
(chosen for a shipped model, with where they come from), else the ``generation_config.json``
a Hugging Face / mlx-lm folder ships, else greedy decoding. ``mlxspec chat``, ``generate``
and ``serve`` start from them (``model_sampling``: the small default model loops at T=0 on
everyday questions); the measurements keep greedy defaults, which exactness checks and
benchmarks compare against."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError
from mlxspec.targets import store

GENERATION_CONFIG = "generation_config.json"


@dataclass(frozen=True)
class SamplingDefaults:
    params: SamplingParams = SamplingParams()
    source: str = "none known: greedy"

    @property
    def label(self) -> str:
        return self.params.label


def sampling_defaults(spec: str) -> SamplingDefaults:
    """``spec``'s recommended settings (a model spec as ``--model`` takes it). A spec that does
    not resolve gets greedy: loading it reports why."""
    name = store.default_target() if spec in ("default", "") else spec
    chosen = store.chat_sampling(name)
    if chosen is not None:
        source = chosen.pop("source", SamplingDefaults.source)
        return SamplingDefaults(SamplingParams(**chosen), source)
    from mlxspec.targets.loading import resolve  # loading imports MLX: only when needed

    try:
        _, path = resolve(spec)
    except MlxspecError:
        return SamplingDefaults()
    return from_generation_config(path / GENERATION_CONFIG) if path.is_dir() else SamplingDefaults()


def from_generation_config(path: Path) -> SamplingDefaults:
    """Hugging Face's ``generation_config.json``: its temperature, top_p, top_k and min_p when it
    samples (``do_sample`` true), each missing one at transformers' own default (temperature 1,
    top_p 1, top_k 50, no min_p), as the authors' settings run there; greedy otherwise."""
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return SamplingDefaults()
    if not isinstance(cfg, dict) or cfg.get("do_sample") is not True:
        return SamplingDefaults(source=f"the model's {path.name}: greedy" if isinstance(cfg, dict) else
                                SamplingDefaults.source)
    try:
        return SamplingDefaults(SamplingParams(float(cfg.get("temperature", 1.0)), float(cfg.get("top_p", 1.0)),
                                               int(cfg.get("top_k", 50)), float(cfg.get("min_p") or 0.0)),
                                source=f"the model's {path.name}")
    except (TypeError, ValueError, MlxspecError):  # out-of-range values: greedy, as an unreadable file
        return SamplingDefaults()


def model_sampling(target: str, temp: float | None = None, top_p: float | None = None, top_k: int | None = None,
                   min_p: float | None = None, processors: SamplingParams | None = None) -> tuple[SamplingParams, str]:
    """Each setting given on the command line, the others ``target``'s recommended ones, over
    ``processors`` (the penalties, logit bias and coupling given); checked, with a line saying
    what they are and where they come from."""
    d = sampling_defaults(target)
    given = {"temperature": temp, "top_p": top_p, "top_k": top_k, "min_p": min_p}
    chosen = {n: getattr(d.params, n) if v is None else v for n, v in given.items()}
    params = replace(processors or SamplingParams(), **chosen)
    set_ = [v is not None for v in given.values()]
    where = ("as given" if all(set_) else f"the model's recommended: {d.source}" if not any(set_)
             else f"the rest the model's recommended: {d.source}")
    return params, f"Sampling {params.label} ({where})."
