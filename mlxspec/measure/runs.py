"""What every measurement shares: runs, the run header, and the prompt sets.

* runs: ``engine_run`` (one generation collected into a ``core.runs.Run``), ``timed_tokens``
  for a generator timed from outside (mlx-lm's); ``method_stats`` pools runs;
* ``RunHeader``: where and on what a measurement ran: the first keys of every result JSON;
* prompts: ``data_dir`` (the shared data folder), ``spec_bench_prompts`` (a balanced
  Spec-Bench subset, or a prompts file), ``encode_prompts``, ``prepare_speculative_run``.

Result JSON (bench, sweep, eval-draft), ``"schema": 2``: as schema 1 (the keys each command's
docstring lists), except that verdicts are objects ``{"kind", "text", "interval"}`` instead of
strings: ``kind`` is a ``verdict.Kind`` value ("faster", "slower", "no measurable difference",
"info", "note", "cause", "bug", ...), ``interval`` is ``{"lo", "hi", "level", "pairs"}`` (a
bootstrap interval of a paired ratio, see ``verdict``) or null. Schema 1 results carry no
``schema`` key.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from mlxspec.core.runs import Run, acceptance_by_position, collect_run
from mlxspec.errors import MlxspecError
from mlxspec.session import Session
from mlxspec.runtime import BLAS, backend_description, torch_description
from mlxspec.targets import loading
from mlxspec.targets.drafts import make_drafter
from mlxspec.targets.tokenizer import encode_prompt, stop_token_ids
from mlxspec.targets.store import data_dir  # noqa: F401  (re-exported: measurements read their prompts there)

SCHEMA = 2

QUESTIONS_FILE = "spec_bench_questions.jsonl"
# Used when the shared data folder is missing.
FALLBACK_PROMPTS: tuple[str, ...] = (
    "Write a short paragraph about the history of the bicycle.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "A shop sells pens at 3 dollars each. How much do 7 pens cost? Explain step by step.",
)
SPEC_BENCH_CATEGORIES: tuple[str, ...] = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
# Spec-Bench's first 80 questions (ids 81-160) are MT-Bench's, under these 8 categories.
MT_BENCH_IDS = range(81, 161)
WARMUP_TOKENS = 16  # warm-up runs are shorter: they only need to touch every code path once


# ----------------------------------------------------------------------------- the run record


def engine_run(lm: Any, ids: list[int], params: Any, max_tokens: int, stop: set[int], seed: int = 0,
               drafter: Any = None, k: Any = 4, tree: Any = None) -> Run:
    """One generation of ``lm`` with the engine (target-only without a drafter), collected."""
    return collect_run(Session(lm, drafter, k, tree, log=None).stream(ids, params, max_tokens, seed, stop_ids=stop))


def timed_tokens(tokens: Iterable[int], prompt_tokens: int, stop: Collection[int] = (),
                 max_tokens: int | None = None) -> Run:
    """A ``Run`` of a token generator timed from outside: start before the first ``next``,
    prefill ends at the first token; it ends at a token in ``stop`` (not kept: "eos") or after
    ``max_tokens`` ("length"). No step statistics (the generator reports none)."""
    out: list[int] = []
    reason = "length"
    t0 = time.perf_counter()
    t_first = t_last = t0
    for tok in tokens:
        now = time.perf_counter()
        if not out:
            t_first = now
        t_last = now
        if tok in stop:
            reason = "eos"
            break
        out.append(int(tok))
        if len(out) == max_tokens:
            break
    return Run(out, prompt_tokens, t_first - t0, t_last - t_first, stop_reason=reason)


def progress_ticker(progress: Callable[[int, int, str], Any] | None, total: int) -> Callable[[str], None]:
    """tick(label): one more unit of ``total`` done, reported to ``progress`` (if any)."""
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, label)

    return tick


def first_mismatch(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (the shorter length if one is a prefix), None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ----------------------------------------------------------------------------- statistics of runs


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def fmt(x: float | None, spec: str = "{:.1f}") -> str:
    """A number for a table cell, "-" for None."""
    return "-" if x is None else spec.format(x)


def fmt_list(xs: Sequence[float | None]) -> str:
    """Rates by position, two decimals each, "-" where unknown."""
    return " ".join("-" if x is None else f"{x:.2f}" for x in xs)


@dataclass(frozen=True)
class MethodStats:
    """Pooled statistics of one method's runs: tokens/s as summed tokens over summed time."""

    runs: int
    tokens: int
    seconds: float
    tps: float
    decode_tps: float | None
    steps: int
    tau: float | None
    tokens_per_step: float | None
    emitted_per_step: float | None
    mean_drafted: float | None
    acceptance: list[float | None]
    draft_ms: float | None
    verify_ms: float | None


