"""The sweep's records: one timed run, what each K (auto, a tree shape) measured, the verify
costs, the settings as run and the result, whose ``to_json()`` is the result JSON (schema 2,
see ``runs``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mlxspec.core.runs import Run
from mlxspec.measure.runs import SCHEMA, RunHeader
from mlxspec.measure.sweep.costmodel import Prediction
from mlxspec.measure.sweep.diagnosis import Diagnosis, Optimum
from mlxspec.measure.verdict import Comparison, Verdict


def tree_method(shape: str) -> str:
    """The method key of a tree shape's runs ("tree 3x2"): a string, unlike the Ks."""
    return f"tree {shape}"


@dataclass(frozen=True)
class SweepRun:
    """One timed run of the sweep (k = 0: target-only, None: auto), with its ratio to the
    target-only run of the same prompt and repeat and, greedy only, where its tokens first
    differ from it."""

    k: int | str | None  # a string: a tree shape's method (``tree_method``)
    prompt_id: Any
    category: str
    repeat: int
    run: Run
    ratio: float | None = None
    first_mismatch: int | None = None

    def to_json(self) -> dict[str, Any]:
        r = self.run
        return {"k": self.k, "prompt_id": self.prompt_id, "category": self.category, "repeat": self.repeat,
                "tps": r.tps, "decode_tps": r.decode_tps, "generated_tokens": r.generated_tokens,
                "prompt_tokens": r.prompt_tokens, "steps": r.steps, "stop_reason": r.stop_reason, "total_s": r.total_s}


@dataclass(frozen=True)
class Baseline:
    tps: float
    tps_min: float
    tps_max: float
    decode_tps: float | None
    ms_per_token: float | None
    runs: int


@dataclass(frozen=True)
class KRow:
    """Everything measured at one K (None: auto, K chosen per step), then the cost model's
    prediction (none for auto) and the verdict's marks."""

    k: int | None
    runs: int
    tps: float
    tps_min: float
    tps_max: float
    decode_tps: float | None
    comparison: Comparison  # median paired speedup over target-only, with its interval
    speedup_min: float | None
    speedup_max: float | None
    acceptance: list[float | None]
    acceptance_cumulative: list[float | None]
    draft_coverage: list[float | None]
    mean_accepted: float | None
    tokens_per_step: float
    mean_drafted: float | None
    draft_ms_per_token: float
    draft_ms_per_step: float | None
    verify_ms_per_step: float | None
    verify_ms: float | None  # one target pass over K+1 tokens (None for auto)
    verify_ratio: float | None
    greedy_identical: bool | None
    greedy_mismatches: list[Any]
    prediction: Prediction | None = None
    is_optimum: bool = False
    indistinguishable: bool = False  # from the optimum
    mean_k: float | None = None  # mean K the engine allowed per step (auto: the K it chose)
    tree: str | None = None  # a tree shape's row (``k`` None then): its shape, e.g. "3x2"

    @property
    def label(self) -> str:
        return f"tree {self.tree}" if self.tree else "auto" if self.k is None else str(self.k)

    @property
    def speedup(self) -> float | None:
        return self.comparison.ratio

    @property
    def predicted_tps(self) -> float | None:
        return self.prediction and self.prediction.tps

    @property
    def predicted_speedup(self) -> float | None:
        return self.prediction and self.prediction.speedup

    def to_json(self) -> dict[str, Any]:
        iv = self.comparison.interval
        return {**{f: getattr(self, f) for f in self.__dataclass_fields__ if f not in ("comparison", "prediction")},
                "label": self.label, "speedup": self.speedup, "verdict": self.comparison.kind.value,
                "interval": None if iv is None else iv.to_json(),
                "expected_tokens": self.prediction and self.prediction.expected_tokens,
                "predicted_tps": self.predicted_tps, "predicted_speedup": self.predicted_speedup}


@dataclass(frozen=True)
class VerifyCost:
    k: int
    tokens: int
    ms: float
    ratio: float
    ms_all: list[float]


