"""Live statistics of one turn, computed from the steps the worker posted (the engine's
``Step`` events, collected by ``RunCollector`` as every run is). Pure Python."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

from mlxspec.core.tree import depths
from mlxspec.core.runs import RunCollector, acceptance_by_position

from .messages import StepData, TurnResult

NOW_WINDOW = 8  # steps behind "tokens/s now"
ONE_TOKEN_PASSES = 5  # undrafted steps a speculative turn needs before its passes become the baseline


@dataclass
class Baseline:
    """Target-only decoding speed, the denominator of the speedup estimate."""

    ms_per_token: float | None = None
    source: str = "not measured"

    @property
    def tps(self) -> float | None:
        return 1000.0 / self.ms_per_token if self.ms_per_token else None


@dataclass
class TurnStats:
    started: float  # the app clock when the turn was submitted
    k: int = 0  # the turn's K (0: target-only); positions and lengths are shown up to it
    steps: list[StepData] = field(default_factory=list)
    result: TurnResult | None = None
    collector: RunCollector = field(default_factory=RunCollector)  # the run so far
    # How deep each step drafted: K for a chain, the deepest node for a tree (whose K is its
    # node count); acceptance by position and the length histogram go by depth.
    reach: list[int] = field(default_factory=list)

    def add(self, step: StepData) -> None:
        self.steps.append(step)
        self.collector.add(step.step)
        tree = step.step.tree
        self.reach.append(step.k if tree is None else max(depths(tree.parents), default=0))

    @property
    def tree(self) -> bool:
        """Whether this turn drafted trees."""
        return any(s.step.tree is not None for s in self.steps)

    @property
    def tokens(self) -> int:
        return len(self.collector.tokens)

    @property
    def drafted(self) -> int:
        return sum(self.collector.drafted)

    @property
    def accepted(self) -> int:
        return sum(self.collector.accepted)

    @property
    def target_only(self) -> bool:
        return bool(self.steps) and not any(self.collector.drafted)

    def tps_now(self, window: int = NOW_WINDOW) -> float | None:
        """Tokens per second over the last ``window`` steps (wall clock)."""
        if len(self.steps) < 2:
            return None
        w = self.steps[-window - 1 :]
        dt = w[-1].t - w[0].t
        return sum(s.emitted for s in w[1:]) / dt if dt > 0 else None

    def tps_turn(self) -> float | None:
        """The run's decode tokens/s (``Run.decode_tps``) once the turn is done; until then the
        same measure from the steps so far (tokens after the first step over the time since it)."""
        if self.result is not None and self.result.decode_tps:
            return self.result.decode_tps
        if len(self.steps) < 2:
            return None
        dt = self.steps[-1].t - self.steps[0].t
        return (self.tokens - (self.collector.first_step_tokens or 0)) / dt if dt > 0 else None

    def accepted_per_step(self) -> float | None:
        """Mean accepted draft length per step (all steps, as the CLI reports it)."""
        steps = len(self.collector.accepted)
        return self.accepted / steps if steps else None

    def tokens_per_step(self) -> float | None:
        steps = len(self.collector.accepted)
        return self.tokens / steps if steps else None

    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def k_now(self) -> int | None:
        """K drafted by the latest step (under auto K it changes step by step; 0: no drafting)."""
        return self.steps[-1].step.k if self.steps else None

    def mean_k(self) -> float | None:
        d = self.collector.drafted
        return statistics.fmean(d) if d else None

    @property
    def k_max(self) -> int:
        return max(self.k, max(self.reach, default=0))

    def position_rates(self) -> list[tuple[int, float | None]]:
        """For each draft position (tree depth) i = 1..K: how often it was accepted, over the
        steps that drafted at least that deep (None while no step has)."""
        return list(enumerate(acceptance_by_position(self.collector.accepted, self.reach, self.k_max), 1))

    def length_histogram(self) -> list[tuple[int, int]]:
        """(accepted length, number of speculative steps) for every length 0..K."""
        counts = Counter(a for a, d in zip(self.collector.accepted, self.reach) if d > 0)
        return [(n, counts[n]) for n in range(self.k_max + 1)] if self.k_max else []

    def by_drafter(self) -> list[tuple[str, float, float | None]]:
        """For each drafter that proposed in this turn (a cascade's parts): its share of the
        steps and the share of its drafted tokens accepted, in order of first use."""
        steps, drafted, kept = Counter(), Counter(), Counter()
        for s in self.steps:
            if (name := s.step.drafter) is not None:
                steps[name] += 1
                drafted[name] += s.step.k
                kept[name] += s.step.accepted
        n = len(self.steps)
        return [(name, steps[name] / n, kept[name] / drafted[name] if drafted[name] else None) for name in steps]

    def mean_draft_ms(self) -> float | None:
        return statistics.fmean(self.collector.draft_ms) if self.collector.draft_ms else None

    def mean_verify_ms(self) -> float | None:
        return statistics.fmean(self.collector.verify_ms) if self.collector.verify_ms else None

    def target_only_ms(self) -> float | None:
        """Target-only ms per token, when this was a target-only turn: the wall time per token
        after the first step (``tps_turn``), the measure a speculative turn's speed is given
        in. Not the median step: a decode's slower steps put its mean 4-8% above its median on
        the default target here, and a median baseline would understate every speedup by that."""
        tps = self.tps_turn() if self.target_only else None
        return 1000.0 / tps if tps else None

    def one_token_ms(self, least: int = ONE_TOKEN_PASSES) -> float | None:
        """Target-only ms per token measured inside a speculative turn: the median pass of its
        steps that drafted nothing (first step excluded), when there were at least ``least``.
        Those passes ran under this turn's conditions (the UI drawing beside them, the
        context's length), which a baseline measured at start-up did not."""
        passes = [ms for k, ms in zip(self.collector.drafted[1:], self.collector.verify_ms[1:]) if k == 0]
        return statistics.median(passes) if len(passes) >= least and not self.target_only else None

    def speedup(self, baseline: Baseline) -> float | None:
        """Measured tokens/s of this turn over the target-only baseline's."""
        tps = self.tps_turn()
        return tps / baseline.tps if tps and baseline.tps else None
