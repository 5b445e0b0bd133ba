"""What ``spec_bench``'s runs add up to: per temperature, per category and overall, target-only
against speculative (and mlx-lm's peer), paired by (prompt, repeat), and the verdicts in words.

Timing, the same for every method: total_s = prefill_s + decode_s, from the generator's first
instruction to its last token; tps = generated tokens / total_s, END-TO-END (prefill included),
the headline number; decode_tps = (generated tokens - tokens of the first step) / decode_s.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from mlxspec.measure.bench.common import fmt_t, ratio
from mlxspec.core.runs import Run
from mlxspec.measure.runs import MethodStats, fmt, method_stats
from mlxspec.measure.verdict import Comparison, Kind, Verdict, pooled_ratio

METHODS = ("target", "spec", "against", "mlx_lm", "llama_cpp")
METHOD_LABELS = {"target": "target-only", "spec": "speculative", "against": "speculative (--against)",
                 "mlx_lm": "mlx-lm speculative", "llama_cpp": "llama.cpp plain"}


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


def paired_speed(a: Sequence[SpecRun], b: Sequence[SpecRun]) -> Comparison:
    """End-to-end tokens/s of runs ``a`` over runs ``b``, paired by (prompt, repeat), pooled."""
    of_b = {(r.prompt_id, r.repeat): r.run for r in b}
    pairs = [(r.run, of_b[(r.prompt_id, r.repeat)]) for r in a if (r.prompt_id, r.repeat) in of_b]
    return pooled_ratio([x.generated_tokens for x, _ in pairs], [x.total_s for x, _ in pairs],
                        [y.generated_tokens for _, y in pairs], [y.total_s for _, y in pairs])


@dataclass(frozen=True)
class PeerStats:
    """Another method over the same runs (mlx-lm's decoding, or the ``--against`` drafter), and
    the benchmarked drafter's speed against it."""

    stats: MethodStats
    ratio: float | None  # mlxspec speculative tps / the other's tps, each pooled over its runs
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
    against: PeerStats | None = None
    llama_cpp: PeerStats | None = None
    # greedy: per prompt, how many tokens llama.cpp's reply shares with our target-only one
    llama_cpp_prefix: tuple[int, ...] = ()
    llama_cpp_runs_identical: tuple[bool, ...] = ()

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
        return ratio(self.spec_tps, self.target_tps)

    @property
    def decode_speedup(self) -> float | None:
        return ratio(self.spec and self.spec.decode_tps, self.target and self.target.decode_tps)

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
            "against": None if self.against is None else self.against.to_json(),
            "llama_cpp": None if self.llama_cpp is None else self.llama_cpp.to_json(),
            "llama_cpp_common_prefix": list(self.llama_cpp_prefix),
            "greedy_identical": self.greedy_identical, "greedy_mismatches": list(self.greedy_mismatches),
        }


def _pair_ratios(a: Sequence[SpecRun], b: Sequence[SpecRun]) -> list[float]:
    of_b = {(r.prompt_id, r.repeat): r.run for r in b}
    out = [ratio(r.run.tps, of_b[(r.prompt_id, r.repeat)].tps) for r in a if (r.prompt_id, r.repeat) in of_b]
    return [x for x in out if x is not None]


def _greedy_check(runs: Sequence[SpecRun]) -> bool | None:
    checks = [r.identical_to_target for r in runs if r.identical_to_target is not None]
    return all(checks) if checks else None


