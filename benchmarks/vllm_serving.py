"""Does vLLM serve our EAGLE-3 head beside our exported target, exactly, and how often does it
accept the head's drafts? (issue 40)

Runs in vLLM's own environment (its CPU build pins its own torch and transformers; DESIGN.md and
README say how to install it), on folders mlxspec wrote in its environment first:

    mlxspec export-target -o /tmp/hf-target
    mlxspec export-draft -d smollm2-135m-eagle3 --format speculators --verifier /tmp/hf-target -o /tmp/e3-spec
    VLLM_CPU_KVCACHE_SPACE=1 vllm-venv/bin/python benchmarks/vllm_serving.py --target /tmp/hf-target \
        --head mlxspec/models/smollm2-135m-eagle3 --head /tmp/e3-spec --out benchmarks/results/vllm-eagle3.json

For each head (the shipped SpecForge-layout folder as it is, and its speculators-layout export),
greedy decoding of the held-out prompts with the head drafting K tokens a step, against the same
engine's target-only greedy: the prompts whose texts are equal, and vLLM's own counters: drafts,
draft tokens, accepted tokens, and the acceptance rate at each draft position.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class HeadRun:
    head: str
    layout: str
    equal_prompts: int
    prompts: int
    tokens: int
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_by_position: list[float]
    mean_acceptance_length: float  # 1 + accepted / drafts: tokens a step, as vLLM reports it
    seconds: float


@dataclass(frozen=True)
class ServingCheck:
    date: str
    versions: dict[str, str]
    target: str
    k: int
    max_tokens: int
    runs: list[HeadRun] = field(default_factory=list)


def read_prompts(path: Path) -> list[str]:
    return [json.loads(line)["turns"][0] for line in path.read_text().splitlines() if line.strip()]


def counters(llm) -> dict[str, object]:
    """vLLM's speculative-decoding counters so far (a vector for the per-position counts)."""
    out = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode"):
            out[metric.name] = list(metric.values) if hasattr(metric, "values") else metric.value
    return out


def greedy(llm, prompts: list[list[dict]], max_tokens: int) -> tuple[list[list[int]], float]:
    from vllm import SamplingParams

    t0 = time.perf_counter()
    outs = llm.chat(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], time.perf_counter() - t0


def engine(target: str, head: str | None, k: int):
    from vllm import LLM

    spec = {"method": "eagle3", "model": head, "num_speculative_tokens": k} if head else None
    return LLM(model=target, speculative_config=spec, dtype="float32", enforce_eager=True, max_model_len=2048,
               disable_log_stats=False, seed=0)


def head_run(target: str, head: str, k: int, prompts: list[list[dict]], plain: list[list[int]],
             max_tokens: int) -> HeadRun:
    llm = engine(target, head, k)
    texts, seconds = greedy(llm, prompts, max_tokens)
    c = counters(llm)
    drafts = int(c.get("vllm:spec_decode_num_drafts", 0))
    accepted = int(c.get("vllm:spec_decode_num_accepted_tokens", 0))
    per_pos = c.get("vllm:spec_decode_num_accepted_tokens_per_pos", [])
    config = json.loads((Path(head) / "config.json").read_text())
    del llm
    return HeadRun(head, "speculators" if "speculators_model_type" in config else "specforge",
                   sum(a == b for a, b in zip(texts, plain)), len(prompts), sum(map(len, texts)), drafts,
                   int(c.get("vllm:spec_decode_num_draft_tokens", 0)), accepted,
                   [round(n / drafts, 3) if drafts else 0.0 for n in per_pos],
                   round(1 + accepted / drafts, 3) if drafts else 1.0, round(seconds, 2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="The target as a Hugging Face folder (mlxspec export-target).")
    ap.add_argument("--head", action="append", required=True, help="An EAGLE-3 head folder (repeat for several).")
    ap.add_argument("--prompts", default=str(Path(__file__).resolve().parent / "prompts" / "heldout-8.jsonl"))
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("-n", "--max-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    import torch
    import transformers
    import vllm

    versions = {"vllm": vllm.__version__, "torch": torch.__version__, "transformers": transformers.__version__}
    prompts = [[{"role": "user", "content": p}] for p in read_prompts(Path(args.prompts))]
    plain_llm = engine(args.target, None, args.k)
    plain, _ = greedy(plain_llm, prompts, args.max_tokens)
    del plain_llm
    check = ServingCheck(time.strftime("%Y-%m-%d"), versions, args.target, args.k, args.max_tokens)
    for head in args.head:
        run = head_run(args.target, head, args.k, prompts, plain, args.max_tokens)
        check.runs.append(run)
        print(f"{run.layout:12s} greedy equal {run.equal_prompts}/{run.prompts}, {run.tokens} tokens, "
              f"{run.drafts} drafts, acceptance by position {run.acceptance_by_position}, "
              f"mean acceptance length {run.mean_acceptance_length}")
    if args.out:
        args.out.write_text(json.dumps(asdict(check), indent=2) + "\n")


if __name__ == "__main__":
    main()
