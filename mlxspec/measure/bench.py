"""Benchmarks. Two of them:

* ``baseline_bench``: mlxspec's target-only decoder against mlx-lm's, and both against the
  memory-bandwidth floor (below);
* ``spec_bench``: speculative against target-only decoding on a balanced Spec-Bench subset, with
  acceptance statistics, and mlx-lm's own speculative decoding as a peer (see its docstring).

The baseline benchmark: mlxspec's target-only decoder against mlx-lm's, and both against the
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

import mlx.core as mx

from mlxspec.runtime import BLAS, backend_description  # (imports runtime before mlx)

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
    return Path(__file__).resolve().parents[3] / "shared" / "data"


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
    from mlxspec.core.engine import generate_plain
    from mlxspec.core.events import Step
    from mlxspec.core.sampling import SamplingParams

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


def run_header(lm) -> dict[str, Any]:
    """Where and on what a measurement ran: the first keys of every result JSON."""

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
    }


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
    from mlxspec.errors import MlxspecError
    from mlxspec.targets import loading
    from mlxspec.targets.tokenizer import encode_prompt

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

    return {
        **run_header(lm),
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

SPEC_BENCH_CATEGORIES: tuple[str, ...] = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
# Spec-Bench's first 80 questions (ids 81-160) are MT-Bench's, under these 8 categories.
MT_BENCH_IDS = range(81, 161)
METHODS = ("target", "spec", "mlx_lm")
METHOD_LABELS = {"target": "target-only", "spec": "speculative", "mlx_lm": "mlx-lm speculative"}
WARMUP_TOKENS = 16  # warm-up runs are shorter: they only need to touch every code path once
NGRAM_NO_PEER = ("mlx-lm's speculative decoding needs a draft model; prompt lookup (ngram) "
                 "has no mlx-lm equivalent")


def spec_category(row: dict[str, Any]) -> str:
    """The Spec-Bench subtask of a question row: ids 81-160 are all ``mt_bench``."""
    qid = row.get("question_id")
    if isinstance(qid, int) and qid in MT_BENCH_IDS:
        return "mt_bench"
    return str(row.get("category", "unknown"))


def _read_prompts_file(path: str | Path) -> list[dict[str, Any]]:
    from mlxspec.errors import MlxspecError

    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise MlxspecError(f"cannot read prompts file {path}: {e}") from None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise MlxspecError(f"prompts file {path} has no prompts")
    as_json = path.suffix == ".jsonl" or lines[0].lstrip().startswith("{")
    items = []
    for i, ln in enumerate(lines):
        if not as_json:
            items.append({"id": f"custom-{i + 1}", "category": "custom", "text": ln})
            continue
        try:
            row = json.loads(ln)
        except json.JSONDecodeError as e:
            raise MlxspecError(f"{path}, prompt {i + 1}: not JSON ({e.msg})") from None
        turns = row.get("turns") if isinstance(row, dict) else None
        if not (isinstance(turns, list) and turns and isinstance(turns[0], str)):
            raise MlxspecError(f"{path}, prompt {i + 1}: expected an object with a non-empty 'turns' list")
        items.append({"id": row.get("question_id", f"custom-{i + 1}"), "category": "custom", "text": turns[0]})
    return items


def spec_bench_prompts(
    categories: list[str] | tuple[str, ...] | None = None,
    per_category: int = 2,
    prompts_file: str | Path | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """The prompt set of ``spec_bench`` and a note (None, or why the built-in prompts are used).

    Default: for each Spec-Bench subtask (``SPEC_BENCH_CATEGORIES``, filtered by ``categories``)
    its first ``per_category`` questions in file order, first turn only. For mt_bench those are
    question ids 81, 82, ... (writing first); translation 161, ...; summarization 241, ...;
    qa 321, ...; math_reasoning 401, ...; rag 481, .... Items: {id, category, source_category,
    text}. ``prompts_file`` replaces the set (all its prompts, category "custom"). Without the
    shared data folder and no explicit ``categories``: the built-in fallback prompts.
    """
    from mlxspec.errors import MlxspecError

    if prompts_file is not None:
        return _read_prompts_file(prompts_file), None
    if per_category < 1:
        raise MlxspecError(f"per_category must be >= 1, got {per_category}")
    wanted = list(SPEC_BENCH_CATEGORIES) if not categories else list(dict.fromkeys(categories))
    unknown = [c for c in wanted if c not in SPEC_BENCH_CATEGORIES]
    if unknown:
        raise MlxspecError(f"unknown Spec-Bench categor{'y' if len(unknown) == 1 else 'ies'} "
                           f"{', '.join(map(repr, unknown))}; choose from: {', '.join(SPEC_BENCH_CATEGORIES)}")
    path = data_dir() / QUESTIONS_FILE
    if not path.is_file():
        if categories:
            raise MlxspecError(f"Spec-Bench questions not found at {path} (set MLXSPEC_DATA, or pass a prompts file)")
        note = f"Spec-Bench questions not found at {path}: built-in prompts used instead"
        return [{"id": f"builtin-{i + 1}", "category": "builtin", "source_category": "builtin", "text": t}
                for i, t in enumerate(FALLBACK_PROMPTS)], note
    picked: dict[str, list[dict[str, Any]]] = {c: [] for c in wanted}
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            cat = spec_category(row)
            if cat in picked and len(picked[cat]) < per_category and row.get("turns"):
                picked[cat].append({"id": row["question_id"], "category": cat,
                                    "source_category": row.get("category", cat), "text": row["turns"][0]})
    missing = [c for c, v in picked.items() if not v]
    if missing:
        raise MlxspecError(f"{path} has no questions for {', '.join(missing)}")
    return [it for c in wanted for it in picked[c]], None


# ----------------------------------------------------------------------------- one run -> one row


def _row(method: str, tokens: list[int], prompt_tokens: int, prefill_s: float, decode_s: float,
         first_step_tokens: int, stop_reason: str, accepted: list[int], drafted: list[int],
         draft_ms: list[float], verify_ms: list[float]) -> dict[str, Any]:
    n = len(tokens)
    total = prefill_s + decode_s
    rest = n - min(first_step_tokens, n)
    return {
        "method": method,
        "prompt_tokens": prompt_tokens,
        "generated_tokens": n,
        "tokens": tokens,
        "stop_reason": stop_reason,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "total_s": total,
        "first_step_tokens": min(first_step_tokens, n),
        "tps": n / total if total > 0 else 0.0,
        "decode_tps": rest / decode_s if rest > 0 and decode_s > 0 else None,
        "steps": len(accepted),
        "accepted": accepted,
        "drafted": drafted,
        "draft_ms": draft_ms,
        "verify_ms": verify_ms,
    }


def _mlxspec_run(method: str, lm, ids: list[int], params, max_tokens: int, stop: set[int], seed: int,
                 drafter, k: int) -> dict[str, Any]:
    from mlxspec.core.engine import generate
    from mlxspec.core.events import Done, Step

    tokens: list[int] = []
    accepted, drafted, dms, vms = [], [], [], []
    first, done = None, None
    for ev in generate(lm.model, ids, params, max_tokens, stop, lm.context_length, seed=seed,
                       drafter=drafter, k=k):
        if isinstance(ev, Step):
            em = ev.emitted
            tokens += em
            if first is None:
                first = len(em)
            accepted.append(ev.accepted)
            drafted.append(ev.k)
            dms.append(ev.draft_ms)
            vms.append(ev.verify_ms)
        elif isinstance(ev, Done):
            done = ev
    assert done is not None
    return _row(method, tokens, len(ids), done.prefill_s, done.decode_s, first or 0, done.stop_reason,
                accepted, drafted, dms, vms)


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


def _mlx_lm_run(ref_target, ref_draft, tokenizer, ids: list[int], temperature: float, max_tokens: int,
                k: int, seed: int) -> dict[str, Any]:
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    mx.random.seed(seed)
    sampler = make_sampler(temp=temperature)
    toks: list[int] = []
    flags: list[bool] = []
    stamps: list[float] = []
    finish = None
    t0 = time.perf_counter()
    for r in mlx_lm.stream_generate(ref_target, tokenizer, ids, max_tokens=max_tokens, draft_model=ref_draft,
                                    num_draft_tokens=k, sampler=sampler):
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
    return _row("mlx_lm", out, len(ids), t_first - t0, t_last - t_first, first,
                "eos" if finish == "stop" else "length", accepted, drafted, [], [])


def _mlx_lm_peer(lm, draft: str, drafter) -> tuple[Any, Any, str | None, str | None]:
    """(ref target, ref draft, description, reason when there is none) for mlx-lm's own
    speculative decoding with the same pair, in mlx-lm's llama class sharing our arrays."""
    import dataclasses

    from mlx.utils import tree_flatten

    from mlxspec.core.drafters import ModelDrafter
    from mlxspec.core.model import Llama
    from mlxspec.targets import loading
    from mlxspec.training.draft import DraftModel, as_llama

    if not isinstance(drafter, ModelDrafter):
        return None, None, None, NGRAM_NO_PEER if draft.startswith("ngram") else f"no mlx-lm peer for drafter {draft!r}"
    src = drafter.model
    if drafter.num_layers is not None:  # self:L -> a truncated copy: embed, layers[:L], norm, head
        L = drafter.num_layers
        small = Llama(dataclasses.replace(lm.config, num_layers=L))
        params = [(name, v) for name, v in tree_flatten(lm.model.parameters())
                  if not name.startswith("model.layers.") or int(name.split(".")[2]) < L]
        if any(name.endswith(".scales") for name, _ in params):
            loading._quantize_like(small, dict(params))
        small.load_weights(params, strict=True)  # shares the arrays, copies nothing
        src = small
        desc = f"mlx-lm stream_generate with draft_model = the target's first {L} layers + norm + head"
    elif isinstance(src, DraftModel):
        src = as_llama(src, lm)
        desc = (f"mlx-lm stream_generate with draft_model = {draft} as a full-vocabulary llama "
                "(logit 0 instead of -inf outside its head)")
    else:
        desc = f"mlx-lm stream_generate with draft_model = {draft}"
    ref_target, ref_draft = loading.to_mlx_lm(lm.model), loading.to_mlx_lm(src)
    mx.eval(ref_target.parameters(), ref_draft.parameters())
    return ref_target, ref_draft, desc, None


