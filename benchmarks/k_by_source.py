"""Does ``--k auto`` gain from learning each kind of draft on its own? (issue 38 item 3)

Prompt lookup (``ngram:3``, the CPU default) tells before drafting how long a match it found,
and a 3-token match's drafts are kept far more often than a 2-token one's. One policy keeps an
acceptance estimate per match length (``autok.SourcedK`` over the drafter's ``sources``); the
other, what ``--k auto`` builds for lookup, pools them in one ``AutoK``. One session on the default model; for each setting (greedy, plain T=1, the chat's T=1
min-p 0.1), each held-out prompt and seed: target-only decoding, then lookup under each policy,
the order of the two rotating from pair to pair. Both policies learn across prompts, as a chat's
does across turns. Exact either way (only K differs), so the texts at T = 0 are checked equal.

    python benchmarks/k_by_source.py [--prompts benchmarks/prompts/heldout-8.jsonl] [-n 96] [--seeds 6]
        [--draft ngram:3] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import mlxspec  # noqa: F401  (fast BLAS before mlx)
from mlxspec.core.autok import DEFAULT_MAX_K, AutoK, SourcedK
from mlxspec.core.drafters.base import sources, trait, used_source
from mlxspec.core.runs import Run, collect_run
from mlxspec.core.sampling import SamplingParams
from mlxspec.cpuload import CpuMeter
from mlxspec.measure.runs import read_prompts_file
from mlxspec.measure.verdict import Interval, median_ratio
from mlxspec.session import Session, SessionOptions

SETTINGS = (("greedy", 0.0, 0.0), ("T=1", 1.0, 0.0), ("T=1 min-p=0.1", 1.0, 0.1))  # (label, temperature, min-p)
POLICIES = ("by kind", "pooled")


@dataclass(frozen=True)
class Reply:
    """One timed reply: which pair (setting, prompt, seed) and method, and the engine's run."""

    setting: str
    prompt: str
    seed: int
    method: str
    seconds: float
    run: Run
    kinds: tuple[int, ...]  # the kind of draft (index in ``sources``) of each step that drafted

    @property
    def tps(self) -> float:
        return len(self.run.tokens) / self.seconds

    def record(self) -> dict:
        steps = [(d, a) for d, a in zip(self.run.drafted, self.run.accepted) if d]
        return {"setting": self.setting, "prompt": self.prompt, "seed": self.seed, "method": self.method,
                "tokens": len(self.run.tokens), "seconds": self.seconds, "drafting_steps": len(steps),
                "drafted": sum(d for d, _ in steps), "kept": sum(a for _, a in steps)}


@dataclass(frozen=True)
class Summary:
    setting: str
    policy: str
    tau: float  # drafts kept per drafting step
    mean_k: float  # drafts per drafting step
    vs_target: float | None
    vs_target_interval: Interval | None
    vs_pooled: float | None
    vs_pooled_interval: Interval | None
    same_text_as_pooled: int | None  # greedy: pairs whose text is the pooled policy's
    runs: int
    by_kind: dict[str, KindStats]


@dataclass(frozen=True)
class KindStats:
    steps: int
    mean_k: float
    first_kept: float  # share of the kind's steps that kept their first draft
    tau: float


class KindLog:
    """Wraps a drafter's ``propose`` to note the kind of draft of every non-empty proposal."""

    def __init__(self, drafter: Any):
        self.drafter, self.kinds, self._propose = drafter, [], drafter.propose
        drafter.propose = self.propose

    def propose(self, *args: Any) -> Any:
        proposal = self._propose(*args)
        if len(proposal.tokens):
            self.kinds.append(used_source(self.drafter))
        return proposal


def timed(session: Session, log: KindLog, setting: str, prompt: str, seed: int, method: str, ids: list[int],
          params: SamplingParams, max_tokens: int) -> Reply:
    log.kinds.clear()
    t0 = time.perf_counter()
    run = collect_run(session.stream(ids, params, max_tokens, seed))
    seconds = time.perf_counter() - t0
    assert len(log.kinds) == sum(1 for d in run.drafted if d), "a drafting step's kind went unnoted"
    return Reply(setting, prompt, seed, method, seconds, run, tuple(log.kinds))


