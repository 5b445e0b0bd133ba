"""What a target pass over n = 1..8 tokens costs against one token, route by route, and whether
each route is batch-invariant (row i of the n-token pass bitwise equal to the one-token pass at
that position). Issue 23, item 3; results in benchmarks/notes/2026-12-01-verify-routes.md.

    .venv/bin/python benchmarks/verify_routes.py [--rounds 15] [--context 256] [--threads N]
                                                 [--routes torch-mkl,torch-invariant,...] [--out FILE.json]

Routes (one model per backend; a route swaps its kernels in place, nothing else changes):

  torch-mkl            today's torch path: nn.Linear (MKL sgemm/sgemv), fused SDPA
  torch-mkl-packed     weights packed once for MKL's packed GEMM (torch.ops.mkl._mkl_linear, batch 8)
  torch-onednn         weights packed once for oneDNN (torch.ops.mkldnn), fused SDPA
  torch-invariant      torchpath.invariant.make_batch_invariant: oneDNN packed, q/k/v and gate/up
                       fused into one product each, products padded to 4 rows, attention in
                       256-key blocks (what --backend torch runs)
  torch-invariant-unfused  the same with every projection its own product (before 2026-12-02)
  torch-int4           the file's 4-bit layers on torch's int4 kernel (torchpath.int4, --dtype quantized),
                       bfloat16 products, the rest as torch-invariant: another target (not float32)
  torch-rows           every row alone: n GEMVs per projection, n one-query SDPAs (invariant by
                       construction; the cost of n one-token passes less the per-pass overhead)
  mlx-cpupath          today's MLX CPU path (core.model.CpuPath, compiled)
  mlx-invariant        CpuPath batch-invariant (mlx_invariant.py): every product padded to the row
                       count from which its rows agree (probed), attention in 64-key blocks
  mlx-blocks           MLX, the blocks' own path (use_cpu_path False)
  mlx-cpupath-wt       CpuPath with every weight stored transposed (x @ W, W (in, out) row-major)

Timing: a cache holding ``--context`` tokens of a Spec-Bench prompt; one pass over n tokens, then
the cache trimmed back. Each round runs every (route, n) once, routes and sizes in rotating
order so drift spreads evenly; two warm-up rounds. Reported: the median ms per (route, n) and
the median over rounds of its ratio to the same route's one-token pass in that round. The machine is shared, so the load average is
printed beside them; under load, ``--clock cpu`` with one thread per library counts the work
done rather than the time spent waiting for a core.
"""

# ruff: noqa: I001
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import mlxspec  # noqa: F401  (the fast BLAS must load before mlx: imports stay in this order)
import mlx.core as mx
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mlxspec.core.cache import rewind
from mlxspec.measure.runs import encode_prompts, spec_bench_prompts
from mlxspec.targets import loading
from mlxspec.torchpath import invariant
from mlxspec.torchpath.load import to_torch

from mlx_invariant import invariant_path

TORCH_ROUTES = ("torch-mkl", "torch-mkl-packed", "torch-onednn", "torch-invariant", "torch-invariant-unfused",
                "torch-int4", "torch-rows")
MLX_ROUTES = ("mlx-cpupath", "mlx-invariant", "mlx-blocks", "mlx-cpupath-wt")
MAX_N = 8


@dataclass
class RouteResult:
    route: str
    ms: list[float]  # median ms of a pass over n = 1..MAX_N tokens
    ratios: list[float]  # the median over rounds of (ms over n tokens) / (ms over 1 token)
    equal_rows: int  # rows of the n = 1..MAX_N passes bitwise equal to the one-token pass
    rows: int
    max_abs_diff: float  # over all those rows


# ----------------------------------------------------------------------------- torch routes


