"""What a sweep is asked for: the K list (``parse_ks``: "1..8", "1,2,4,8", "1..3,8") and the
``SweepOptions`` record, checked before anything loads."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mlxspec.core.drafters import MAX_K
from mlxspec.errors import MlxspecError
from mlxspec.measure.sweep.costmodel import VERIFY_REPS

_RANGE = re.compile(r"^(-?\d+)\s*\.\.\s*(-?\d+)$")
_INT = re.compile(r"^-?\d+$")


def parse_ks(text: str) -> list[int]:
    """``"1..8"``, ``"1,2,4,8"``, ``"1..3,8"`` -> sorted distinct Ks, each in 1..MAX_K."""
    if text is None or not str(text).strip():
        raise MlxspecError("no K values given: expected e.g. 1..8 or 1,2,4,8")
    text = str(text)
    ks: set[int] = set()
    for part in text.split(","):
        ks.update(_parse_k_item(part.strip(), text))
    return sorted(ks)


def _parse_k_item(part: str, text: str) -> range:
    if not part:
        raise MlxspecError(f"bad K list {text!r}: empty item (expected e.g. 1..8 or 1,2,4,8)")
    m = _RANGE.match(part)
    if m:
        lo, hi = int(m.group(1)), int(m.group(2))
        for v in (lo, hi):
            _check_k(v, text)
        if lo > hi:
            raise MlxspecError(f"bad K range {part!r} in {text!r}: it runs backwards (write {hi}..{lo})")
        return range(lo, hi + 1)
    if _INT.match(part):
        _check_k(int(part), text)
        return range(int(part), int(part) + 1)
    raise MlxspecError(f"bad K value {part!r} in {text!r}: expected an integer or a range "
                       f"like 1..8 (e.g. 1..8, 1,2,4,8 or 1..3,8)")


def _check_k(v: int, text: str) -> None:
    if not 1 <= v <= MAX_K:
        raise MlxspecError(f"K must be in 1..{MAX_K}, got {v} (in {text!r})")


@dataclass(frozen=True)
class SweepOptions:
    """What ``sweep`` was asked for. ``ks``: a list or a ``parse_ks`` text; ``model``: a
    ``loading.load`` spec or a loaded model; ``auto``: time ``--k auto`` too, a fresh ``AutoK``
    per run on this machine's verify-cost curve (measured first if not cached, or with
    ``remeasure_cost``); ``trees``: ``TreeShape``s timed beside the Ks."""

    ks: Sequence[int] | str
    model: Any = "default"
    draft: str = "ngram:3"
    temp: float = 0.0
    top_p: float = 1.0
    prompts_file: str | Path | None = None
    per_category: int = 1
    categories: Sequence[str] | None = None
    max_tokens: int = 48
    warmup: int = 1
    repeats: int = 1
    seed: int = 0
    dtype: str = "auto"
    verify_reps: int = VERIFY_REPS
    auto: bool = True
    remeasure_cost: bool = False
    trees: Sequence[Any] = ()

    def checked(self) -> SweepOptions:
        """The options with the Ks parsed, sorted and checked, the other counts checked."""
        ks = parse_ks(self.ks) if isinstance(self.ks, str) else self.ks
        ks = sorted({int(k) for k in ks})
        if not ks:
            raise MlxspecError("no K values to sweep")
        for k in ks:
            _check_k(k, ",".join(map(str, ks)))
        if self.max_tokens < 2:
            raise MlxspecError(f"max_tokens must be >= 2 to time decoding, got {self.max_tokens}")
        if self.repeats < 1 or self.warmup < 0:
            raise MlxspecError("repeats must be >= 1 and warmup >= 0")
        if self.verify_reps < 1:
            raise MlxspecError(f"verify_reps must be >= 1, got {self.verify_reps}")
        return replace(self, ks=ks, temp=float(self.temp), top_p=float(self.top_p))
