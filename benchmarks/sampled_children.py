"""Top-B against sampled children at T > 0: accepted drafts per tree step, same prompts, same
shapes, same seeds (``--tree DxB`` vs ``--tree DxB:sample``). Acceptance only: timings are
``mlxspec sweep --tree 3x2,3x2:sample``'s job.

    python benchmarks/sampled_children.py --draft smollm2-135m-draft --tree 1x2 --tree 3x2 --temp 1
"""

from __future__ import annotations

import argparse
import json

import numpy as np

import mlxspec  # noqa: F401  (fast BLAS before mlx)
from mlxspec.core.engine import generate
from mlxspec.core.events import Step
from mlxspec.core.sampling import SamplingParams
from mlxspec.core.tree import parse_tree
from mlxspec.measure.runs import encode_prompts, spec_bench_prompts
from mlxspec.targets import loading
from mlxspec.targets.drafts import make_drafter
from mlxspec.targets.tokenizer import stop_token_ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", default="smollm2-135m-draft")
    ap.add_argument("--tree", action="append", default=None)
    ap.add_argument("--temp", type=float, default=1.0)
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    lm = loading.load("default", "float32")
    items, _ = spec_bench_prompts(per_category=args.per_category)
    ids = encode_prompts(lm, items, args.max_tokens)
    params, stop = SamplingParams(temperature=args.temp), stop_token_ids(lm.tokenizer)
    rows = []
    for spec in args.tree or ["1x2", "3x2"]:
        for shape in (parse_tree(spec), parse_tree(spec + ":sample")):
            accepted = []
            for seed in range(args.seeds):
                for prompt in ids:
                    drafter = make_drafter(args.draft, lm, lm.dtype)
                    for ev in generate(lm.model, prompt, params, args.max_tokens, stop, lm.context_length, seed,
                                       drafter, shape.depth, tree=shape):
                        if isinstance(ev, Step) and ev.tree is not None:
                            accepted.append(ev.accepted)
            a = np.array(accepted, float)
            boot = np.random.default_rng(0).choice(a, (2000, len(a))).mean(axis=1)
            row = {"tree": str(shape), "nodes": shape.nodes, "steps": len(a), "accepted_per_step": a.mean(),
                   "lo": float(np.quantile(boot, 0.025)), "hi": float(np.quantile(boot, 0.975))}
            rows.append(row)
            print(f"{row['tree']:>12} {row['nodes']:>3} nodes  {row['steps']:>5} steps  "
                  f"accepted/step {row['accepted_per_step']:.3f} [{row['lo']:.3f}, {row['hi']:.3f}]", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"draft": args.draft, "temperature": args.temp, "prompts": len(ids), "seeds": args.seeds,
                       "max_tokens": args.max_tokens, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