class TorchRoutes:
    """The torch model and, per projection, the module each route puts in its place."""

    def __init__(self, lm: Any):
        self.model = to_torch(lm, "float32", "cpu").model
        self.slots = []  # (owner, name, {route: module})
        for block in self.model.model.layers:
            for owner in (block.self_attn, block.mlp):
                for name, child in list(owner.named_children()):
                    if type(child) is nn.Linear:
                        self.slots.append((owner, name, {
                            "mkl": child, "mkl-packed": MklPacked(child.weight), "onednn": invariant.PackedLinear(child),
                            "rows": RowByRow(child.weight, child.bias)}))
        # what make_batch_invariant fused (q, k, v; gate, up): only the invariant route runs them
        self.fused = [(b.self_attn, b.self_attn.fused_qkv, b.mlp, b.mlp.fused_gate_up) for b in self.model.model.layers]
        self.chunked = self.model.model.layers[0].self_attn.attend  # make_batch_invariant's, with its bias cache
        head = self.model.model.embed_tokens.weight
        # plain callables: the model's packed_head is not a submodule
        self.heads = {"mkl": None, "mkl-packed": MklPacked(head).forward, "onednn": invariant.PackedWeight(head),
                      "rows": RowByRow(head).forward}

    def use(self, route: str) -> None:
        kind = route.removeprefix("torch-")
        fused, kind = kind == "invariant", kind.removesuffix("-unfused")
        linear = "onednn" if kind == "invariant" else kind
        for attn, qkv, mlp, gate_up in self.fused:
            attn.fused_qkv, mlp.fused_gate_up = (qkv, gate_up) if fused else (None, None)
        for owner, name, modules in self.slots:
            setattr(owner, name, modules[linear])
        self.model.packed_head = self.heads[linear]
        attend = {"invariant": self.chunked, "rows": attend_rows}.get(kind, invariant.sdpa)
        act = invariant.padded_silu if kind == "invariant" else F.silu
        for block in self.model.model.layers:
            block.self_attn.attend, block.mlp.act = attend, act

    def tokens(self, ids: list[int]) -> Any:
        return torch.tensor([ids])

    def run(self, ids: list[int], cache: Any) -> Any:
        with torch.inference_mode():
            return self.model(self.tokens(ids), cache)[0].float().numpy()


class MklPacked(nn.Module):
    """``F.linear`` through MKL's packed GEMM, the weight packed once for up to 8 rows."""

    def __init__(self, weight: Any):
        super().__init__()
        self.w, self.packed = weight.detach(), torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), MAX_N)

    def forward(self, x: Any) -> Any:
        rows = x.reshape(-1, x.shape[-1])
        out = torch.ops.mkl._mkl_linear(rows, self.packed, self.w, None, MAX_N)
        return out.reshape(*x.shape[:-1], -1)


class RowByRow(nn.Module):
    """``F.linear`` one row at a time (a GEMV each, as a one-token pass runs it)."""

    def __init__(self, weight: Any, bias: Any = None):
        super().__init__()
        self.w, self.b = weight.detach(), None if bias is None else bias.detach()

    def forward(self, x: Any) -> Any:
        rows = x.reshape(-1, x.shape[-1])
        out = torch.cat([F.linear(rows[i:i + 1], self.w, self.b) for i in range(rows.shape[0])])
        return out.reshape(*x.shape[:-1], -1)


def attend_rows(q: Any, k: Any, v: Any, mask: Any, scale: float) -> Any:
    """Each query row alone, over exactly the keys its mask row keeps (a chain's: a prefix)."""
    if mask is None:
        return invariant.sdpa(q, k, v, None, scale)
    outs = []
    for i in range(q.shape[2]):
        keys = mask[i].nonzero()[:, 0]
        outs.append(invariant.sdpa(q[:, :, i:i + 1], k.index_select(2, keys), v.index_select(2, keys), None, scale))
    return torch.cat(outs, dim=2)


class Int4Route:
    """The quantized target on torch (``--dtype quantized``): its own model, nothing to swap."""

    def __init__(self):
        self.model = loading.load("default", "quantized", backend="torch:cpu").model

    def use(self, route: str) -> None:
        pass

    tokens, run = TorchRoutes.tokens, TorchRoutes.run


# ----------------------------------------------------------------------------- MLX routes


