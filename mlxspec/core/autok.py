"""``--k auto``: choose each step's draft length K (0 = no drafting, a plain target step) from
the verify-cost curve measured on this machine and a running estimate of acceptance by position.

The model, per step (Leviathan et al. 2023): with conditional acceptance a_i = P(draft i
accepted | drafts 1..i-1 were), E(K) = 1 + sum_{i<=K} prod_{j<=i} a_j tokens are committed in
T(K) = s c(K) + K d milliseconds, where c(K) is the measured time of one target pass over K+1
tokens (``measure.costcurve``), s how much slower the machine runs now than when c was measured
(1 until timings are observed) and d the drafter's milliseconds per drafted token. Each step
takes the K in 0..max_k with the highest E(K)/T(K), the smallest K on ties, so K > 0 only when
it beats the plain step, 1/(s c(0)).

Acceptance: per position, counts of the steps that reached it and of those that accepted there,
exponentially forgotten (each observation of a position multiplies its counts by ``forget``, so
the estimate follows a change of domain within about 1/(1-forget) steps), shrunk towards a
prior: position 1 towards ``prior``, position i > 1 towards the current estimate of position
i-1 (acceptance is roughly flat in depth, so a position seldom reached borrows from the one
before it). A step that drafted m tokens and kept n reached positions 1..min(n+1, m), accepted
1..n and, when n < m, rejected n+1; positions it did not draft are not observed, so a drafter
that offers fewer than K (prompt lookup without a match) is not counted as rejecting.

Exploring: while K = 0 is chosen nothing is observed, so after ``probe_every`` plain steps the
policy drafts once at its best K > 0; the interval doubles (up to ``probe_max``) each time a probe
does not change its mind, and resets when drafting pays again. A drafter that could not pay even
if every draft were accepted is never probed.

Timings (optional): ``observe_timing(draft_ms, verify_ms, drafted)`` for each step, in order
(the engine gives a run's when it ends), keeps d as a running mean of draft ms per drafted token,
from steps that follow one this drafter drafted too, and s as a running geometric mean of
measured verify ms / c(drafted). Pure Python: no MLX.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from mlxspec.core.drafters.base import MAX_K, parse_k, sources, trait, upcoming_source, used_source
from mlxspec.core.drafters.cascade import CascadeDrafter
from mlxspec.errors import MlxspecError

DEFAULT_MAX_K = 8
PRIOR = 0.6  # first-position acceptance assumed before anything is observed (optimistic: it tries)
PRIOR_WEIGHT = 2.0  # pseudo-observations behind each position's prior
FORGET = 0.95  # per observation of a position: memory of about 20 steps
DRAFT_PRIOR_RATIO = 0.1  # draft ms per token before any is observed, as a fraction of c(0)
TIMING_RATE = 0.2  # weight of a new timing in the running means
PROBE_EVERY = 8
PROBE_MAX = 128


def parse_k_option(spec: Any) -> int | str:
    """A ``--k`` value: ``"auto"`` or an integer in 1..MAX_K (an int is accepted as is)."""
    if isinstance(spec, bool):
        raise MlxspecError(f"--k must be auto or an integer in 1..{MAX_K}, got {spec!r}")
    if isinstance(spec, int):
        k = spec
    else:
        text = str(spec).strip().lower()
        if text == "auto":
            return "auto"
        try:
            k = int(text)
        except ValueError:
            raise MlxspecError(f"--k must be auto or an integer in 1..{MAX_K}, got {spec!r}") from None
    return parse_k(k)


def curve_ms(cost: Any) -> list[float]:
    """The ms list of a cost curve: a ``CostCurve`` (its ``ms``) or a sequence, ms[L-1] being one
    target pass over L tokens."""
    ms = [float(x) for x in (cost.ms if hasattr(cost, "ms") else cost)]
    if not ms or not all(math.isfinite(x) and x > 0 for x in ms):
        raise MlxspecError(f"a verify-cost curve needs positive, finite ms per pass length; got {ms}")
    return ms


def extend_curve(ms: Sequence[float], n: int) -> list[float]:
    """``ms`` to at least ``n`` lengths, linearly past the last two points (never decreasing)."""
    out = list(ms)
    slope = max(0.0, out[-1] - out[-2]) if len(out) > 1 else 0.0
    while len(out) < n:
        out.append(out[-1] + slope)
    return out


class AutoK:
    """A ``KPolicy`` that picks K in 0..max_k maximising expected tokens per second (see the
    module docstring). ``cost``: a ``CostCurve`` or ms of a target pass over 1, 2, ... tokens
    (extended linearly to max_k+1 tokens if shorter). ``draft_ms_per_token``: None to start from
    ``draft_prior_ratio`` x c(0) until a timing is observed. ``probe_every=None`` never probes.
    The curve is made non-decreasing (running maximum): a dip in it is measurement noise."""

    def __init__(self, cost: Any, draft_ms_per_token: float | None = None, max_k: int = DEFAULT_MAX_K,
                 prior: float = PRIOR, prior_weight: float = PRIOR_WEIGHT, forget: float = FORGET,
                 draft_prior_ratio: float = DRAFT_PRIOR_RATIO, timing_rate: float = TIMING_RATE,
                 probe_every: int | None = PROBE_EVERY, probe_max: int = PROBE_MAX):
        if not 1 <= max_k <= MAX_K:
            raise MlxspecError(f"auto K: max_k must be in 1..{MAX_K}, got {max_k}")
        if not 0.0 <= prior <= 1.0 or prior_weight <= 0 or not 0.0 < forget <= 1.0 or not 0.0 < timing_rate <= 1.0:
            raise MlxspecError("auto K: need 0 <= prior <= 1, prior_weight > 0, 0 < forget <= 1, 0 < timing_rate <= 1")
        if draft_ms_per_token is not None and not (math.isfinite(draft_ms_per_token) and draft_ms_per_token >= 0):
            raise MlxspecError(f"auto K: draft ms per token must be >= 0, got {draft_ms_per_token}")
        if probe_every is not None and probe_every < 1:
            raise MlxspecError(f"auto K: probe_every must be >= 1 or None, got {probe_every}")
        # A longer pass never costs less: a dip in the measured curve is noise, so take the running max.
        ms = curve_ms(cost)
        self.cost = extend_curve([max(ms[: i + 1]) for i in range(len(ms))], max_k + 1)
        self.max_k, self.prior, self.prior_weight, self.forget = max_k, prior, prior_weight, forget
        self.timing_rate, self.probe_every, self.probe_max = timing_rate, probe_every, max(probe_max, probe_every or 1)
        self.draft_prior_ratio = draft_prior_ratio
        self.draft_ms = self.cost[0] * draft_prior_ratio if draft_ms_per_token is None else float(draft_ms_per_token)
        self._draft_seen = draft_ms_per_token is not None
        self._drafted_last = False  # whether this drafter drafted the last step timed
        self.log_scale = 0.0
        self.timed_steps = 0  # verify timings seen: how far ``scale`` can be trusted
        self.reset()

    def reset(self) -> None:
        """Forget the acceptance seen (a new sequence, another drafter); timings are kept."""
        self.reached = [0.0] * self.max_k
        self.kept = [0.0] * self.max_k
        self._plain, self._interval = 0, self.probe_every or 0

    def fresh(self) -> AutoK:
        """A policy for another run: the same curve, settings and timings learned so far, no
        acceptance history."""
        new = AutoK.__new__(AutoK)
        new.__dict__.update(self.__dict__)
        new.reset()
        return new

    # ------------------------------------------------------------------ the estimate and model

    def acceptance(self) -> list[float]:
        """Current conditional acceptance estimate a_i, i = 1..max_k."""
        out, prev = [], self.prior
        for n, s in zip(self.reached, self.kept):
            prev = (s + self.prior_weight * prev) / (n + self.prior_weight)
            out.append(prev)
        return out

    @property
    def scale(self) -> float:
        return math.exp(self.log_scale)

    def step_ms(self, k: int) -> float:
        """T(K) = s c(K) + K d."""
        return self.scale * self._c(k) + k * self.draft_ms

    def expected_tokens(self, k: int, acceptance: Sequence[float] | None = None) -> float:
        a = self.acceptance() if acceptance is None else acceptance
        total, run = 1.0, 1.0
        for i in range(k):
            run *= a[i]
            total += run
        return total

    def rates(self, acceptance: Sequence[float] | None = None) -> list[float]:
        """Expected tokens per second for K = 0..max_k."""
        a = self.acceptance() if acceptance is None else acceptance
        out, e, run = [], 1.0, 1.0
        for k in range(self.max_k + 1):
            if k:
                run *= a[k - 1]
                e += run
            out.append(1e3 * e / self.step_ms(k))
        return out

    def best(self, acceptance: Sequence[float] | None = None) -> int:
        """The K of the highest expected tokens/s (the smallest on ties): no exploring."""
        r = self.rates(acceptance)
        return max(range(len(r)), key=lambda k: (r[k], -k))

    def can_pay(self) -> bool:
        """Whether some K > 0 would beat the plain step if every draft were accepted."""
        return self.best([1.0] * self.max_k) > 0

    # ------------------------------------------------------------------ KPolicy

    def next_k(self) -> int:
        r = self.rates()
        k = max(range(len(r)), key=lambda j: (r[j], -j))
        if k > 0:
            self._plain, self._interval = 0, self.probe_every or 0
            return k
        if self.probe_every is None or not self.can_pay():
            return 0
        self._plain += 1
        if self._plain <= self._interval:
            return 0
        self._plain, self._interval = 0, min(2 * self._interval, self.probe_max)
        return max(range(1, len(r)), key=lambda j: (r[j], -j))

    def observe(self, drafted: int, accepted: int) -> None:
        drafted = min(max(0, drafted), self.max_k)
        accepted = min(max(0, accepted), drafted)
        for i in range(min(accepted + 1, drafted)):
            self.reached[i] = self.forget * self.reached[i] + 1.0
            self.kept[i] = self.forget * self.kept[i] + (1.0 if i < accepted else 0.0)

    def observe_timing(self, draft_ms: float, verify_ms: float, drafted: int) -> None:
        """One step's measured draft and verify milliseconds with ``drafted`` tokens drafted
        (what the engine reports in ``Step``)."""
        mine = drafted > 0 and math.isfinite(draft_ms) and draft_ms >= 0
        # A drafter that sat out the step before first catches up on what it did not see (a head
        # runs the target features of those tokens): a cost of the plain steps, not of drafting,
        # and charging it to K would make every probe look dear and keep K at 0.
        if mine and self._drafted_last:
            per = draft_ms / drafted
            self.draft_ms = per if not self._draft_seen else self.draft_ms + self.timing_rate * (per - self.draft_ms)
            self._draft_seen = True
        self._drafted_last = mine
        if math.isfinite(verify_ms) and verify_ms > 0:
            ratio = min(max(verify_ms / self._c(max(0, drafted)), 0.125), 8.0)
            self.log_scale += self.timing_rate * (math.log(ratio) - self.log_scale)
            self.timed_steps += 1

    def describe(self) -> dict[str, Any]:
        """The policy's state, for displays and JSON."""
        return {"max_k": self.max_k, "acceptance": self.acceptance(), "draft_ms_per_token": self.draft_ms,
                "verify_scale": self.scale, "verify_ms": [self.scale * c for c in self.cost], "best": self.best()}

    def _c(self, k: int) -> float:
        return self.cost[k] if k < len(self.cost) else extend_curve(self.cost, k + 1)[k]


