"""The baseline benchmark's torch columns: the same engine on PyTorch (``torchpath``), one
column per dtype (and per thread setting, if several), each judged against mlxspec on MLX by a
paired verdict and by where its greedy tokens first leave MLX's. A half-precision dtype is
"exact enough" only if it never does for the tokens measured. torch stays an optional import."""

from __future__ import annotations

import importlib.util
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlxspec.errors import MlxspecError
from mlxspec.measure.bench.common import TORCH_DTYPES, TORCH_PREFIX, label, ratio, torch_key
from mlxspec.core.runs import Run
from mlxspec.measure.runs import first_mismatch
from mlxspec.measure.verdict import Kind, Verdict, median_ratio
from mlxspec.targets import loading
from mlxspec.torchpath import INSTALL_HINT, default_dtype, pick_device, require_torch


@dataclass(frozen=True)
class TorchColumn:
    """One torch column against mlxspec on MLX. ``ratio`` = its median decode tps / mlxspec's;
    ``verdict``: the paired comparison, run pair by run pair; ``first_divergence``: per prompt,
    the first position where its greedy tokens left mlxspec's (the earliest over the repeats;
    None: identical for all ``max_tokens``)."""

    dtype: str
    threads: int  # torch.set_num_threads while it ran; 0: the target's governor chose (``torchpath.threads``)
    ratio: float
    verdict: Verdict
    first_divergence: list[int | None]
    weight_bytes_per_token: int

    @property
    def agrees(self) -> bool:
        """Exact enough: the same greedy tokens as MLX for every prompt and token measured."""
        return all(d is None for d in self.first_divergence)

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "threads": self.threads, "ratio": self.ratio, "verdict": self.verdict.to_json(),
                "first_divergence": self.first_divergence, "agrees": self.agrees,
                "weight_bytes_per_token": self.weight_bytes_per_token}


@dataclass(frozen=True)
class TorchInfo:
    """The torch side of a baseline run: where it ran, the thread settings it compared (one:
    torch's own or the one asked for) and its ``TorchColumn``s, keyed as ``implementations``
    without the "torch_" ("float32", or "float32_1t" when several thread settings ran)."""

    version: str
    device: str
    threads: list[int]
    description: str
    columns: dict[str, TorchColumn]

    @property
    def fastest_exact(self) -> str | None:
        """The column with the highest median decode speed among those that agree with MLX."""
        ok = [k for k, c in self.columns.items() if c.agrees]
        return max(ok, key=lambda k: self.columns[k].ratio) if ok else None

    @property
    def fastest_exact_dtype(self) -> str | None:
        best = self.fastest_exact
        return None if best is None else self.columns[best].dtype

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "device": self.device, "threads": self.threads,
                "description": self.description, "columns": {k: c.to_json() for k, c in self.columns.items()},
                "fastest_exact": self.fastest_exact, "fastest_exact_dtype": self.fastest_exact_dtype}


def torch_verdict(pairs: list[dict[str, Run]], key: str) -> Verdict:
    """A torch column against mlxspec on MLX on decode tokens/s, as ``baseline_verdict``."""
    c = median_ratio([ratio(p[key].decode_tps, p["mlxspec"].decode_tps) for p in pairs])
    if c.ratio is None:
        return Verdict(Kind.EMPTY, "no timed runs")
    name = label(key)
    words = {Kind.FASTER: f"{name} decodes faster than mlxspec on MLX",
             Kind.SLOWER: f"{name} decodes slower than mlxspec on MLX",
             Kind.SAME: f"no measurable difference in decode speed between {name} and mlxspec on MLX"}[c.kind]
    return Verdict(c.kind, f"{words}: {c.ratio:.2f}x median per pair ({c.describe()})", c.interval)


