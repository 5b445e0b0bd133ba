"""Where an eagle training step's time goes on torch: the shipped recipe's batches (its command is
in BENCHMARKS.md, "The eagle head"), a few steps timed, then torch's profiler over three more,
operators by their own time.
Needs the recipe's features in ``$MLXSPEC_HOME/eagle-data`` (built by the recipe, or first here).

    python benchmarks/eagle_step_profile.py [--steps 12] [--rows 25]
"""

from __future__ import annotations

import argparse
import time

import mlxspec  # noqa: F401  (fast BLAS before mlx)
from torch.profiler import ProfilerActivity, profile

from mlxspec.targets.loading import load
from mlxspec.torchpath import backend_spec
from mlxspec.training import eagle_train as et
from mlxspec.training.eagle import new_head
from mlxspec.training.torch_train import TorchStepper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12, help="timed steps (the first two are not counted)")
    ap.add_argument("--rows", type=int, default=25, help="operators listed")
    args = ap.parse_args()
    teacher = load("default", "float32", backend_spec("torch", None))
    target = teacher.source
    data = et.prepare_features(teacher, 300, None, 0, 256, 3300)
    head = new_head(target, et.head_vocabulary(data, 8192, target), seed=0)
    rows = target.model.model.embed_tokens.weight[head.vocab_ids]
    cfg = et.EagleTrainConfig(loss="eal", k=3, temp=1.0, steps=4000, batch=8, context=160, lr=3e-4,
                              feature_weight=0.5)
    stepper = TorchStepper(head, cfg, teacher.model)
    batch = et.step_batches(data, head, rows, cfg)

    seconds, positions = 0.0, 0.0
    for step in range(args.steps):
        b = batch(step)
        t0 = time.perf_counter()
        stepper.step(b, 0.5)
        if step >= 2:
            seconds += time.perf_counter() - t0
            positions += float(b["mask"].sum().item())
    n = args.steps - 2
    print(f"{seconds / n:.3f} s a step, {positions / n:.0f} trained positions a step, "
          f"{positions / seconds:.0f} positions/s")
    b = batch(args.steps)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            stepper.step(b, 0.5)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
