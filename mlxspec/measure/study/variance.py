"""Domain against depth: logistic regressions of ``accepted`` (judged nodes) on domain dummies,
depth dummies and both (numpy IRLS on the domain x depth cells), their deviances and the
likelihood-ratio test of each factor given the other."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.stats import chi2

from mlxspec.measure.study.prompts import DOMAINS


def logistic_deviance(X: np.ndarray, successes: np.ndarray, trials: np.ndarray, max_iter: int = 200,
                      tol: float = 1e-10) -> float:
    """-2 log-likelihood of the maximum-likelihood logistic regression of binomial counts
    (``successes`` of ``trials`` per row of the design ``X``), by Newton's method (IRLS) with
    step halving. A category whose cells all succeed or all fail drives its coefficient off to
    infinity; the deviance still converges, to that of the fitted cell rates."""
    X = np.asarray(X, dtype=np.float64)
    s, n = np.asarray(successes, dtype=np.float64), np.asarray(trials, dtype=np.float64)

    def dev(beta: np.ndarray) -> tuple[float, np.ndarray]:
        eta = np.clip(X @ beta, -40, 40)
        mu = 1.0 / (1.0 + np.exp(-eta))
        ll = s * np.log(np.maximum(mu, 1e-300)) + (n - s) * np.log(np.maximum(1 - mu, 1e-300))
        return float(-2 * ll.sum()), mu

    beta = np.zeros(X.shape[1])
    d, mu = dev(beta)
    for _ in range(max_iter):
        w = n * mu * (1 - mu)
        grad = X.T @ (s - n * mu)
        hess = (X.T * w) @ X + 1e-9 * np.eye(X.shape[1])
        step = np.linalg.lstsq(hess, grad, rcond=None)[0]
        for _ in range(30):
            d_new, mu_new = dev(beta + step)
            if d_new <= d + 1e-12:
                break
            step = step / 2
        else:
            break
        beta = beta + step
        improved = d - d_new
        d, mu = d_new, mu_new
        if improved < tol * max(1.0, abs(d)):
            break
    return d


def _dummies(levels: Sequence[Any], values: Sequence[Any]) -> np.ndarray:
    """Treatment coding: one column per level but the first."""
    return np.array([[v == lv for lv in levels[1:]] for v in values], dtype=np.float64).reshape(len(values), -1)


@dataclass(frozen=True)
class FactorTest:
    """How much of the deviance of ``accepted`` a factor explains, alone and given the other."""

    factor: str
    levels: int
    deviance: float  # of the model with this factor alone
    explained: float  # null deviance minus that
    pseudo_r2: float  # McFadden: explained / null deviance
    lr_given_other: float  # deviance drop when it joins the other factor
    df: int
    p_given_other: float


@dataclass(frozen=True)
class VarianceTest:
    """Logistic regressions of ``accepted`` (judged nodes) on domain, depth and both."""

    nodes: int
    null_deviance: float
    both_deviance: float
    domain: FactorTest
    depth: FactorTest

    @property
    def stronger(self) -> str | None:
        """The factor that explains more deviance alone ("domain", "depth"; None on a tie)."""
        a, b = self.domain.explained, self.depth.explained
        return None if abs(a - b) < 1e-9 else "domain" if a > b else "depth"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "stronger": self.stronger}


def _cells(judged: Sequence[dict[str, Any]]) -> dict[tuple[str, int], list[int]]:
    """(domain, depth) -> [accepted, judged] counts."""
    cells: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for n in judged:
        c = cells[(n["domain"], n["depth"])]
        c[0] += bool(n["accepted"])
        c[1] += 1
    return cells


def domain_vs_depth(nodes: Sequence[dict[str, Any]]) -> VarianceTest | None:
    """``VarianceTest`` of the judged nodes; None when there are none, or nothing varies."""
    judged = [n for n in nodes if n["judged"]]
    if not judged:
        return None
    doms = [d for d in DOMAINS if any(n["domain"] == d for n in judged)]
    doms += sorted({n["domain"] for n in judged} - set(doms))
    deps = sorted({n["depth"] for n in judged})
    cells = _cells(judged)
    keys = list(cells)
    s = np.array([cells[k][0] for k in keys], dtype=np.float64)
    t = np.array([cells[k][1] for k in keys], dtype=np.float64)
    one = np.ones((len(keys), 1))
    xd, xk = _dummies(doms, [k[0] for k in keys]), _dummies(deps, [k[1] for k in keys])
    d0 = logistic_deviance(one, s, t)
    dd = logistic_deviance(np.hstack([one, xd]), s, t)
    dk = logistic_deviance(np.hstack([one, xk]), s, t)
    db = logistic_deviance(np.hstack([one, xd, xk]), s, t)

    def test(name: str, levels: int, alone: float, other: float) -> FactorTest:
        lr, df = max(0.0, other - db), levels - 1
        return FactorTest(name, levels, alone, d0 - alone, (d0 - alone) / d0 if d0 > 0 else 0.0, lr, df,
                          float(chi2.sf(lr, df)) if df > 0 else 1.0)

    return VarianceTest(len(judged), d0, db, test("domain", len(doms), dd, dk), test("depth", len(deps), dk, dd))
