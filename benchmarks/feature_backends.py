"""The eagle feature build on MLX and on torch, alternating, over the corpus's first shard:
positions per second, and the torch shard against the cached MLX one (features, log-normaliser,
argmax). Needs that shard in $MLXSPEC_HOME/eagle-data (any eagle training builds it).

    python benchmarks/feature_backends.py --rounds 2
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import mlxspec  # noqa: F401  (fast BLAS before mlx)
from mlxspec.targets import loading, store
from mlxspec.torchpath.load import to_torch
from mlxspec.training import features
from mlxspec.training.eagle_train import corpus_examples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    lm = loading.load("default", "float32")
    backends = {"mlx": lm, "torch": to_torch(lm, "float32", "cpu")}
    examples, _ = corpus_examples(300, 0)
    chunk = examples[: features.SHARD]
    cached = features.FeatureSet.load(store.home() / "eagle-data" / "shards" /
                                      f"{features.cache_key(lm.name, chunk, features.MAX_TOKENS)}.npz")
    ref = cached.features.astype(np.float32)
    rates: dict[str, list[float]] = {name: [] for name in backends}
    for r in range(args.rounds):
        for name, target in backends.items():
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                built = features.build(target, chunk, Path(tmp))
                seconds = time.perf_counter() - t0
            rates[name].append(len(built.tokens) / seconds)
            rel = np.abs(built.features.astype(np.float32) - ref).max() / np.abs(ref).max()
            print(f"round {r} {name:>5}: {len(built.tokens)} positions in {seconds:.1f} s "
                  f"({rates[name][-1]:.0f}/s); vs the cached MLX shard: features {rel:.1e} (relative), "
                  f"lse {np.abs(built.lse - cached.lse).max():.1e}, argmax agree {(built.argmax == cached.argmax).mean():.5f}",
                  flush=True)
    print("torch / mlx positions per second, per round:",
          ", ".join(f"{t / m:.2f}x" for m, t in zip(rates["mlx"], rates["torch"])))


if __name__ == "__main__":
    main()