# ----------------------------------------------------------------------------- aggregation


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def acceptance_by_position(accepted: list[int], drafted: list[int], k: int) -> list[float | None]:
    """Position i (0-based) is accepted iff a step kept more than i drafts, over the steps that
    drafted more than i tokens; None where no step drafted that far."""
    out: list[float | None] = []
    for i in range(k):
        tried = [a for a, d in zip(accepted, drafted) if d > i]
        out.append(sum(a > i for a in tried) / len(tried) if tried else None)
    return out


def method_stats(rows: list[dict[str, Any]], k: int) -> dict[str, Any] | None:
    """Pooled statistics of one method's runs: tokens/s as summed tokens over summed time."""
    if not rows:
        return None
    tokens = sum(r["generated_tokens"] for r in rows)
    seconds = sum(r["total_s"] for r in rows)
    dec_tokens = sum(r["generated_tokens"] - r["first_step_tokens"] for r in rows)
    dec_s = sum(r["decode_s"] for r in rows)
    acc = [a for r in rows for a in r["accepted"]]
    dft = [d for r in rows for d in r["drafted"]]
    tau = _mean(acc)
    return {
        "runs": len(rows),
        "tokens": tokens,
        "seconds": seconds,
        "tps": tokens / seconds if seconds > 0 else 0.0,
        "decode_tps": dec_tokens / dec_s if dec_tokens > 0 and dec_s > 0 else None,
        "steps": len(acc),
        "tau": tau,
        "tokens_per_step": tau + 1 if tau is not None else None,
        "emitted_per_step": tokens / len(acc) if acc else None,
        "mean_drafted": _mean(dft),
        "acceptance": acceptance_by_position(acc, dft, k),
        "draft_ms": _mean([x for r in rows for x in r["draft_ms"]]),
        "verify_ms": _mean([x for r in rows for x in r["verify_ms"]]),
    }


