"""The speculative benchmark: speculative against target-only decoding, prompt by prompt, on a
balanced Spec-Bench subset, per temperature, with acceptance statistics and mlx-lm's own
speculative decoding as a peer (``peer``). For mlxspec the timings come from the engine's
``Done`` event (for speculation the first step's draft + verify count as prefill, the time to
the first committed tokens); mlx-lm's runs are timed from outside its generator the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from mlxspec.core.autok import parse_k_option
from mlxspec.core.drafters import can_branch
from mlxspec.core.drafters.base import MAX_K
from mlxspec.core.sampling import SamplingParams
from mlxspec.core.schedule import timed_rounds, warmup_rounds
from mlxspec.cpuload import CpuMeter
from mlxspec.errors import MlxspecError
from mlxspec.measure.bench.summary import METHOD_LABELS, SpecRun, TempResult, temp_result, verdicts
from mlxspec.measure.bench.common import Progress, fmt_t
from mlxspec.measure.bench.peer import MLX_LM_K_WITH_AUTO, MLX_LM_NOTE, Peer, choose_peer, mlx_lm_run
from mlxspec.core.runs import Run
from mlxspec.measure.runs import (
    SCHEMA, WARMUP_TOKENS, RunHeader, engine_run, first_mismatch, prepare_speculative_run, prepared_prompts, progress_ticker, run_header, spec_bench_prompts,
)
from mlxspec.measure.verdict import Verdict
from mlxspec.session import Session
from mlxspec.measure.bench.llamacpp import LlamaCpp, check_same_tokens, llama_cpp_run, open_llama_cpp, threads_of
from mlxspec.targets.drafts import branching_kinds, make_drafter


@dataclass(frozen=True)
class SpecOptions:
    """What ``bench`` was asked for. ``model``: a ``loading.load`` spec or an already loaded
    ``LoadedModel``; ``k``: an int or "auto"; ``tree``: a ``TreeShape`` every speculative step
    drafts (K is then its depth); ``peer_draft`` / ``peer_k``: mlx-lm's peer's own draft and
    draft length (default: ours, and K, or ``MLX_LM_K_WITH_AUTO`` under auto); ``against``: another
    drafter timed side by side in the same rounds, with the same K setting or tree."""

    model: Any = "default"
    draft: str = "ngram:3"
    k: int | str = 4
    temps: tuple[float, ...] = (0.0, 1.0)
    categories: list[str] | tuple[str, ...] | None = None
    per_category: int = 2
    max_tokens: int = 64
    warmup: int = 1
    repeats: int = 1
    with_mlx_lm: bool = True
    prompts_file: str | Path | None = None
    seed: int = 0
    dtype: str = "auto"
    remeasure_cost: bool = False
    tree: Any = None
    peer_draft: str | None = None
    peer_k: int | None = None
    against: str | None = None
    sampling: SamplingParams = SamplingParams()  # filters and processors of every run; ``temps`` set its temperature
    llama_cpp: bool = False  # also llama.cpp's plain decoding of the target's GGUF file

    def checked(self) -> SpecOptions:
        """The options with K parsed and the temperatures as floats; bad values refused before
        anything loads."""
        k = parse_k_option(self.k)
        if self.max_tokens < 1:
            raise MlxspecError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.repeats < 1 or self.warmup < 0:
            raise MlxspecError("repeats must be >= 1 and warmup >= 0")
        temps = tuple(float(t) for t in self.temps)
        if not temps:
            raise MlxspecError("no temperatures to run")
        if self.peer_k is not None and not 1 <= self.peer_k <= MAX_K:
            raise MlxspecError(f"--mlx-lm-k must be in 1..{MAX_K}, got {self.peer_k}")
        if (self.peer_draft is not None or self.peer_k is not None) and not self.with_mlx_lm:
            raise MlxspecError("--mlx-lm-draft and --mlx-lm-k set up mlx-lm's peer; drop --no-mlx-lm")
        if self.against is not None and self.against in ("none", "", self.draft):
            raise MlxspecError(f"--against names the drafter to compare {self.draft!r} with: another drafter, "
                               f"not {self.against or 'none'!r} (target-only runs in every benchmark)")
        return replace(self, k=k, temps=temps)


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
    against: str | None = None  # the drafter timed beside ``draft`` in the same rounds
    top_p: float = 1.0  # sampling filters at T > 0 (every method, mlx-lm's too)
    min_p: float = 0.0
    llama_cpp: str | None = None  # llama.cpp's peer as run (version, threads), when it ran


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


@dataclass(frozen=True)
class _Plan:
    """What the session made of K and the tree: the K policy each run starts from (an int or
    an ``AutoK``), the tree, K as reported, the draft positions reported, the peer's K."""

    policy: Any
    tree: Any
    k: int | str
    width: int
    peer_k: int
    rival: Any = None  # the --against drafter
    rival_policy: Any = None  # its K policy (an int, or an ``AutoK`` to copy per run)


