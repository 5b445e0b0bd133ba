"""The baseline benchmark: mlxspec's target-only decoder against mlx-lm's, and both against the
memory-bandwidth floor; with torch columns, the same engine on PyTorch beside them.

Both implementations run the same weights (``export.to_mlx_lm`` copies ours into mlx-lm's
llama class; a target only mlx-lm implements is its own class already), the same chat-templated
prompt ids, greedy, and exactly ``max_tokens`` tokens each (end-of-sequence ignored), timed the
same way from outside the generator: prefill = time from the call to the first token; decode =
time from the first token to the last, decode tokens/s = (tokens - 1) / decode. Each repeat runs
every prompt through every column, the order reversed pair by pair to cancel drift
(``core.schedule``). The floor is the time one decoded token needs just to stream its weights
through memory at the copy bandwidth MLX reaches on this machine.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import mlx.core as mx
import mlx_lm

from mlxspec.core.events import Step
from mlxspec.core.schedule import alternated, timed_rounds, warmup_rounds
from mlxspec.cpuload import CpuMeter
from mlxspec.errors import MlxspecError
from mlxspec.measure.bench.common import IMPLEMENTATIONS, Progress, label, ratio
from mlxspec.measure.bench.torch_columns import TorchInfo, load_torch_columns, torch_info
from mlxspec.core.runs import Run
from mlxspec.measure.runs import (
    QUESTIONS_FILE, SCHEMA, RunHeader, data_dir, encode_prompts, fallback_prompts, jsonl_rows, prepared_prompts, progress_ticker, run_header, timed_tokens,
)
from mlxspec.measure.verdict import Kind, Verdict, median_ratio
from mlxspec.session import Session
from mlxspec.targets import export, loading
from mlxspec.torchpath import require_torch

# The first question of three different Spec-Bench categories (chat-style writing, code,
# GSM8K maths), all short single-turn prompts. question_id -> category, first turn used.
DEFAULT_QUESTIONS: dict[int, str] = {81: "writing", 121: "coding", 401: "math_reasoning"}
BANDWIDTH_BYTES = 256 * 1024 * 1024  # copied when measuring bandwidth, far above any cache
TorchModels = dict[str, tuple[Any, int]]  # column key -> (the model on torch, its thread count)


@dataclass(frozen=True)
class BaselineOptions:
    """What ``bench --baseline`` was asked for. ``prompts`` None: ``DEFAULT_QUESTIONS``;
    ``torch_dtypes``: one torch column per dtype (none: no torch); ``torch_threads``:
    ``torch.set_num_threads`` settings (empty: the torch target's own, following the load), one
    column per dtype and setting."""

    model: str = "default"
    dtype: str = "auto"
    prompts: list[str] | None = None
    max_tokens: int = 64
    warmup: int = 1
    repeats: int = 3
    torch_dtypes: Sequence[str] = ()
    torch_device: str = "cpu"
    torch_threads: Sequence[int] = ()

    def checked(self) -> BaselineOptions:
        if self.max_tokens < 2:
            raise MlxspecError(f"max_tokens must be >= 2 to time decoding, got {self.max_tokens}")
        if self.repeats < 1 or self.warmup < 0:
            raise MlxspecError("repeats must be >= 1 and warmup >= 0")
        return self


@dataclass(frozen=True)
class ImplStats:
    """Decode and prefill speed of one implementation over its runs."""

    decode_tps_median: float
    decode_tps_min: float
    decode_tps_max: float
    prefill_tps_median: float
    ms_per_token: float
    floor_ratio: float
    tokens_per_run: list[int]
    runs: int
    decode_tps_all: list[float]


def impl_stats(runs: list[Run], floor_ms: float) -> ImplStats:
    dec = [r.decode_tps or 0.0 for r in runs]
    med = statistics.median(dec)
    ms = 1e3 / med if med > 0 else math.inf
    return ImplStats(med, min(dec), max(dec), statistics.median([r.prefill_tps for r in runs]), ms,
                     ms / floor_ms if floor_ms > 0 else math.inf, sorted({r.generated_tokens for r in runs}),
                     len(runs), dec)


@dataclass(frozen=True)
class Goals:
    mlxspec_at_least_mlx_lm: bool
    mlxspec_within_1_5x_floor: bool


@dataclass(frozen=True)
class BaselineSettings:
    max_tokens: int
    warmup: int
    repeats: int
    prompts: list[dict[str, Any]]


@dataclass(frozen=True)
class BaselineResult:
    """``baseline_bench``'s result. ``ratio`` = mlxspec median decode tps / mlx-lm's;
    ``verdict``: the paired comparison of decode tokens/s, run pair by run pair; ``torch``: the
    torch columns (None when none ran; their ``ImplStats`` are in ``implementations`` under
    ``torch_<name>`` (``TorchInfo``), each ``floor_ratio`` against the floor of its own weight
    bytes: half precision reads half as many)."""

    header: RunHeader
    settings: BaselineSettings
    implementations: dict[str, ImplStats]
    ratio: float
    bandwidth_gbs: float
    weight_bytes_per_token: int
    floor_ms_per_token: float
    same_tokens: float | None
    goals: Goals
    verdict: Verdict
    torch: TorchInfo | None = None

    @property
    def floor_ratio(self) -> dict[str, float]:
        return {k: v.floor_ratio for k, v in self.implementations.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, **self.header.to_json(), "settings": asdict(self.settings),
            "implementations": {k: asdict(v) for k, v in self.implementations.items()},
            "ratio": self.ratio, "bandwidth_gbs": self.bandwidth_gbs,
            "weight_bytes_per_token": self.weight_bytes_per_token, "floor_ms_per_token": self.floor_ms_per_token,
            "floor_ratio": self.floor_ratio, "same_tokens": self.same_tokens, "goals": asdict(self.goals),
            "verdict": self.verdict.to_json(), "torch": None if self.torch is None else self.torch.to_json(),
        }


def default_prompts() -> list[dict[str, Any]]:
    """[{id, category, text}] for ``DEFAULT_QUESTIONS``, or the built-in fallback prompts."""
    path = data_dir() / QUESTIONS_FILE
    found: dict[int, dict[str, Any]] = {}
    if path.is_file():
        for row in jsonl_rows(path):
            qid = row.get("question_id")
            if qid in DEFAULT_QUESTIONS and row.get("turns"):
                found[qid] = {"id": qid, "category": row.get("category", DEFAULT_QUESTIONS[qid]),
                              "text": row["turns"][0]}
    if len(found) == len(DEFAULT_QUESTIONS):
        return [found[q] for q in DEFAULT_QUESTIONS]
    return [{k: v for k, v in it.items() if k != "source_category"} for it in fallback_prompts()]


def measure_bandwidth(nbytes: int = BANDWIDTH_BYTES, runs: int = 9, warmup: int = 2) -> float:
    """Copy bandwidth MLX reaches on the default device, GB/s (1e9 bytes/s).

    ``a + 1`` over a float32 array of ``nbytes`` reads and writes every byte once (2x bytes
    counted); median of ``runs`` after ``warmup``. The allocator's cache limit is raised for the
    duration: MLX on Linux CPU keeps only 32 MB of freed buffers by default, so each 256 MB
    result would be a fresh mapping (65536 page faults a run) and the number would measure the
    kernel zeroing pages (about 4 GB/s here) instead of memory (about 30 GB/s).
    """
    n = max(1, nbytes // 4)
    old_limit = mx.set_cache_limit(max(mx.get_cache_memory() + 4 * n * 4, 1 << 30))
    try:
        a = mx.arange(n, dtype=mx.float32)
        mx.eval(a)
        times = []
        for i in range(warmup + runs):
            t0 = time.perf_counter()
            b = a + 1.0
            mx.eval(b)
            dt = time.perf_counter() - t0
            del b
            if i >= warmup:
                times.append(dt)
        del a
    finally:
        mx.set_cache_limit(old_limit)
        mx.clear_cache()
    return 2 * n * 4 / statistics.median(times) / 1e9


def _mlxspec_tokens(lm, ids: list[int], max_tokens: int) -> Iterator[int]:
    for ev in Session(lm, log=None).stream(ids, max_tokens=max_tokens, stop_ids=set()):
        if isinstance(ev, Step):
            yield from ev.emitted


def _mlx_lm_tokens(ref_model, tokenizer, ids: list[int], max_tokens: int) -> Iterator[int]:
    for r in mlx_lm.stream_generate(ref_model, tokenizer, ids, max_tokens=max_tokens):
        yield r.token


def _no_eos(tokenizer):
    """A shallow copy of mlx-lm's TokenizerWrapper that never stops: stream_generate breaks
    when ``token in tokenizer.eos_token_ids``."""
    tok = copy.copy(tokenizer)
    tok.eos_token_ids = []
    return tok


def _baseline_items(prompts: list[str] | None) -> list[dict[str, Any]]:
    if prompts is None:
        return default_prompts()
    if not prompts:
        raise MlxspecError("no prompts to benchmark")
    return [{"id": f"custom-{i + 1}", "category": "custom", "text": t} for i, t in enumerate(prompts)]


def _baseline_runner(lm, max_tokens: int, torch_models: TorchModels | None = None) -> Callable[[str, list[int]], Run]:
    """Runs one implementation on one prompt, exactly ``max_tokens`` tokens, timed from outside.
    ``torch_models``: column key -> (the ``LoadedModel`` on torch it runs, its thread count,
    set before the run starts)."""
    ref_model = export.as_mlx_lm(lm.model)
    mx.eval(ref_model.parameters())
    ref_tok = _no_eos(lm.tokenizer)
    torch_models = torch_models or {}

    def run(impl: str, p: list[int]) -> Run:
        if impl in torch_models:
            tlm, threads = torch_models[impl]
            torch = require_torch()
            if threads and torch.get_num_threads() != threads:  # 0: the target's governor decides
                torch.set_num_threads(threads)
            tokens = _mlxspec_tokens(tlm, p, max_tokens)
        elif impl == "mlxspec":
            tokens = _mlxspec_tokens(lm, p, max_tokens)
        else:
            tokens = _mlx_lm_tokens(ref_model, ref_tok, p, max_tokens)
        got = timed_tokens(tokens, len(p))
        if got.generated_tokens != max_tokens:
            raise MlxspecError(f"{label(impl)} produced {got.generated_tokens} tokens, expected {max_tokens}")
        return got

    return run


def time_pairs(run: Callable[[str, list[int]], Run], columns: Sequence[str], items: list[dict[str, Any]],
               ids: list[list[int]], options: BaselineOptions, progress: Progress) -> list[dict[str, Run]]:
    """``options.warmup`` untimed rounds on the first prompt, then every (repeat, prompt) pair
    through every column, back to back, the order reversed every other pair (so each column's
    mean position in the pair is the same)."""
    columns = tuple(columns)
    for order in warmup_rounds(columns, options.warmup):
        for impl in order:
            run(impl, ids[0])
    tick = progress_ticker(progress, options.repeats * len(items) * len(columns))
    rounds = [(r, it, p) for r in range(options.repeats) for it, p in zip(items, ids)]
    pairs: list[dict[str, Run]] = []
    for (r, it, p), order in timed_rounds(columns, rounds, turn=alternated):
        got: dict[str, Run] = {}
        for impl in order:
            got[impl] = run(impl, p)
            tick(f"{label(impl)} · {it['category']} #{it['id']} · repeat {r + 1}/{options.repeats}")
        pairs.append(got)
    return pairs


def baseline_verdict(pairs: list[dict[str, Run]]) -> Verdict:
    """mlxspec against mlx-lm on decode tokens/s: median of the paired ratios, with its interval."""
    c = median_ratio([ratio(p["mlxspec"].decode_tps, p["mlx_lm"].decode_tps) for p in pairs])
    if c.ratio is None:
        return Verdict(Kind.EMPTY, "no timed runs")
    words = {Kind.FASTER: "mlxspec decodes faster than mlx-lm", Kind.SLOWER: "mlxspec decodes slower than mlx-lm",
             Kind.SAME: "no measurable difference in decode speed between mlxspec and mlx-lm"}[c.kind]
    return Verdict(c.kind, f"{words}: {c.ratio:.2f}x median per pair ({c.describe()})", c.interval)


def _torch_models(options: BaselineOptions) -> tuple[TorchModels, int | None]:
    """The torch columns' models, and torch's thread count before (None: no torch columns)."""
    if not options.torch_dtypes:
        return {}, None
    before = require_torch().get_num_threads()
    # none asked for: as a user gets it, the torch target's own governor (``torchpath.threads``) decides
    if options.torch_threads and min(options.torch_threads) < 1:
        raise MlxspecError(f"torch threads must be >= 1, got {min(options.torch_threads)}")
    settings = list(dict.fromkeys(options.torch_threads)) or [0]
    return load_torch_columns(options.model, options.torch_dtypes, options.torch_device, settings), before


def _floor_ms(weight_bytes: int, bandwidth_gbs: float) -> float:
    return weight_bytes / (bandwidth_gbs * 1e9) * 1e3 if bandwidth_gbs > 0 else 0.0


def _result(lm, options: BaselineOptions, items: list[dict[str, Any]], ids: list[list[int]],
            pairs: list[dict[str, Run]], torch_models: TorchModels, bandwidth: float) -> BaselineResult:
    """The columns' statistics, the floor, the goals and the verdicts from the timed pairs."""
    weight_bytes = int(lm.weight_bytes_per_token())
    floor_ms = _floor_ms(weight_bytes, bandwidth)
    impls = {impl: impl_stats([p[impl] for p in pairs], floor_ms) for impl in IMPLEMENTATIONS}
    for key, (tlm, _) in torch_models.items():
        impls[key] = impl_stats([p[key] for p in pairs], _floor_ms(int(tlm.weight_bytes_per_token()), bandwidth))
    a, b = impls["mlxspec"].decode_tps_median, impls["mlx_lm"].decode_tps_median
    speed = a / b if b > 0 else math.inf
    same = [p["mlxspec"].tokens == p["mlx_lm"].tokens for p in pairs]
    return BaselineResult(
        header=run_header(lm),
        settings=BaselineSettings(options.max_tokens, options.warmup, options.repeats, prepared_prompts(items, ids)),
        implementations=impls, ratio=speed, bandwidth_gbs=bandwidth, weight_bytes_per_token=weight_bytes,
        floor_ms_per_token=floor_ms, same_tokens=sum(same) / len(same) if same else None,
        goals=Goals(speed >= 1.0, impls["mlxspec"].floor_ratio <= 1.5), verdict=baseline_verdict(pairs),
        torch=torch_info(torch_models, pairs, len(items)) if torch_models else None,
    )


def baseline_bench(options: BaselineOptions, progress: Progress = None) -> BaselineResult:
    """Decode/prefill tokens/s of mlxspec's ``generate_plain`` and mlx-lm's ``stream_generate``
    on the same weights, side by side, plus the memory-bandwidth floor; with torch dtypes, also
    mlxspec on PyTorch, one column per dtype (and thread setting), in the same pairs.

    JSON (``to_json``): schema, the run header, settings, implementations{mlxspec, mlx_lm,
    torch_NAME: ``ImplStats``}, ratio, bandwidth_gbs, weight_bytes_per_token,
    floor_ms_per_token, floor_ratio, same_tokens, goals, verdict, torch (``TorchInfo`` or null).
    """
    options = options.checked()
    meter = CpuMeter()
    items = _baseline_items(options.prompts)
    bandwidth = measure_bandwidth()
    lm = loading.load(options.model, options.dtype)
    ids = encode_prompts(lm, items, options.max_tokens)
    torch_models, threads_before = _torch_models(options)
    run = _baseline_runner(lm, options.max_tokens, torch_models)
    try:
        pairs = time_pairs(run, (*IMPLEMENTATIONS, *torch_models), items, ids, options, progress)
    finally:
        if threads_before is not None:
            require_torch().set_num_threads(threads_before)
    result = _result(lm, options, items, ids, pairs, torch_models, bandwidth)
    return replace(result, header=replace(result.header, others_busy=meter.others_busy()))
