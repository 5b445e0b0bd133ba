"""The published study's findings (``PAPER``) and ours beside them: each claim marked holds,
does not hold or cannot tell, from the figures and the domain-vs-depth regression."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlxspec.measure.study.figures import DepthRow, DomainRow
from mlxspec.measure.study.variance import VarianceTest

FLAT_DEPTH = 0.10  # a depth profile whose acceptance spans less than this is "flat"
WEAK_RHO = 0.3  # |rho| below this is a "weak" correlation
SIGNIFICANT = 0.01  # likelihood-ratio tests


@dataclass(frozen=True)
class Paper:
    """The published figures (TinyLlama-1.1B drafting for Llama-2-7B, 50 prompts per domain,
    3x2 trees of at most 8 nodes, greedy). Its domains: code (HumanEval), maths
    (MATH algebra), reasoning (GSM8K), chat (UltraChat)."""

    expected_length: tuple[float, float] = (0.91, 1.07)  # per step, maths lowest, chat highest
    mean_alpha: tuple[float, float] = (0.52, 0.57)
    rho: tuple[float, float] = (-0.20, -0.15)  # entropy vs alpha, within each domain
    above_one: tuple[str, ...] = ("chat",)
    text: str = ("TinyLlama-1.1B -> Llama-2-7B, 200 prompts, ~100k nodes, 3x2 trees (8 nodes), greedy; its "
                 "domains: code HumanEval, maths MATH algebra, reasoning GSM8K, chat UltraChat")


PAPER = Paper()


@dataclass(frozen=True)
class Claim:
    claim: str
    paper: str
    ours: str
    verdict: str  # "holds" | "does not hold" | "cannot tell"


def _range(xs: Sequence[float]) -> str:
    return f"{min(xs):.2f}-{max(xs):.2f}" if xs else "-"


def _length_claims(rows: Sequence[DomainRow]) -> list[Claim]:
    el = {r.domain: r.expected_length.value for r in rows if r.expected_length.value is not None}
    if not el:
        return []
    lo, hi = PAPER.expected_length
    inside = all(lo - 0.05 <= v <= hi + 0.05 for v in el.values())
    above = sorted(d for d, v in el.items() if v > 1.0)
    return [Claim("E[accepted length] per step across domains", "0.91 (maths) - 1.07 (chat)",
                  ", ".join(f"{d} {v:.2f}" for d, v in el.items()), "holds" if inside else "does not hold"),
            Claim("only chat accepts more than 1.0 token per step", "chat only", ", ".join(above) or "none",
                  "holds" if above == ["chat"] else "cannot tell" if "chat" not in el else "does not hold")]


def _alpha_claims(rows: Sequence[DomainRow]) -> list[Claim]:
    alphas = [r.mean_alpha for r in rows if r.mean_alpha is not None]
    if not alphas:
        return []
    lo, hi = PAPER.mean_alpha
    inside = all(lo - 0.05 <= a <= hi + 0.05 for a in alphas)
    return [Claim("mean alpha = min(1, p/q) per node", "0.52-0.57", _range(alphas),
                  "holds" if inside else "does not hold")]


def _rho_claims(rows: Sequence[DomainRow]) -> list[Claim]:
    out = []
    for label, get in (("entropy vs alpha", lambda r: r.rho_alpha), ("entropy vs acceptance", lambda r: r.rho_accepted)):
        ests = [(r.domain, get(r)) for r in rows if get(r).value is not None]
        if not ests:
            continue
        if any(e.hi is None for _, e in ests):
            verdict = "cannot tell"
        elif all(e.hi < 0 and e.value > -WEAK_RHO for _, e in ests):
            verdict = "holds"
        elif any(e.lo > 0 or e.value <= -WEAK_RHO for _, e in ests):
            verdict = "does not hold"
        else:
            verdict = "cannot tell"  # some interval includes 0
        out.append(Claim(f"Spearman rho, {label}: weak and negative in every domain",
                         "-0.20 to -0.15 (entropy vs alpha)", ", ".join(f"{d} {e.value:+.2f}" for d, e in ests), verdict))
    return out


def _variance_claims(test: VarianceTest | None) -> list[Claim]:
    if test is None:
        return []
    dom, dep = test.domain, test.depth
    ours = (f"deviance explained: domain {dom.explained:.1f} ({dom.df} df, p={dom.p_given_other:.2g} given depth), "
            f"depth {dep.explained:.1f} ({dep.df} df, p={dep.p_given_other:.2g} given domain)")
    verdict = ("cannot tell" if test.stronger is None or (dom.p_given_other > SIGNIFICANT and dep.p_given_other > SIGNIFICANT)
               else "holds" if test.stronger == "domain" else "does not hold")
    return [Claim("task type predicts acceptance better than depth", "yes", ours, verdict)]


def _depth_claims(depths: Sequence[DepthRow]) -> list[Claim]:
    # the paper's profile is of alpha; without draft probabilities, of the judged nodes' acceptance
    every = [r for r in depths if r.domain == "all" and r.judged >= 20]
    by_alpha = all(r.mean_alpha is not None for r in every)
    pooled = [r.mean_alpha if by_alpha else r.acceptance for r in every]
    if len(pooled) < 2:
        return []
    spread = max(pooled) - min(pooled)
    return [Claim(f"flat depth profile ({'mean alpha' if by_alpha else 'acceptance of judged nodes'} by depth)",
                  "flat",
                  " / ".join(f"{a:.2f}" for a in pooled) + f" (spread {spread:.2f})",
                  "holds" if spread < FLAT_DEPTH else "does not hold")]


def _chat_claims(rows: Sequence[DomainRow]) -> list[Claim]:
    ent = {r.domain: r.mean_entropy for r in rows if r.mean_entropy is not None}
    acc = {r.domain: r.acceptance for r in rows if r.acceptance is not None}
    if not ("chat" in ent and "chat" in acc and len(ent) > 1):
        return []
    top_h, top_a = max(ent, key=ent.get), max(acc, key=acc.get)
    return [Claim("chat has the highest entropy and yet the highest acceptance", "chat, chat",
                  f"highest entropy {top_h} ({ent[top_h]:.2f} nats), highest acceptance {top_a} ({acc[top_a]:.2f})",
                  "holds" if top_h == top_a == "chat" else "does not hold")]


def paper_claims(rows: Sequence[DomainRow], depths: Sequence[DepthRow], test: VarianceTest | None) -> list[Claim]:
    """The paper's findings, each against ours."""
    return (_length_claims(rows) + _alpha_claims(rows) + _rho_claims(rows) + _variance_claims(test)
            + _depth_claims(depths) + _chat_claims(rows))