def _plan(lm, drafter, options: SpecOptions, progress: Progress) -> _Plan:
    if options.tree is not None and not can_branch(drafter):
        raise MlxspecError(f"drafter {options.draft!r} cannot branch: --tree needs one of {branching_kinds()}")
    say = (lambda s: progress(0, None, s)) if progress else None
    session = Session(lm, drafter, options.k, options.tree, remeasure_cost=options.remeasure_cost, log=say)
    tree, policy = session.tree, session.policy
    k = tree.depth if tree is not None else options.k
    width = policy if isinstance(policy, int) else policy.max_k
    # mlx-lm has no auto K and no trees: its peer drafts a chain of --mlx-lm-k, --k or the tree's depth
    peer_k = options.peer_k or (k if isinstance(k, int) else MLX_LM_K_WITH_AUTO)
    rival = rival_policy = None
    if options.against is not None:
        rival = make_drafter(options.against, lm, lm.dtype)
        if tree is not None and not can_branch(rival):
            raise MlxspecError(f"--against {options.against!r} cannot branch, so it cannot draft --tree {tree}")
        rival_policy = Session(lm, rival, options.k, options.tree, log=say).policy
        width = max(width, rival_policy if isinstance(rival_policy, int) else rival_policy.max_k)
    return _Plan(policy, tree, k, width, peer_k, rival, rival_policy)


Runner = Callable[[str, float, list[int], int], Run]


@dataclass(frozen=True)
class SpecRunner:
    """run(method, temperature, prompt ids, max tokens) for every method of the benchmark; each
    speculative run starts from a fresh copy of an ``AutoK`` policy."""

    lm: Any
    drafter: Any
    stop: set[int]
    params_of: dict[float, Any]
    peer: Peer
    plan: _Plan
    seed: int
    cpp: LlamaCpp | None = None

    def __call__(self, method: str, t: float, p: list[int], n: int) -> Run:
        if method == "llama_cpp":
            return llama_cpp_run(self.cpp, p, self.params_of[t], n, self.stop, self.seed)
        if method == "mlx_lm":
            return mlx_lm_run(self.peer, self.lm.tokenizer, p, self.params_of[t], n, self.plan.peer_k, self.seed)
        drafter, policy = {"spec": (self.drafter, self.plan.policy),
                           "against": (self.plan.rival, self.plan.rival_policy)}.get(method, (None, 4))
        policy = policy if isinstance(policy, int) else policy.fresh()
        return engine_run(self.lm, p, self.params_of[t], n, self.stop, self.seed, drafter, policy,
                          tree=self.plan.tree if drafter is not None else None)


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


def time_spec_runs(run: Runner, methods: list[str], options: SpecOptions, items: list[dict[str, Any]],
                   ids: list[list[int]], progress: Progress) -> list[SpecRun]:
    """Per temperature: warm-up rounds on the first prompt, then every (repeat, prompt) round,
    the method order rotating by temperature, repeat and prompt (``core.schedule``), so each
    method runs in each position equally often and drift over a round favours none."""
    o = options
    runs: list[SpecRun] = []
    tick = progress_ticker(progress, len(o.temps) * len(items) * o.repeats * len(methods))
    for ti, t in enumerate(o.temps):
        for order in warmup_rounds(methods, o.warmup):
            for m in order:
                run(m, t, ids[0], min(o.max_tokens, WARMUP_TOKENS))
        for r in range(o.repeats):
            suffix = f" · repeat {r + 1}/{o.repeats}"
            for (it, p), order in timed_rounds(methods, list(zip(items, ids)), start=ti + r):
                runs += _round(run, order, t, it, p, r, o.max_tokens, lambda label, s=suffix: tick(label + s))
    return runs