def aggregate(rows: list[dict[str, Any]], k: int) -> dict[str, Any]:
    """Target-only vs speculative (vs mlx-lm) over ``rows`` of one temperature and any prompts.

    speedup = spec tps / target tps, each summed tokens over summed end-to-end seconds;
    speedup_median = median over (prompt, repeat) pairs of spec tps / target tps;
    decode_speedup = the same as speedup on decode-only tokens/s; tau = mean accepted drafts per
    step; mlx_lm_ratio = mlxspec speculative tps / mlx-lm speculative tps.
    """
    by = {m: [r for r in rows if r["method"] == m] for m in METHODS}
    st = {m: method_stats(by[m], k) for m in METHODS}
    t, s, p = st["target"], st["spec"], st["mlx_lm"]

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    target_of = {(r["prompt_id"], r["repeat"]): r for r in by["target"]}
    pair_ratios = [ratio(r["tps"], target_of[(r["prompt_id"], r["repeat"])]["tps"])
                   for r in by["spec"] if (r["prompt_id"], r["repeat"]) in target_of]
    pair_ratios = [x for x in pair_ratios if x is not None]
    checks = [r for r in by["spec"] if r.get("identical_to_target") is not None]
    peer_checks = [r for r in by["mlx_lm"] if r.get("identical_to_target") is not None]
    speedup = ratio(s and s["tps"], t and t["tps"])
    return {
        "prompts": len({r["prompt_id"] for r in rows}),
        "methods": st,
        "target_tps": t and t["tps"],
        "spec_tps": s and s["tps"],
        "speedup": speedup,
        "speedup_median": statistics.median(pair_ratios) if pair_ratios else None,
        "decode_speedup": ratio(s and s["decode_tps"], t and t["decode_tps"]),
        "slower": speedup is not None and speedup < 1.0,
        "tau": s and s["tau"],
        "tokens_per_step": s and s["tokens_per_step"],
        "acceptance": s["acceptance"] if s else [None] * k,
        "draft_ms": s and s["draft_ms"],
        "verify_ms": s and s["verify_ms"],
        "target_ms_per_token": t and t["verify_ms"],
        "mlx_lm": None if p is None else {
            "tps": p["tps"],
            "decode_tps": p["decode_tps"],
            "tau": p["tau"],
            "tokens_per_step": p["tokens_per_step"],
            "acceptance": p["acceptance"],
            "ratio": ratio(s and s["tps"], p["tps"]),
            "speedup_vs_target": ratio(p["tps"], t and t["tps"]),
            # informational: mlx-lm's llama differs from ours in float details
            "greedy_identical": (all(r["identical_to_target"] for r in peer_checks) if peer_checks else None),
        },
        "greedy_identical": all(r["identical_to_target"] for r in checks) if checks else None,
        "greedy_mismatches": [r["prompt_id"] for r in checks if not r["identical_to_target"]],
    }