@dataclass(frozen=True)
class Verification:
    target_ms: float
    target_ms_all: list[float]
    context_tokens: int
    per_k: list[VerifyCost]
    slope: float
    kind: str


@dataclass(frozen=True)
class SweepSettings:
    ks: list[int]
    draft: str
    temperature: float
    top_p: float
    categories: list[str]
    per_category: int | None
    prompts_file: str | None
    max_tokens: int
    warmup: int
    warmup_tokens: int
    repeats: int
    seed: int
    verify_reps: int
    headline: str = "end-to-end tokens/s = generated tokens / (prefill_s + decode_s), median over runs"
    speedup: str = ("median over (prompt, repeat) pairs of K tokens/s / target-only tokens/s, with a bootstrap 95% "
                    "interval over the pairs")
    acceptance: str = ("conditional per position: P(draft i accepted | drafts before it accepted); a position the "
                       "drafter left empty counts as rejected")
    cost_model: str = ("E(K) = 1 + sum_j prod_{i<=j} a_i; T(K) = K*draft_ms_per_token + verify_ms(K); predicted tps = "
                       "E/T; target-only = 1/verification.target_ms")
    auto_max_k: int | None = None  # the auto row's largest K; None: no auto row
    trees: list[str] = field(default_factory=list)  # tree shapes timed beside the Ks ("3x2", "auto")
    tree_nodes: int | None = None  # --tree-nodes: the cap on every tree


@dataclass(frozen=True)
class SweepResult:
    header: RunHeader
    settings: SweepSettings
    note: str | None
    prompts: list[dict[str, Any]]
    baseline: Baseline
    rows: list[KRow]
    verification: Verification
    diagnosis: Diagnosis
    verdict: list[Verdict]
    runs: list[SweepRun]
    auto: KRow | None = None  # the auto row (not in ``rows``: those are the fixed Ks)
    auto_vs_best: Comparison | None = None  # auto tokens/s over the best fixed K's, paired
    trees: list[KRow] = field(default_factory=list)  # one row per tree shape
    trees_vs_best: list[Comparison | None] = field(default_factory=list)  # each over the best fixed K, paired

    @property
    def all_rows(self) -> list[KRow]:
        """The fixed Ks, then auto if it ran, then the tree shapes."""
        return [*self.rows, *([self.auto] if self.auto else []), *self.trees]

    @property
    def optimum_measured(self) -> Optimum | None:
        return self.diagnosis.optimum_measured

    @property
    def optimum_predicted(self) -> Optimum | None:
        return self.diagnosis.optimum_predicted

    @property
    def pays(self) -> bool:
        return self.diagnosis.pays

    def to_json(self) -> dict[str, Any]:
        d = self.diagnosis
        om, op = d.optimum_measured, d.optimum_predicted
        return {
            "schema": SCHEMA, **self.header.to_json(), "settings": asdict(self.settings), "note": self.note,
            "prompts": self.prompts, "baseline": asdict(self.baseline), "rows": [r.to_json() for r in self.all_rows],
            "verification": asdict(self.verification),
            "optimum_measured": om and om.to_json(),
            "optimum_predicted": op and {"k": op.k, "tps": op.tps, "speedup": op.speedup},
            "pays": d.pays, "causes": [asdict(c) for c in d.causes], "verdict": [v.to_json() for v in self.verdict],
            "runs": [r.to_json() for r in self.runs],
            "auto_vs_best": _comparison_json(self.auto_vs_best, om and om.k),
            "trees_vs_best": [dict(_comparison_json(c, om and om.k) or {}, tree=t.tree)
                              for t, c in zip(self.trees, self.trees_vs_best)],
        }


def _comparison_json(c: Comparison | None, k: int | None) -> dict[str, Any] | None:
    """Auto against the best fixed K ``k``: {k, ratio, verdict, interval}."""
    if c is None:
        return None
    return {"k": k, "ratio": c.ratio, "verdict": c.kind.value,
            "interval": None if c.interval is None else c.interval.to_json()}
