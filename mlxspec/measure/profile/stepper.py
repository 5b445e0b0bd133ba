"""One engine step with a timer around each part: the drafter's graph built then evaluated, the
target pass over L = K + 1 tokens built then evaluated, the acceptance rule on its own, and the
host's bookkeeping (read back, cache rewind, commit). The instrumented step evaluates the target
pass and the rule apart, which the engine does in one eval; the engine's own step time is taken
beside it (``engine_step_ms``), so the difference shows what the instrumentation adds.

On torch (eager) a "build" part runs the computation as it is built and an "evaluate" part only
waits for an accelerator (nothing on the CPU): the step's total stands, the split between
Python and arithmetic does not (``StepProfile.eager``)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from mlxspec.core.cache import check_trimmable, rewind
from mlxspec.core.drafters import Commit
from mlxspec.core.engine import NOT_TRIMMABLE_HINT
from mlxspec.core.ops import ops_for
from mlxspec.measure.profile.records import (
    ACCEPT,
    BOOKKEEPING,
    DRAFT_BUILD,
    DRAFT_EVAL,
    PHASES,
    TARGET_BUILD,
    TARGET_EVAL,
    ProfileOptions,
)
from mlxspec.measure.runs import engine_run

SYNC_PROBES = 50


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


def eager(model: Any) -> bool:
    """Whether ``model`` computes as its operations are called (torch), not when evaluated (MLX)."""
    return ops_for(model).name != "mlx"


class Stepper:
    """The engine's step for one drafter, with a timer around each part (module docstring).
    Holds the target cache, the history and the last committed token ``y``; runs on the
    target's backend (``core.ops``)."""

    def __init__(self, lm: Any, drafter: Any, prompt: list[int], params: Any, seed: int = 0):
        self.lm, self.drafter, self.params = lm, drafter, params
        self.model = lm.model
        self.ops = ops = ops_for(self.model)
        self.eager = eager(self.model)
        self.cache = check_trimmable(self.model.make_cache(), "the target", NOT_TRIMMABLE_HINT)
        want = drafter.wants_hidden
        out = ops.prefill(self.model, self.cache, prompt[:-1], return_hidden=want)
        hidden = out[1] if want else None
        ops.evaluate([c.state for c in self.cache], hidden)
        drafter.reset(prompt, hidden)
        self.history, self.y = list(prompt), prompt[-1]
        self.key = ops.key(seed)

    def _settle(self, *arrays: Any) -> None:
        """Wait until ``arrays`` are computed: MLX evaluates them; torch has computed them
        already and waits only for an accelerator's queue."""
        self.ops.evaluate(*arrays)
        if self.eager:
            self.ops.synchronize()

    def _draft(self, k: int, key: Any, t: dict[str, float]) -> Any:
        t0 = time.perf_counter()
        proposal = self.drafter.propose(self.history, k, self.params, key)
        t[DRAFT_BUILD] = _ms(t0)
        t0 = time.perf_counter()
        self._settle(proposal.tokens, proposal.q)
        t[DRAFT_EVAL] = _ms(t0)
        return proposal

    def _target_pass(self, proposal: Any, t: dict[str, float]) -> tuple[Any, Any]:
        ops, want = self.ops, self.drafter.wants_hidden
        t0 = time.perf_counter()
        tokens = ops.concatenate([ops.tokens([self.y]), ops.tokens(proposal.tokens)])[None]
        out = self.model(tokens, self.cache, **({"return_hidden": want} if want else {}))
        logits, hidden = (out[0][0], out[1][0]) if want else (out[0], None)
        t[TARGET_BUILD] = _ms(t0)
        t0 = time.perf_counter()
        self._settle(logits, hidden)
        t[TARGET_EVAL] = _ms(t0)
        return logits, hidden

    def _accept(self, proposal: Any, logits: Any, key: Any, t: dict[str, float]) -> tuple[Any, Any]:
        ops = self.ops
        t0 = time.perf_counter()
        if self.params.greedy:
            n_acc, nxt = ops.greedy_verify(proposal.tokens, logits)
        else:
            p = ops.probs(logits, self.params)
            n_acc, nxt = ops.rejection_verify(proposal.tokens, ops.pad_vocab(proposal.q, p.shape[-1]), p, key)
        self._settle(n_acc, nxt)
        t[ACCEPT] = _ms(t0)
        return n_acc, nxt

    def _commit(self, proposal: Any, n_acc: Any, nxt: Any, hidden: Any, t: dict[str, float]) -> int:
        t0 = time.perf_counter()
        drafted, n, y = proposal.tokens.tolist(), n_acc.item(), nxt.item()
        rewind(self.cache, len(drafted) - n)
        self.drafter.commit(Commit(drafted, n, y, None if hidden is None else hidden[: n + 1]))
        self.history += drafted[:n] + [y]
        self.y = y
        t[BOOKKEEPING] = _ms(t0)
        return n

    def step(self, k: int) -> tuple[dict[str, float], int]:
        """One timed step drafting ``k`` tokens: {phase: ms}, accepted drafts."""
        t: dict[str, float] = {}
        self.key, draft_key, verify_key = self.ops.split(self.key, 3)
        proposal = self._draft(k, draft_key, t)
        logits, hidden = self._target_pass(proposal, t)
        n_acc, nxt = self._accept(proposal, logits, verify_key, t)
        return t, self._commit(proposal, n_acc, nxt, hidden, t)


def profile_steps(lm: Any, drafter: Any, prompt: list[int], params: Any, o: ProfileOptions,
                  tick: Callable[[str], None]) -> tuple[dict[str, list[float]], list[int]]:
    """Timings of ``o.steps`` instrumented steps after ``o.warmup`` untimed ones; restarts from
    the prompt when the context would run out."""
    limit = lm.context_length - o.k - 2
    stepper = Stepper(lm, drafter, prompt, params, o.seed)
    for _ in range(o.warmup):
        stepper.step(o.k)
    times: dict[str, list[float]] = {p: [] for p in PHASES}
    accepted = []
    for i in range(o.steps):
        if len(stepper.history) >= limit:
            stepper = Stepper(lm, drafter, prompt, params, o.seed + i)
        t, n = stepper.step(o.k)
        for name, ms in t.items():
            times[name].append(ms)
        accepted.append(n)
        tick(f"step {i + 1}/{o.steps}")
    return times, accepted


def engine_step_ms(lm: Any, drafter: Any, prompt: list[int], params: Any, k: int, steps: int,
                   seed: int) -> float | None:
    """Median draft + verify ms per step of the real engine, first step (prefill) excluded."""
    budget = min(steps * (k + 1), lm.context_length - len(prompt) - 1)
    run = engine_run(lm, prompt, params, budget, set(), seed, drafter, k)
    per_step = [d + v for d, v in zip(run.draft_ms[1:], run.verify_ms[1:])]
    return statistics.median(per_step) if per_step else None
