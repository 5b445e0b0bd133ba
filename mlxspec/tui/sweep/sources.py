"""Where the sweep app's numbers come from: the real sweep (``sweep_runner``) or a scripted,
deterministic one without a model (``demo_runner``: for tests and ``--demo``). Either runs in
the app's worker thread, reporting through two callbacks, and returns a ``SweepResult``."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mlxspec.core.schedule import timed_rounds, warmup_rounds
from mlxspec.core.runs import Run
from mlxspec.measure.runs import Machine, RunHeader
from mlxspec.measure.sweep import SweepOptions, SweepResult, SweepRun, SweepSettings, run_sweep, summarise

Progress = Callable[[int, int, str], None]
OnRun = Callable[[dict[str, Any]], None]
# Runs a whole sweep in the worker thread, reporting through the two callbacks, and returns
# ``run_sweep``'s result.
SweepRunner = Callable[[Progress, OnRun], SweepResult]


def sweep_runner(options: SweepOptions) -> SweepRunner:
    """The real sweep: ``run_sweep(options)`` with the app's callbacks."""

    def run(progress: Progress, on_run: OnRun) -> SweepResult:
        return run_sweep(options, progress, on_run)

    return run


def describe(options: SweepOptions, model: str) -> str:
    """The app's subtitle: what is swept, on ``model`` (as the user named it)."""
    ks = sorted(options.ks)
    span = f"{ks[0]}..{ks[-1]}" if ks == list(range(ks[0], ks[-1] + 1)) and len(ks) > 2 else ",".join(map(str, ks))
    mode = "greedy" if options.temp == 0 else f"T={options.temp:g}"
    return (f"{model} + {options.draft}, K {span}{' + auto' if options.auto else ''}, {mode}, "
            f"{options.max_tokens} tokens, {options.repeats} repeat(s)")


@dataclass(frozen=True)
class _Script:
    """The demo's made-up machine: costs, acceptance falling with the draft position, and a
    run-to-run jitter, turned into the run records a real sweep collects."""

    target_ms: float = 110.0
    draft_ms: float = 0.4
    tokens: int = 48
    jitter: tuple[float, ...] = (1.0, 0.93, 1.06, 0.97, 1.03, 0.9, 1.08)

    def acceptance(self, k: int) -> list[float]:
        return [0.62 * 0.9 ** i for i in range(k)]

    def verify_ms(self, k: int) -> float:
        return self.target_ms * (1 + 0.12 * k)

    def tps(self, k: int, i: int) -> float:
        if k == 0:
            return 1e3 / self.target_ms * self.jitter[i % len(self.jitter)]
        acc = self.acceptance(k)
        e = 1 + sum(math.prod(acc[: j + 1]) for j in range(k))
        return 1e3 * e / (k * self.draft_ms + self.verify_ms(k)) * 0.85 * self.jitter[(i + k) % len(self.jitter)]

    def steps(self, k: int, i: int) -> list[int]:
        """Accepted drafts per step until ``tokens`` are out (one token per step for K = 0)."""
        rng, out, emitted = random.Random(1000 * k + i), [], 0
        while emitted < self.tokens:
            a = 0
            while a < k and rng.random() < self.acceptance(k)[a]:
                a += 1
            out.append(a)
            emitted += a + 1
        return out

    def run(self, k: int, i: int) -> Run:
        acc = self.steps(k, i)
        total = self.tokens / self.tps(k, i)
        n = len(acc)
        return Run(list(range(self.tokens)), 20, 0.1 * total, 0.9 * total, acc[0] + 1, "length", acc, [k] * n,
                   [k] * n, [self.draft_ms * k] * n, [self.verify_ms(k) if k else self.target_ms] * n)

    def auto_run(self, i: int) -> Run:
        """``--k auto``: K chosen per step around the best fixed K (the model's, without jitter),
        about as fast as it but with its own jitter, so the two pair up noisily."""
        best = max(range(1, 9), key=lambda k: self.tps(k, -k))  # jitter index (i + k) = 0: no jitter
        rng, acc, rooms, emitted = random.Random(7000 + i), [], [], 0
        while emitted < self.tokens:
            room, a = max(1, best + rng.choice((-1, 0, 0, 1))), 0
            while a < room and rng.random() < self.acceptance(room)[a]:
                a += 1
            acc.append(a)
            rooms.append(room)
            emitted += a + 1
        total = self.tokens / self.tps(best, i + 3)
        return Run(list(range(self.tokens)), 20, 0.1 * total, 0.9 * total, acc[0] + 1, "length", acc, rooms, rooms,
                   [self.draft_ms * r for r in rooms], [self.verify_ms(r) for r in rooms])


def _demo_summary(ks: list[int], runs_by: dict[int | None, list[SweepRun]], script: _Script,
                  prompts: int) -> SweepResult:
    """The scripted runs through the sweep's own summary, as a real sweep's."""
    vt = {1: [script.target_ms] * 3, **{k + 1: [script.verify_ms(k)] * 3 for k in ks}}
    header = RunHeader("demo", Machine("demo", "demo", None), "no model", None, "-", None, "demo", "scripted")
    settings = SweepSettings(list(ks), "demo", 0.0, 1.0, ["demo"], None, None, script.tokens, 1, 1, 1, 0, 3,
                             auto_max_k=8 if None in runs_by else None)
    return summarise(ks, runs_by, vt, 20, header, settings, "demo data: scripted numbers, no model ran",
                     [{"id": p, "category": "demo", "prompt_tokens": 20} for p in range(prompts)])


def demo_runner(ks: Sequence[int] = (1, 2, 3, 4, 6, 8), prompts: int = 6, delay: float = 0.0,
                before_run: Callable[[], None] | None = None, auto: bool = True) -> SweepRunner:
    """Scripted, deterministic runs through ``run_sweep``'s summary, no model: for tests and
    ``--demo``. ``before_run`` is called before each timed run (tests use it to hold the sweep).
    ``auto``: an auto row too (scripted ``--k auto``), in the same rotation as the fixed Ks
    (``core.schedule``, as the real sweep)."""
    ks = sorted(ks)
    script = _Script()

    def name(m: int | None) -> str:
        return "target-only" if m == 0 else "auto" if m is None else f"K={m}"

    def run(progress: Progress, on_run: OnRun) -> SweepResult:
        methods: list[int | None] = [0, *ks, *([None] if auto else [])]
        total = len(methods) + 3 + prompts * len(methods)
        done = 0

        def tick(label: str) -> None:
            nonlocal done
            done += 1
            time.sleep(delay)
            progress(done, total, label)

        for order in warmup_rounds(methods, 1):
            for m in order:
                tick(f"warm-up 1/1 · {name(m)}")
        for r in range(3):
            tick(f"verify cost · {r + 1}/3 rounds")
        runs_by: dict[int | None, list[SweepRun]] = {m: [] for m in methods}
        for p, order in timed_rounds(methods, range(prompts)):
            got: dict[int | None, Run] = {}
            for m in order:
                if before_run is not None:
                    before_run()
                got[m] = x = script.auto_run(p) if m is None else script.run(m, p)
                on_run({"k": m, "prompt_id": p, "category": "demo", "repeat": 0, "tps": x.tps,
                        "accepted": list(x.accepted), "drafted": list(x.drafted), "rooms": list(x.rooms),
                        "done": p + 1, "of": prompts})
                tick(f"{name(m)} · demo #{p} · repeat 1/1")
            for m in methods:
                runs_by[m].append(SweepRun(m, p, "demo", 0, got[m], got[m].tps / got[0].tps if m != 0 else None))
        return _demo_summary(ks, runs_by, script, prompts)

    return run