def _first_mismatch(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _fmt_t(t: float) -> str:
    return f"T={t:g}"


def verdicts(result: dict[str, Any]) -> list[str]:
    """Plain-text summary lines, one verdict per temperature, then problems."""
    s = result["settings"]
    lines = []
    for res in result["results"]:
        o = res["overall"]
        head = f"{_fmt_t(res['temperature'])}, {s['draft']} k={s['k']}:"
        if o["speedup"] is None:
            lines.append(f"{head} no timed runs")
            continue
        nums = (f"{o['spec_tps']:.1f} vs {o['target_tps']:.1f} tok/s end-to-end, "
                f"median per prompt {_f(o['speedup_median'], '{:.2f}x')}, decode-only "
                f"{_f(o['decode_speedup'], '{:.2f}x')}, tau {_f(o['tau'], '{:.2f}')})")
        if o["slower"]:
            line = f"{head} speculation is SLOWER than target-only here: {o['speedup']:.2f}x ({nums}"
        else:
            line = f"{head} speculation is {o['speedup']:.2f}x target-only ({nums}"
        slow = [c for c, a in res["categories"].items() if a["slower"]]
        if slow and len(res["categories"]) > 1:
            line += f"; slower in: {', '.join(slow)}"
        lines.append(line)
        if o["mlx_lm"] is not None and o["mlx_lm"]["ratio"] is not None:
            m = o["mlx_lm"]
            lines.append(f"{head} mlxspec / mlx-lm speculative = {m['ratio']:.2f}x ({o['spec_tps']:.1f} vs "
                         f"{m['tps']:.1f} tok/s; tau {_f(o['tau'], '{:.2f}')} vs {_f(m['tau'], '{:.2f}')})")
            if m["greedy_identical"] is False:
                lines.append(f"{head} note: mlx-lm's greedy output differs from mlxspec target-only on some prompt(s)")
        if o["greedy_mismatches"]:
            lines.append(f"{head} BUG: greedy speculative output differs from target-only on prompt(s) "
                         f"{', '.join(map(str, o['greedy_mismatches']))}")
    return lines


# ----------------------------------------------------------------------------- the benchmark


def prepare_speculative_run(model_spec: Any, draft: str, dtype: str, items: list[dict[str, Any]],
                            max_tokens: int, no_drafter: str) -> tuple[Any, Any, set[int], list[list[int]]]:
    """What spec_bench and the sweep both start from: the target (a spec, or an already loaded
    model), its drafter, the stop tokens and every prompt encoded and checked against the context."""
    from mlxspec.errors import MlxspecError
    from mlxspec.targets import loading
    from mlxspec.targets.drafts import make_drafter
    from mlxspec.targets.tokenizer import encode_prompt, stop_token_ids

    lm = model_spec if hasattr(model_spec, "model") and hasattr(model_spec, "tokenizer") else loading.load(model_spec, dtype)
    drafter = make_drafter(draft, lm, lm.dtype)
    if drafter is None:
        raise MlxspecError(no_drafter)
    ids = [encode_prompt(lm.tokenizer, it["text"]) for it in items]
    for it, p in zip(items, ids):
        if len(p) + max_tokens >= lm.context_length:
            raise MlxspecError(f"prompt {it['id']} ({len(p)} tokens) + {max_tokens} new tokens exceeds "
                               f"the context ({lm.context_length})")
    return lm, drafter, stop_token_ids(lm.tokenizer), ids


def spec_bench(
    model_spec: Any = "default",
    draft: str = "ngram:3",
    k: int = 4,
    temps: tuple[float, ...] = (0.0, 1.0),
    categories: list[str] | tuple[str, ...] | None = None,
    per_category: int = 2,
    max_tokens: int = 64,
    warmup: int = 1,
    repeats: int = 1,
    with_mlx_lm: bool = True,
    prompts_file: str | Path | None = None,
    seed: int = 0,
    progress: Callable[[int, int, str], Any] | None = None,
    dtype: str = "auto",
) -> dict[str, Any]:
    """Speculative (``draft``, ``k``) against target-only decoding of ``model_spec`` (a spec for
    ``loading.load`` or an already loaded ``LoadedModel``), per Spec-Bench category and overall,
    per temperature; plus mlx-lm's own speculative decoding with the same pair when the drafter
    is a model (``self:L``: a truncated copy of the target; a model path: that model).

    Prompts: ``spec_bench_prompts`` (chat template applied). For each temperature and prompt:
    target-only (``generate(drafter=None)``) and speculative (same seed, same ``max_tokens``,
    the tokenizer's real end-of-sequence set), order alternating across prompts and repeats,
    after ``warmup`` untimed rounds of every method per temperature (``WARMUP_TOKENS`` tokens,
    first prompt). Headline tokens/s is END-TO-END: generated tokens / (prefill + decode)
    seconds; decode-only tokens/s is kept too. Greedy speculative output must equal target-only
    output token for token (``identical_to_target``; a mismatch is reported as a bug).

    mlx-lm peer: ``stream_generate(draft_model=..., num_draft_tokens=k, sampler=make_sampler(T))``
    timed the same way. Its accepted tokens per step are rebuilt from the ``from_draft`` flags
    (``mlx_lm_steps``). Note that at T > 0 mlx-lm accepts a draft token only if the target's
    *sampled* token equals it (no rejection sampling), so its acceptance is lower than ours by
    construction there.

    Result (JSON-serialisable): date, machine, backend, blas, mlx_version, mlx_lm_version,
    model, dtype, settings, note, prompts[{id, category, source_category, prompt_tokens}],
    mlx_lm ({description, note} or None), mlx_lm_reason, runs[per-run rows], results[{temperature,
    categories{cat: aggregate}, overall: aggregate}], verdicts[str]. See ``aggregate``.
    """
    from mlxspec.core.drafters import parse_k
    from mlxspec.core.sampling import SamplingParams
    from mlxspec.errors import MlxspecError

    k = parse_k(k)
    if max_tokens < 1:
        raise MlxspecError(f"max_tokens must be >= 1, got {max_tokens}")
    if repeats < 1 or warmup < 0:
        raise MlxspecError("repeats must be >= 1 and warmup >= 0")
    temps = tuple(float(t) for t in temps)
    if not temps:
        raise MlxspecError("no temperatures to run")
    params_of = {t: SamplingParams(temperature=t) for t in temps}  # validates them

    items, note = spec_bench_prompts(categories, per_category, prompts_file)
    lm, drafter, stop, ids = prepare_speculative_run(
        model_spec, draft, dtype, items, max_tokens, no_drafter="spec_bench needs a drafter (got 'none')")

    ref_target = ref_draft = peer_desc = None
    peer_reason = "not requested (with_mlx_lm=False)"
    if with_mlx_lm:
        ref_target, ref_draft, peer_desc, peer_reason = _mlx_lm_peer(lm, draft, drafter)
    methods = ["target", "spec"] + (["mlx_lm"] if ref_target is not None else [])

    def run(method: str, t: float, p: list[int], n: int) -> dict[str, Any]:
        if method == "mlx_lm":
            return _mlx_lm_run(ref_target, ref_draft, lm.tokenizer, p, t, n, k, seed)
        return _mlxspec_run(method, lm, p, params_of[t], n, stop, seed,
                            drafter if method == "spec" else None, k)

    rows: list[dict[str, Any]] = []
    total = len(temps) * len(items) * repeats * len(methods)
    done = 0
    for ti, t in enumerate(temps):
        for _ in range(warmup):
            for m in methods:
                run(m, t, ids[0], min(max_tokens, WARMUP_TOKENS))
        for r in range(repeats):
            for j, (it, p) in enumerate(zip(items, ids)):
                order = methods if (ti + j + r) % 2 == 0 else methods[::-1]
                got = {}
                for pos, m in enumerate(order):
                    row = run(m, t, p, max_tokens)
                    row.update(temperature=t, prompt_id=it["id"], category=it["category"], repeat=r, order=pos,
                               identical_to_target=None, first_mismatch=None)
                    got[m] = row
                    rows.append(row)
                    done += 1
                    if progress is not None:
                        progress(done, total, f"{_fmt_t(t)} · {METHOD_LABELS[m]} · {it['category']} #{it['id']}"
                                 f" · repeat {r + 1}/{repeats}")
                if t == 0:
                    for m in methods[1:]:
                        mm = _first_mismatch(got["target"]["tokens"], got[m]["tokens"])
                        got[m].update(identical_to_target=mm is None, first_mismatch=mm)

    results = []
    cats = list(dict.fromkeys(it["category"] for it in items))
    for t in temps:
        tr = [r for r in rows if r["temperature"] == t]
        results.append({
            "temperature": t,
            "categories": {c: aggregate([r for r in tr if r["category"] == c], k) for c in cats},
            "overall": aggregate(tr, k),
        })

    result = {
        **run_header(lm),
        "settings": {
            "draft": draft,
            "k": k,
            "temps": list(temps),
            "categories": cats,
            "per_category": per_category if prompts_file is None else None,
            "max_tokens": max_tokens,
            "warmup": warmup,
            "warmup_tokens": min(max_tokens, WARMUP_TOKENS),
            "repeats": repeats,
            "seed": seed,
            "with_mlx_lm": with_mlx_lm,
            "prompts_file": str(prompts_file) if prompts_file is not None else None,
            "headline": "end-to-end tokens/s = generated tokens / (prefill_s + decode_s)",
        },
        "note": note,
        "prompts": [{"id": it["id"], "category": it["category"],
                     "source_category": it.get("source_category", it["category"]), "prompt_tokens": len(p)}
                    for it, p in zip(items, ids)],
        "mlx_lm": None if ref_target is None else {
            "description": peer_desc,
            "note": "accepted tokens per step rebuilt from stream_generate's from_draft flags; at T > 0 "
                    "mlx-lm accepts a draft only if the target's sampled token equals it",
        },
        "mlx_lm_reason": peer_reason,
        "runs": rows,
        "results": results,
    }
    result["verdicts"] = verdicts(result)
    return result


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def _acc(xs: list[float | None]) -> str:
    return " ".join("-" if x is None else f"{x:.2f}" for x in xs)


def print_spec(result: dict[str, Any], console) -> None:
    """Render a ``spec_bench`` result: one rich table per temperature, then the verdicts."""
    from rich.table import Table
    from rich.text import Text

    s = result["settings"]
    prompts = result["prompts"]
    peer = result.get("mlx_lm") is not None
    per_cat = f" ({s['per_category']} per category)" if s.get("per_category") and not s.get("prompts_file") else ""
    for res in result["results"]:
        table = Table(
            title=(f"Speculative decoding, {_fmt_t(res['temperature'])}: {result['model']} ({result['dtype']}) "
                   f"+ {s['draft']}, k={s['k']} — {result['backend']}"),
            caption=(f"{len(prompts)} prompts{per_cat}, {s['max_tokens']} new tokens max, {s['warmup']} warm-up, "
                     f"{s['repeats']} repeat(s). tok/s end-to-end (prefill included); speedup = summed spec tok/s / "
                     f"summed target tok/s (median: of per-prompt ratios); tau = accepted drafts per step; "
                     f"acc = acceptance by draft position"
                     + ("; vs mlx-lm = mlxspec / mlx-lm speculative tok/s" if peer else "")),
        )
        cols = [("category", "left"), ("target\ntok/s", "right"), ("spec\ntok/s", "right"),
                ("speedup", "right"), ("median", "right"), ("tau", "right"), ("acc by\nposition", "left"),
                ("draft\nms", "right"), ("verify\nms", "right")]
        if peer:
            cols += [("mlx-lm\ntok/s", "right"), ("vs\nmlx-lm", "right"), ("mlx-lm\ntau", "right")]
        entries = list(res["categories"].items()) + [("overall", res["overall"])]
        rows = []
        for name, a in entries:
            sp = _f(a["speedup"], "{:.2f}x")
            if a["slower"]:
                sp = f"[red]{sp} SLOWER[/]"
            if a["greedy_mismatches"]:
                sp += " [bold red]MISMATCH[/]"
            cells = [name, _f(a["target_tps"]), _f(a["spec_tps"]), sp,
                     _f(a["speedup_median"], "{:.2f}x"), _f(a["tau"], "{:.2f}"), _acc(a["acceptance"]),
                     _f(a["draft_ms"]), _f(a["verify_ms"])]
            if peer:
                m = a["mlx_lm"] or {}
                cells += [_f(m.get("tps")), _f(m.get("ratio"), "{:.2f}x"), _f(m.get("tau"), "{:.2f}")]
            rows.append(cells)
        for c, (col, just) in enumerate(cols):
            # never cut a number: a column may wrap at spaces but is at least its longest word wide
            longest = max(len(w) for r in rows for w in Text.from_markup(r[c]).plain.split())
            table.add_column(col, justify=just, no_wrap=c == 0, min_width=longest)
        for i, cells in enumerate(rows):
            table.add_row(*cells, style="bold" if i == len(rows) - 1 else None, end_section=i == len(rows) - 2)
        console.print(table)
    if result.get("note"):
        console.print(f"[yellow]note:[/] {result['note']}")
    if not peer and s.get("with_mlx_lm"):
        console.print(f"[dim]mlx-lm peer: none ({result.get('mlx_lm_reason')})[/]")
    for line in result["verdicts"]:
        style = "red" if ("SLOWER" in line or "BUG" in line) else "green" if "speculation is" in line else ""
        console.print(f"[{style}]{line}[/]" if style else line, highlight=False)
