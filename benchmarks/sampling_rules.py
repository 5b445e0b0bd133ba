"""Which acceptance rule makes the default drafter pay at T > 0? (issue 38 items 5 and 6)

One session on the default model and drafter (``--k auto``); for each sampling setting (plain
T=1, and the chat's T=1 min-p 0.1), each held-out prompt and each seed, in turn: target-only
decoding, then the default under each rule asked for, all with the same seed:
- ``token``: token-by-token rejection sampling (the default);
- ``block``: chains verified as blocks (``--block-verify``); the same as ``token`` on
  prompt-lookup steps (point-mass drafts), so only the head's sampled chains can gain;
- ``coupled``: ``--coupled``, every token the argmax of p plus noise keyed by (seed, position),
  drafts drawn with the same noise on q; its text is checked equal to target-only's under
  coupling (``target-only coupled``, also timed) on every prompt and seed.
All are exact, so what differs is how many drafts a step keeps (tau) and the speed.

    python benchmarks/sampling_rules.py [--prompts benchmarks/prompts/heldout-8.jsonl] [-n 96] [--seeds 2]
        [--rules token,block,coupled] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import mlxspec  # noqa: F401  (fast BLAS before mlx)
from mlxspec.core.runs import collect_run
from mlxspec.core.sampling import SamplingParams
from mlxspec.cpuload import CpuMeter
from mlxspec.measure.runs import read_prompts_file
from mlxspec.measure.verdict import Interval, median_ratio
from mlxspec.session import Session, SessionOptions

SETTINGS = (("T=1", 1.0, 0.0), ("T=1 min-p=0.1", 1.0, 0.1))  # (label, temperature, min-p)
RULES = {"token": {}, "block": {"block_verify": True}, "coupled": {"coupled": True}}


@dataclass(frozen=True)
class Timed:
    setting: str
    prompt: str
    seed: int
    method: str
    tokens: int
    seconds: float
    steps: int  # verify steps that drafted something
    accepted: int  # drafts kept over those steps
    first: int  # steps that kept their first draft
    verify_steps: int  # all of them, plain steps included
    text: tuple[int, ...]

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds


@dataclass(frozen=True)
class RuleSummary:
    setting: str
    rule: str
    tau: float  # drafts kept per drafting step
    first_draft_acceptance: float
    drafting_share: float  # steps that drafted, of all verify steps
    vs_target: float | None  # median per-run ratio of tokens/s, same prompt and seed
    vs_target_interval: Interval | None
    vs_token: float | None
    vs_token_interval: Interval | None
    same_text_as_target_only: int | None  # coupled: runs whose text is target-only coupled's
    runs: int


def timed(session: Session, setting: str, prompt: str, seed: int, method: str, ids: list[int],
          params: SamplingParams, max_tokens: int) -> Timed:
    t0 = time.perf_counter()
    run = collect_run(session.stream(ids, params, max_tokens, seed))
    seconds = time.perf_counter() - t0
    drafted = [(d, a) for d, a in zip(run.drafted, run.accepted) if d]
    return Timed(setting, prompt, seed, method, len(run.tokens), seconds, len(drafted),
                 sum(a for _, a in drafted), sum(a > 0 for _, a in drafted), len(run.drafted), tuple(run.tokens))


def summarize(setting: str, rule: str, runs: list[Timed]) -> RuleSummary:
    by = {(r.prompt, r.seed, r.method): r for r in runs if r.setting == setting}
    pairs = sorted({(p, s) for p, s, m in by if m == rule})
    rs = [by[(p, s, rule)] for p, s in pairs]
    steps = sum(r.steps for r in rs)

    def ratio(b: str):
        if not all((p, s, b) in by for p, s in pairs):
            return median_ratio([])
        return median_ratio([by[(p, s, rule)].tps / by[(p, s, b)].tps for p, s in pairs])

    vt, vk = ratio("target-only"), ratio("token")
    same = (sum(by[(p, s, rule)].text == by[(p, s, "target-only coupled")].text for p, s in pairs)
            if rule == "coupled" else None)
    return RuleSummary(setting, rule, round(sum(r.accepted for r in rs) / max(1, steps), 3),
                       round(sum(r.first for r in rs) / max(1, steps), 3),
                       round(steps / max(1, sum(r.verify_steps for r in rs)), 3),
                       vt.ratio, vt.interval, vk.ratio if rule != "token" else None,
                       vk.interval if rule != "token" else None, same, len(rs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default=str(Path(__file__).resolve().parent / "prompts" / "heldout-8.jsonl"))
    ap.add_argument("-n", "--max-tokens", type=int, default=96)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--rules", default="token,block,coupled", help="comma-separated: " + ", ".join(RULES))
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    rules = [r.strip() for r in a.rules.split(",") if r.strip()]
    if not rules or any(r not in RULES for r in rules):
        ap.error(f"--rules takes some of {', '.join(RULES)}; got {a.rules!r}")
    items = read_prompts_file(a.prompts)
    meter = CpuMeter()
    session = Session.open(SessionOptions("default", "auto", "auto", "default", None)).ready()
    draft = session.drafter.name
    collect_run(session.use("none").stream(session.encode("Hello"), SamplingParams(), 8))  # warm-up
    runs: list[Timed] = []
    for setting, temp, min_p in SETTINGS:
        params = SamplingParams(temperature=temp, min_p=min_p)
        for it in items:
            ids = session.encode(it["text"])
            for seed in range(a.seeds):
                runs.append(timed(session.use("none"), setting, it["id"], seed, "target-only", ids, params, a.max_tokens))
                if "coupled" in rules:
                    runs.append(timed(session.use("none"), setting, it["id"], seed, "target-only coupled", ids,
                                      replace(params, coupled=True), a.max_tokens))
                for rule in rules:
                    runs.append(timed(session.use(draft), setting, it["id"], seed, rule, ids,
                                      replace(params, **RULES[rule]), a.max_tokens))
    summaries = [summarize(label, rule, runs) for label, _, _ in SETTINGS for rule in rules]
    for s in summaries:
        vs_token = "" if s.vs_token is None else f", / token {s.vs_token:.2f}x {_interval(s.vs_token_interval)}"
        same = "" if s.same_text_as_target_only is None else f"; text = target-only coupled {s.same_text_as_target_only}/{s.runs}"
        print(f"{s.setting:14s} {s.rule:8s} tau {s.tau:.2f}, first draft {s.first_draft_acceptance:.2f}, drafting "
              f"{s.drafting_share:.0%} of steps; / target-only {s.vs_target:.2f}x {_interval(s.vs_target_interval)}"
              f"{vs_token}{same}")
    print(f"others kept {meter.others_busy():.0%} of the CPUs busy")
    if a.out:
        a.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "drafter": draft, "others_busy": meter.others_busy(),
                                     "summaries": [asdict(s) for s in summaries],
                                     "runs": [asdict(r) | {"text": None} for r in runs]}, indent=1) + "\n")


def _interval(iv: Interval | None) -> str:
    return "" if iv is None else f"[{iv}]"


if __name__ == "__main__":
    main()
