"""Benchmarks. Two of them:

* ``baseline_bench``: mlxspec's target-only decoder against mlx-lm's, and both against the
  memory-bandwidth floor (below);
* ``spec_bench``: speculative against target-only decoding on a balanced Spec-Bench subset, with
  acceptance statistics, and mlx-lm's own speculative decoding as a peer (see its docstring).

The baseline benchmark: mlxspec's target-only decoder against mlx-lm's, and both against the
memory-bandwidth floor.

Both implementations run the same weights (``loading.to_mlx_lm`` copies ours into mlx-lm's
llama class; a target only mlx-lm implements is its own class already), the same chat-templated prompt ids, greedy, and exactly ``max_tokens`` tokens
each (end-of-sequence ignored), timed the same way from outside the generator:

* prefill = time from the call to the first token; prefill tokens/s = prompt tokens / prefill;
* decode = time from the first token to the last; decode tokens/s = (tokens - 1) / decode.

Each repeat runs every prompt through both, the order alternating pair by pair to cancel drift.
The floor is the time one decoded token needs just to stream its weights through memory at the
copy bandwidth MLX reaches on this machine.

With ``torch_dtypes`` the same engine also runs on PyTorch (``torchpath``: the same weights,
copied), one column per dtype (and per ``torch_threads`` setting, if several) on
``torch_device``, timed the same way and interleaved with the MLX columns in every pair; each
gets a paired verdict against mlxspec on MLX and the position where its greedy tokens first
leave MLX's (``TorchColumn``): a half-precision dtype is "exact enough" only if it never does
for the tokens measured.

Results are records (``BaselineResult``, ``SpecBenchResult``) whose ``to_json()`` is the
result JSON (schema 2, see ``runs``). Verdicts rest on paired comparisons (``verdict``).
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxspec.errors import MlxspecError
from mlxspec.session import Session
from mlxspec.measure.runs import (
    QUESTIONS_FILE,
    SCHEMA,
    WARMUP_TOKENS,
    MethodStats,
    Run,
    RunHeader,
    data_dir,
    encode_prompts,
    engine_run,
    fallback_prompts,
    first_mismatch,
    fmt,
    fmt_list,
    jsonl_rows,
    method_stats,
    prepare_speculative_run,
    prepared_prompts,
    progress_ticker,
    run_header,
    spec_bench_prompts,
    timed_tokens,
)
from mlxspec.measure.verdict import (
    Comparison,
    Kind,
    Verdict,
    markup,
    median_ratio,
    pooled_ratio,
)

Progress = Callable[[int, int, str], Any] | None

# The first question of three different Spec-Bench categories (chat-style writing, code,
# GSM8K maths), all short single-turn prompts. question_id -> category, first turn used.
DEFAULT_QUESTIONS: dict[int, str] = {81: "writing", 121: "coding", 401: "math_reasoning"}

BANDWIDTH_BYTES = 256 * 1024 * 1024  # copied when measuring bandwidth, far above any cache
IMPLEMENTATIONS = ("mlxspec", "mlx_lm")
LABELS = {"mlxspec": "mlxspec generate_plain", "mlx_lm": "mlx-lm stream_generate"}
TORCH_DTYPES = ("float32", "bfloat16", "float16")  # torchpath.model.DTYPES, named without importing torch
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


# ----------------------------------------------------------------------------- small helpers


def fmt_t(t: float) -> str:
    return f"T={t:g}"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


# ----------------------------------------------------------------------------- prompts


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


# ----------------------------------------------------------------------------- bandwidth


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


# ============================================================================= baseline bench


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
class TorchColumn:
    """One torch column against mlxspec on MLX. ``ratio`` = its median decode tps / mlxspec's;
    ``verdict``: the paired comparison, run pair by run pair; ``first_divergence``: per prompt,
    the first position where its greedy tokens left mlxspec's (the earliest over the repeats;
    None: identical for all ``max_tokens``)."""

    dtype: str
    threads: int  # torch.get_num_threads() while it ran
    ratio: float
    verdict: Verdict
    first_divergence: list[int | None]
    weight_bytes_per_token: int

    @property
    def agrees(self) -> bool:
        """Exact enough: the same greedy tokens as MLX for every prompt and token measured."""
        return all(d is None for d in self.first_divergence)

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "threads": self.threads, "ratio": self.ratio, "verdict": self.verdict.to_json(),
                "first_divergence": self.first_divergence, "agrees": self.agrees,
                "weight_bytes_per_token": self.weight_bytes_per_token}


@dataclass(frozen=True)
class TorchInfo:
    """The torch side of a baseline run: where it ran, the thread settings it compared (one:
    torch's own or the one asked for) and its ``TorchColumn``s, keyed as ``implementations``
    without the "torch_" ("float32", or "float32_1t" when several thread settings ran)."""

    version: str
    device: str
    threads: list[int]
    description: str
    columns: dict[str, TorchColumn]

    @property
    def fastest_exact(self) -> str | None:
        """The column with the highest median decode speed among those that agree with MLX."""
        ok = [k for k, c in self.columns.items() if c.agrees]
        return max(ok, key=lambda k: self.columns[k].ratio) if ok else None

    @property
    def fastest_exact_dtype(self) -> str | None:
        best = self.fastest_exact
        return None if best is None else self.columns[best].dtype

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "device": self.device, "threads": self.threads,
                "description": self.description, "columns": {k: c.to_json() for k, c in self.columns.items()},
                "fastest_exact": self.fastest_exact, "fastest_exact_dtype": self.fastest_exact_dtype}


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


def _mlxspec_tokens(lm, ids: list[int], max_tokens: int) -> Iterator[int]:
    from mlxspec.core.events import Step

    for ev in Session(lm, log=None).stream(ids, max_tokens=max_tokens, stop_ids=set()):
        if isinstance(ev, Step):
            yield from ev.emitted


def _mlx_lm_tokens(ref_model, tokenizer, ids: list[int], max_tokens: int) -> Iterator[int]:
    import mlx_lm

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


def _baseline_runner(lm, max_tokens: int, torch_models: dict[str, tuple[Any, int]] | None = None
                     ) -> Callable[[str, list[int]], Run]:
    """Runs one implementation on one prompt, exactly ``max_tokens`` tokens, timed from outside.
    ``torch_models``: column key -> (the ``LoadedModel`` on torch it runs, its thread count,
    set before the run starts)."""
    from mlxspec.targets.loading import as_mlx_lm

    ref_model = as_mlx_lm(lm.model)
    mx.eval(ref_model.parameters())
    ref_tok = _no_eos(lm.tokenizer)
    torch_models = torch_models or {}

    def run(impl: str, p: list[int]) -> Run:
        if impl in torch_models:
            import torch

            tlm, threads = torch_models[impl]
            if torch.get_num_threads() != threads:
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


def _time_baseline_pairs(run: Callable[[str, list[int]], Run], items: list[dict[str, Any]], ids: list[list[int]],
                         repeats: int, progress: Progress,
                         impls: Sequence[str] = IMPLEMENTATIONS) -> list[dict[str, Run]]:
    """Every (repeat, prompt) pair through every implementation, back to back, the order
    reversed every other pair (so each column's mean position in the pair is the same)."""
    impls = tuple(impls)
    pairs: list[dict[str, Run]] = []
    total = repeats * len(items) * len(impls)
    for r in range(repeats):
        for it, p in zip(items, ids):
            order = impls if len(pairs) % 2 == 0 else impls[::-1]
            got: dict[str, Run] = {}
            for impl in order:
                got[impl] = run(impl, p)
                if progress is not None:
                    done = len(pairs) * len(impls) + len(got)
                    progress(done, total, f"{label(impl)} · {it['category']} #{it['id']} · repeat {r + 1}/{repeats}")
            pairs.append(got)
    return pairs


def baseline_verdict(pairs: list[dict[str, Run]]) -> Verdict:
    """mlxspec against mlx-lm on decode tokens/s: median of the paired ratios, with its interval."""
    c = median_ratio([_ratio(p["mlxspec"].decode_tps, p["mlx_lm"].decode_tps) for p in pairs])
    if c.ratio is None:
        return Verdict(Kind.EMPTY, "no timed runs")
    words = {Kind.FASTER: "mlxspec decodes faster than mlx-lm", Kind.SLOWER: "mlxspec decodes slower than mlx-lm",
             Kind.SAME: "no measurable difference in decode speed between mlxspec and mlx-lm"}[c.kind]
    return Verdict(c.kind, f"{words}: {c.ratio:.2f}x median per pair ({c.describe()})", c.interval)


def torch_verdict(pairs: list[dict[str, Run]], key: str) -> Verdict:
    """A torch column against mlxspec on MLX on decode tokens/s, as ``baseline_verdict``."""
    c = median_ratio([_ratio(p[key].decode_tps, p["mlxspec"].decode_tps) for p in pairs])
    if c.ratio is None:
        return Verdict(Kind.EMPTY, "no timed runs")
    name = label(key)
    words = {Kind.FASTER: f"{name} decodes faster than mlxspec on MLX",
             Kind.SLOWER: f"{name} decodes slower than mlxspec on MLX",
             Kind.SAME: f"no measurable difference in decode speed between {name} and mlxspec on MLX"}[c.kind]
    return Verdict(c.kind, f"{words}: {c.ratio:.2f}x median per pair ({c.describe()})", c.interval)


def first_divergence(pairs: list[dict[str, Run]], key: str, n_prompts: int) -> list[int | None]:
    """Per prompt (pairs run prompt by prompt, repeat after repeat), the earliest position where
    ``key``'s greedy tokens differ from mlxspec's over the repeats; None if they never do."""
    out: list[int | None] = [None] * n_prompts
    for i, p in enumerate(pairs):
        d = first_mismatch(p[key].tokens, p["mlxspec"].tokens)
        j = i % n_prompts
        if d is not None and (out[j] is None or d < out[j]):
            out[j] = d
    return out


def torch_columns(enabled: bool | None, dtypes: Sequence[str] | None = None,
                  device: str = "cpu") -> tuple[tuple[str, ...], str | None]:
    """The torch dtypes a baseline run adds, and a note to print (or None).

    ``enabled`` None: on iff torch is importable (a note says so when it is not); True without
    torch: the install error. The columns are float32 and then ``dtypes`` (default: the
    device's default dtype, ``torchpath.default_dtype``; "auto" means it too)."""
    import importlib.util

    from mlxspec.torchpath import INSTALL_HINT, default_dtype, pick_device

    if enabled is False:
        return (), None
    if importlib.util.find_spec("torch") is None:
        if enabled:
            raise MlxspecError(f"--torch needs PyTorch, which is not installed: {INSTALL_HINT}")
        return (), f"PyTorch is not installed: no torch columns ({INSTALL_HINT})"
    device = pick_device(device)
    wanted = [default_dtype(device) if d == "auto" else d for d in (dtypes or ["auto"])]
    bad = [d for d in wanted if d not in TORCH_DTYPES]
    if bad:
        raise MlxspecError(f"--torch-dtype {bad[0]}: choose auto, {', '.join(TORCH_DTYPES)}")
    return tuple(dict.fromkeys(["float32", *wanted])), None


def _load_torch_columns(model_spec: str, torch_dtypes: Sequence[str], device: str,
                        threads: Sequence[int]) -> dict[str, tuple[Any, int]]:
    """Column key -> (the model on torch in that dtype, the same weights as the MLX model; its
    thread count), for every dtype x thread setting (one model per dtype)."""
    from mlxspec.targets import loading
    from mlxspec.torchpath import require_torch

    require_torch()
    several = len(threads) > 1
    out = {}
    for dt in dict.fromkeys(torch_dtypes):
        tlm = loading.load(model_spec, dt, backend=f"torch:{device}")
        out.update({torch_key(dt, n if several else None): (tlm, n) for n in threads})
    return out


def baseline_bench(
    model_spec: str = "default",
    dtype: str = "auto",
    prompts: list[str] | None = None,
    max_tokens: int = 64,
    warmup: int = 1,
    repeats: int = 3,
    progress: Progress = None,
    torch_dtypes: Sequence[str] = (),
    torch_device: str = "cpu",
    torch_threads: Sequence[int] = (),
) -> BaselineResult:
    """Decode/prefill tokens/s of mlxspec's ``generate_plain`` and mlx-lm's ``stream_generate``
    on the same weights, side by side, plus the memory-bandwidth floor; with ``torch_dtypes``,
    also mlxspec's ``generate_plain`` on PyTorch (``torch_device``), one column per dtype, in the
    same pairs. ``torch_threads``: ``torch.set_num_threads`` settings (empty: torch's own); with
    several, one column per dtype and setting, the setting switched before each run.

    JSON keys (``to_json``): schema, date, machine{platform, processor, cpu_count}, backend, blas,
    mlx_version, mlx_lm_version, model, dtype, settings{max_tokens, warmup, repeats, prompts[{id,
    category, source_category, prompt_tokens}]}, implementations{mlxspec, mlx_lm:
    {decode_tps_median, decode_tps_min, decode_tps_max, prefill_tps_median, ms_per_token,
    floor_ratio, ...}}, ratio (mlxspec median decode tps / mlx-lm's), bandwidth_gbs,
    weight_bytes_per_token, floor_ms_per_token, floor_ratio{mlxspec, mlx_lm}, same_tokens, goals,
    verdict, torch (null, or {version, device, threads[], description, columns{NAME: {dtype, threads,
    ratio (its median decode tps / mlxspec's), verdict, first_divergence[per prompt], agrees,
    weight_bytes_per_token}}, fastest_exact, fastest_exact_dtype}; each column's stats are
    implementations.torch_NAME; NAME: the dtype, or DTYPE_Nt when several thread settings ran).
    """
    from mlxspec.targets import loading

    if max_tokens < 2:
        raise MlxspecError(f"max_tokens must be >= 2 to time decoding, got {max_tokens}")
    if repeats < 1 or warmup < 0:
        raise MlxspecError("repeats must be >= 1 and warmup >= 0")
    items = _baseline_items(prompts)
    bandwidth = measure_bandwidth()
    lm = loading.load(model_spec, dtype)
    ids = encode_prompts(lm, items, max_tokens)
    torch_models: dict[str, tuple[Any, int]] = {}
    threads_before = None
    if torch_dtypes:
        from mlxspec.torchpath import require_torch

        threads_before = require_torch().get_num_threads()
        settings = list(dict.fromkeys(torch_threads)) or [threads_before]
        if min(settings) < 1:
            raise MlxspecError(f"torch threads must be >= 1, got {min(settings)}")
        torch_models = _load_torch_columns(model_spec, torch_dtypes, torch_device, settings)
    columns = (*IMPLEMENTATIONS, *torch_models)
    run = _baseline_runner(lm, max_tokens, torch_models)
    try:
        for _ in range(warmup):
            for impl in columns:
                run(impl, ids[0])
        pairs = _time_baseline_pairs(run, items, ids, repeats, progress, columns)
    finally:
        if threads_before is not None:
            import torch

            torch.set_num_threads(threads_before)
    torch_info = _torch_info(torch_models, pairs, len(items)) if torch_models else None

    weight_bytes = int(lm.weight_bytes_per_token())
    floor_ms = _floor_ms(weight_bytes, bandwidth)
    impls = {impl: impl_stats([p[impl] for p in pairs], floor_ms) for impl in IMPLEMENTATIONS}
    for key, (tlm, _) in torch_models.items():
        impls[key] = impl_stats([p[key] for p in pairs], _floor_ms(int(tlm.weight_bytes_per_token()), bandwidth))
    a, b = impls["mlxspec"].decode_tps_median, impls["mlx_lm"].decode_tps_median
    ratio = a / b if b > 0 else math.inf
    same = [p["mlxspec"].tokens == p["mlx_lm"].tokens for p in pairs]
    return BaselineResult(
        header=run_header(lm),
        settings=BaselineSettings(max_tokens, warmup, repeats, prepared_prompts(items, ids)),
        implementations=impls, ratio=ratio, bandwidth_gbs=bandwidth, weight_bytes_per_token=weight_bytes,
        floor_ms_per_token=floor_ms, same_tokens=sum(same) / len(same) if same else None,
        goals=Goals(ratio >= 1.0, impls["mlxspec"].floor_ratio <= 1.5), verdict=baseline_verdict(pairs),
        torch=torch_info,
    )


def _floor_ms(weight_bytes: int, bandwidth_gbs: float) -> float:
    return weight_bytes / (bandwidth_gbs * 1e9) * 1e3 if bandwidth_gbs > 0 else 0.0


def _torch_info(torch_models: dict[str, tuple[Any, int]], pairs: list[dict[str, Run]], n_prompts: int) -> TorchInfo:
    """The torch columns' comparisons with mlxspec on MLX."""
    import torch

    backend = next(iter(torch_models.values()))[0].backend
    device = backend.partition(":")[2]
    mlx_med = statistics.median([p["mlxspec"].decode_tps or 0.0 for p in pairs])
    columns = {}
    for key, (tlm, threads) in torch_models.items():
        med = statistics.median([p[key].decode_tps or 0.0 for p in pairs])
        columns[key[len(TORCH_PREFIX):]] = TorchColumn(
            tlm.dtype, threads, med / mlx_med if mlx_med > 0 else math.inf, torch_verdict(pairs, key),
            first_divergence(pairs, key, n_prompts), int(tlm.weight_bytes_per_token()))
    threads = sorted({c.threads for c in columns.values()}, reverse=True)
    where = (f"CPU ({'/'.join(map(str, threads))} thread{'' if threads == [1] else 's'})" if device == "cpu"
             else f"{device.upper()} ({torch.cuda.get_device_name()})" if device == "cuda" else device.upper())
    return TorchInfo(torch.__version__, device, threads, f"PyTorch {torch.__version__} on {where}", columns)


def _baseline_table(result: BaselineResult):
    from rich.table import Table

    s, h = result.settings, result.header
    prompts = ", ".join(f"{p['category']} #{p['id']} ({p['prompt_tokens']} tok)" for p in s.prompts)
    on_torch = f"; {result.torch.description}" if result.torch is not None else ""
    table = Table(
        title=f"Baseline decoding: {h.model} ({h.dtype}), {h.backend}{on_torch}",
        caption=(f"{s.max_tokens} tokens per run, {s.warmup} warm-up, {s.repeats} repeats x "
                 f"{len(s.prompts)} prompts: {prompts}"),
    )
    for col, just in (("implementation", "left"), ("decode tok/s (median)", "right"), ("min - max", "right"),
                      ("prefill tok/s", "right"), ("ms/token", "right"), ("x floor", "right"),
                      ("/ mlxspec", "right")):
        table.add_column(col, justify=just, no_wrap=col == "implementation")
    ref = result.implementations["mlxspec"].decode_tps_median
    for key, st in result.implementations.items():
        table.add_row(label(key), f"{st.decode_tps_median:.1f}",
                      f"{st.decode_tps_min:.1f} - {st.decode_tps_max:.1f}", f"{st.prefill_tps_median:.0f}",
                      f"{st.ms_per_token:.2f}", f"{st.floor_ratio:.2f}x", fmt(_ratio(st.decode_tps_median, ref), "{:.2f}x"))
    floor = result.floor_ms_per_token
    table.add_row("bandwidth floor", f"{1e3 / floor:.1f}" if floor > 0 else "-", "", "", f"{floor:.2f}", "1.00x", "",
                  style="dim")
    return table


def print_baseline(result: BaselineResult, console) -> None:
    """Render a ``baseline_bench`` result as a rich table plus a short summary."""
    console.print(_baseline_table(result))
    g = result.goals
    ok = lambda b: "[green]yes[/]" if b else "[red]no[/]"
    console.print(f"ratio mlxspec / mlx-lm (decode): [bold]{result.ratio:.3f}[/] "
                  f"(goal >= 1.0: {ok(g.mlxspec_at_least_mlx_lm)})")
    console.print(markup(result.verdict.kind, result.verdict.text), highlight=False)
    console.print(
        f"bandwidth {result.bandwidth_gbs:.1f} GB/s, {result.weight_bytes_per_token / 1e6:.1f} MB of weights "
        f"per token -> floor {result.floor_ms_per_token:.2f} ms/token; mlxspec at "
        f"{result.floor_ratio['mlxspec']:.2f}x the floor (goal <= 1.5x: {ok(g.mlxspec_within_1_5x_floor)})"
    )
    if result.same_tokens is not None and result.same_tokens < 1:
        console.print(f"[yellow]note:[/] identical greedy tokens in {result.same_tokens:.0%} of run pairs")
    if result.torch is not None:
        _print_torch(result, console)


def _print_torch(result: BaselineResult, console) -> None:
    """Per torch column: its verdict against mlxspec on MLX and whether its greedy tokens match."""
    t, s, ref = result.torch, result.settings, result.header.dtype
    seen: set[str] = set()
    for col in t.columns.values():
        console.print(markup(col.verdict.kind, col.verdict.text), highlight=False)
        if col.dtype in seen:  # the same weights at another thread count: the same tokens
            continue
        seen.add(col.dtype)
        if col.agrees:
            console.print(f"  torch {col.dtype}: the same greedy tokens as MLX ({ref}) for all "
                          f"{len(s.prompts)} prompts x {s.max_tokens} tokens", highlight=False)
        else:
            where = ", ".join(f"#{p['id']} at token {d}" for p, d in zip(s.prompts, col.first_divergence)
                              if d is not None)
            console.print(markup(Kind.NOTE, f"  torch {col.dtype}: greedy tokens leave MLX's ({ref}): "
                                            f"{where}; not exact enough"), highlight=False)
    best = t.fastest_exact
    console.print(f"fastest torch column with MLX's tokens: [bold]{label(TORCH_PREFIX + best) if best else 'none'}[/]"
                  + (f" ({t.columns[best].ratio:.2f}x mlxspec on MLX)" if best else ""))


# ============================================================================= speculative bench
#
# spec_bench: target-only vs speculative decoding, prompt by prompt, on a balanced Spec-Bench
# subset. Timing (for every method the same):
#   total_s   = prefill_s + decode_s, from the generator's first instruction to its last token;
#   tps       = generated tokens / total_s  -- END-TO-END, prefill included: the HEADLINE number;
#   decode_tps = (generated tokens - tokens of the first step) / decode_s -- decode only.
# For mlxspec both come from the engine's ``Done`` event (for speculation the first step's
# draft + verify count as prefill, the time to the first committed tokens). mlx-lm runs are timed
# from outside its generator the same way (prefill ends when the first step's last token arrives).

METHODS = ("target", "spec", "mlx_lm")
METHOD_LABELS = {"target": "target-only", "spec": "speculative", "mlx_lm": "mlx-lm speculative"}
NGRAM_NO_PEER = ("mlx-lm's speculative decoding needs a draft model; prompt lookup (ngram) "
                 "has no mlx-lm equivalent")
MLX_LM_NOTE = ("accepted tokens per step rebuilt from stream_generate's from_draft flags; at T > 0 "
               "mlx-lm accepts a draft only if the target's sampled token equals it")
EAGLE_PEER_LAYERS = 8  # mlx-lm's draft beside an eagle head: the target's first 8 layers
MLX_LM_K_WITH_AUTO = 4  # mlx-lm has no auto K: its peer drafts this many under --k auto


@dataclass(frozen=True)
class SpecRun:
    """One timed run of ``spec_bench``: the method, the prompt and repeat, what it produced,
    and (greedy only) whether it matched target-only decoding of the same prompt."""

    method: str
    run: Run
    temperature: float
    prompt_id: Any
    category: str
    repeat: int
    order: int
    identical_to_target: bool | None = None
    first_mismatch: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, **self.run.to_json(), "temperature": self.temperature,
                "prompt_id": self.prompt_id, "category": self.category, "repeat": self.repeat, "order": self.order,
                "identical_to_target": self.identical_to_target, "first_mismatch": self.first_mismatch}


# ----------------------------------------------------------------------------- mlx-lm's peer


def mlx_lm_steps(from_draft: list[bool], k: int, max_tokens: int) -> tuple[list[int], list[int]]:
    """Rebuild mlx-lm's speculative steps from the ``from_draft`` flags of its tokens.

    mlx-lm 0.2x/0.3x ``speculative_generate_step`` drafts ``min(max_tokens - emitted, k)`` tokens
    per step and yields the accepted ones (``from_draft=True``), then the target's own token
    (``False``) unless ``max_tokens`` was reached. So each step is a run of True flags closed
    by one False. Returns (accepted per step, drafted per step). A final step cut short by
    end-of-sequence is dropped: how many of its drafts the target would have kept is unknown.
    ``from_draft`` must include the end-of-sequence token when generation stopped on one.
    """
    accepted: list[int] = []
    drafted: list[int] = []
    i, emitted = 0, 0
    while i < len(from_draft) and emitted < max_tokens:
        num_draft = min(max_tokens - emitted, k)
        n = 0
        while n < num_draft and i + n < len(from_draft) and from_draft[i + n]:
            n += 1
        if i + n < len(from_draft) and not from_draft[i + n]:
            used = n + 1  # closed by the target's correction or bonus token
        elif n == num_draft and emitted + n == max_tokens:
            used = n  # everything accepted and the budget spent: no target token
        else:
            break  # cut short by end-of-sequence
        accepted.append(n)
        drafted.append(num_draft)
        i += used
        emitted += used
    return accepted, drafted


def mlx_lm_run(ref_target, ref_draft, tokenizer, ids: list[int], temperature: float, max_tokens: int,
               k: int, seed: int) -> Run:
    """mlx-lm's speculative ``stream_generate``, timed from outside as our engine times itself."""
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    mx.random.seed(seed)
    toks: list[int] = []
    flags: list[bool] = []
    stamps: list[float] = []
    finish = None
    t0 = time.perf_counter()
    for r in mlx_lm.stream_generate(ref_target, tokenizer, ids, max_tokens=max_tokens, draft_model=ref_draft,
                                    num_draft_tokens=k, sampler=make_sampler(temp=temperature)):
        stamps.append(time.perf_counter())
        toks.append(r.token)
        flags.append(bool(r.from_draft))
        finish = r.finish_reason
    accepted, drafted = mlx_lm_steps(flags, k, max_tokens)
    # stream_generate yields the end-of-sequence token last (finish_reason "stop"): not output.
    out = toks[:-1] if finish == "stop" else toks
    # The first step ends with the target's token, unless it used up max_tokens on drafts alone.
    first = accepted[0] + (accepted[0] < max_tokens) if accepted else len(stamps)
    first = max(1, min(first, len(stamps)))
    t_first = stamps[first - 1] if stamps else t0
    t_last = stamps[-1] if stamps else t0
    return Run(out, len(ids), t_first - t0, t_last - t_first, first, "eos" if finish == "stop" else "length",
               accepted, drafted, list(drafted))


@dataclass(frozen=True)
class Peer:
    """mlx-lm's own speculative decoding with the same pair, or why there is none."""

    target: Any = None
    draft: Any = None
    description: str | None = None
    reason: str | None = None


def _self_draft_llama(lm, num_layers: int):
    """The target's first ``num_layers`` layers + norm + head as a llama sharing its arrays."""
    import dataclasses

    from mlx.utils import tree_flatten

    from mlxspec.core.model import Llama
    from mlxspec.targets import loading

    small = Llama(dataclasses.replace(lm.config, num_layers=num_layers))
    params = [(name, v) for name, v in tree_flatten(lm.model.parameters())
              if not name.startswith("model.layers.") or int(name.split(".")[2]) < num_layers]
    if any(name.endswith(".scales") for name, _ in params):
        loading.quantize_to_match(small, dict(params))
    small.load_weights(params, strict=True)  # shares the arrays, copies nothing
    return small


def mlx_lm_peer(lm, draft: str, drafter) -> Peer:
    """mlx-lm's speculative decoding with the same pair, in mlx-lm's llama class sharing our arrays."""
    from mlxspec.core.drafters import ModelDrafter
    from mlxspec.core.drafters.eagle import EagleDrafter
    from mlxspec.targets.loading import as_mlx_lm
    from mlxspec.core.drafters.draft_model import DraftModel
    from mlxspec.targets.folders import as_llama

    if isinstance(drafter, EagleDrafter):
        # mlx-lm cannot run a head that reads the target's features; its best draft here is a
        # plain model, so it gets the target's own first layers.
        drafter = ModelDrafter(lm.model, f"self:{EAGLE_PEER_LAYERS}", num_layers=EAGLE_PEER_LAYERS)
    elif not isinstance(drafter, ModelDrafter):
        return Peer(reason=NGRAM_NO_PEER if draft.startswith("ngram") else f"no mlx-lm peer for drafter {draft!r}")
    src = drafter.model
    if drafter.num_layers is not None:  # self:L -> a truncated copy: embed, layers[:L], norm, head
        src = _self_draft_llama(lm, drafter.num_layers)
        desc = f"mlx-lm stream_generate with draft_model = the target's first {drafter.num_layers} layers + norm + head"
    elif isinstance(src, DraftModel):
        src = as_llama(src, lm)
        desc = (f"mlx-lm stream_generate with draft_model = {draft} as a full-vocabulary llama "
                "(logit 0 instead of -inf outside its head)")
    else:
        desc = f"mlx-lm stream_generate with draft_model = {draft}"
    ref_target, ref_draft = as_mlx_lm(lm.model), as_mlx_lm(src)
    mx.eval(ref_target.parameters(), ref_draft.parameters())
    return Peer(ref_target, ref_draft, desc)


# ----------------------------------------------------------------------------- aggregation


def paired_speed(a: Sequence[SpecRun], b: Sequence[SpecRun]) -> Comparison:
    """End-to-end tokens/s of runs ``a`` over runs ``b``, paired by (prompt, repeat), pooled."""
    of_b = {(r.prompt_id, r.repeat): r.run for r in b}
    pairs = [(r.run, of_b[(r.prompt_id, r.repeat)]) for r in a if (r.prompt_id, r.repeat) in of_b]
    return pooled_ratio([x.generated_tokens for x, _ in pairs], [x.total_s for x, _ in pairs],
                        [y.generated_tokens for _, y in pairs], [y.total_s for _, y in pairs])


@dataclass(frozen=True)
class PeerStats:
    """mlx-lm's speculative decoding over the same runs, and mlxspec's against it."""

    stats: MethodStats
    ratio: float | None  # mlxspec speculative tps / mlx-lm speculative tps, each pooled over its runs
    comparison: Comparison  # the same over (prompt, repeat) pairs, with its interval
    speedup_vs_target: float | None
    greedy_identical: bool | None  # informational: mlx-lm's llama differs from ours in float details

    def to_json(self) -> dict[str, Any]:
        s = self.stats
        return {"tps": s.tps, "decode_tps": s.decode_tps, "tau": s.tau, "tokens_per_step": s.tokens_per_step,
                "acceptance": s.acceptance, "ratio": self.ratio, "speedup_vs_target": self.speedup_vs_target,
                "greedy_identical": self.greedy_identical, "verdict": self.comparison.kind.value,
                "interval": None if self.comparison.interval is None else self.comparison.interval.to_json()}


@dataclass(frozen=True)
class Aggregate:
    """Target-only vs speculative (vs mlx-lm) over the runs of one temperature and some prompts.

    speedup = spec tps / target tps, each summed tokens over summed end-to-end seconds, with a
    bootstrap interval over (prompt, repeat) pairs (``comparison``; ``slower`` only when that
    interval lies below 1); speedup_median = median over pairs of spec tps / target tps;
    decode_speedup = speedup on decode-only tokens/s; tau = mean accepted drafts per step.
    """

    k: int
    prompts: int
    methods: dict[str, MethodStats | None]
    comparison: Comparison
    speedup_median: float | None
    mlx_lm: PeerStats | None
    greedy_identical: bool | None
    greedy_mismatches: list[Any]

    @property
    def target(self) -> MethodStats | None:
        return self.methods["target"]

    @property
    def spec(self) -> MethodStats | None:
        return self.methods["spec"]

    @property
    def target_tps(self) -> float | None:
        return self.target and self.target.tps

    @property
    def spec_tps(self) -> float | None:
        return self.spec and self.spec.tps

    @property
    def speedup(self) -> float | None:
        return _ratio(self.spec_tps, self.target_tps)

    @property
    def decode_speedup(self) -> float | None:
        return _ratio(self.spec and self.spec.decode_tps, self.target and self.target.decode_tps)

    @property
    def slower(self) -> bool:
        return self.comparison.kind is Kind.SLOWER

    def to_json(self) -> dict[str, Any]:
        s, t = self.spec, self.target
        c = self.comparison
        return {
            "prompts": self.prompts, "methods": {m: None if v is None else asdict(v) for m, v in self.methods.items()},
            "target_tps": self.target_tps, "spec_tps": self.spec_tps, "speedup": self.speedup,
            "speedup_median": self.speedup_median, "decode_speedup": self.decode_speedup, "slower": self.slower,
            "verdict": c.kind.value, "interval": None if c.interval is None else c.interval.to_json(),
            "tau": s and s.tau, "tokens_per_step": s and s.tokens_per_step,
            "acceptance": s.acceptance if s else [None] * self.k, "draft_ms": s and s.draft_ms,
            "verify_ms": s and s.verify_ms, "target_ms_per_token": t and t.verify_ms,
            "mlx_lm": None if self.mlx_lm is None else self.mlx_lm.to_json(),
            "greedy_identical": self.greedy_identical, "greedy_mismatches": list(self.greedy_mismatches),
        }


def _pair_ratios(a: Sequence[SpecRun], b: Sequence[SpecRun]) -> list[float]:
    of_b = {(r.prompt_id, r.repeat): r.run for r in b}
    out = [_ratio(r.run.tps, of_b[(r.prompt_id, r.repeat)].tps) for r in a if (r.prompt_id, r.repeat) in of_b]
    return [x for x in out if x is not None]


def _greedy_check(runs: Sequence[SpecRun]) -> bool | None:
    checks = [r.identical_to_target for r in runs if r.identical_to_target is not None]
    return all(checks) if checks else None


def aggregate(runs: Sequence[SpecRun], k: int) -> Aggregate:
    """``Aggregate`` of ``runs`` (one temperature, any prompts)."""
    by = {m: [r for r in runs if r.method == m] for m in METHODS}
    st = {m: method_stats([r.run for r in by[m]], k) for m in METHODS}
    peer = None
    if st["mlx_lm"] is not None:
        peer = PeerStats(st["mlx_lm"], _ratio(st["spec"] and st["spec"].tps, st["mlx_lm"].tps),
                         paired_speed(by["spec"], by["mlx_lm"]),
                         _ratio(st["mlx_lm"].tps, st["target"] and st["target"].tps), _greedy_check(by["mlx_lm"]))
    ratios = _pair_ratios(by["spec"], by["target"])
    return Aggregate(
        k=k, prompts=len({r.prompt_id for r in runs}), methods=st, comparison=paired_speed(by["spec"], by["target"]),
        speedup_median=statistics.median(ratios) if ratios else None, mlx_lm=peer,
        greedy_identical=_greedy_check(by["spec"]),
        greedy_mismatches=[r.prompt_id for r in by["spec"] if r.identical_to_target is False],
    )


@dataclass(frozen=True)
class TempResult:
    temperature: float
    categories: dict[str, Aggregate]
    overall: Aggregate

    def to_json(self) -> dict[str, Any]:
        return {"temperature": self.temperature,
                "categories": {c: a.to_json() for c, a in self.categories.items()},
                "overall": self.overall.to_json()}


def temp_result(runs: Sequence[SpecRun], temperature: float, categories: Sequence[str], k: int) -> TempResult:
    """The aggregates of one temperature's runs: per category and overall."""
    tr = [r for r in runs if r.temperature == temperature]
    return TempResult(temperature, {c: aggregate([r for r in tr if r.category == c], k) for c in categories},
                      aggregate(tr, k))


# ----------------------------------------------------------------------------- verdicts


def _headline(head: str, o: Aggregate, slow_in: list[str]) -> Verdict:
    c = o.comparison
    nums = (f"{o.spec_tps:.1f} vs {o.target_tps:.1f} tok/s end-to-end, {c.describe()}, median per prompt "
            f"{fmt(o.speedup_median, '{:.2f}x')}, decode-only {fmt(o.decode_speedup, '{:.2f}x')}, "
            f"tau {fmt(o.spec and o.spec.tau, '{:.2f}')})")
    if c.kind is Kind.SLOWER:
        text = f"{head} speculation is SLOWER than target-only here: {o.speedup:.2f}x ({nums}"
    elif c.kind is Kind.FASTER:
        text = f"{head} speculation is faster: {o.speedup:.2f}x target-only ({nums}"
    else:
        text = (f"{head} no measurable difference between speculation and target-only: {o.speedup:.2f}x "
                f"({nums}")
    if slow_in:
        text += f"; slower in: {', '.join(slow_in)}"
    return Verdict(c.kind, text, c.interval)


def _peer_verdicts(head: str, o: Aggregate) -> list[Verdict]:
    m = o.mlx_lm
    if m is None or m.ratio is None:
        return []
    c = m.comparison
    out = [Verdict(c.kind, f"{head} mlxspec / mlx-lm speculative = {m.ratio:.2f}x ({o.spec_tps:.1f} vs "
                           f"{m.stats.tps:.1f} tok/s; {c.describe()}; tau {fmt(o.spec and o.spec.tau, '{:.2f}')} "
                           f"vs {fmt(m.stats.tau, '{:.2f}')})", c.interval)]
    if m.greedy_identical is False:
        out.append(Verdict(Kind.NOTE, f"{head} note: mlx-lm's greedy output differs from mlxspec target-only "
                                      "on some prompt(s)"))
    return out


def verdicts(results: Sequence[TempResult], draft: str, k: int | str) -> list[Verdict]:
    """One verdict per temperature (faster / slower / no measurable difference, with its
    interval), mlxspec against mlx-lm where it ran, then problems."""
    out: list[Verdict] = []
    for res in results:
        o = res.overall
        head = f"{fmt_t(res.temperature)}, {draft} k={k}:"
        if o.speedup is None:
            out.append(Verdict(Kind.EMPTY, f"{head} no timed runs"))
            continue
        slow_in = [c for c, a in res.categories.items() if a.slower] if len(res.categories) > 1 else []
        out.append(_headline(head, o, slow_in))
        out += _peer_verdicts(head, o)
        if o.greedy_mismatches:
            out.append(Verdict(Kind.BUG, f"{head} BUG: greedy speculative output differs from target-only on "
                                         f"prompt(s) {', '.join(map(str, o.greedy_mismatches))}"))
    return out


# ----------------------------------------------------------------------------- the benchmark


@dataclass(frozen=True)
class SpecSettings:
    draft: str
    k: int | str  # or "auto" (``core.autok``)
    temps: list[float]
    categories: list[str]
    per_category: int | None
    max_tokens: int
    warmup: int
    warmup_tokens: int
    repeats: int
    seed: int
    with_mlx_lm: bool
    prompts_file: str | None
    headline: str = "end-to-end tokens/s = generated tokens / (prefill_s + decode_s)"
    mlx_lm_k: int | None = None  # K of mlx-lm's peer (``MLX_LM_K_WITH_AUTO`` under --k auto)
    mlx_lm_draft: str | None = None  # the peer's own drafter, when not the benchmarked one
    tree: str | None = None  # --tree: the shape every speculative step drafts (k is then its depth)


@dataclass(frozen=True)
class SpecBenchResult:
    header: RunHeader
    settings: SpecSettings
    note: str | None
    prompts: list[dict[str, Any]]
    peer: Peer
    runs: list[SpecRun]
    results: list[TempResult]
    verdicts: list[Verdict] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        p = self.peer
        return {
            "schema": SCHEMA, **self.header.to_json(), "settings": asdict(self.settings), "note": self.note,
            "prompts": self.prompts,
            "mlx_lm": None if p.target is None else {"description": p.description, "note": MLX_LM_NOTE},
            "mlx_lm_reason": p.reason, "runs": [r.to_json() for r in self.runs],
            "results": [r.to_json() for r in self.results], "verdicts": [v.to_json() for v in self.verdicts],
        }


Runner = Callable[[str, float, list[int], int], Run]


def _spec_runner(lm, drafter, stop: set[int], params_of: dict[float, Any], peer: Peer, k: Any, seed: int,
                 tree: Any, peer_k: int) -> Runner:
    """run(method, temperature, prompt ids, max tokens) for every method of the benchmark. ``k``:
    an int, or an ``AutoK`` whose ``fresh()`` copy each speculative run starts from. ``tree``:
    the speculative runs draft trees of that shape. mlx-lm's peer drafts ``peer_k`` tokens a step."""

    def run(method: str, t: float, p: list[int], n: int) -> Run:
        if method == "mlx_lm":
            return mlx_lm_run(peer.target, peer.draft, lm.tokenizer, p, t, n, peer_k, seed)
        policy = k if isinstance(k, int) else k.fresh()
        spec = method == "spec"
        return engine_run(lm, p, params_of[t], n, stop, seed, drafter if spec else None, policy,
                          tree=tree if spec else None)

    return run


def _round(run: Runner, order: Sequence[str], t: float, it: dict[str, Any], p: list[int], r: int,
           max_tokens: int, tick: Callable[[str], None]) -> list[SpecRun]:
    """Every method once on one prompt, in ``order``; greedy runs compared with target-only."""
    got: dict[str, Run] = {}
    for m in order:
        got[m] = run(m, t, p, max_tokens)
        tick(f"{fmt_t(t)} · {METHOD_LABELS[m]} · {it['category']} #{it['id']}")
    out = []
    for pos, m in enumerate(order):
        mm = first_mismatch(got["target"].tokens, got[m].tokens) if t == 0 and m != "target" else None
        same = (mm is None) if t == 0 and m != "target" else None
        out.append(SpecRun(m, got[m], t, it["id"], it["category"], r, pos, same, mm))
    return out


def _time_spec_runs(run: Runner, methods: list[str], temps: Sequence[float], items: list[dict[str, Any]],
                    ids: list[list[int]], max_tokens: int, warmup: int, repeats: int,
                    progress: Progress) -> list[SpecRun]:
    """Warm-up, then every (temperature, repeat, prompt) round, the method order rotating from
    round to round, so each method runs in each position equally often (a machine that slows
    down or warms up over a round then favours none)."""
    runs: list[SpecRun] = []
    tick = progress_ticker(progress, len(temps) * len(items) * repeats * len(methods))
    for ti, t in enumerate(temps):
        for _ in range(warmup):
            for m in methods:
                run(m, t, ids[0], min(max_tokens, WARMUP_TOKENS))
        for r in range(repeats):
            for j, (it, p) in enumerate(zip(items, ids)):
                shift = (ti + j + r) % len(methods)
                order = methods[shift:] + methods[:shift]
                suffix = f" · repeat {r + 1}/{repeats}"
                runs += _round(run, order, t, it, p, r, max_tokens, lambda label, s=suffix: tick(label + s))
    return runs


def _check_spec_args(k: int | str, max_tokens: int, warmup: int, repeats: int,
                     temps: Sequence[float]) -> tuple[int | str, tuple[float, ...]]:
    from mlxspec.core.autok import parse_k_option

    k = parse_k_option(k)
    if max_tokens < 1:
        raise MlxspecError(f"max_tokens must be >= 1, got {max_tokens}")
    if repeats < 1 or warmup < 0:
        raise MlxspecError("repeats must be >= 1 and warmup >= 0")
    temps = tuple(float(t) for t in temps)
    if not temps:
        raise MlxspecError("no temperatures to run")
    return k, temps


def spec_bench(
    model_spec: Any = "default",
    draft: str = "ngram:3",
    k: int | str = 4,
    temps: tuple[float, ...] = (0.0, 1.0),
    categories: list[str] | tuple[str, ...] | None = None,
    per_category: int = 2,
    max_tokens: int = 64,
    warmup: int = 1,
    repeats: int = 1,
    with_mlx_lm: bool = True,
    prompts_file: str | Path | None = None,
    seed: int = 0,
    progress: Progress = None,
    dtype: str = "auto",
    remeasure_cost: bool = False,
    tree: Any = None,
    peer_draft: str | None = None,
    peer_k: int | None = None,
) -> SpecBenchResult:
    """Speculative (``draft``, ``k``) against target-only decoding of ``model_spec`` (a spec for
    ``loading.load`` or an already loaded ``LoadedModel``), per Spec-Bench category and overall,
    per temperature; plus mlx-lm's own speculative decoding with the same pair when the drafter
    is a model (``self:L``: a truncated copy of the target; a model path: that model), or with
    ``peer_draft`` (any model drafter: mlx-lm's best draft for this target need not be ours),
    drafting ``peer_k`` tokens a step.

    Prompts: ``runs.spec_bench_prompts`` (chat template applied). For each temperature and
    prompt: target-only (``generate(drafter=None)``) and speculative (same seed, same
    ``max_tokens``, the tokenizer's real end-of-sequence set; mlx-lm's peer too), the order
    rotating across prompts and repeats, after ``warmup`` untimed rounds of every method per temperature
    (``WARMUP_TOKENS`` tokens, first prompt). Headline tokens/s is END-TO-END: generated tokens /
    (prefill + decode) seconds; decode-only tokens/s is kept too. The verdict per temperature
    rests on a bootstrap interval of the speedup over (prompt, repeat) pairs (``verdict``).
    Greedy speculative output must equal target-only output token for token
    (``identical_to_target``; a mismatch is reported as a bug).

    mlx-lm peer: ``stream_generate(draft_model=..., num_draft_tokens=k, sampler=make_sampler(T))``
    timed the same way. Its accepted tokens per step are rebuilt from the ``from_draft`` flags
    (``mlx_lm_steps``). Note that at T > 0 mlx-lm accepts a draft token only if the target's
    *sampled* token equals it (no rejection sampling), so its acceptance is lower than ours by
    construction there.

    JSON keys (``to_json``): schema, date, machine, backend, blas, mlx_version, mlx_lm_version,
    model, dtype, settings, note, prompts[{id, category, source_category, prompt_tokens}],
    mlx_lm ({description, note} or None), mlx_lm_reason, runs[per-run rows], results[{temperature,
    categories{cat: aggregate}, overall: aggregate}], verdicts[{kind, text, interval}]. See
    ``Aggregate``.
    """
    from mlxspec.core.sampling import SamplingParams

    k, temps = _check_spec_args(k, max_tokens, warmup, repeats, temps)
    if peer_k is not None:
        from mlxspec.core.drafters.base import MAX_K

        if not 1 <= peer_k <= MAX_K:
            raise MlxspecError(f"--mlx-lm-k must be in 1..{MAX_K}, got {peer_k}")
    if (peer_draft is not None or peer_k is not None) and not with_mlx_lm:
        raise MlxspecError("--mlx-lm-draft and --mlx-lm-k set up mlx-lm's peer; drop --no-mlx-lm")
    params_of = {t: SamplingParams(temperature=t) for t in temps}  # validates them before any loading
    items, note = spec_bench_prompts(categories, per_category, prompts_file)
    lm, drafter, stop, ids = prepare_speculative_run(
        model_spec, draft, dtype, items, max_tokens, no_drafter="spec_bench needs a drafter (got 'none')")
    if getattr(lm, "backend", "mlx") != "mlx":
        peer = Peer(reason=f"mlx-lm runs on MLX only; the target runs on {lm.backend}")
    elif not with_mlx_lm:
        peer = Peer(reason="not requested (with_mlx_lm=False)")
    elif peer_draft is not None:
        from mlxspec.targets.drafts import make_drafter

        peer = mlx_lm_peer(lm, peer_draft, make_drafter(peer_draft, lm, lm.dtype))
    else:
        peer = mlx_lm_peer(lm, draft, drafter)
    say = (lambda s: progress(0, None, s)) if progress else None
    if tree is not None:  # every speculative step drafts this shape; K is its depth
        from mlxspec.core.drafters import can_branch

        if not can_branch(drafter):
            raise MlxspecError(f"drafter {draft!r} cannot branch: --tree needs a draft model, self:L, an eagle head "
                               "or ngram:N")
    session = Session(lm, drafter, k, tree, remeasure_cost=remeasure_cost, log=say)
    tree, policy = session.tree, session.policy
    k = tree.depth if tree is not None else k
    width = policy if isinstance(policy, int) else policy.max_k  # draft positions reported
    # mlx-lm has no auto K and no trees: its peer drafts a chain of --mlx-lm-k, --k or the tree's depth
    peer_k = peer_k or (k if isinstance(k, int) else MLX_LM_K_WITH_AUTO)
    run = _spec_runner(lm, drafter, stop, params_of, peer, policy, seed, tree, peer_k)
    methods = ["target", "spec"] + (["mlx_lm"] if peer.target is not None else [])
    runs = _time_spec_runs(run, methods, temps, items, ids, max_tokens, warmup, repeats, progress)

    cats = list(dict.fromkeys(it["category"] for it in items))
    results = [temp_result(runs, t, cats, width) for t in temps]
    settings = SpecSettings(draft, k, list(temps), cats, per_category if prompts_file is None else None, max_tokens,
                            warmup, min(max_tokens, WARMUP_TOKENS), repeats, seed, with_mlx_lm,
                            str(prompts_file) if prompts_file is not None else None,
                            mlx_lm_k=peer_k,
                            mlx_lm_draft=peer_draft,
                            tree=None if tree is None else str(tree))
    return SpecBenchResult(run_header(lm), settings, note, prepared_prompts(items, ids), peer, runs, results,
                           verdicts(results, draft, k if tree is None else f"tree {tree}"))


# ----------------------------------------------------------------------------- output


def _speedup_cell(a: Aggregate) -> str:
    sp = fmt(a.speedup, "{:.2f}x")
    kind = a.comparison.kind
    if kind is Kind.SLOWER:
        sp = markup(kind, f"{sp} SLOWER")
    elif kind is Kind.FASTER:
        sp = markup(kind, sp)
    if a.greedy_mismatches:
        sp += " " + markup(Kind.BUG, "MISMATCH")
    return sp


def _spec_columns(peer: bool) -> list[tuple[str, str]]:
    cols = [("category", "left"), ("target\ntok/s", "right"), ("spec\ntok/s", "right"), ("speedup", "right"),
            ("95%\ninterval", "right"), ("median", "right"), ("tau", "right"), ("acc by\nposition", "left"),
            ("draft\nms", "right"), ("verify\nms", "right")]
    if peer:
        cols += [("mlx-lm\ntok/s", "right"), ("vs\nmlx-lm", "right"), ("mlx-lm\ntau", "right")]
    return cols


def _spec_cells(name: str, a: Aggregate, peer: bool) -> list[str]:
    s, iv = a.spec, a.comparison.interval
    cells = [name, fmt(a.target_tps), fmt(a.spec_tps), _speedup_cell(a), "-" if iv is None else str(iv),
             fmt(a.speedup_median, "{:.2f}x"), fmt(s and s.tau, "{:.2f}"),
             fmt_list(s.acceptance if s else [None] * a.k), fmt(s and s.draft_ms), fmt(s and s.verify_ms)]
    if peer:
        m = a.mlx_lm
        cells += [fmt(m and m.stats.tps), fmt(m and m.ratio, "{:.2f}x"), fmt(m and m.stats.tau, "{:.2f}")]
    return cells


def _spec_table(result: SpecBenchResult, res: TempResult):
    from rich.table import Table
    from rich.text import Text

    s, h = result.settings, result.header
    peer = result.peer.target is not None
    per_cat = f" ({s.per_category} per category)" if s.per_category and not s.prompts_file else ""
    shape = f"tree={s.tree}" if s.tree else f"k={s.k}"
    table = Table(
        title=(f"Speculative decoding, {fmt_t(res.temperature)}: {h.model} ({h.dtype}) + {s.draft}, {shape} "
               f"— {h.backend}"),
        caption=(f"{len(result.prompts)} prompts{per_cat}, {s.max_tokens} new tokens max, {s.warmup} warm-up, "
                 f"{s.repeats} repeat(s). tok/s end-to-end (prefill included); speedup = summed spec tok/s / "
                 f"summed target tok/s, 95% interval: bootstrap over (prompt, repeat) pairs (median: of per-prompt "
                 f"ratios); tau = accepted drafts per step; acc = acceptance by draft position"
                 + ("; vs mlx-lm = mlxspec / mlx-lm speculative tok/s" if peer else "")),
    )
    entries = list(res.categories.items()) + [("overall", res.overall)]
    rows = [_spec_cells(name, a, peer) for name, a in entries]
    for c, (col, just) in enumerate(_spec_columns(peer)):
        # never cut a number: a column may wrap at spaces but is at least its longest word wide
        longest = max(len(w) for r in rows for w in Text.from_markup(r[c]).plain.split())
        table.add_column(col, justify=just, no_wrap=c == 0, min_width=longest)
    for i, cells in enumerate(rows):
        table.add_row(*cells, style="bold" if i == len(rows) - 1 else None, end_section=i == len(rows) - 2)
    return table


def print_verdicts(verdicts: Sequence[Verdict], console) -> None:
    """One line per verdict, coloured by its kind."""
    for v in verdicts:
        console.print(markup(v.kind, v.text), highlight=False)


def print_spec(result: SpecBenchResult, console) -> None:
    """Render a ``spec_bench`` result: one rich table per temperature, then the verdicts."""
    for res in result.results:
        console.print(_spec_table(result, res))
    if result.note:
        console.print(f"[yellow]note:[/] {result.note}")
    if result.peer.target is None and result.settings.with_mlx_lm:
        console.print(f"[dim]mlx-lm peer: none ({result.peer.reason})[/]")
    elif result.peer.target is not None:
        console.print(f"[dim]mlx-lm peer: {result.peer.description}, {result.settings.mlx_lm_k} draft tokens a step[/]")
    print_verdicts(result.verdicts, console)
