"""Benchmarks. Two of them, each a settings record in, a result record out, rendering apart:

* ``baseline_bench(BaselineOptions)``: mlxspec's target-only decoder against mlx-lm's, and both
  against the memory-bandwidth floor, with torch columns beside them (``baseline``,
  ``torch_columns``);
* ``spec_bench(SpecOptions)``: speculative against target-only decoding on a balanced
  Spec-Bench subset, with acceptance statistics (``speculative``, ``summary``), and mlx-lm's
  own speculative decoding as a peer (``peer``).

Both time in ``core.schedule``'s order; results' ``to_json()`` is the result JSON (schema 2,
see ``runs``), verdicts rest on paired comparisons (``verdict``), ``render`` prints them.
"""

from mlxspec.measure.bench.baseline import (
    DEFAULT_QUESTIONS,
    BaselineOptions,
    BaselineResult,
    baseline_bench,
    default_prompts,
    measure_bandwidth,
)
from mlxspec.measure.bench.busy import busy_cores
from mlxspec.measure.bench.common import label, torch_key
from mlxspec.measure.bench.peer import mlx_lm_steps
from mlxspec.measure.bench.render import print_baseline, print_result, print_spec, print_verdicts
from mlxspec.measure.bench.speculative import SpecBenchResult, SpecOptions, spec_bench
from mlxspec.measure.bench.summary import SpecRun, aggregate, temp_result, verdicts
from mlxspec.measure.bench.torch_columns import (
    TorchFlags,
    TorchColumn,
    TorchInfo,
    first_divergence,
    torch_columns,
    torch_verdict,
)

__all__ = [
    "DEFAULT_QUESTIONS", "BaselineOptions", "BaselineResult", "SpecBenchResult", "SpecOptions", "SpecRun",
    "TorchColumn", "TorchInfo", "aggregate", "baseline_bench", "busy_cores", "default_prompts", "first_divergence", "label",
    "measure_bandwidth", "mlx_lm_steps", "print_baseline", "print_result", "print_spec", "print_verdicts",
    "spec_bench", "temp_result", "TorchFlags", "torch_columns", "torch_key", "torch_verdict", "verdicts",
]
