"""Peak memory and time of reading a head's cached training features: ``FeatureSet.gather``
(one shard at a time into arrays allocated once, what training does) against every shard
loaded and then concatenated, for the corpus and the target's answers and then the two
together (what it did before 2026-12-02). Synthetic shards of the real set's shape: random
float16 features and four tapped states per position, in a temporary folder.

    python benchmarks/feature_loading.py [--positions 552000] [--taps 4] [--out FILE.json]

Each way runs in a child process of its own, so its peak resident memory is its own.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import mlxspec  # noqa: F401  (fast BLAS before mlx)
from mlxspec.training.features import SHARD, FeatureSet

HIDDEN = 576  # the default model's
POSITIONS_PER_EXAMPLE = 56
CORPUS_SHARE = 0.65  # of the shards: the corpus; the rest the target's own answers


def make_shards(folder: Path, positions: int, taps: int) -> list[Path]:
    rng = np.random.default_rng(0)
    lengths = np.full(SHARD, POSITIONS_PER_EXAMPLE)
    n = int(lengths.sum())
    paths = []
    for i in range(max(1, positions // n)):
        part = FeatureSet(np.zeros(n, np.int32), rng.standard_normal((n, HIDDEN)).astype(np.float16),
                          np.zeros(n, np.float32), np.zeros(n, np.int32), lengths, np.full(SHARD, 20),
                          ["c"] * SHARD, {}, rng.standard_normal((n, taps * HIDDEN)).astype(np.float16))
        paths.append(part.save(folder / f"{i:04d}.npz"))
    return paths


def read(way: str, paths: list[Path]) -> None:
    """In the child: read the set one way; print its seconds and this process's peak memory."""
    t0 = time.perf_counter()
    if way == "concatenated":
        cut = int(len(paths) * CORPUS_SHARE)
        corpus = FeatureSet.concat([FeatureSet.load(p) for p in paths[:cut]], {})
        answers = FeatureSet.concat([FeatureSet.load(p) for p in paths[cut:]], {})
        FeatureSet.concat([corpus, answers], {})
    else:
        FeatureSet.gather(paths, {})
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"seconds": time.perf_counter() - t0, "peak_gib": peak_kib / 2**20}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", type=int, default=552_000, help="positions in the whole set")
    ap.add_argument("--taps", type=int, default=4, help="tapped states per position (an EAGLE-3 cache's)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        way, folder = args.child.split(":", 1)
        read(way, sorted(Path(folder).glob("*.npz")))
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_shards(Path(tmp), args.positions, args.taps)
        size = sum(p.stat().st_size for p in paths)
        print(f"{len(paths)} shards, {size / 2**30:.2f} GiB", flush=True)
        for way in ("concatenated", "gathered"):
            out = subprocess.run([sys.executable, __file__, "--child", f"{way}:{tmp}"], check=True,
                                 capture_output=True, text=True).stdout
            measured = json.loads(out.strip().splitlines()[-1])
            results.append({"way": way, **measured})
            print(f"{way}: peak {measured['peak_gib']:.2f} GiB resident, {measured['seconds']:.1f} s", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"positions": args.positions, "taps": args.taps,
                                              "set_gib": size / 2**30, "results": results}, indent=1))


if __name__ == "__main__":
    main()
