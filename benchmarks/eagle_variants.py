"""Variants of the shipped eagle recipe (B, the w2000 row of BENCHMARKS.md, "The eagle head"), one
lever at a time.

The base is B's data (300 corpus examples per category and the target's answers to 3,300 of
their prompts, features on torch, cached) and B's training (eal over a 3-step unroll, T = 1,
8 x 160 slots, lr 3e-4). Each option changes one thing:

    --more-data        add the corpus examples a 1,000-per-category build holds beyond B's
                       (~7,900 people's answers: ~1.9x the response positions)
    --feature-weight   the regression weight (0: the token loss only, as EAGLE-3 trains)
    --mlp N            the head block's MLP width (B: the target's 1,536)

    python benchmarks/eagle_variants.py --more-data --out /tmp/eagle-d3x
    mlxspec eval-draft -d /tmp/eagle-d3x -k 5 -t 0 -t 1 --per-category 2 -n 96

The head is saved like train-draft's (model card included) and evaluated with the real engine.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mlxspec.targets import store
from mlxspec.targets.folders import save_head
from mlxspec.targets.loading import load
from mlxspec.torchpath import backend_spec
from mlxspec.training import eagle_train as et
from mlxspec.training.eagle import new_head
from mlxspec.training.features import FeatureSet, build
from mlxspec.training.torch_train import TorchStepper
from mlxspec.training.train import peak_memory_gb

PER_CATEGORY, WRITTEN, MORE = 300, 3300, 1000


def features(teacher, more_data: bool, started: float) -> FeatureSet:
    data = et.prepare_features(teacher, PER_CATEGORY, None, 0, 256, WRITTEN)
    if not more_data:
        return data
    seen = {e.prompt for e in et.corpus_examples(PER_CATEGORY, 0)[0]}
    extra = [e for e in et.corpus_examples(MORE, 0)[0] if e.prompt not in seen]
    built = build(teacher, extra, store.home() / "eagle-data", max_tokens=256,
                  progress=lambda i, n: print(f"features {i}/{n} {time.perf_counter() - started:.0f}s", flush=True))
    return FeatureSet.concat([data, built], {**data.meta, "extra_examples": len(extra)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--more-data", action="store_true")
    ap.add_argument("--feature-weight", type=float, default=0.5)
    ap.add_argument("--mlp", type=int, default=None)
    a = ap.parse_args()

    t0 = time.perf_counter()
    teacher = load("default", "float32", backend_spec("torch", None))
    target = teacher.source
    data = features(teacher, a.more_data, t0)
    feature_s = time.perf_counter() - t0
    cfg = et.EagleTrainConfig(loss="eal", k=3, temp=1.0, steps=a.steps, batch=8, context=160, lr=3e-4,
                              feature_weight=a.feature_weight, seed=0)
    head = new_head(target, et.head_vocabulary(data, 8192, target), seed=0, intermediate_size=a.mlp)
    rows = target.model.model.embed_tokens.weight[head.vocab_ids]

    def on_step(log: et.EagleStepLog) -> None:
        if log.step % 50 == 0:
            print(f"step {log.step} loss {log.loss:.3f} acc1 {log.accept_1:.2f} chain {log.chain:.2f} "
                  f"{time.perf_counter() - t0:.0f}s", flush=True)

    history = et.train_head(head, data, rows, cfg, a.out, on_step=on_step, stepper=TorchStepper(head, cfg, teacher.model))
    seconds = time.perf_counter() - t0
    recipe = " ".join(x for x in ["python benchmarks/eagle_variants.py", f"--steps {a.steps}",
                                  "--more-data" * a.more_data, f"--feature-weight {a.feature_weight:g}",
                                  f"--mlp {a.mlp}" * (a.mlp is not None), f"--out {a.out}"] if x)
    save_head(head, a.out, card=et.model_card(a.out.name, recipe, data, cfg, head, history, seconds),
              extra={"target": target.name, "recipe": recipe})
    print(json.dumps({"out": str(a.out), "seconds": round(seconds), "feature_s": round(feature_s),
                      "peak_memory_gb": round(peak_memory_gb(), 2), "positions": data.trained_positions()}))


if __name__ == "__main__":
    main()
