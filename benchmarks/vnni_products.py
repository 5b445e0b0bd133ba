"""How much faster is the target pass on the 8-bit-activation VNNI kernel than on torch's? (issue 37)

Loads the default twice in one process: its 4-bit layers on torch's int4 kernel with the
bfloat16 head (what ran before ``mlxspec.torchpath.vnni``), and on the VNNI kernel with the
file's 8-bit head; both through their compiled passes (compiled into the store first where
missing, ~2 minutes). Times one-token and 4-token passes interleaved at three context lengths,
a 200-token prefill and the head alone, and says how long the two greedy texts agree (that the
VNNI pass's verify rows have its one-token bits: ``compiled_stack.py``, which runs the kernel
this machine loads, and tests/test_vnni.py).

    .venv/bin/python benchmarks/vnni_products.py [--reps 25] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from unittest import mock

# ruff: noqa: I001
import mlxspec  # noqa: F401  (the fast BLAS must load before mlx: imports stay in this order)
import torch

from mlxspec.targets import loading
from mlxspec.torchpath import compiled, vnni

CONTEXTS = (64, 200, 400)
WIDTHS = (1, 4)
KERNELS = ("torch", "vnni")


@dataclass(frozen=True)
class Timing:
    what: str
    context: int
    tokens: int
    torch_ms: float
    vnni_ms: float

    @property
    def speedup(self) -> float:
        return self.torch_ms / self.vnni_ms


def load(kernel: str) -> loading.LoadedModel:
    """The default on ``kernel``'s products, its compiled pass loaded (compiled first if missing)."""
    with ExitStack() as patches:
        if kernel == "torch":  # as a process without the VNNI kernel loads it
            patches.enter_context(mock.patch.object(vnni, "active", return_value=False))
            patches.enter_context(mock.patch.object(vnni, "ensure", return_value=False))
        loaded = loading.load("default", "quantized", backend="torch:cpu")
        model = loaded.model
        if model.compiled is None:
            compiled.compile_to(model, loading.compiled_folder(), print)
            model.compiled = compiled.load_from(model, loading.compiled_folder())
        model(torch.tensor([[0]]), None)  # packs the weights while the choice holds
    return loaded


def interleaved(run, reps: int) -> tuple[float, float]:
    """Median ms of ``run(kernel)`` for torch's and vnni, alternated so drift hits both alike."""
    times: dict = {k: [] for k in KERNELS}
    for _ in range(reps):
        for k in KERNELS:
            start = time.perf_counter()
            run(k)
            times[k].append(time.perf_counter() - start)
    return statistics.median(times["torch"]) * 1e3, statistics.median(times["vnni"]) * 1e3


def time_passes(models: dict, reps: int) -> list[Timing]:
    out = []
    for ctx in CONTEXTS:
        caches = {k: m.make_cache() for k, m in models.items()}
        for k, m in models.items():
            m(torch.tensor([[100 + i % 5000 for i in range(ctx)]]), caches[k])
        for n in WIDTHS:
            def step(k: str, n: int = n) -> None:
                models[k](torch.tensor([[1234] * n]), caches[k])
                for c in caches[k]:
                    c.trim(n)
            out.append(Timing("pass", ctx, n, *interleaved(step, reps)))
    prompt = torch.tensor([[100 + i for i in range(200)]])
    out.append(Timing("prefill", 0, 200, *interleaved(
        lambda k: models[k](prompt, models[k].make_cache(), logit_rows=1), max(3, reps // 5))))
    h = torch.randn(1, 1, models["vnni"].cfg.hidden_size)
    out.append(Timing("head", 0, 1, *interleaved(lambda k: models[k].head(h), reps * 4)))
    for t in out:
        print(f"{t.what} context {t.context}, {t.tokens} token(s): torch's {t.torch_ms:.2f} ms, "
              f"vnni {t.vnni_ms:.2f} ms, {t.speedup:.2f}x", flush=True)
    return out


def greedy(model, prompt: list[int], n: int) -> list[int]:
    cache, out = model.make_cache(), []
    with torch.inference_mode():
        logits = model(torch.tensor([prompt]), cache, logit_rows=1)
        for _ in range(n):
            out.append(int(logits[0, -1].argmax()))
            logits = model(torch.tensor([[out[-1]]]), cache)
    return out


def agreement(models: dict, tokenizer, n: int = 96) -> list[int]:
    """Per prompt, how many greedy tokens the two kernels' texts share before they part."""
    prompts = ["Explain why the sky is blue in three sentences.", "Write a Python function that reverses a list.",
               "What is 17 times 23? Show your steps.", "Summarize the plot of Romeo and Juliet."]
    shared = []
    for p in prompts:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
        a, b = (greedy(models[k], ids, n) for k in KERNELS)
        shared.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), n))
    return shared


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--out")
    args = ap.parse_args()
    if not loading.with_kernels():
        raise SystemExit("this CPU has no AVX-512 VNNI (or the kernel did not build): nothing to compare")
    loaded = {k: load(k) for k in KERNELS}
    models = {k: lm.model for k, lm in loaded.items()}
    timings = time_passes(models, args.reps)
    shared = agreement(models, loaded["vnni"].tokenizer)
    print(f"greedy tokens shared before the texts part (of 96): {shared}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"greedy_shared_of_96": shared, "torch": torch.__version__,
                       "threads": torch.get_num_threads(),
                       "timings": [asdict(t) | {"speedup": t.speedup} for t in timings]}, f, indent=1)


if __name__ == "__main__":
    main()
