"""The records of ``mlxspec parity``: what each of its four checks finds (``Diff`` per output,
``GreedyRow`` per method, ``DecisionRow`` per prompt, ``Speed``), the goals, and the
``ParityResult`` whose ``to_json()`` is the command's JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from mlxspec.measure.runs import SCHEMA, RunHeader

# Max relative logit difference allowed, by the torch model's dtype (the MLX reference is
# float32). The issue's goal is float32's; half precision rounds every weight and activation
# to 3 (float16) or 2 (bfloat16) decimal digits, so its bound is that precision's, looser.
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
RELATIVE = "|mlx - torch| / max |mlx| over the row (one position's outputs), MLX float32 the reference"
DEFAULT_KS = tuple(range(1, 9))
DEFAULT_PROMPTS = 6  # one per Spec-Bench category
DEFAULT_MAX_TOKENS = 32
DECISION_Q_TEMP = 1.25  # q of the decision check: the target's own distribution at this temperature
DECISION_DRAWS = 200
SPEED_REPEATS = 3
SELF_LAYERS = 8
# --quick: CI-sized (two prompts, fewer Ks and draws).
QUICK = {"prompts": 2, "ks": (1, 4, 8), "max_tokens": 16, "draws": 50, "repeats": 2}

@dataclass(frozen=True)
class Diff:
    """One output compared over all prompts (``RELATIVE``)."""

    name: str
    max_rel: float
    mean_rel: float
    max_abs: float
    elements: int


@dataclass(frozen=True)
class Divergence:
    """Where one prompt's two greedy outputs first differ, and the two tokens' logits there
    (each backend's one fresh pass over the common prefix)."""

    prompt: Any
    at: int
    mlx_token: int | None
    torch_token: int | None
    mlx_text: str
    torch_text: str
    mlx_logits: tuple[float, float] | None  # MLX's logits of (mlx_token, torch_token)
    torch_logits: tuple[float, float] | None  # torch's logits of the same two tokens
    allowed_gap: float | None  # 2 * tolerance * max |MLX logit|
    near_tie: bool
    reason: str = ""


@dataclass(frozen=True)
class GreedyRow:
    """One method (target-only, or a drafter at one K) over every prompt."""

    draft: str
    k: int | None  # None: target-only
    prompts: int
    identical: int
    near_ties: int
    mismatches: int
    tokens_compared: int
    tokens_agreeing: int
    same_steps: int  # prompts whose per-step accepted counts agree too
    tau_mlx: float | None  # mean accepted drafts per step
    tau_torch: float | None
    divergences: list[Divergence]

    @property
    def label(self) -> str:
        return "target-only" if self.k is None else f"{self.draft} K={self.k}"


@dataclass(frozen=True)
class DecisionRow:
    """One prompt's decisions under ``draws`` shared uniform vectors."""

    prompt: Any
    k: int
    draws: int
    agree: int
    explained: int  # disagreements where a uniform lies between the two acceptance ratios
    unexplained: int
    mean_accepted: float  # MLX's n_accepted, averaged over the draws
    residual_max_abs: float  # over draws that agree
    keep_max_abs: float  # |min(1, p/q) MLX - torch| at the draft tokens, max over positions


@dataclass(frozen=True)
class BackendSpeed:
    backend: str
    decode_tps_median: float
    decode_tps_min: float
    decode_tps_max: float
    tps_median: float  # end to end, prefill included
    tokens_per_run: int
    runs: int


@dataclass(frozen=True)
class Speed:
    prompt: Any
    prompt_tokens: int
    max_tokens: int
    warmup: int
    mlx: BackendSpeed
    torch: BackendSpeed

    @property
    def ratio(self) -> float | None:
        """torch / MLX median decode tokens/s."""
        return self.torch.decode_tps_median / self.mlx.decode_tps_median if self.mlx.decode_tps_median else None


@dataclass(frozen=True)
class TorchInfo:
    version: str
    device: str
    dtype: str
    threads: int


@dataclass(frozen=True)
class Settings:
    prompts: list[dict[str, Any]]
    drafters: list[str]
    ks: list[int]
    max_tokens: int
    decision_draws: int
    decision_q_temp: float
    speed_repeats: int
    seed: int
    note: str | None


@dataclass(frozen=True)
class Goals:
    """The issue's goals: logits within ``tolerance``, no greedy mismatch, no unexplained
    decision disagreement."""

    tolerance: float
    logits_max_rel: float
    logits: bool
    greedy: bool
    decisions: bool

    def missed(self) -> list[str]:
        out = []
        if not self.logits:
            out.append(f"logits: max relative difference {self.logits_max_rel:.2e} > {self.tolerance:g}")
        if not self.greedy:
            out.append("greedy: outputs differ beyond a near-tie")
        if not self.decisions:
            out.append("decisions: n_accepted differs for the same uniforms beyond the logits' difference")
        return out

    @property
    def passed(self) -> bool:
        return self.logits and self.greedy and self.decisions


@dataclass(frozen=True)
class ParityResult:
    header: RunHeader  # of the MLX reference
    torch: TorchInfo
    settings: Settings
    layers: list[Diff]  # embed, layer 0..N-1, norm, head, logits (cached pass)
    greedy: list[GreedyRow]
    decisions: list[DecisionRow]
    speed: Speed | None
    goals: Goals

    @property
    def passed(self) -> bool:
        return self.goals.passed

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "check": "parity", "header": self.header.to_json(), "torch": asdict(self.torch),
            "settings": asdict(self.settings), "relative": RELATIVE, "tolerance": self.goals.tolerance,
            "layers": [asdict(d) for d in self.layers],
            "greedy": [{**asdict(g), "label": g.label} for g in self.greedy],
            "decisions": [asdict(d) for d in self.decisions],
            "speed": None if self.speed is None else {**asdict(self.speed), "ratio": self.speed.ratio},
            "goals": asdict(self.goals), "missed": self.goals.missed(), "passed": self.passed,
        }