class SourcedK:
    """``--k auto`` for a drafter that tells kinds of draft apart before drafting
    (``drafters.base.sources``: a cascade's parts, prompt lookup's match lengths): one ``AutoK``
    per kind, each learning the acceptance and draft cost of the steps that kind drafted. The
    verify timings of every step go to all of them, so they share one view of how busy the
    machine is.

    ``k_policy`` builds one for a cascade only. Prompt lookup's match lengths are kinds too (a
    3-token match's first draft is kept 0.73-0.75 of the time, a 2-token one's 0.39-0.55), but
    learning them apart chose other K's for the same wall-clock time as one pooled estimate
    (1.00x at T=1 and the chat's sampling, 0.99x greedy: ``benchmarks/k_by_source.py``)."""

    def __init__(self, policies: Sequence[AutoK], drafter: Any):
        self.policies, self.drafter = list(policies), drafter
        # The kind behind each observed step whose timing has not come yet: the engine gives a
        # run's timings when it ends (``core.engine``), in step order.
        self._untimed: deque[int] = deque()

    @property
    def max_k(self) -> int:
        return self.policies[0].max_k

    @property
    def scale(self) -> float:
        return self.policies[0].scale

    @property
    def timed_steps(self) -> int:
        return self.policies[0].timed_steps

    def reset(self) -> None:
        for p in self.policies:
            p.reset()
        self._untimed.clear()

    def fresh(self) -> SourcedK:
        return SourcedK([p.fresh() for p in self.policies], self.drafter)

    def next_k(self) -> int:
        return self.policies[upcoming_source(self.drafter)].next_k()

    def observe(self, drafted: int, accepted: int) -> None:
        used = used_source(self.drafter)
        self.policies[used].observe(drafted, accepted)
        self._untimed.append(used)

    def observe_timing(self, draft_ms: float, verify_ms: float, drafted: int) -> None:
        # a draft time only for the kind that drafted that step (AutoK skips a non-finite one)
        used = self._untimed.popleft() if self._untimed else used_source(self.drafter)
        for i, p in enumerate(self.policies):
            p.observe_timing(draft_ms if i == used else math.nan, verify_ms, drafted)

    def describe(self) -> dict[str, Any]:
        return dict(zip(sources(self.drafter), (p.describe() for p in self.policies)))


