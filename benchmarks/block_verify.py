"""Does block verification keep more of the default drafter's sampled chains than token-by-token
rejection sampling, and is it faster for it? (issue 38 item 5)

One session on the default model and drafter (``--k auto``); for each sampling setting (plain
T=1, and the chat's T=1 min-p 0.1), each held-out prompt and each seed, in turn: target-only
decoding, the default verifying token by token, and the default verifying chains as blocks
(``--block-verify``), the last two with the same seed. Both rules are exact, so what differs is
how many drafts a step keeps (tau) and the speed. Prompt-lookup steps (point-mass drafts) are
the same under both rules; only the head's sampled chains can gain.

    python benchmarks/block_verify.py [--prompts benchmarks/prompts/heldout-8.jsonl] [-n 96] [--seeds 2] [--out FILE.json]
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
from mlxspec.measure.verdict import median_ratio
from mlxspec.session import Session, SessionOptions

SETTINGS = (("T=1", 1.0, 0.0), ("T=1 min-p=0.1", 1.0, 0.1))  # (label, temperature, min-p)
METHODS = ("target-only", "token", "block")


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

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds


@dataclass(frozen=True)
class Summary:
    setting: str
    tau_token: float  # drafts kept per drafting step
    tau_block: float
    block_vs_token: float | None  # median per-run ratio of tokens/s, same prompt and seed
    block_vs_token_interval: tuple[float, float] | None
    token_vs_target: float | None
    block_vs_target: float | None


def timed(session: Session, setting: str, prompt: str, seed: int, method: str, ids: list[int],
          params: SamplingParams, max_tokens: int) -> Timed:
    t0 = time.perf_counter()
    run = collect_run(session.stream(ids, params, max_tokens, seed))
    drafted = [(d, a) for d, a in zip(run.drafted, run.accepted) if d]
    return Timed(setting, prompt, seed, method, len(run.tokens), time.perf_counter() - t0, len(drafted),
                 sum(a for _, a in drafted))


def summarize(setting: str, runs: list[Timed]) -> Summary:
    by = {(r.prompt, r.seed, r.method): r for r in runs if r.setting == setting}
    pairs = sorted({(p, s) for p, s, _ in by})

    def tau(method: str) -> float:
        rs = [by[(p, s, method)] for p, s in pairs]
        return sum(r.accepted for r in rs) / max(1, sum(r.steps for r in rs))

    def ratio(a: str, b: str):
        return median_ratio([by[(p, s, a)].tps / by[(p, s, b)].tps for p, s in pairs])

    bt = ratio("block", "token")
    return Summary(setting, round(tau("token"), 3), round(tau("block"), 3), bt.ratio, bt.interval,
                   ratio("token", "target-only").ratio, ratio("block", "target-only").ratio)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default=str(Path(__file__).resolve().parent / "prompts" / "heldout-8.jsonl"))
    ap.add_argument("-n", "--max-tokens", type=int, default=96)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
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
                for method, block in (("token", False), ("block", True)):
                    runs.append(timed(session.use(draft), setting, it["id"], seed, method, ids,
                                      replace(params, block_verify=block), a.max_tokens))
    summaries = [summarize(label, runs) for label, _, _ in SETTINGS]
    for s in summaries:
        print(f"{s.setting:14s} tau token {s.tau_token:.3f} block {s.tau_block:.3f}; tokens/s block / token "
              f"{s.block_vs_token:.3f}x {s.block_vs_token_interval}; vs target-only: token "
              f"{s.token_vs_target:.2f}x, block {s.block_vs_target:.2f}x")
    print(f"others kept {meter.others_busy():.0%} of the CPUs busy")
    if a.out:
        a.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "drafter": draft, "others_busy": meter.others_busy(),
                                     "summaries": [asdict(s) for s in summaries],
                                     "runs": [asdict(r) for r in runs]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
