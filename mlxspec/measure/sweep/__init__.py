"""``mlxspec sweep``: wall-clock throughput for every K, the optimum, and why speculation loses.

For each K, on the same prompts as target-only decoding (measured in the same run, the method
order rotating round by round, ``core.schedule``), after warm-up: end-to-end tokens/s, the
paired speedup over target-only with a bootstrap 95% interval, conditional acceptance per draft
position, draft ms per token, and one target pass over K+1 tokens against one token (flat:
batch-parallel verification; ~K+1: serial). ``--k auto`` and tree shapes are timed beside the
Ks and judged paired against the best fixed K. A settings record in (``options``), the runs
(``run``), a result record out (``summary``, ``records``, ``diagnosis`` with the ``costmodel``),
rendering apart (``render``, ``plot``).
"""

from mlxspec.measure.sweep.costmodel import (
    VERIFY_REPS,
    Prediction,
    argbest,
    cost_model,
    expected_tokens,
    predicted_tps,
    step_ms,
    verify_kind,
    verify_slope,
)
from mlxspec.measure.sweep.diagnosis import Diagnosis, Measured, diagnose
from mlxspec.measure.sweep.options import SweepOptions, parse_ks
from mlxspec.measure.sweep.plot import plot_sweep
from mlxspec.measure.sweep.records import KRow, SweepResult, SweepRun, SweepSettings, tree_method
from mlxspec.measure.sweep.render import print_sweep, write_csv, write_files
from mlxspec.measure.sweep.run import run_sweep
from mlxspec.measure.sweep.summary import k_row, position_acceptance, summarise

__all__ = [
    "VERIFY_REPS", "Diagnosis", "KRow", "Measured", "Prediction", "SweepOptions", "SweepResult", "SweepRun",
    "SweepSettings", "argbest", "cost_model", "diagnose", "expected_tokens", "k_row", "parse_ks", "plot_sweep",
    "position_acceptance", "predicted_tps", "print_sweep", "run_sweep", "step_ms", "summarise", "tree_method",
    "verify_kind", "verify_slope", "write_csv", "write_files",
]
