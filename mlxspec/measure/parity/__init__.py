"""``mlxspec parity``: how far apart the MLX and the PyTorch backends are on the same held-out
prompts. Four checks: the logits layer by layer (``logits``), greedy tokens for target-only and
every drafter at every K (``greedy``), sampling decisions under shared uniforms
(``decisions``), and decoding speed side by side (``speed``); ``run_parity`` takes a
``ParityOptions`` record and returns a ``ParityResult`` (``records``); ``render`` draws it.
"""

from mlxspec.measure.parity.greedy import divergence, drafter_pairs, greedy_agreement
from mlxspec.measure.parity.logits import DiffSum, layer_diffs
from mlxspec.measure.parity.decisions import decision_agreement
from mlxspec.measure.parity.records import (
    DECISION_DRAWS,
    QUICK,
    RELATIVE,
    SPEED_REPEATS,
    TOLERANCE,
    ParityResult,
)
from mlxspec.measure.parity.render import print_parity
from mlxspec.measure.parity.run import (
    ParityOptions,
    default_drafters,
    load_pair,
    parity_prompts,
    parse_drafters,
    run_parity,
)
from mlxspec.measure.parity.speed import speed

__all__ = [
    "DECISION_DRAWS", "QUICK", "RELATIVE", "SPEED_REPEATS", "TOLERANCE", "DiffSum", "ParityOptions", "ParityResult",
    "decision_agreement", "default_drafters", "divergence", "drafter_pairs", "greedy_agreement", "layer_diffs",
    "load_pair", "parity_prompts", "parse_drafters", "print_parity", "run_parity", "speed",
]