def method_stats(runs: Sequence[Run], k: int) -> MethodStats | None:
    """``MethodStats`` of ``runs`` (None for none); acceptance by position up to ``k``."""
    if not runs:
        return None
    tokens = sum(r.generated_tokens for r in runs)
    seconds = sum(r.total_s for r in runs)
    dec_tokens = sum(r.decode_tokens for r in runs)
    dec_s = sum(r.decode_s for r in runs)
    acc = [a for r in runs for a in r.accepted]
    dft = [d for r in runs for d in r.drafted]
    tau = _mean(acc)
    return MethodStats(
        runs=len(runs), tokens=tokens, seconds=seconds, tps=tokens / seconds if seconds > 0 else 0.0,
        decode_tps=dec_tokens / dec_s if dec_tokens > 0 and dec_s > 0 else None, steps=len(acc), tau=tau,
        tokens_per_step=tau + 1 if tau is not None else None,
        emitted_per_step=tokens / len(acc) if acc else None, mean_drafted=_mean(dft),
        acceptance=acceptance_by_position(acc, dft, k),
        draft_ms=_mean([x for r in runs for x in r.draft_ms]), verify_ms=_mean([x for r in runs for x in r.verify_ms]),
    )


# ----------------------------------------------------------------------------- the header


@dataclass(frozen=True)
class Machine:
    platform: str
    processor: str
    cpu_count: int | None


@dataclass(frozen=True)
class RunHeader:
    """Where and on what a measurement ran."""

    date: str
    machine: Machine
    backend: str
    blas: str | None
    mlx_version: str
    mlx_lm_version: str | None
    model: str
    dtype: str
    others_busy: float | None = None  # other processes' share of all CPUs while it ran (None: not known)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def run_header(lm: Any, others_busy: float | None = None) -> RunHeader:
    """The header of a measurement on ``lm`` (a ``LoadedModel``), dated now; ``others_busy``:
    how busy other processes kept the machine meanwhile (``cpuload.CpuMeter``)."""
    import mlx.core as mx


    return RunHeader(
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        machine=Machine(platform.platform(), platform.processor() or platform.machine(), os.cpu_count()),
        backend=backend_description() if getattr(lm, "backend", "mlx") == "mlx" else torch_description(lm.backend),
        blas=BLAS.library,
        mlx_version=mx.__version__,
        mlx_lm_version=_version("mlx-lm") or _version("mlx_lm"),
        model=lm.name,
        dtype=lm.dtype,
        others_busy=others_busy,
    )


# ----------------------------------------------------------------------------- prompts


def jsonl_rows(path: Path) -> Iterator[dict[str, Any]]:
    """The objects of a JSON-lines file, blank lines skipped."""
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def fallback_prompts() -> list[dict[str, Any]]:
    """The built-in prompts as items {id, category, source_category, text}."""
    return [{"id": f"builtin-{i + 1}", "category": "builtin", "source_category": "builtin", "text": t}
            for i, t in enumerate(FALLBACK_PROMPTS)]


def spec_category(row: dict[str, Any]) -> str:
    """The Spec-Bench subtask of a question row: ids 81-160 are all ``mt_bench``."""
    qid = row.get("question_id")
    if isinstance(qid, int) and qid in MT_BENCH_IDS:
        return "mt_bench"
    return str(row.get("category", "unknown"))


def _prompt_item(row: Any, i: int, path: Path) -> dict[str, Any]:
    turns = row.get("turns") if isinstance(row, dict) else None
    if not (isinstance(turns, list) and turns and isinstance(turns[0], str)):
        raise MlxspecError(f"{path}, prompt {i + 1}: expected an object with a non-empty 'turns' list")
    return {"id": row.get("question_id", f"custom-{i + 1}"), "category": str(row.get("category", "custom")),
            "text": turns[0]}


