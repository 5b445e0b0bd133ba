"""Would the eagle head's drafts be accepted more at T = 1 if it sampled from a sharper or flatter
distribution? Speculative sampling accepts a draft drawn from q with probability
sum_x min(p(x), q(x)) for the target's p, and stays exact for any q, so q may be the head's
softmax at its own temperature tau (q_tau = softmax(z / tau)) if that overlaps p more.

Along the held-out texts refusals.py cached (24 Spec-Bench prompts x 128 greedy tokens, the
target's own text), one torch pass per prompt gives the target's logits at every output
position and the head's, teacher-forced (real features), for the same token. The table is the
mean overlap sum_x min(p, q_tau) per tau, with p the target's T = 1 distribution.

    python benchmarks/draft_temperature.py [--cache benchmarks/results/refusals-greedy.json]
        [--taus 0.5,0.7,0.85,1,1.2,1.5] [--out benchmarks/results/draft-temperature.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import mlxspec  # noqa: F401  (fast BLAS before mlx)
import torch

from mlxspec.targets.drafts import make_drafter
from mlxspec.targets.loading import load


def overlaps(model, head, seq: list[int], start: int, taus: list[float]) -> torch.Tensor:
    """(len(taus), positions): sum_x min(p, q_tau) for each output token seq[t], t >= start, with p
    the target's distribution after seq[:t] and q_tau the head's from slot t - 2 (real features)."""
    with torch.inference_mode():
        logits, feat = model(torch.tensor([seq[:-1]]), None, return_hidden=True)
        p = torch.softmax(logits[0, start - 1 :].float(), -1)  # predicts seq[start:]
        _, z = head(feat[:, :-1], torch.tensor([seq[1:-1]]))
        z = z[0, start - 2 :].float()  # slot t - 2 predicts seq[t]
        p_head = p[:, head.vocab_ids]  # q is 0 outside the head's vocabulary
        return torch.stack([torch.minimum(p_head, torch.softmax(z / tau, -1)).sum(-1) for tau in taus])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draft", default="smollm2-135m-eagle")
    ap.add_argument("--cache", type=Path, default=Path("benchmarks/results/refusals-greedy.json"))
    ap.add_argument("--taus", default="0.5,0.7,0.85,1,1.2,1.5")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/draft-temperature.json"))
    a = ap.parse_args()
    taus = [float(x) for x in a.taus.split(",")]
    lm = load("default", backend="torch:cpu")
    head = make_drafter(a.draft, lm).head
    samples = json.loads(a.cache.read_text())["samples"]
    per_category: dict[str, list[torch.Tensor]] = {}
    for s in samples:
        seq = s["prompt"] + s["output"]
        per_category.setdefault(s["category"], []).append(overlaps(lm.model, head, seq, len(s["prompt"]), taus))
        print(f"{s['category']} #{s['id']}", flush=True)
    rows = {c: torch.cat(v, 1).mean(1).tolist() for c, v in per_category.items()}
    rows["all"] = torch.cat([x for v in per_category.values() for x in v], 1).mean(1).tolist()
    a.out.write_text(json.dumps({"draft": a.draft, "cache": str(a.cache), "taus": taus, "overlap": rows}, indent=1))
    print("| category | " + " | ".join(f"tau {t:g}" for t in taus) + " |")
    print("|---|" + "---|" * len(taus))
    for c, v in rows.items():
        print(f"| {c} | " + " | ".join(f"{x:.3f}" for x in v) + " |")


if __name__ == "__main__":
    main()
