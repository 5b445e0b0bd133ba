"""Real-model distribution equivalence (level c of the three levels): ``mlxspec verify``.

Two checks on the real target, both against target-only decoding with the same weights: a
two-sample chi-squared test of sampled tokens with a paired permutation p-value (``sampling``,
``homogeneity``) and token-for-token greedy agreement with near-ties told apart from mismatches
(``greedy``). ``run_verify`` takes a ``VerifyOptions`` record (``inputs``) and returns a
``VerifyResult`` (``run``); ``render`` draws it.
"""

from mlxspec.measure.equivalence.greedy import NEAR_TIE, greedy_check
from mlxspec.measure.equivalence.homogeneity import (
    ALPHA,
    chi2_stat,
    contingency_bins,
    homogeneity,
    permutation_null,
    permutation_p,
)
from mlxspec.measure.equivalence.inputs import (
    QUICK_GREEDY,
    QUICK_SAMPLING,
    MethodTotals,
    VerifyOptions,
    verify_prompts,
)
from mlxspec.measure.equivalence.render import print_verify
from mlxspec.measure.equivalence.run import VerifyResult, run_verify
from mlxspec.measure.equivalence.sampling import sampling_check

__all__ = [
    "ALPHA", "NEAR_TIE", "QUICK_GREEDY", "QUICK_SAMPLING", "MethodTotals", "VerifyOptions", "VerifyResult",
    "chi2_stat", "contingency_bins", "greedy_check", "homogeneity", "permutation_null", "permutation_p",
    "print_verify", "run_verify", "sampling_check", "verify_prompts",
]
