#!/usr/bin/env bash
# The draft-training study of BENCHMARKS.md ("The plain draft: KL vs EAL vs WTV"): one
# distillation set, one architecture (2 blocks, 8192-token head), one step budget; only the
# objective differs. Then tau with the real engine (eval-draft) and end-to-end speed (bench) for
# each. About 90 minutes on the 2-core Linux CPU.
set -euo pipefail
OUT=${1:-out/study}
M=${MLXSPEC:-.venv/bin/mlxspec}
mkdir -p "$OUT"
for loss in kl eal wtv; do
  $M train-draft --loss $loss --steps 150 --out "$OUT/$loss" --json > "$OUT/$loss.json"
done
for loss in eal wtv; do  # the same distillation, then 30 GRPO steps
  rm -rf "$OUT/$loss-grpo" && cp -r "$OUT/$loss" "$OUT/$loss-grpo"
  $M train-draft --loss $loss --steps 150 --grpo --grpo-steps 30 --resume --out "$OUT/$loss-grpo" --json > "$OUT/$loss-grpo.json"
done
for d in kl eal wtv eal-grpo wtv-grpo; do
  $M eval-draft --draft "$OUT/$d" --out "$OUT/eval-$d.json"
  $M bench --draft "$OUT/$d" --k 5 --per-category 1 --category mt_bench --category qa --category math_reasoning --max-tokens 48 --no-mlx-lm --out "$OUT/bench-$d.json"
done