class MlxRoutes:
    def __init__(self, lm: Any):
        self.model = lm.model
        self.own, self.invariant = lm.model.cpu_path(), invariant_path(lm.model)
        self.plain, self.transposed = [], []
        for block in self.model.layers:
            for lin in (*(getattr(block.self_attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")),
                        *(getattr(block.mlp, n) for n in ("gate_proj", "up_proj", "down_proj"))):
                self.plain.append((lin, lin.weight))
                self.transposed.append((lin, mx.contiguous(lin.weight.T).T))  # the same values, (in, out) in memory
        mx.eval([w for _, w in self.transposed])

    def use(self, route: str) -> None:
        self.model.use_cpu_path = route != "mlx-blocks"
        self.model.run_cpu_path(self.invariant if route == "mlx-invariant" else self.own)
        for lin, w in self.transposed if route == "mlx-cpupath-wt" else self.plain:
            lin.weight = w

    def tokens(self, ids: list[int]) -> Any:
        return mx.array([ids])

    def run(self, ids: list[int], cache: Any) -> Any:
        out = self.model(self.tokens(ids), cache)[0]
        return np.array(out.astype(mx.float32))


# ----------------------------------------------------------------------------- measuring


def invariance(backend: Any, context: list[int], tokens: list[int]) -> tuple[int, int, float]:
    """Rows of the passes over tokens[:n], n = 1..len, bitwise equal to the one-token passes."""
    cache = backend.model.make_cache()
    backend.run(context, cache)
    singles = [backend.run([t], cache)[0] for t in tokens]
    rewind(cache, len(tokens))
    equal, rows, diff = 0, 0, 0.0
    for n in range(1, len(tokens) + 1):
        out = backend.run(tokens[:n], cache)
        rewind(cache, n)
        for i in range(n):
            rows += 1
            equal += int(np.array_equal(out[i], singles[i]))
            diff = max(diff, float(np.abs(out[i] - singles[i]).max()))
    return equal, rows, diff


def measure(routes: list[str], backends: dict[str, Any], context: list[int], tokens: list[int],
            rounds: int, clock: Any = time.perf_counter) -> dict[str, list[list[float]]]:
    """ms per (route, n) over ``rounds`` interleaved rounds (two warm-up rounds first), by
    ``clock`` (wall time, or this process's CPU time)."""
    caches = {}
    for r in routes:
        b = backends[r]
        b.use(r)
        caches[r] = b.model.make_cache()
        b.run(context, caches[r])
    times: dict[str, list[list[float]]] = {r: [[] for _ in range(MAX_N)] for r in routes}
    sizes = list(range(1, MAX_N + 1))
    for rnd in range(rounds + 2):
        order = routes[rnd % len(routes):] + routes[:rnd % len(routes)]
        for r in order:
            b = backends[r]
            b.use(r)
            for n in sizes[rnd % MAX_N:] + sizes[:rnd % MAX_N]:
                t0 = clock()
                b.run(tokens[:n], caches[r])
                dt = (clock() - t0) * 1e3
                rewind(caches[r], n)
                if rnd >= 2:
                    times[r][n - 1].append(dt)
        print(f"round {rnd + 1}/{rounds + 2} done, load {os.getloadavg()[0]:.2f}", flush=True)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default, as the engine)")
    ap.add_argument("--routes", default=",".join(TORCH_ROUTES + MLX_ROUTES))
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: this process's CPU seconds, which another process's load does not inflate "
                         "(with one thread each: --threads 1 and OPENBLAS_NUM_THREADS=1)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    routes = [r for r in args.routes.split(",") if r]
    unknown = set(routes) - set(TORCH_ROUTES + MLX_ROUTES)
    if unknown:
        raise SystemExit(f"unknown routes: {', '.join(sorted(unknown))}")

    lm = loading.load("default", "float32")
    items, _ = spec_bench_prompts(per_category=1)
    text = [t for ids in encode_prompts(lm, items, 64) for t in ids]
    context, tokens = text[: args.context], text[args.context: args.context + MAX_N]
    backends: dict[str, Any] = {}
    if any(r.startswith("torch") for r in routes):
        if args.threads:
            torch.set_num_threads(args.threads)
        tr = TorchRoutes(lm)
        backends.update({r: tr for r in routes if r.startswith("torch")})
        if "torch-int4" in routes:
            backends["torch-int4"] = Int4Route()
    if any(r.startswith("mlx") for r in routes):
        mr = MlxRoutes(lm)
        backends.update({r: mr for r in routes if r.startswith("mlx")})

    checks = {}
    for r in routes:
        backends[r].use(r)
        checks[r] = invariance(backends[r], context, tokens)
        print(f"{r}: {checks[r][0]}/{checks[r][1]} rows bitwise equal to the one-token passes", flush=True)
    load_before = os.getloadavg()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    times = measure(routes, backends, context, tokens, args.rounds, clock)
    load_after = os.getloadavg()

    results = []
    for r in routes:
        ms = [statistics.median(t) for t in times[r]]
        equal, rows, diff = checks[r]
        # each round's pass over n against the same round's one-token pass: adjacent in time
        ratios = [statistics.median(a / b for a, b in zip(times[r][n], times[r][0])) for n in range(MAX_N)]
        results.append(RouteResult(r, ms, ratios, equal, rows, diff))
    threads = torch.get_num_threads()
    print(f"\ncontext {len(context)} tokens, {args.rounds} rounds, {args.clock} clock, torch threads {threads}, "
          f"OPENBLAS_NUM_THREADS {os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}, "
          f"load average before {load_before[0]:.2f} / after {load_after[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"| route | n=1 ms | {' | '.join(f'{n}' for n in range(2, MAX_N + 1))} | rows bitwise equal | max diff |")
    print(f"|---|---|{'---|' * (MAX_N - 1)}---|---|")
    for res in results:
        print(f"| {res.route} | {res.ms[0]:.1f} | {' | '.join(f'{x:.2f}' for x in res.ratios[1:])} | "
              f"{res.equal_rows}/{res.rows} | {res.max_abs_diff:.1e} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"context": len(context), "rounds": args.rounds, "threads": threads, "clock": args.clock,
                       "load_before": load_before, "load_after": load_after,
                       "raw_ms": times, "routes": [asdict(r) for r in results]}, f, indent=1)


if __name__ == "__main__":
    main()