def _result(lm, o: SpecOptions, plan: _Plan, prompts: tuple[list[dict[str, Any]], list[list[int]], str | None],
            peer: Peer, runs: list[SpecRun]) -> SpecBenchResult:
    """The aggregates per temperature, the settings as run and the verdicts."""
    items, ids, note = prompts
    cats = list(dict.fromkeys(it["category"] for it in items))
    results = [temp_result(runs, t, cats, plan.width) for t in o.temps]
    settings = SpecSettings(o.draft, plan.k, list(o.temps), cats, o.per_category if o.prompts_file is None else None,
                            o.max_tokens, o.warmup, min(o.max_tokens, WARMUP_TOKENS), o.repeats, o.seed,
                            o.with_mlx_lm, str(o.prompts_file) if o.prompts_file is not None else None,
                            mlx_lm_k=plan.peer_k, mlx_lm_draft=o.peer_draft,
                            tree=None if plan.tree is None else str(plan.tree), against=o.against,
                            top_p=o.sampling.top_p, min_p=o.sampling.min_p)
    shape = plan.k if plan.tree is None else f"tree {plan.tree}"
    return SpecBenchResult(run_header(lm), settings, note, prepared_prompts(items, ids), peer, runs, results,
                           verdicts(results, o.draft, shape, "target-only" if o.peer_draft == "none" else "speculative",
                                    o.against, o.sampling.filters_label))


def spec_bench(options: SpecOptions, progress: Progress = None) -> SpecBenchResult:
    """Speculative (``draft``, ``k``) against target-only decoding, per Spec-Bench category and
    overall, per temperature, plus mlx-lm's peer where it can run. Every (prompt, repeat) runs
    each method once with the same seed and ``max_tokens`` in rotating order, after warm-up
    (``time_spec_runs``); the verdict per temperature rests on a bootstrap interval of the
    speedup over those pairs. Greedy speculative output must equal target-only output token
    for token (a mismatch is reported as a bug). JSON (``to_json``): schema, the run header,
    settings, note, prompts, mlx_lm, mlx_lm_reason, runs, results[{temperature, categories,
    overall}] (``Aggregate``), verdicts.
    """
    o = options.checked()
    meter = CpuMeter()
    # validates them before any loading; the filters act at T > 0 only
    params_of = {t: replace(o.sampling, temperature=t) for t in o.temps}
    items, note = spec_bench_prompts(o.categories, o.per_category, o.prompts_file)
    lm, drafter, stop, ids = prepare_speculative_run(
        o.model, o.draft, o.dtype, items, o.max_tokens, no_drafter="spec_bench needs a drafter (got 'none')")
    peer = choose_peer(lm, o.draft, drafter, o.with_mlx_lm, o.peer_draft)
    plan = _plan(lm, drafter, o, progress)
    cpp = open_llama_cpp(lm, threads_of(lm)) if o.llama_cpp else None
    if cpp is not None:
        check_same_tokens(cpp, lm.tokenizer, ids)
    run = SpecRunner(lm, drafter, stop, params_of, peer, plan, o.seed, cpp)
    methods = (["target", "spec"] + (["against"] if plan.rival is not None else [])
               + (["mlx_lm"] if peer.target is not None else []) + (["llama_cpp"] if cpp is not None else []))
    runs = time_spec_runs(run, methods, o, items, ids, progress)
    result = _result(lm, o, plan, (items, ids, note), peer, runs)
    if cpp is not None:
        result = replace(result, settings=replace(result.settings, llama_cpp=cpp.description))
    return replace(result, header=replace(result.header, others_busy=meter.others_busy()))