def aggregate(runs: Sequence[SpecRun], k: int) -> Aggregate:
    """``Aggregate`` of ``runs`` (one temperature, any prompts)."""
    by = {m: [r for r in runs if r.method == m] for m in METHODS}
    st = {m: method_stats([r.run for r in by[m]], k) for m in METHODS}
    def beside(m: str) -> PeerStats | None:
        if st[m] is None:
            return None
        return PeerStats(st[m], ratio(st["spec"] and st["spec"].tps, st[m].tps), paired_speed(by["spec"], by[m]),
                         ratio(st[m].tps, st["target"] and st["target"].tps), _greedy_check(by[m]))

    ratios = _pair_ratios(by["spec"], by["target"])
    return Aggregate(
        k=k, prompts=len({r.prompt_id for r in runs}), methods=st, comparison=paired_speed(by["spec"], by["target"]),
        speedup_median=statistics.median(ratios) if ratios else None, mlx_lm=beside("mlx_lm"),
        greedy_identical=_greedy_check(by["spec"] + by["against"]),
        greedy_mismatches=[r.prompt_id for r in by["spec"] + by["against"] if r.identical_to_target is False],
        against=beside("against"), llama_cpp=beside("llama_cpp"),
        llama_cpp_prefix=tuple(len(r.run.tokens) if r.first_mismatch is None else r.first_mismatch
                               for r in by["llama_cpp"] if r.identical_to_target is not None),
        llama_cpp_runs_identical=tuple(r.identical_to_target for r in by["llama_cpp"]
                                       if r.identical_to_target is not None),
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


def _peer_verdicts(head: str, o: Aggregate, peer_kind: str) -> list[Verdict]:
    m = o.mlx_lm
    if m is None or m.ratio is None:
        return []
    c = m.comparison
    out = [Verdict(c.kind, f"{head} mlxspec / mlx-lm {peer_kind} = {m.ratio:.2f}x ({o.spec_tps:.1f} vs "
                           f"{m.stats.tps:.1f} tok/s; {c.describe()}; tau {fmt(o.spec and o.spec.tau, '{:.2f}')} "
                           f"vs {fmt(m.stats.tau, '{:.2f}')})", c.interval)]
    if m.greedy_identical is False:
        out.append(Verdict(Kind.NOTE, f"{head} note: mlx-lm's greedy output differs from mlxspec target-only "
                                      "on some prompt(s)"))
    return out


def _against_verdict(head: str, o: Aggregate, against: str) -> list[Verdict]:
    a = o.against
    if a is None or a.ratio is None:
        return []
    c = a.comparison
    return [Verdict(c.kind, f"{head} against {against}: {a.ratio:.2f}x ({o.spec_tps:.1f} vs {a.stats.tps:.1f} tok/s; "
                            f"{c.describe()}; {against} {fmt(a.speedup_vs_target, '{:.2f}x')} target-only; tau "
                            f"{fmt(o.spec and o.spec.tau, '{:.2f}')} vs {fmt(a.stats.tau, '{:.2f}')})", c.interval)]


def _llama_cpp_verdicts(head: str, o: Aggregate) -> list[Verdict]:
    """Ours against llama.cpp's plain decoding of the same file: the benchmarked drafter and
    target-only, and (greedy) how far the replies agree."""
    m = o.llama_cpp
    if m is None or m.ratio is None:
        return []
    c = m.comparison
    text = (f"{head} mlxspec / llama.cpp plain = {m.ratio:.2f}x ({o.spec_tps:.1f} vs {m.stats.tps:.1f} tok/s; "
            f"{c.describe()}; target-only / llama.cpp {fmt(ratio(o.target_tps, m.stats.tps), '{:.2f}x')}; "
            f"decode {fmt(o.spec and o.spec.decode_tps)} vs {fmt(m.stats.decode_tps)} tok/s)")
    out = [Verdict(c.kind, text, c.interval)]
    if o.llama_cpp_prefix:
        same = sum(1 for r in o.llama_cpp_runs_identical if r)
        out.append(Verdict(Kind.NOTE, f"{head} llama.cpp's greedy reply equals our target-only one on {same} of "
                                      f"{len(o.llama_cpp_prefix)} runs; tokens in common before they part: median "
                                      f"{statistics.median(o.llama_cpp_prefix):g} (the same weights, other "
                                      "arithmetic: they part at near-ties)"))
    return out


def verdicts(results: Sequence[TempResult], draft: str, k: int | str, peer_kind: str = "speculative",
             against: str | None = None, filters: str = "") -> list[Verdict]:
    """One verdict per temperature (faster / slower / no measurable difference, with its
    interval), the ``against`` drafter and mlx-lm (``peer_kind``: speculative or target-only)
    where they ran, then problems. ``filters``: the sampling filters at T > 0 (" min-p=0.1")."""
    out: list[Verdict] = []
    for res in results:
        o = res.overall
        head = f"{fmt_t(res.temperature)}{filters if res.temperature > 0 else ''}, {draft} k={k}:"
        if o.speedup is None:
            out.append(Verdict(Kind.EMPTY, f"{head} no timed runs"))
            continue
        slow_in = [c for c, a in res.categories.items() if a.slower] if len(res.categories) > 1 else []
        out.append(_headline(head, o, slow_in))
        out += _against_verdict(head, o, against or "")
        out += _peer_verdicts(head, o, peer_kind)
        out += _llama_cpp_verdicts(head, o)
        if o.greedy_mismatches:
            out.append(Verdict(Kind.BUG, f"{head} BUG: greedy speculative output differs from target-only on "
                                         f"prompt(s) {', '.join(map(str, o.greedy_mismatches))}"))
    return out
