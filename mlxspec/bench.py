"""The baseline benchmark: mlxspec's target-only decoder against mlx-lm's, and both against the
memory-bandwidth floor.

Both implementations run the same weights (``loading.to_mlx_lm`` copies ours into mlx-lm's
llama class), the same chat-templated prompt ids, greedy, and exactly ``max_tokens`` tokens
each (end-of-sequence ignored), timed the same way from outside the generator:

* prefill = time from the call to the first token; prefill tokens/s = prompt tokens / prefill;
* decode = time from the first token to the last; decode tokens/s = (tokens - 1) / decode.

Each repeat runs every prompt through both, the order alternating pair by pair to cancel drift.
The floor is the time one decoded token needs just to stream its weights through memory at the
copy bandwidth MLX reaches on this machine.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from . import runtime  # noqa: F401  (before mlx)

import mlx.core as mx

# The first question of three different Spec-Bench categories (chat-style writing, code,
# GSM8K maths), all short single-turn prompts. question_id -> category, first turn used.
DEFAULT_QUESTIONS: dict[int, str] = {81: "writing", 121: "coding", 401: "math_reasoning"}
QUESTIONS_FILE = "spec_bench_questions.jsonl"
# Used when the shared data folder is missing.
FALLBACK_PROMPTS: tuple[str, ...] = (
    "Write a short paragraph about the history of the bicycle.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "A shop sells pens at 3 dollars each. How much do 7 pens cost? Explain step by step.",
)

BANDWIDTH_BYTES = 256 * 1024 * 1024  # copied when measuring bandwidth, far above any cache
IMPLEMENTATIONS = ("mlxspec", "mlx_lm")
LABELS = {"mlxspec": "mlxspec generate_plain", "mlx_lm": "mlx-lm stream_generate"}


# ----------------------------------------------------------------------------- prompts


def data_dir() -> Path:
    """The shared prompt data: ``$MLXSPEC_DATA`` or ``<repo>/../shared/data``."""
    env = os.environ.get("MLXSPEC_DATA")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[2] / "shared" / "data"


def default_prompts() -> list[dict[str, Any]]:
    """[{id, category, text}] for ``DEFAULT_QUESTIONS``, or the built-in fallback prompts."""
    path = data_dir() / QUESTIONS_FILE
    found: dict[int, dict[str, Any]] = {}
    if path.is_file():
        with path.open(encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                row = json.loads(line)
                qid = row.get("question_id")
                if qid in DEFAULT_QUESTIONS and row.get("turns"):
                    found[qid] = {"id": qid, "category": row.get("category", DEFAULT_QUESTIONS[qid]),
                                  "text": row["turns"][0]}
    if len(found) == len(DEFAULT_QUESTIONS):
        return [found[q] for q in DEFAULT_QUESTIONS]
    return [{"id": f"builtin-{i + 1}", "category": "builtin", "text": t}
            for i, t in enumerate(FALLBACK_PROMPTS)]


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


# ----------------------------------------------------------------------------- timed runs


@dataclass
class Run:
    tokens: list[int]
    prompt_tokens: int
    prefill_s: float
    decode_s: float

    @property
    def decode_tps(self) -> float:
        n = len(self.tokens) - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0


def _timed(tokens: Iterator[int], prompt_tokens: int) -> Run:
    """Time an iterator of token ids: start before the first ``next``, stamp each token."""
    out: list[int] = []
    t0 = time.perf_counter()
    t_first = t_last = t0
    for tok in tokens:
        now = time.perf_counter()
        if not out:
            t_first = now
        t_last = now
        out.append(tok)
    return Run(out, prompt_tokens, t_first - t0, t_last - t_first)


def _mlxspec_tokens(lm, ids: list[int], max_tokens: int) -> Iterator[int]:
    from .engine import generate_plain
    from .events import Step
    from .sampling import SamplingParams

    for ev in generate_plain(lm.model, ids, SamplingParams(), max_tokens, set(), lm.context_length):
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


def _stats(runs: list[Run], floor_ms: float) -> dict[str, Any]:
    dec = [r.decode_tps for r in runs]
    pre = [r.prefill_tps for r in runs]
    med = statistics.median(dec)
    ms = 1e3 / med if med > 0 else math.inf
    return {
        "decode_tps_median": med,
        "decode_tps_min": min(dec),
        "decode_tps_max": max(dec),
        "prefill_tps_median": statistics.median(pre),
        "ms_per_token": ms,
        "floor_ratio": ms / floor_ms if floor_ms > 0 else math.inf,
        "tokens_per_run": sorted({len(r.tokens) for r in runs}),
        "runs": len(runs),
        "decode_tps_all": dec,
    }


# ----------------------------------------------------------------------------- the benchmark


def baseline_bench(
    model_spec: str = "default",
    dtype: str = "auto",
    prompts: list[str] | None = None,
    max_tokens: int = 64,
    warmup: int = 1,
    repeats: int = 3,
    progress: Callable[[int, int, str], Any] | None = None,
) -> dict[str, Any]:
    """Decode/prefill tokens/s of mlxspec's ``generate_plain`` and mlx-lm's ``stream_generate``
    on the same weights, side by side, plus the memory-bandwidth floor. JSON-serialisable.

    Result keys: date, machine{platform, processor, cpu_count}, backend, blas, mlx_version,
    mlx_lm_version, model, dtype, settings{max_tokens, warmup, repeats, prompts[{id, category,
    prompt_tokens}]}, implementations{mlxspec, mlx_lm: {decode_tps_median, decode_tps_min,
    decode_tps_max, prefill_tps_median, ms_per_token, floor_ratio, ...}}, ratio (mlxspec median
    decode tps / mlx-lm's), bandwidth_gbs, weight_bytes_per_token, floor_ms_per_token,
    floor_ratio{mlxspec, mlx_lm}, same_tokens, goals.
    """
    from . import loading
    from .errors import MlxspecError
    from .runtime import BLAS, backend_description
    from .tokenizer import encode_prompt

    if max_tokens < 2:
        raise MlxspecError(f"max_tokens must be >= 2 to time decoding, got {max_tokens}")
    if repeats < 1 or warmup < 0:
        raise MlxspecError("repeats must be >= 1 and warmup >= 0")

    if prompts is None:
        items = default_prompts()
    else:
        if not prompts:
            raise MlxspecError("no prompts to benchmark")
        items = [{"id": f"custom-{i + 1}", "category": "custom", "text": t} for i, t in enumerate(prompts)]

    bandwidth = measure_bandwidth()

    lm = loading.load(model_spec, dtype)
    ref_model = loading.to_mlx_lm(lm.model)
    mx.eval(ref_model.parameters())
    ref_tok = _no_eos(lm.tokenizer)
    ids = [encode_prompt(lm.tokenizer, it["text"]) for it in items]
    for it, p in zip(items, ids):
        if len(p) + max_tokens >= lm.context_length:
            raise MlxspecError(f"prompt {it['id']} ({len(p)} tokens) + {max_tokens} exceeds the context")

    def run(impl: str, p: list[int]) -> Run:
        if impl == "mlxspec":
            return _timed(_mlxspec_tokens(lm, p, max_tokens), len(p))
        return _timed(_mlx_lm_tokens(ref_model, ref_tok, p, max_tokens), len(p))

    for _ in range(warmup):
        for impl in IMPLEMENTATIONS:
            run(impl, ids[0])

    runs: dict[str, list[Run]] = {k: [] for k in IMPLEMENTATIONS}
    same: list[bool] = []
    total = repeats * len(items) * len(IMPLEMENTATIONS)
    done, pair = 0, 0
    for r in range(repeats):
        for it, p in zip(items, ids):
            order = IMPLEMENTATIONS if pair % 2 == 0 else IMPLEMENTATIONS[::-1]
            pair += 1
            got = {}
            for impl in order:
                got[impl] = run(impl, p)
                if len(got[impl].tokens) != max_tokens:
                    raise MlxspecError(
                        f"{LABELS[impl]} produced {len(got[impl].tokens)} tokens, expected {max_tokens}"
                    )
                runs[impl].append(got[impl])
                done += 1
                if progress is not None:
                    progress(done, total, f"{LABELS[impl]} · {it['category']} #{it['id']} · repeat {r + 1}/{repeats}")
            same.append(got["mlxspec"].tokens == got["mlx_lm"].tokens)

    weight_bytes = int(lm.weight_bytes_per_token())
    floor_ms = weight_bytes / (bandwidth * 1e9) * 1e3 if bandwidth > 0 else 0.0
    impls = {k: _stats(v, floor_ms) for k, v in runs.items()}
    a, b = impls["mlxspec"]["decode_tps_median"], impls["mlx_lm"]["decode_tps_median"]
    ratio = a / b if b > 0 else math.inf

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
        },
        "backend": backend_description(),
        "blas": BLAS.library,
        "mlx_version": mx.__version__,
        "mlx_lm_version": version("mlx-lm") or version("mlx_lm"),
        "model": lm.name,
        "dtype": lm.dtype,
        "settings": {
            "max_tokens": max_tokens,
            "warmup": warmup,
            "repeats": repeats,
            "prompts": [{"id": it["id"], "category": it["category"], "prompt_tokens": len(p)}
                        for it, p in zip(items, ids)],
        },
        "implementations": impls,
        "ratio": ratio,
        "bandwidth_gbs": bandwidth,
        "weight_bytes_per_token": weight_bytes,
        "floor_ms_per_token": floor_ms,
        "floor_ratio": {k: v["floor_ratio"] for k, v in impls.items()},
        "same_tokens": sum(same) / len(same) if same else None,
        "goals": {
            "mlxspec_at_least_mlx_lm": ratio >= 1.0,
            "mlxspec_within_1_5x_floor": impls["mlxspec"]["floor_ratio"] <= 1.5,
        },
    }


def print_baseline(result: dict[str, Any], console) -> None:
    """Render a ``baseline_bench`` result as a rich table plus a short summary."""
    from rich.table import Table

    s = result["settings"]
    prompts = ", ".join(f"{p['category']} #{p['id']} ({p['prompt_tokens']} tok)" for p in s["prompts"])
    table = Table(
        title=f"Baseline decoding: {result['model']} ({result['dtype']}), {result['backend']}",
        caption=(f"{s['max_tokens']} tokens per run, {s['warmup']} warm-up, {s['repeats']} repeats x "
                 f"{len(s['prompts'])} prompts: {prompts}"),
    )
    table.add_column("implementation")
    table.add_column("decode tok/s (median)", justify="right")
    table.add_column("min - max", justify="right")
    table.add_column("prefill tok/s", justify="right")
    table.add_column("ms/token", justify="right")
    table.add_column("x floor", justify="right")
    for key, st in result["implementations"].items():
        table.add_row(
            LABELS.get(key, key),
            f"{st['decode_tps_median']:.1f}",
            f"{st['decode_tps_min']:.1f} - {st['decode_tps_max']:.1f}",
            f"{st['prefill_tps_median']:.0f}",
            f"{st['ms_per_token']:.2f}",
            f"{st['floor_ratio']:.2f}x",
        )
    table.add_row(
        "bandwidth floor",
        f"{1e3 / result['floor_ms_per_token']:.1f}" if result["floor_ms_per_token"] > 0 else "-",
        "", "",
        f"{result['floor_ms_per_token']:.2f}",
        "1.00x",
        style="dim",
    )
    console.print(table)
    g = result["goals"]
    ok = lambda b: "[green]yes[/]" if b else "[red]no[/]"  # noqa: E731
    console.print(
        f"ratio mlxspec / mlx-lm (decode): [bold]{result['ratio']:.3f}[/] (goal >= 1.0: {ok(g['mlxspec_at_least_mlx_lm'])})"
    )
    console.print(
        f"bandwidth {result['bandwidth_gbs']:.1f} GB/s, {result['weight_bytes_per_token'] / 1e6:.1f} MB of weights "
        f"per token -> floor {result['floor_ms_per_token']:.2f} ms/token; mlxspec at "
        f"{result['floor_ratio']['mlxspec']:.2f}x the floor (goal <= 1.5x: {ok(g['mlxspec_within_1_5x_floor'])})"
    )
    if result.get("same_tokens") is not None and result["same_tokens"] < 1:
        console.print(f"[yellow]note:[/] identical greedy tokens in {result['same_tokens']:.0%} of run pairs")
