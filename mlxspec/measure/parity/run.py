"""``run_parity(ParityOptions(...))``: the MLX and the PyTorch backends on the same held-out
prompts (Spec-Bench, which draft training never sees), four checks in turn (logits, greedy
tokens, sampling decisions, speed), and the goals they meet or miss, as a ``ParityResult``.
Both backends hold the same weights: the torch model is copied from the float32 MLX model the
loader read (``LoadedModel.source``), the reference every difference is taken against."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from mlxspec.core.drafters import parse_k
from mlxspec.errors import MlxspecError
from mlxspec.measure.parity.decisions import decision_agreement
from mlxspec.measure.parity.greedy import drafter_pairs, greedy_agreement, ks_of
from mlxspec.measure.parity.logits import layer_diffs
from mlxspec.measure.parity.records import (
    DECISION_DRAWS,
    DECISION_Q_TEMP,
    DEFAULT_KS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_PROMPTS,
    QUICK,
    SELF_LAYERS,
    SPEED_REPEATS,
    TOLERANCE,
    Goals,
    ParityResult,
    Settings,
    TorchInfo,
)
from mlxspec.measure.parity.speed import speed
from mlxspec.measure.runs import encode_prompts, prepared_prompts, progress_ticker, run_header, spec_bench_prompts
from mlxspec.targets import loading, store
from mlxspec.torchpath import pick_device, require_torch

Progress = Callable[[int, int, str], Any] | None


@dataclass(frozen=True)
class ParityOptions:
    """What a parity run is asked for. ``model``: a spec, loaded on torch ``device`` (None: the
    best here) in ``dtype`` ("auto": float32 on CPU, half on accelerators), or a torch
    ``LoadedModel``; ``prompts``: a count of held-out prompts, or items {id, category, text};
    ``drafters``: None for ``default_drafters``; ``threads``: ``torch.set_num_threads`` for the
    run (None: torch's own; MLX's CPU matmuls take OpenBLAS's, OPENBLAS_NUM_THREADS)."""

    model: Any = "default"
    device: str | None = None
    dtype: str = "auto"
    prompts: int | Sequence[dict[str, Any]] = DEFAULT_PROMPTS
    drafters: Sequence[str] | None = None
    ks: Sequence[int] = DEFAULT_KS
    max_tokens: int = DEFAULT_MAX_TOKENS
    draws: int = DECISION_DRAWS
    repeats: int = SPEED_REPEATS
    seed: int = 0
    with_speed: bool = True
    threads: int | None = None

    def checked(self, quick: bool = False) -> ParityOptions:
        """The command's options: ``--quick``'s CI-sized run in place of the counts, then checked."""
        o = self
        if quick:
            o = replace(o, prompts=QUICK["prompts"], ks=list(QUICK["ks"]), max_tokens=QUICK["max_tokens"],
                        draws=QUICK["draws"], repeats=QUICK["repeats"])
        if o.prompts < 1 or o.max_tokens < 1 or o.draws < 1 or (o.threads or 0) < 0:
            raise MlxspecError("--prompts, --max-tokens and --draws must be >= 1, --torch-threads >= 0")
        return o


def parse_drafters(text: str | None) -> list[str] | None:
    """``--draft`` as a list of drafter specs (comma-separated); None when not given."""
    drafts = None if text is None else [d.strip() for d in text.split(",")]
    if drafts is not None and not all(drafts):
        raise MlxspecError(f"bad --draft {text!r}: expected drafters separated by commas, e.g. none,ngram:3,self:8")
    return drafts


def parity_prompts(n: int) -> tuple[list[dict[str, Any]], str | None]:
    """The first ``n`` held-out prompts, one per Spec-Bench category in turn (the first of each
    category, then the second, ...), so any prefix is varied; and a note when the built-in
    fallback prompts stand in for Spec-Bench."""
    if n < 1:
        raise MlxspecError(f"--prompts must be >= 1, got {n}")
    items, note = spec_bench_prompts(None, per_category=-(-n // 6))
    by_cat: dict[str, list[dict[str, Any]]] = {}
    for it in items:
        by_cat.setdefault(it["category"], []).append(it)
    lists = list(by_cat.values())
    out = [v[i] for i in range(max(map(len, lists))) for v in lists if i < len(v)]
    return out[:n], note


def default_drafters(lm) -> list[str]:
    """none, ngram:3, self:8 (when the target has more layers) and every draft the registry
    ships for the target (for the default model: its trained draft and its eagle head), else
    its registry default draft."""
    out = ["none", "ngram:3"]
    if lm.config.num_layers > SELF_LAYERS:
        out.append(f"self:{SELF_LAYERS}")
    shipped = [d["name"] for d in store.drafts() if d["target"] == lm.name and d["present"]]
    default = store.default_draft(lm.name)
    for d in shipped or ([default] if default else []):
        if d not in out:
            out.append(d)
    return out


def load_pair(model_spec: Any, device: str | None, dtype: str):
    """(MLX reference, torch model): the torch LoadedModel and the float32 MLX model its weights
    were copied from. ``model_spec``: a spec, or a torch ``LoadedModel`` already loaded."""
    require_torch()
    if getattr(model_spec, "backend", "mlx") != "mlx" and getattr(model_spec, "source", None) is not None:
        return model_spec.source, model_spec
    if not isinstance(model_spec, str):
        raise MlxspecError("parity needs the torch model (load with backend='torch:DEVICE') or a model spec")
    device = pick_device(device)
    if dtype == "auto" and device == "cpu":
        dtype = "float32"  # the twin of the MLX reference; the CPU default (quantized) is another target
    tl = loading.load(model_spec, dtype, backend=f"torch:{device}")
    return tl.source, tl


@contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    """``torch.set_num_threads(n)`` for the block (nothing for None)."""
    import torch

    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_parity(options: ParityOptions, progress: Progress = None) -> ParityResult:
    """MLX vs torch on the options' prompts: layer diffs, greedy agreement for target-only and
    every drafter at every K, decision agreement under shared uniforms (K = the largest of
    ``ks``), and tokens/s of each backend (``with_speed``)."""
    o = options
    ks = sorted({parse_k(int(k)) for k in o.ks})
    if not ks:
        raise MlxspecError("parity needs at least one K")
    if o.max_tokens < 1 or o.draws < 1 or o.repeats < 1:
        raise MlxspecError("--max-tokens, draws and repeats must be >= 1")
    items, note = parity_prompts(o.prompts) if isinstance(o.prompts, int) else (list(o.prompts), None)
    if o.threads is not None and o.threads < 1:
        raise MlxspecError(f"torch threads must be >= 1, got {o.threads}")
    lm, tl = load_pair(o.model, o.device, o.dtype)
    with _torch_threads(o.threads):
        return _measure(lm, tl, replace(o, ks=ks, prompts=items), note, progress)


def _measure(lm, tl, o: ParityOptions, note: str | None, progress: Progress) -> ParityResult:
    """The four checks on the loaded pair, ``o.prompts`` the items and ``o.ks`` sorted."""
    import torch

    tol = TOLERANCE[tl.dtype]
    drafters = list(dict.fromkeys(default_drafters(lm) if o.drafters is None else o.drafters))
    pairs = drafter_pairs(lm, tl, drafters)
    ids = encode_prompts(lm, o.prompts, o.max_tokens)
    keys = [f"{it['category']} #{it['id']}" for it in o.prompts]
    methods = sum(len(ks_of(d, o.ks)) for d in drafters)
    tick = progress_ticker(progress, len(ids) * (2 + 2 * methods) + (2 + 2 * o.repeats) * o.with_speed)

    layers = layer_diffs(lm, tl, ids, tick, keys)
    greedy = greedy_agreement(lm, tl, list(zip(keys, ids)), pairs, o.ks, o.max_tokens, tol, tick)
    decisions = decision_agreement(lm, tl, list(zip(keys, ids)), max(o.ks), o.draws, o.seed, tick=tick)
    timing = speed(lm, tl, ids[0], keys[0], o.max_tokens, o.repeats, tick) if o.with_speed else None

    logits_max = max(d.max_rel for d in layers[-2:])
    goals = Goals(tol, logits_max, logits_max <= tol, all(r.mismatches == 0 for r in greedy),
                  all(d.unexplained == 0 for d in decisions))
    return ParityResult(
        header=run_header(lm),
        torch=TorchInfo(torch.__version__, tl.backend.partition(":")[2], tl.dtype, torch.get_num_threads()),
        settings=Settings(prepared_prompts(o.prompts, ids), drafters, list(o.ks), o.max_tokens, o.draws,
                          DECISION_Q_TEMP, o.repeats, o.seed, note),
        layers=layers, greedy=greedy, decisions=decisions, speed=timing, goals=goals,
    )
