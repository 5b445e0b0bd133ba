"""The eagle head on torch with its weights in bfloat16 (oneDNN), 8 or 4 bits (the VNNI kernel):
what a drafted step costs and how often its drafts are kept, held out.

A head step comes right after the target's pass has swept the head's weights out of the cache, so
it costs about its bytes. Per setting (greedy; T = 1; the chat's T = 1 with min-p 0.1) and head:
the head alone at K = 1 over the prompts (median ms of a drafted step's drafting, ms per
committed token, target-only's ms per token beside it in the same round), then at K = 3 (first
drafts kept, tau) over ``--seeds`` seeds at T > 0.

    python benchmarks/head_bits.py [--prompts benchmarks/prompts/heldout-8.jsonl] [--seeds 2]
        [--out benchmarks/results/head-bits.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import mlxspec  # noqa: F401  (fast BLAS before mlx)

from mlxspec.core.engine import generate
from mlxspec.core.events import Done, Step
from mlxspec.core.sampling import SamplingParams
from mlxspec.targets.drafts import make_drafter
from mlxspec.targets.loading import load
from mlxspec.targets.tokenizer import encode_prompt
from mlxspec.torchpath import load as torch_load

HEAD = "smollm2-135m-eagle"
SETTINGS = {"greedy": (0.0, 0.0), "T=1": (1.0, 0.0), "T=1 min-p 0.1": (1.0, 0.1)}  # temperature, min-p
TOKENS = 96


@dataclass
class Row:
    head: str  # bfloat16, or the bits its weights were rounded to
    setting: str
    draft_ms: float  # median, a K = 1 step's drafting
    ms_per_token: float  # K = 1, decoding only
    target_only_ms_per_token: float  # the same round, no drafter
    first_kept: float  # K = 3: share of drafting steps that kept their first draft
    tau: float  # K = 3: drafts kept a drafting step
    steps: int  # K = 3 drafting steps counted


def decode(target, prompts: list[list[int]], params: SamplingParams, seed: int, drafter_of, k: int) -> tuple[list[Step], float, int]:
    """Every prompt decoded: the drafting steps, decode seconds and the tokens those seconds committed."""
    steps, seconds, tokens = [], 0.0, 0
    stop = {target.tokenizer.eos_token_id}
    for ids in prompts:
        for ev in generate(target.model, ids, params, TOKENS, stop, target.context_length, seed=seed,
                           drafter=drafter_of(), k=k):
            if isinstance(ev, Step) and ev.k:
                steps.append(ev)
            if isinstance(ev, Done):
                seconds, tokens = seconds + ev.decode_s, tokens + ev.generated_tokens - 1  # decode_s runs from the first
    return steps, seconds, tokens


def measure(target, prompts: list[list[int]], head: str, setting: str, seeds: int) -> Row:
    temperature, min_p = SETTINGS[setting]
    params = SamplingParams(temperature=temperature, min_p=min_p)
    _, plain_s, plain_n = decode(target, prompts, params, 1, lambda: None, 1)
    timed, spec_s, spec_n = decode(target, prompts, params, 1, lambda: make_drafter(HEAD, target), 1)
    kept = []
    for seed in range(1, 2 if params.greedy else seeds + 1):
        kept += decode(target, prompts, params, seed, lambda: make_drafter(HEAD, target), 3)[0]
    return Row(head, setting, statistics.median(s.draft_ms for s in timed), spec_s * 1e3 / spec_n,
               plain_s * 1e3 / plain_n, sum(s.accepted > 0 for s in kept) / len(kept),
               sum(s.accepted for s in kept) / len(kept), len(kept))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=Path, default=Path("benchmarks/prompts/heldout-8.jsonl"))
    ap.add_argument("--seeds", type=int, default=2, help="seeds of the K = 3 runs at T > 0")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/head-bits.json"))
    args = ap.parse_args()
    target = load("default", "auto", "auto")
    prompts = [encode_prompt(target.tokenizer, json.loads(line)["turns"][0])
               for line in args.prompts.read_text().splitlines() if line.strip()]
    rows = []
    for bits in (None, 8, 4):
        torch_load.HEAD_BITS = bits  # head_bits(): None keeps the bfloat16 head
        for setting in SETTINGS:
            rows.append(measure(target, prompts, "bfloat16" if bits is None else f"{bits} bits", setting, args.seeds))
            r = rows[-1]
            print(f"{r.head:>9} {r.setting:<14} draft {r.draft_ms:.2f} ms, K=1 {r.ms_per_token:.2f} ms/token "
                  f"(target-only {r.target_only_ms_per_token:.2f}), K=3 first kept {r.first_kept:.3f}, "
                  f"tau {r.tau:.3f} over {r.steps} steps", flush=True)
    args.out.write_text(json.dumps({"head": HEAD, "tokens": TOKENS, "prompts": str(args.prompts),
                                    "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
