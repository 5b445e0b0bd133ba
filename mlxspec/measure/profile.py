"""``mlxspec profile``: where one speculative step's time goes.

One step of the engine is: the drafter proposes K tokens, the target runs one pass over the last
committed token and the K drafts (L = K + 1 tokens), the acceptance rule decides how many drafts
stay, and the host reads the result back, rolls the caches back and tells the drafter. This
module times each part apart, on one prompt, after warm-up, as medians over steps:

* **draft**: building the drafter's graph in Python, then evaluating it (its own host sync);
* **target pass**: building the target's graph over L tokens in Python, then evaluating it;
* **acceptance rule**: greedy prefix match (or rejection sampling at T > 0) on the evaluated
  logits, built and evaluated on its own;
* **host bookkeeping**: reading tokens back (``tolist``/``item``), trimming the KV cache,
  ``drafter.commit`` and the history;
* **host sync**: the round trip of one ``mx.eval`` on a trivial graph, times the syncs the
  engine makes per step (2), shown for scale (each eval above already includes one).

The instrumented step evaluates the target pass and the acceptance rule apart, which the engine
does in one eval; the engine's own step time (from its ``Step`` events, same prompt, drafter and
K) is reported next to the sum, and the difference is what the instrumentation adds or what
escapes it. Separately, one target pass over L = 1..K+1 tokens is timed with
``costcurve.time_verify`` (cache holding the prompt, trimmed back after each pass, rotating order,
medians), with the per-extra-token slope in one-token passes (``sweep.verify_slope``).

With ``compare=True`` (``--compare``) the target passes are also timed for each forward path
of the model side by side: ``plain`` (the blocks' own per-layer path), ``tables`` (the CPU path
of ``core.model.CpuPath``, RoPE tables and mask built once per pass, without ``mx.compile``) and
``tables+compile`` (what float models run on the CPU), in rotating order round by round, each
round one ``time_verify`` call per path; ratios are medians of the per-round ratios to ``plain``.

The result is a ``StepProfile`` record; ``to_json()`` is the JSON (schema 2, see ``runs``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import mlx.core as mx

from mlxspec.core.model import COMPILE_MAX_TOKENS
from mlxspec.errors import MlxspecError
from mlxspec.targets.costcurve import time_verify
from mlxspec.measure.runs import (
    SCHEMA,
    RunHeader,
    encode_prompts,
    engine_run,
    progress_ticker,
    run_header,
    spec_bench_prompts,
)
from mlxspec.measure.sweep import verify_slope
from mlxspec.measure.verdict import Comparison, markup, median_ratio

SYNCS_PER_STEP = 2  # the engine evaluates the proposal, then the verify pass with its decision
SYNC_PROBES = 50


@dataclass(frozen=True)
class Phase:
    """One part of a step: median ms over the profiled steps, and every sample."""

    name: str
    ms: float
    samples: list[float] = field(default_factory=list)
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class VerifyPass:
    """One target pass over ``tokens`` tokens: median ms and its cost in one-token passes."""

    tokens: int
    ms: float
    ratio: float
    samples: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class PathTiming:
    """One forward path's target passes: median ms per L, the median per-round ratio to the
    plain path per L, its own per-extra-token slope, and its speedup over the plain path: the
    median over rounds of (plain ms / this path's ms, each summed over every L), with its
    bootstrap interval (``verdict.median_ratio``: faster only when the interval excludes 1.0)."""

    path: str
    ms: list[float]
    vs_plain: list[float]
    slope: float
    speedup: Comparison
    round_ms: list[float] = field(default_factory=list)  # per round, summed over every L

    def to_json(self) -> dict[str, Any]:
        c = self.speedup
        return {"path": self.path, "ms": self.ms, "vs_plain": self.vs_plain, "slope": self.slope,
                "speedup": c.ratio, "interval": None if c.interval is None else c.interval.to_json(),
                "verdict": c.kind.value, "round_ms": self.round_ms}


@dataclass(frozen=True)
class ProfileSettings:
    model: str
    draft: str
    k: int
    temp: float
    steps: int
    warmup: int
    repeats: int
    prompt_id: Any
    prompt_tokens: int


@dataclass(frozen=True)
class StepProfile:
    header: RunHeader
    settings: ProfileSettings
    phases: list[Phase]
    verify: list[VerifyPass]
    slope: float  # extra cost of each extra verified token, in one-token passes
    sync_ms: float  # one host round trip (mx.eval of a trivial graph)
    engine_step_ms: float | None  # median draft + verify ms per step of the real engine
    accepted_mean: float  # accepted drafts per profiled step
    paths: list[PathTiming] | None = None  # with --compare

    @property
    def instrumented_ms(self) -> float:
        return sum(p.ms for p in self.phases)

    @property
    def python_ms(self) -> float:
        """Host-side Python per step: graph building plus bookkeeping."""
        return sum(p.ms for p in self.phases if p.name in PYTHON_PHASES)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, **self.header.to_json(), "command": "profile",
            "settings": asdict(self.settings),
            "phases": [p.to_json() for p in self.phases],
            "instrumented_step_ms": self.instrumented_ms, "python_ms": self.python_ms,
            "sync_ms": self.sync_ms, "syncs_per_step": SYNCS_PER_STEP,
            "engine_step_ms": self.engine_step_ms, "accepted_mean": self.accepted_mean,
            "verify": [asdict(v) for v in self.verify], "verify_slope": self.slope,
            "paths": None if self.paths is None else [p.to_json() for p in self.paths],
        }


DRAFT_BUILD, DRAFT_EVAL = "draft: build graph (Python)", "draft: evaluate"
TARGET_BUILD, TARGET_EVAL = "target pass: build graph (Python)", "target pass: evaluate"
ACCEPT, BOOKKEEPING = "acceptance rule", "host: read back, rewind, commit"
PHASES = (DRAFT_BUILD, DRAFT_EVAL, TARGET_BUILD, TARGET_EVAL, ACCEPT, BOOKKEEPING)
PYTHON_PHASES = (DRAFT_BUILD, TARGET_BUILD, BOOKKEEPING)


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


def sync_round_trip_ms(probes: int = SYNC_PROBES) -> float:
    """Median ms of one ``mx.eval`` of a one-element graph: the fixed cost of a host sync."""
    x = mx.array(0.0)
    mx.eval(x)
    times = []
    for _ in range(probes):
        t0 = time.perf_counter()
        mx.eval(x + 1.0)
        times.append(_ms(t0))
    return statistics.median(times)


class _Stepper:
    """The engine's step for one drafter, with a timer around each part (see the module
    docstring). Holds the target cache, the history and the last committed token ``y``."""

    def __init__(self, lm: Any, drafter: Any, prompt: list[int], params: Any, seed: int = 0):
        from mlxspec.core.cache import check_trimmable
        from mlxspec.core.engine import NOT_TRIMMABLE_HINT
        from mlxspec.core.prefill import prefill

        self.lm, self.drafter, self.params = lm, drafter, params
        self.model = lm.model
        self.cache = check_trimmable(self.model.make_cache(), "the target", NOT_TRIMMABLE_HINT)
        want = drafter.wants_hidden
        out = prefill(self.model, self.cache, prompt[:-1], return_hidden=want)
        hidden = out[1] if want else None
        mx.eval([c.state for c in self.cache], hidden)
        drafter.reset(prompt, hidden)
        self.history, self.y = list(prompt), prompt[-1]
        self.key = mx.random.key(seed)

    def step(self, k: int) -> tuple[dict[str, float], int]:
        """One timed step drafting ``k`` tokens: {phase: ms}, accepted drafts."""
        from mlxspec.core.cache import rewind
        from mlxspec.core.drafters import Commit
        from mlxspec.core.sampling import probs
        from mlxspec.core.verify import greedy_verify, pad_vocab, rejection_verify

        t: dict[str, float] = {}
        self.key, draft_key, verify_key = mx.random.split(self.key, 3)
        t0 = time.perf_counter()
        proposal = self.drafter.propose(self.history, k, self.params, draft_key)
        t[DRAFT_BUILD] = _ms(t0)
        t0 = time.perf_counter()
        mx.eval(proposal.tokens, proposal.q)
        t[DRAFT_EVAL] = _ms(t0)

        want = self.drafter.wants_hidden
        t0 = time.perf_counter()
        tokens = mx.concatenate([mx.array([self.y], mx.int32), proposal.tokens.astype(mx.int32)])[None]
        out = self.model(tokens, self.cache, **({"return_hidden": True} if want else {}))
        logits, hidden = (out[0][0], out[1][0]) if want else (out[0], None)
        t[TARGET_BUILD] = _ms(t0)
        t0 = time.perf_counter()
        mx.eval(logits, hidden)
        t[TARGET_EVAL] = _ms(t0)

        t0 = time.perf_counter()
        if self.params.greedy:
            n_acc, nxt = greedy_verify(proposal.tokens, logits)
        else:
            p = probs(logits, self.params)
            n_acc, nxt = rejection_verify(proposal.tokens, pad_vocab(proposal.q, p.shape[-1]), p, verify_key)
        mx.eval(n_acc, nxt)
        t[ACCEPT] = _ms(t0)

        t0 = time.perf_counter()
        drafted, n, y = proposal.tokens.tolist(), n_acc.item(), nxt.item()
        rewind(self.cache, len(drafted) - n)
        self.drafter.commit(Commit(drafted, n, y, None if hidden is None else hidden[: n + 1]))
        self.history += drafted[:n] + [y]
        self.y = y
        t[BOOKKEEPING] = _ms(t0)
        return t, n


def _profile_steps(lm: Any, drafter: Any, prompt: list[int], params: Any, k: int, steps: int, warmup: int,
                   seed: int, tick: Callable[[str], None]) -> tuple[dict[str, list[float]], list[int]]:
    """Timings of ``steps`` instrumented steps after ``warmup`` untimed ones; restarts from the
    prompt when the context would run out."""
    limit = lm.context_length - k - 2
    stepper = _Stepper(lm, drafter, prompt, params, seed)
    for _ in range(warmup):
        stepper.step(k)
    times: dict[str, list[float]] = {p: [] for p in PHASES}
    accepted = []
    for i in range(steps):
        if len(stepper.history) >= limit:
            stepper = _Stepper(lm, drafter, prompt, params, seed + i)
        t, n = stepper.step(k)
        for name, ms in t.items():
            times[name].append(ms)
        accepted.append(n)
        tick(f"step {i + 1}/{steps}")
    return times, accepted


def _engine_step_ms(lm: Any, drafter: Any, prompt: list[int], params: Any, k: int, steps: int,
                    seed: int) -> float | None:
    """Median draft + verify ms per step of the real engine, first step (prefill) excluded."""
    budget = min(steps * (k + 1), lm.context_length - len(prompt) - 1)
    run = engine_run(lm, prompt, params, budget, set(), seed, drafter, k)
    per_step = [d + v for d, v in zip(run.draft_ms[1:], run.verify_ms[1:])]
    return statistics.median(per_step) if per_step else None


def _use_path(model: Any, path: str) -> None:
    """Switch ``model`` to one forward path (``PATHS``)."""
    model.use_cpu_path = path != "plain"
    cpu = model.cpu_path()
    if cpu is not None:
        cpu.compile_max_tokens = 0 if path == "tables" else COMPILE_MAX_TOKENS


PATHS = ("plain", "tables", "tables+compile")


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


NO_DRAFTER = "profile needs a drafter; --draft none drafts nothing (try --draft default or ngram:3)"


def profiled_draft(draft: str, model_spec: Any) -> str:
    """The drafter ``--draft`` names. ``default`` is the registry's default for the target; where
    that is ``none`` (target-only decoding is the default) it is the target's first shipped draft
    that is present, else ``ngram:3``: a step that drafts nothing has nothing to break down."""
    from mlxspec.targets import store
    from mlxspec.targets.drafts import DEFAULT_FALLBACK
    from mlxspec.targets.loading import resolve

    if draft != "default":
        return draft
    target = model_spec.name if hasattr(model_spec, "name") else resolve(model_spec)[0]
    name = store.default_draft(target)
    if name and name != "none":
        return name
    shipped = [d["name"] for d in store.drafts() if d["target"] == target and d["present"]]
    return shipped[0] if shipped else DEFAULT_FALLBACK


def _check(draft: str, k: int, steps: int, warmup: int, repeats: int) -> None:
    """Refuse bad arguments before anything loads."""
    from mlxspec.core.drafters import parse_k

    if draft in ("none", ""):
        raise MlxspecError(NO_DRAFTER)
    parse_k(k)
    if steps < 1 or repeats < 1 or warmup < 0:
        raise MlxspecError("--steps and --repeats must be >= 1, --warmup >= 0")


def profile_step(model_spec: Any = "default", draft: str = "default", k: int = 5, temp: float = 0.0,
                 steps: int = 24, warmup: int = 4, repeats: int = 7, dtype: str = "auto", seed: int = 0,
                 progress: Callable[[int, int, str], Any] | None = None, compare: bool = False) -> StepProfile:
    """Profile one speculative step of ``draft`` on ``model_spec`` at K = ``k`` (module docstring).
    ``steps`` instrumented steps (after ``warmup``), ``repeats`` rounds of target passes (and,
    with ``compare``, of every forward path)."""
    from mlxspec.core.sampling import SamplingParams
    from mlxspec.targets import loading
    from mlxspec.targets.drafts import make_drafter

    _check(draft, k, steps, warmup, repeats)
    draft = profiled_draft(draft, model_spec)
    params = SamplingParams(temp)
    lm = model_spec if hasattr(model_spec, "model") else loading.load(model_spec, dtype)
    drafter = make_drafter(draft, lm, lm.dtype)
    if drafter is None:
        raise MlxspecError(NO_DRAFTER)
    items, _ = spec_bench_prompts(per_category=1)
    item = items[0]
    prompt = encode_prompts(lm, [item], steps * (k + 1))[0]
    tick = progress_ticker(progress, steps + repeats * (2 if compare else 1) + 1)

    sizes = list(range(1, k + 2))
    vt = time_verify(lm.model, prompt, sizes, reps=repeats, progress=lambda r: tick(f"target passes {r}/{repeats}"))
    med = {n: statistics.median(v) for n, v in vt.items()}
    verify = [VerifyPass(n, med[n], med[n] / med[1], vt[n]) for n in sizes]
    slope = verify_slope([n - 1 for n in sizes[1:]], [v.ratio for v in verify[1:]])

    times, accepted = _profile_steps(lm, drafter, prompt, params, k, steps, warmup, seed, tick)
    phases = [Phase(name, statistics.median(times[name]), times[name]) for name in PHASES]
    engine_ms = _engine_step_ms(lm, drafter, prompt, params, k, steps, seed)
    tick("engine")
    paths = compare_paths(lm.model, prompt, sizes, repeats, tick) if compare else None
    settings = ProfileSettings(lm.name, drafter.name, k, temp, steps, warmup, repeats, item["id"], len(prompt))
    return StepProfile(run_header(lm), settings, phases, verify, slope, sync_round_trip_ms(), engine_ms,
                       sum(accepted) / len(accepted), paths)


# ----------------------------------------------------------------------------- printing


def _phase_table(result: StepProfile):
    from rich.table import Table

    s = result.settings
    total = result.instrumented_ms
    t = Table(title=f"one step: {s.model} + {s.draft}, K={s.k}, T={s.temp:g} "
                    f"(medians of {s.steps} steps, {s.prompt_tokens}-token prompt)")
    t.add_column("part")
    t.add_column("ms", justify="right")
    t.add_column("share", justify="right")
    for p in result.phases:
        t.add_row(p.name, f"{p.ms:.2f}", f"{p.ms / total:.0%}" if total > 0 else "-")
    t.add_row("[bold]sum (instrumented step)[/]", f"[bold]{total:.2f}[/]", "100%")
    t.add_row("  of which Python (graph building + bookkeeping)", f"{result.python_ms:.2f}",
              f"{result.python_ms / total:.0%}" if total > 0 else "-")
    t.add_row(f"  one host sync (engine: {SYNCS_PER_STEP} a step, inside the evals)",
              f"{result.sync_ms:.3f}", "")
    if result.engine_step_ms is not None:
        t.add_row("engine step (draft + verify, same K)", f"{result.engine_step_ms:.2f}", "")
    return t


def _verify_table(result: StepProfile):
    from rich.table import Table

    t = Table(title=f"target pass over L tokens (medians of {result.settings.repeats})")
    t.add_column("L", justify="right")
    t.add_column("ms", justify="right")
    t.add_column("x one token", justify="right")
    for v in result.verify:
        t.add_row(str(v.tokens), f"{v.ms:.2f}", f"{v.ratio:.2f}")
    return t


def _paths_table(result: StepProfile):
    from rich.table import Table

    paths = result.paths or []
    t = Table(title=f"target pass per forward path, side by side (ms, medians of {result.settings.repeats} rounds)")
    t.add_column("L", justify="right")
    for p in paths:
        t.add_column(p.path, justify="right")
    for i, v in enumerate(result.verify):
        t.add_row(str(v.tokens), *(f"{p.ms[i]:.1f}" for p in paths))
    t.add_row("slope", *(f"{p.slope:.3f}" for p in paths))

    def speed(c: Comparison) -> str:
        if c.ratio is None:
            return "-"
        text = f"{c.ratio:.2f}x" + ("" if c.interval is None else f" [{c.interval.lo:.2f}, {c.interval.hi:.2f}]")
        return markup(c.kind, text)

    t.add_row("speedup", *("1.00x" if p.path == "plain" else speed(p.speedup) for p in paths))
    return t


def print_profile(result: StepProfile, console) -> None:
    """The step breakdown and the verify-cost table, then one line on the slope."""
    console.print(_phase_table(result))
    console.print(_verify_table(result))
    if result.paths:
        console.print(_paths_table(result))
    console.print(f"each extra verified token costs [bold]{result.slope:.3f}[/] of a one-token pass "
                  f"(least-squares slope over L = 2..{result.settings.k + 1}); accepted "
                  f"{result.accepted_mean:.2f} drafts per profiled step")