def read_prompts_file(path: str | Path) -> list[dict[str, Any]]:
    """Prompts from a file: one per line, or JSON lines with a ``turns`` list (first turn used)."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise MlxspecError(f"cannot read prompts file {path}: {e}") from None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise MlxspecError(f"prompts file {path} has no prompts")
    if not (path.suffix == ".jsonl" or lines[0].lstrip().startswith("{")):
        return [{"id": f"custom-{i + 1}", "category": "custom", "text": ln} for i, ln in enumerate(lines)]
    items = []
    for i, ln in enumerate(lines):
        try:
            row = json.loads(ln)
        except json.JSONDecodeError as e:
            raise MlxspecError(f"{path}, prompt {i + 1}: not JSON ({e.msg})") from None
        items.append(_prompt_item(row, i, path))
    return items


def _wanted_categories(categories: Iterable[str] | None) -> list[str]:
    wanted = list(SPEC_BENCH_CATEGORIES) if not categories else list(dict.fromkeys(categories))
    unknown = [c for c in wanted if c not in SPEC_BENCH_CATEGORIES]
    if unknown:
        raise MlxspecError(f"unknown Spec-Bench categor{'y' if len(unknown) == 1 else 'ies'} "
                           f"{', '.join(map(repr, unknown))}; choose from: {', '.join(SPEC_BENCH_CATEGORIES)}")
    return wanted


def _pick_questions(path: Path, wanted: list[str], per_category: int) -> list[dict[str, Any]]:
    picked: dict[str, list[dict[str, Any]]] = {c: [] for c in wanted}
    for row in jsonl_rows(path):
        cat = spec_category(row)
        if cat in picked and len(picked[cat]) < per_category and row.get("turns"):
            picked[cat].append({"id": row["question_id"], "category": cat,
                                "source_category": row.get("category", cat), "text": row["turns"][0]})
    missing = [c for c, v in picked.items() if not v]
    if missing:
        raise MlxspecError(f"{path} has no questions for {', '.join(missing)}")
    return [it for c in wanted for it in picked[c]]


def spec_bench_prompts(
    categories: Iterable[str] | None = None,
    per_category: int = 2,
    prompts_file: str | Path | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """The prompt set of bench and sweep, and a note (None, or why the built-in prompts are used).

    Default: for each Spec-Bench subtask (``SPEC_BENCH_CATEGORIES``, filtered by ``categories``)
    its first ``per_category`` questions in file order, first turn only. For mt_bench those are
    question ids 81, 82, ... (writing first); translation 161, ...; summarization 241, ...;
    qa 321, ...; math_reasoning 401, ...; rag 481, .... Items: {id, category, source_category,
    text}. ``prompts_file`` replaces the set (all its prompts, category "custom"). Without the
    shared data folder and no explicit ``categories``: the built-in fallback prompts.
    """
    if prompts_file is not None:
        return read_prompts_file(prompts_file), None
    if per_category < 1:
        raise MlxspecError(f"per_category must be >= 1, got {per_category}")
    wanted = _wanted_categories(categories)
    path = data_dir() / QUESTIONS_FILE
    if path.is_file():
        return _pick_questions(path, wanted, per_category), None
    if categories:
        raise MlxspecError(f"Spec-Bench questions not found at {path} (set MLXSPEC_DATA, or pass a prompts file)")
    return fallback_prompts(), f"Spec-Bench questions not found at {path}: built-in prompts used instead"


def encode_prompts(lm: Any, items: list[dict[str, Any]], max_tokens: int) -> list[list[int]]:
    """Every item's text chat-templated and encoded, each checked to leave room for
    ``max_tokens`` new tokens in the context."""

    ids = [encode_prompt(lm.tokenizer, it["text"]) for it in items]
    for it, p in zip(items, ids):
        if len(p) + max_tokens >= lm.context_length:
            raise MlxspecError(f"prompt {it['id']} ({len(p)} tokens) + {max_tokens} new tokens exceeds "
                               f"the context ({lm.context_length})")
    return ids


def prepared_prompts(items: list[dict[str, Any]], ids: list[list[int]]) -> list[dict[str, Any]]:
    """The ``prompts`` list of a result: {id, category, source_category, prompt_tokens}."""
    return [{"id": it["id"], "category": it["category"], "source_category": it.get("source_category", it["category"]),
             "prompt_tokens": len(p)} for it, p in zip(items, ids)]


def prepare_speculative_run(model_spec: Any, draft: str, dtype: str, items: list[dict[str, Any]],
                            max_tokens: int, no_drafter: str) -> tuple[Any, Any, set[int], list[list[int]]]:
    """What bench, sweep and eval-draft start from: the target (a spec, or an already loaded
    model), its drafter, the stop tokens and every prompt encoded and checked against the context.
    ``no_drafter`` is the error when ``draft`` names no drafter."""

    lm = loading.as_loaded(model_spec, dtype)
    drafter = make_drafter(draft, lm, lm.dtype)
    if drafter is None:
        raise MlxspecError(no_drafter)
    return lm, drafter, stop_token_ids(lm.tokenizer), encode_prompts(lm, items, max_tokens)