def kind_stats(replies: list[Reply], names: tuple[str, ...]) -> dict[str, KindStats]:
    steps: dict[int, list[tuple[int, int]]] = {}
    for r in replies:
        drafting = [(d, a) for d, a in zip(r.run.drafted, r.run.accepted) if d]
        for kind, step in zip(r.kinds, drafting):
            steps.setdefault(kind, []).append(step)
    return {names[kind]: KindStats(len(s), round(sum(d for d, _ in s) / len(s), 2),
                                   round(sum(a > 0 for _, a in s) / len(s), 3), round(sum(a for _, a in s) / len(s), 3))
            for kind, s in sorted(steps.items())}


def summarize(setting: str, policy: str, replies: list[Reply], names: tuple[str, ...]) -> Summary:
    by = {(r.prompt, r.seed, r.method): r for r in replies if r.setting == setting}
    pairs = sorted({(p, s) for p, s, m in by if m == policy})
    rs = [by[(p, s, policy)].record() for p, s in pairs]
    steps = max(1, sum(r["drafting_steps"] for r in rs))

    def ratio(other: str):
        return median_ratio([by[(p, s, policy)].tps / by[(p, s, other)].tps for p, s in pairs])

    vt, vp = ratio("target-only"), ratio("pooled")
    same = sum(by[(p, s, policy)].run.tokens == by[(p, s, "pooled")].run.tokens for p, s in pairs) if setting == "greedy" else None
    mine = policy != "pooled"
    return Summary(setting, policy, round(sum(r["kept"] for r in rs) / steps, 3),
                   round(sum(r["drafted"] for r in rs) / steps, 2), vt.ratio, vt.interval,
                   vp.ratio if mine else None, vp.interval if mine else None, same if mine else None, len(rs),
                   kind_stats([by[(p, s, policy)] for p, s in pairs], names))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default=str(Path(__file__).resolve().parent / "prompts" / "heldout-8.jsonl"))
    ap.add_argument("-n", "--max-tokens", type=int, default=96)
    ap.add_argument("--seeds", type=int, default=6, help="seeds per prompt at T > 0")
    ap.add_argument("--draft", default="ngram:3")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    items = read_prompts_file(a.prompts)
    meter = CpuMeter()
    session = Session.open(SessionOptions("default", "auto", "auto", a.draft, None)).ready()
    drafter = session.drafter
    log = KindLog(drafter)
    curve = session.cost_curve(DEFAULT_MAX_K + 1)
    ratio = trait(drafter, "draft_prior_ratio")
    policies = {"by kind": SourcedK([AutoK(curve, draft_prior_ratio=ratio) for _ in sources(drafter)], drafter),
                "pooled": AutoK(curve, draft_prior_ratio=ratio)}
    collect_run(session.use("none").stream(session.encode("Hello"), SamplingParams(), 8))  # warm-up
    runs: list[Reply] = []
    turn = 0
    for setting, temp, min_p in SETTINGS:
        params = SamplingParams(temperature=temp, min_p=min_p)
        for it in items:
            ids = session.encode(it["text"])
            for seed in range(a.seeds if temp > 0 else 1):
                runs.append(timed(session.use("none"), log, setting, it["id"], seed, "target-only", ids, params, a.max_tokens))
                for name in POLICIES[turn % 2 :] + POLICIES[: turn % 2]:
                    runs.append(timed(session.use(drafter, policies[name]), log, setting, it["id"], seed, name, ids, params,
                                      a.max_tokens))
                turn += 1
    summaries = [summarize(label, name, runs, sources(drafter)) for label, _, _ in SETTINGS for name in POLICIES]
    for s in summaries:
        vs = "" if s.vs_pooled is None else f", / pooled {s.vs_pooled:.2f}x [{s.vs_pooled_interval}]"
        same = "" if s.same_text_as_pooled is None else f"; text = pooled's {s.same_text_as_pooled}/{s.runs}"
        print(f"{s.setting:14s} {s.policy:8s} tau {s.tau:.2f}, K {s.mean_k:.1f}; / target-only {s.vs_target:.2f}x "
              f"[{s.vs_target_interval}]{vs}{same}")
        for name, k in s.by_kind.items():
            print(f"    {name}: {k.steps} steps, K {k.mean_k:.1f}, first draft kept {k.first_kept:.2f}, tau {k.tau:.2f}")
    print(f"others kept {meter.others_busy():.0%} of the CPUs busy")
    if a.out:
        a.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "drafter": drafter.name,
                                     "others_busy": meter.others_busy(), "summaries": [asdict(s) for s in summaries],
                                     "policies": {n: p.describe() for n, p in policies.items()},
                                     "runs": [r.record() for r in runs]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
