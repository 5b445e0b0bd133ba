"""``run_verify(VerifyOptions(...))``: both equivalence checks on one model, the sampling check
then the greedy one, as a ``VerifyResult`` whose ``to_json()`` is ``mlxspec verify``'s JSON."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlxspec.measure.equivalence.greedy import greedy_check
from mlxspec.measure.equivalence.inputs import VerifyOptions
from mlxspec.measure.equivalence.sampling import sampling_check


@dataclass(frozen=True)
class VerifyResult:
    """The two checks' results (``sampling_check``'s and ``greedy_check``'s JSON)."""

    sampling: dict[str, Any]
    greedy: dict[str, Any]

    @property
    def passed(self) -> bool:
        return self.sampling["passed"] and self.greedy["passed"]

    def to_json(self) -> dict[str, Any]:
        return {"sampling": self.sampling, "greedy": self.greedy, "passed": self.passed}


def run_verify(options: VerifyOptions, progress: Callable[[int, int, str], Any] | None = None) -> VerifyResult:
    """The sampling check, then the greedy check (each loads ``options.model`` if it is a spec)."""
    return VerifyResult(sampling_check(options, progress), greedy_check(options, progress))
