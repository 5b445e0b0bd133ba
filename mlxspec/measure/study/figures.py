"""The study's figures, pure functions of the node records: per domain (E[accepted length] per
tree step, acceptance of judged nodes, mean alpha = min(1, p/q), mean entropy, Spearman rho of
entropy against acceptance and alpha), the depth profile, and acceptance in entropy bins."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from mlxspec.measure.study.prompts import DOMAINS
from mlxspec.measure.study.stats import RESAMPLES, Estimate, ratio_estimate, spearman_estimate


def alpha(node: dict[str, Any]) -> float | None:
    """The paper's per-node acceptance measure min(1, p/q); None without a draft probability."""
    q = node.get("q_draft")
    if q is None:
        return None
    return 1.0 if q <= 0 else min(1.0, node["p_target"] / q)


@dataclass(frozen=True)
class DomainRow:
    domain: str
    prompts: int
    steps: int  # tree steps
    nodes: int
    judged: int
    expected_length: Estimate  # accepted nodes per tree step
    acceptance: float | None  # accepted / judged nodes
    mean_alpha: float | None  # min(1, p/q) over all nodes (None without draft probabilities)
    mean_entropy: float | None  # nats, over all nodes
    rho_accepted: Estimate  # Spearman(entropy, accepted), judged nodes
    rho_alpha: Estimate  # Spearman(entropy, alpha), all nodes with q

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("expected_length", "rho_accepted", "rho_alpha"):
            d[k] = getattr(self, k).to_json()
        return d


@dataclass(frozen=True)
class DepthRow:
    """One depth of the profile. Node level: ``acceptance`` = accepted / judged nodes (at most
    1/B with B siblings, one of which can be on the path) and ``mean_alpha``. Path level:
    ``reached`` steps whose accepted path got to depth - 1 with children below it, of which
    ``continued`` accepted one of them; ``continues`` = their ratio, as a chain's acceptance
    by position (E[accepted length] = sum over depths of the product of continues up to there)."""

    domain: str  # or "all"
    depth: int
    nodes: int
    judged: int
    accepted: int
    acceptance: float | None  # accepted / judged
    mean_alpha: float | None
    reached: int = 0
    continued: int = 0
    continues: float | None = None


@dataclass(frozen=True)
class EntropyBin:
    domain: str  # or "all"
    lo: float
    hi: float
    judged: int
    acceptance: float | None
    nodes: int
    mean_alpha: float | None


def _mean(xs: Sequence[float]) -> float | None:
    return float(np.mean(xs)) if len(xs) else None


def _domains_in(nodes: Sequence[dict[str, Any]]) -> list[str]:
    present = {n["domain"] for n in nodes}
    return [d for d in DOMAINS if d in present] + sorted(present - set(DOMAINS))


def _domain_row(d: str, mine: list[dict[str, Any]], resamples: int, seed: int) -> DomainRow:
    steps: dict[tuple, int] = defaultdict(int)
    for n in mine:
        steps[(n["prompt_id"], n["step"])] += bool(n["accepted"])
    skeys = list(steps)
    judged = [n for n in mine if n["judged"]]
    with_q = [(n["entropy"], a) for n in mine if (a := alpha(n)) is not None]
    return DomainRow(
        domain=d, prompts=len({n["prompt_id"] for n in mine}), steps=len(skeys), nodes=len(mine),
        judged=len(judged),
        expected_length=ratio_estimate([steps[k] for k in skeys], [1.0] * len(skeys), [k[0] for k in skeys],
                                       resamples, seed),
        acceptance=_mean([float(n["accepted"]) for n in judged]),
        mean_alpha=_mean([a for _, a in with_q]), mean_entropy=_mean([n["entropy"] for n in mine]),
        rho_accepted=spearman_estimate([n["entropy"] for n in judged], [float(n["accepted"]) for n in judged],
                                       [n["prompt_id"] for n in judged], resamples, seed),
        rho_alpha=spearman_estimate([h for h, _ in with_q], [a for _, a in with_q],
                                    [n["prompt_id"] for n in mine if alpha(n) is not None], resamples, seed),
    )


def domain_rows(nodes: Sequence[dict[str, Any]], resamples: int = RESAMPLES, seed: int = 0) -> list[DomainRow]:
    return [_domain_row(d, [n for n in nodes if n["domain"] == d], resamples, seed) for d in _domains_in(nodes)]


def depth_rows(nodes: Sequence[dict[str, Any]]) -> list[DepthRow]:
    """The depth profile per domain, then pooled ("all")."""
    out = []
    for d in [*_domains_in(nodes), "all"]:
        mine = [n for n in nodes if d == "all" or n["domain"] == d]
        for depth in sorted({n["depth"] for n in mine}):
            at = [n for n in mine if n["depth"] == depth]
            judged = [n for n in at if n["judged"]]
            acc = sum(bool(n["accepted"]) for n in judged)
            # the judged nodes of one step at one depth are the children of its path's node above
            groups = {(n["domain"], n["prompt_id"], n["step"]) for n in judged}
            went_on = {(n["domain"], n["prompt_id"], n["step"]) for n in judged if n["accepted"]}
            out.append(DepthRow(d, depth, len(at), len(judged), acc, acc / len(judged) if judged else None,
                                _mean([a for n in at if (a := alpha(n)) is not None]), len(groups), len(went_on),
                                len(went_on) / len(groups) if groups else None))
    return out


def entropy_bins(nodes: Sequence[dict[str, Any]], bins: int = 8) -> list[EntropyBin]:
    """Acceptance (judged nodes) and mean alpha (all nodes) in entropy bins: quantiles of the
    pooled entropies, the same edges for every domain."""
    if not nodes:
        return []
    h = np.array([n["entropy"] for n in nodes])
    edges = np.unique(np.quantile(h, np.linspace(0, 1, bins + 1)))
    if edges.size < 2:
        edges = np.array([h.min(), h.max() + 1e-9])
    out = []
    for d in [*_domains_in(nodes), "all"]:
        mine = [n for n in nodes if d == "all" or n["domain"] == d]
        idx = np.clip(np.searchsorted(edges, [n["entropy"] for n in mine], side="right") - 1, 0, edges.size - 2)
        for b in range(edges.size - 1):
            at = [n for n, i in zip(mine, idx) if i == b]
            judged = [n for n in at if n["judged"]]
            out.append(EntropyBin(d, float(edges[b]), float(edges[b + 1]), len(judged),
                                  _mean([float(n["accepted"]) for n in judged]), len(at),
                                  _mean([a for n in at if (a := alpha(n)) is not None])))
    return out