def first_divergence(pairs: list[dict[str, Run]], key: str, n_prompts: int) -> list[int | None]:
    """Per prompt (pairs run prompt by prompt, repeat after repeat), the earliest position where
    ``key``'s greedy tokens differ from mlxspec's over the repeats; None if they never do."""
    out: list[int | None] = [None] * n_prompts
    for i, p in enumerate(pairs):
        d = first_mismatch(p[key].tokens, p["mlxspec"].tokens)
        j = i % n_prompts
        if d is not None and (out[j] is None or d < out[j]):
            out[j] = d
    return out


def torch_columns(enabled: bool | None, dtypes: Sequence[str] | None = None,
                  device: str = "cpu") -> tuple[tuple[str, ...], str | None]:
    """The torch dtypes a baseline run adds, and a note to print (or None).

    ``enabled`` None: on iff torch is importable (a note says so when it is not); True without
    torch: the install error. The columns are float32 and then ``dtypes`` (default: the
    device's default dtype, ``torchpath.default_dtype``; "auto" means it too)."""
    if enabled is False:
        return (), None
    if importlib.util.find_spec("torch") is None:
        if enabled:
            raise MlxspecError(f"--torch needs PyTorch, which is not installed: {INSTALL_HINT}")
        return (), f"PyTorch is not installed: no torch columns ({INSTALL_HINT})"
    device = pick_device(device)
    wanted = [default_dtype(device) if d == "auto" else d for d in (dtypes or ["auto"])]
    bad = [d for d in wanted if d not in TORCH_DTYPES]
    if bad:
        raise MlxspecError(f"--torch-dtype {bad[0]}: choose auto, {', '.join(TORCH_DTYPES)}")
    return tuple(dict.fromkeys(["float32", *wanted])), None


def load_torch_columns(model_spec: str, torch_dtypes: Sequence[str], device: str,
                       threads: Sequence[int]) -> dict[str, tuple[Any, int]]:
    """Column key -> (the model on torch in that dtype, the same weights as the MLX model; its
    thread count), for every dtype x thread setting (one model per dtype)."""
    require_torch()
    several = len(threads) > 1
    out = {}
    for dt in dict.fromkeys(torch_dtypes):
        tlm = loading.load(model_spec, dt, backend=f"torch:{device}")
        out.update({torch_key(dt, n if several else None): (tlm, n) for n in threads})
    return out


def torch_info(torch_models: dict[str, tuple[Any, int]], pairs: list[dict[str, Run]], n_prompts: int) -> TorchInfo:
    """The torch columns' comparisons with mlxspec on MLX."""
    torch = require_torch()

    backend = next(iter(torch_models.values()))[0].backend
    device = backend.partition(":")[2]
    mlx_med = statistics.median([p["mlxspec"].decode_tps or 0.0 for p in pairs])
    columns = {}
    for key, (tlm, threads) in torch_models.items():
        med = statistics.median([p[key].decode_tps or 0.0 for p in pairs])
        columns[key[len(TORCH_PREFIX):]] = TorchColumn(
            tlm.dtype, threads, med / mlx_med if mlx_med > 0 else math.inf, torch_verdict(pairs, key),
            first_divergence(pairs, key, n_prompts), int(tlm.weight_bytes_per_token()))
    threads = sorted({c.threads for c in columns.values()}, reverse=True)
    counts = "/".join(str(n) if n else "load-governed" for n in threads)
    where = (f"CPU ({counts} thread{'' if threads == [1] else 's'})" if device == "cpu"
             else f"{device.upper()} ({torch.cuda.get_device_name()})" if device == "cuda" else device.upper())
    return TorchInfo(torch.__version__, device, threads, f"PyTorch {torch.__version__} on {where}", columns)


@dataclass(frozen=True)
class TorchFlags:
    """``bench --baseline``'s torch flags as given; ``columns`` checks them when a baseline runs."""

    enabled: bool | None = None
    dtypes: tuple[str, ...] = ()
    device: str = "cpu"
    threads: tuple[int, ...] = ()

    def columns(self) -> tuple[tuple[str, ...], str | None]:
        return torch_columns(self.enabled, self.dtypes, self.device)
