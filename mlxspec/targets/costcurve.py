"""The verify-cost curve of a target on this machine: the milliseconds of one target pass over L
tokens, L = 1..max_k+1, on a cache already holding a realistic context. ``--k auto`` weighs
expected accepted tokens against it (``core.autok``).

Measured with ``time_verify`` (the sweep's too: two untimed passes per length, then ``reps``
rounds over all lengths in rotating order, cache trimmed back after every pass; medians), once per target,
dtype and device, and cached as JSON in ``$MLXSPEC_HOME/costcurves/<target>-<dtype>-<device>.json``;
``remeasure=True`` (``--remeasure-cost``) measures again. A curve measured while other processes
kept a good share of the CPUs busy is used for that run only, never cached: later runs on a quiet
machine would otherwise plan with passes several times too slow.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlxspec.core.cache import check_trimmable, rewind
from mlxspec.core.engine import NOT_TRIMMABLE_HINT
from mlxspec.core.ops import ops_for
from mlxspec.core.schedule import timed_rounds, warmup_rounds
from mlxspec.cpuload import CpuMeter
from mlxspec.errors import MlxspecError
from mlxspec.core.autok import extend_curve
from mlxspec.targets.store import home

SCHEMA = 1
CONTEXT_TOKENS = 256  # tokens in the cache while timing: a chat turn's worth
REPS = 5
BUSY_SHARE = 0.3  # other processes' share of all CPUs above which a measurement is marked busy
QUIET_PROBE_S = 0.3  # how long a session start watches the load before re-measuring a busy curve
STALE_SCALE = 1.5  # live verify timings this many times off the cached curve (either way) make it stale
STALE_STEPS = 16  # timed steps before the live scale is trusted


@dataclass(frozen=True)
class CostCurve:
    """ms[L-1]: median ms of one target pass over L tokens; ms_all: every timing."""

    target: str
    dtype: str
    device: str
    context_tokens: int
    reps: int
    ms: list[float]
    ms_all: list[list[float]] = field(default_factory=list)
    measured: str = ""  # local time of the measurement
    seconds: float = 0.0  # how long measuring took
    schema: int = SCHEMA
    others_busy: float | None = None  # other processes' share of the CPUs meanwhile (None: not known)

    @property
    def max_tokens(self) -> int:
        return len(self.ms)

    @property
    def busy(self) -> bool:
        """Measured while other processes held the CPUs: kept and used, measured again when a
        session starts on a quiet machine."""
        return self.others_busy is not None and self.others_busy > BUSY_SHARE

    @property
    def ratios(self) -> list[float]:
        """Cost of each pass length in one-token passes."""
        return [m / self.ms[0] for m in self.ms]

    def verify_ms(self, k: int) -> float:
        """ms of the pass that verifies ``k`` drafts (k+1 tokens), extrapolated past the end."""

        return extend_curve(self.ms, k + 1)[k]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CostCurve:
        if d.get("schema") != SCHEMA:
            raise ValueError(f"cost curve schema {d.get('schema')!r}, expected {SCHEMA}")
        names = cls.__dataclass_fields__
        c = cls(**{k: v for k, v in d.items() if k in names})
        if not c.ms or not all(isinstance(x, (int, float)) and x > 0 for x in c.ms):
            raise ValueError("cost curve without positive timings")
        return c


def device_name() -> str:
    import mlx.core as mx

    return mx.default_device().type.name


def curve_path(target: str, dtype: str, device: str | None = None) -> Path:
    """Where the curve of ``target`` in ``dtype`` on ``device`` (default: MLX's) is cached."""

    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{target}-{dtype}-{device or device_name()}").strip("_")
    return home() / "costcurves" / f"{safe}.json"


def device_of(lm: Any) -> str:
    """What the curve was measured on: MLX's device, or the torch backend, device and threads."""
    backend = getattr(lm, "backend", "mlx")
    if backend == "mlx":
        return device_name()
    # the batch-invariant kernels have their own curve: one cached before them would mislead --k auto
    model = getattr(lm, "model", None)
    kernels = "-invariant" if getattr(model, "batch_invariant", False) else ""
    # each build of the compiled pass and of the kernels its own curve: a faster pass re-plans
    if getattr(model, "compiled", None) is not None:
        from mlxspec.torchpath import compiled

        kernels += f"-compiled{compiled.key(model)[:6]}"
    if getattr(lm, "dtype", None) == "quantized":  # the file's layers on torchpath.vnni's kernel or torch's
        from mlxspec.torchpath import vnni

        kernels += f"-vnni{vnni.build_id()}" if vnni.active() else ""
    return backend.replace(":", "-") + kernels + f"-{_torch_threads()}t"


def _torch_threads() -> int:
    """torch's CPU threads now: a pass's cost depends on them (``torchpath.threads`` sets them
    from the load), so each count has its own curve."""
    import torch

    return torch.get_num_threads()


def quiet_now(seconds: float = QUIET_PROBE_S) -> bool:
    """Whether other processes leave the CPUs alone over the next ``seconds``."""
    meter = CpuMeter()
    time.sleep(seconds)
    busy = meter.others_busy()
    return busy is not None and busy <= BUSY_SHARE


def stderr_line(text: str) -> None:
    """A progress line on stderr, rewritten in place on a terminal."""
    end = "" if sys.stderr.isatty() else "\n"
    sys.stderr.write(("\r\033[K" if sys.stderr.isatty() else "") + text + end)
    sys.stderr.flush()


def time_verify(model, prompt: list[int], sizes: Sequence[int], reps: int = REPS,
                progress: Callable[[int], Any] | None = None) -> dict[int, list[float]]:
    """ms of one target forward over n tokens, for each n in ``sizes``, on a cache holding the
    prefilled ``prompt``; trimmed back after every pass. Two untimed passes per size first; then
    ``reps`` rounds over all sizes, the order rotating to spread drift (``core.schedule``).
    {n: [ms, ...]}."""
    ops = ops_for(model)
    cache = check_trimmable(model.make_cache(), "the target", NOT_TRIMMABLE_HINT)
    ops.evaluate(ops.prefill(model, cache, prompt))
    src = prompt if prompt else [0]
    toks = {n: ops.tokens([src[i % len(src)] for i in range(n)])[None] for n in sizes}

    def once(n: int) -> float:
        t0 = time.perf_counter()
        ops.evaluate(model(toks[n], cache))
        ops.synchronize()
        dt = (time.perf_counter() - t0) * 1e3
        rewind(cache, n)
        return dt

    for order in warmup_rounds(sizes, 1, each=2):
        for n in order:
            once(n)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for rep, order in timed_rounds(sizes, range(reps)):
        for n in order:
            times[n].append(once(n))
        if progress is not None:
            progress(rep + 1)
    return times


def measure_cost_curve(lm: Any, max_tokens: int, reps: int = REPS, context_tokens: int = CONTEXT_TOKENS,
                       log: Callable[[str], None] | None = stderr_line) -> CostCurve:
    """Time one target pass over 1..``max_tokens`` tokens of ``lm`` (a ``LoadedModel``) on a
    cache of ``context_tokens`` tokens (fewer if the context is short)."""
    if max_tokens < 1 or reps < 1:
        raise MlxspecError(f"cost curve: need max_tokens >= 1 and reps >= 1, got {max_tokens}, {reps}")
    ctx = max(1, min(context_tokens, getattr(lm, "context_length", 1 << 30) - max_tokens - 1))
    vocab = lm.config.vocab_size
    prompt = [(1 + 37 * i) % vocab for i in range(ctx)]
    sizes = list(range(1, max_tokens + 1))
    say = log or (lambda _text: None)
    head = f"measuring the verify cost of {lm.name} ({lm.dtype}), passes of 1..{max_tokens} tokens"
    say(f"{head}: warm-up")
    t0, meter = time.perf_counter(), CpuMeter()
    times = time_verify(lm.model, prompt, sizes, reps, progress=lambda r: say(f"{head}: round {r}/{reps}"))
    seconds = time.perf_counter() - t0
    curve = CostCurve(lm.name, lm.dtype, device_of(lm), ctx, reps, [statistics.median(times[n]) for n in sizes],
                      [times[n] for n in sizes], time.strftime("%Y-%m-%dT%H:%M:%S"), seconds,
                      others_busy=meter.others_busy())
    say(f"{head}: {curve.ms[0]:.1f} ms for 1 token, {curve.ms[-1]:.1f} ms for {max_tokens} ({seconds:.0f} s)")
    if log is stderr_line and sys.stderr.isatty():
        sys.stderr.write("\n")
    return curve


def load_cost_curve(path: Path) -> CostCurve | None:
    """The curve cached at ``path``, or None when there is none or it cannot be read."""
    try:
        return CostCurve.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def check_against_live(lm: Any, curve: CostCurve, scale: float, steps: int, others_busy: float | None,
                       log: Callable[[str], None] | None = stderr_line) -> bool:
    """Whether the cached ``curve`` of ``lm`` went stale: after ``steps`` >= STALE_STEPS timed
    steps on a quiet machine (``others_busy`` <= BUSY_SHARE), live verify passes ran ``scale``
    times its timings, off by more than STALE_SCALE. A stale curve is removed from the cache, so
    the next run measures it again (``--k auto`` corrects by ``scale`` meanwhile); the clock,
    the thread count or the machine changed since it was measured."""
    if steps < STALE_STEPS or others_busy is None or others_busy > BUSY_SHARE:
        return False
    if 1 / STALE_SCALE <= scale <= STALE_SCALE:
        return False
    path = curve_path(lm.name, lm.dtype, device_of(lm))
    cached = load_cost_curve(path)
    if cached is None or cached.measured != curve.measured:
        return False
    path.unlink(missing_ok=True)
    if log is not None:
        log(f"note: verify passes ran {scale:.2f}x the cached verify-cost curve of {lm.name} (measured "
            f"{curve.measured}) over {steps} steps on a quiet machine; it will be measured again next time")
    return True


def cost_curve(lm: Any, max_tokens: int, remeasure: bool = False, reps: int = REPS,
               context_tokens: int = CONTEXT_TOKENS, log: Callable[[str], None] | None = stderr_line) -> CostCurve:
    """The cached curve of ``lm`` on this device and thread count if it covers ``max_tokens``
    pass lengths, else (or with ``remeasure``) a new measurement, cached. A curve measured under
    load is cached too, marked ``busy``: it is used as it is, and measured again only when a
    session starts on a quiet machine, so no later run waits for it. A cache that cannot be
    written is only a note: the measurement is still used. Sessions call this before their first
    request (``Session.ready``), never inside one."""
    path = curve_path(lm.name, lm.dtype, device_of(lm))
    cached = None if remeasure else load_cost_curve(path)
    fits = cached is not None and cached.target == lm.name and cached.dtype == lm.dtype and cached.max_tokens >= max_tokens
    if fits and not (cached.busy and quiet_now()):
        if cached.busy and log is not None:
            log(f"note: using the verify-cost curve of {lm.name} measured under load ({cached.others_busy:.0%} of the "
                f"CPUs busy, {cached.measured}); it is measured again when a session starts on a quiet machine")
        return cached
    curve = measure_cost_curve(lm, max_tokens, reps, context_tokens, log)
    if curve.busy and log is not None:
        log(f"note: other processes kept {curve.others_busy:.0%} of the CPUs busy while the verify cost was "
            "measured: it is kept, marked busy, until a session starts on a quiet machine")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(curve.to_json(), indent=1))
        tmp.replace(path)
    except OSError as e:
        if log is not None:
            log(f"note: could not cache the verify-cost curve at {path}: {e.strerror}")
    return curve