def _auto_for(drafter: Any, cost: Any, max_k: int) -> AutoK:
    # until the engine reports its real timings, a step costs what the drafter declares
    return AutoK(cost, max_k=max_k, draft_prior_ratio=trait(drafter, "draft_prior_ratio"))


NEEDS_DRAFTER = ("--k auto needs a drafter, but --draft is none: nothing would be drafted (drop --k, or pick a "
                 "drafter such as --draft default or ngram:3)")


def k_policy(spec: Any, drafter: Any, cost_curve: Callable[[int], Any],
             max_k: int | None = None) -> int | AutoK | SourcedK:
    """A ``--k`` value as the engine takes it: an int for a fixed K, or for ``auto`` an ``AutoK``
    (a ``SourcedK`` over a cascade's parts) drafting up to ``max_k`` (default 8) against
    ``cost_curve(n)``, this machine's cost of target passes over 1..n tokens. ``spec`` None
    (``--k`` not given): auto with a drafter; without one K is unused (4)."""
    if spec is None and drafter is None:
        return 4
    k = parse_k_option("auto" if spec is None else spec)
    if k != "auto":
        return k
    if drafter is None:
        raise MlxspecError(NEEDS_DRAFTER)
    max_k = max_k or DEFAULT_MAX_K
    cost = cost_curve(max_k + 1)
    if isinstance(drafter, CascadeDrafter):
        return SourcedK([_auto_for(part, cost, max_k) for part in drafter.parts], drafter)
    return _auto_for(drafter, cost, max_k)
