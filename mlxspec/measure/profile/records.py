"""The records of ``mlxspec profile``: the options it takes, each part of a step (``Phase``),
target passes over L tokens (``VerifyPass``), each forward path side by side (``PathTiming``),
and the ``StepProfile`` whose ``to_json()`` is the command's JSON (schema 2, see ``runs``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mlxspec.core.drafters import parse_k
from mlxspec.errors import MlxspecError
from mlxspec.measure.runs import SCHEMA, RunHeader
from mlxspec.measure.verdict import Comparison

SYNCS_PER_STEP = 2  # the engine evaluates the proposal, then the verify pass with its decision


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


NO_DRAFTER = "profile needs a drafter; --draft none drafts nothing (try --draft default or ngram:3)"


@dataclass(frozen=True)
class ProfileOptions:
    """What ``mlxspec profile`` is asked for; a field's name is its flag's. ``model``: a spec or
    a loaded model; ``steps`` instrumented steps after ``warmup`` untimed ones; ``repeats``
    rounds of target passes (and, with ``compare``, of every forward path)."""

    model: Any = "default"
    draft: str = "default"
    k: int = 5
    temp: float = 0.0
    steps: int = 24
    warmup: int = 4
    repeats: int = 7
    dtype: str = "auto"
    seed: int = 0
    compare: bool = False

    def checked(self) -> ProfileOptions:
        """The options, bad ones refused before anything loads."""
        if self.draft in ("none", ""):
            raise MlxspecError(NO_DRAFTER)
        parse_k(self.k)
        if self.steps < 1 or self.repeats < 1 or self.warmup < 0:
            raise MlxspecError("--steps and --repeats must be >= 1, --warmup >= 0")
        return self


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
    sync_ms: float | None  # one host round trip (mx.eval of a trivial graph); None on an eager backend
    engine_step_ms: float | None  # median draft + verify ms per step of the real engine
    accepted_mean: float  # accepted drafts per profiled step
    paths: list[PathTiming] | None = None  # with --compare
    eager: bool = False  # torch: the build parts hold the arithmetic (``stepper``)

    @property
    def instrumented_ms(self) -> float:
        return sum(p.ms for p in self.phases)

    @property
    def python_ms(self) -> float | None:
        """Host-side Python per step: graph building plus bookkeeping; None where the backend
        computes while the graph is built (eager), so Python cannot be told apart."""
        if self.eager:
            return None
        return sum(p.ms for p in self.phases if p.name in PYTHON_PHASES)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, **self.header.to_json(), "command": "profile",
            "settings": asdict(self.settings),
            "phases": [p.to_json() for p in self.phases],
            "instrumented_step_ms": self.instrumented_ms, "python_ms": self.python_ms,
            "eager": self.eager, "sync_ms": self.sync_ms, "syncs_per_step": SYNCS_PER_STEP,
            "engine_step_ms": self.engine_step_ms, "accepted_mean": self.accepted_mean,
            "verify": [asdict(v) for v in self.verify], "verify_slope": self.slope,
            "paths": None if self.paths is None else [p.to_json() for p in self.paths],
        }


DRAFT_BUILD, DRAFT_EVAL = "draft: build graph (Python)", "draft: evaluate"
TARGET_BUILD, TARGET_EVAL = "target pass: build graph (Python)", "target pass: evaluate"
ACCEPT, BOOKKEEPING = "acceptance rule", "host: read back, rewind, commit"
PHASES = (DRAFT_BUILD, DRAFT_EVAL, TARGET_BUILD, TARGET_EVAL, ACCEPT, BOOKKEEPING)
PYTHON_PHASES = (DRAFT_BUILD, TARGET_BUILD, BOOKKEEPING)
