"""Would compiling the quantized target's pass close the gap to llama.cpp? (issue 37 item 2)

The default's one-token pass on torch is dispatch-bound (DESIGN.md: ~490 small aten calls and
the Python between them beside 3.7 ms of int4 products and 3.9 ms of head). This compiles the
block pass (norms, int4 products, RoPE, cache writes, ``invariant``-style attention, MLP) with
inductor and times it against the eager target in one process, interleaved, at three context
lengths and two pass widths, two ways:

* ``per-layer``: one graph for a block, called once per block (the weights are its inputs);
* ``whole-stack``: one graph for all the blocks, called once per pass.

It checks that the compiled pass keeps row invariance (a pass of 7 tokens across a 256-key
block boundary has, row for row, the bits of 7 one-token passes), and reports how long the
graphs took to compile and, for a second process, to load from inductor's cache.

    .venv/bin/python benchmarks/compiled_stack.py [--mode whole-stack|per-layer] [--reps 30] [--out FILE.json]

Run it on a quiet machine; the second run of a mode reads inductor's cache (TORCHINDUCTOR_CACHE_DIR).
"""

# ruff: noqa: I001
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass

import mlxspec  # noqa: F401  (the fast BLAS must load before mlx: imports stay in this order)
import torch
import torch.nn.functional as F

from mlxspec.core.cache import rewind
from mlxspec.targets import loading
from mlxspec.torchpath.invariant import KEY_BLOCK, MaskBiases
from mlxspec.torchpath.model import pass_inputs
from mlxspec.torchpath.ops import prefill

MIN_BLOCKS = 2  # with one key block inductor specializes the block sums into another graph
CONTEXTS = (64, 200, 400)
WIDTHS = (1, 4)


def _product(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, bias: torch.Tensor | None,
             group_size: int) -> torch.Tensor:
    """``Int4Weight``'s product, on its operands."""
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(-1, x.shape[-1]).to(torch.bfloat16), packed,
                                                     group_size, scales_zeros).float()
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, traditional: bool) -> torch.Tensor:
    """``model.Rope.rotate``."""
    if traditional:
        swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    else:
        swapped = torch.cat(x.chunk(2, dim=-1)[::-1], dim=-1)
    return x * cos + swapped * sin


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor,
            scale: float) -> torch.Tensor:
    """``invariant.chunked_attention`` over the first ``bias.shape[-1]`` cached positions:
    q (B, H, L, D); keys, values the cache's buffers (B, Hkv, capacity, D); ``bias`` its
    (matrices, padded rows, width)."""
    B, H, L, D = q.shape
    hkv = keys.shape[1]
    mats, rows, width = bias.shape
    heads = B * hkv
    queries = F.pad(q.reshape(heads, H // hkv * L, D), (0, 0, 0, rows - H // hkv * L, 0, mats - heads))
    k = F.pad(keys[:, :, :width].reshape(heads, width, D), (0, 0, 0, 0, 0, mats - heads))
    v = F.pad(values[:, :, :width].reshape(heads, width, D), (0, 0, 0, 0, 0, mats - heads))
    scores = torch.baddbmm(bias, queries, k.transpose(1, 2), alpha=scale)
    p = torch.exp(scores - scores.amax(dim=-1, keepdim=True)).view(mats, rows, width // KEY_BLOCK, KEY_BLOCK)
    total = p.sum(dim=-1).sum(dim=-1)  # per block, then the blocks in order
    parts = torch.matmul(p.transpose(1, 2), v.view(mats, width // KEY_BLOCK, KEY_BLOCK, D))
    out = parts.sum(dim=1)  # (matrices, rows, D): a wholly masked block adds exact zeros
    return (out[:heads, : H // hkv * L] / total[:heads, : H // hkv * L, None]).view(B, H, L, D)


def block_pass(h: torch.Tensor, slots: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor,
               keys: torch.Tensor, values: torch.Tensor, weights: tuple, shape: tuple) -> torch.Tensor:
    """One llama block over ``h`` (B, L, hidden), writing its keys and values into the cache's
    buffers at ``slots`` (L,). ``weights``: ``CompiledTarget._weights``' tuple for the block; ``shape``:
    (heads, kv heads, head dim, eps, attention scale, RoPE traditional, group size)."""
    (norm1, qkv, qkv_sz, qkv_bias, q_norm, k_norm, o, o_sz, o_bias, norm2, gate_up, gate_up_sz, gate_up_bias,
     down, down_sz, down_bias) = weights
    heads, kv_heads, head_dim, eps, scale, traditional, group = shape
    B, L, _ = h.shape
    x = _rms_norm(h, norm1, eps)
    q, k, v = _product(x, qkv, qkv_sz, qkv_bias, group).split(
        [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = q.reshape(B, L, heads, head_dim), k.reshape(B, L, kv_heads, head_dim)
    if q_norm is not None:
        q, k = _rms_norm(q, q_norm, eps), _rms_norm(k, k_norm, eps)
    q, k = _rotate(q.transpose(1, 2), cos, sin, traditional), _rotate(k.transpose(1, 2), cos, sin, traditional)
    keys.index_copy_(2, slots, k)
    values.index_copy_(2, slots, v.reshape(B, L, kv_heads, head_dim).transpose(1, 2))
    out = _attend(q, keys, values, bias, scale).transpose(1, 2).reshape(B, L, -1)
    h = h + _product(out, o, o_sz, o_bias, group)
    gate, up = _product(_rms_norm(h, norm2, eps), gate_up, gate_up_sz, gate_up_bias, group).chunk(2, dim=-1)
    return h + _product(F.silu(gate) * up, down, down_sz, down_bias, group)


def _without_global_state(entries: list) -> list[bool]:
    """Dynamo's global-state guard includes torch's thread count, which the ThreadGovernor
    changes with the load: without this filter each count compiles the graphs again."""
    return [entry.guard_type != "GLOBAL_STATE" for entry in entries]


@dataclass(frozen=True)
class Timing:
    context: int
    tokens: int
    eager_ms: float
    compiled_ms: float

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.compiled_ms


class CompiledTarget:
    """The loaded target's embedding, norm and head around compiled blocks, with its own
    static-layout KV buffers (grown a key block at a time)."""

    def __init__(self, model, mode: str):
        cfg = model.cfg
        self.model, self.mode = model, mode
        model(torch.tensor([[0]]), model.make_cache())  # packs the int4 weights
        self.shape = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps, cfg.attn_scale,
                      model.rope.traditional, model.layers[0].self_attn.fused_qkv.group_size)
        self.weights = [self._weights(b) for b in model.layers]
        self.biases = MaskBiases()
        fn = block_pass if mode == "per-layer" else stack_pass
        self.fn = torch.compile(fn, dynamic=True, options={"guard_filter_fn": _without_global_state})

    @staticmethod
    def _weights(block) -> tuple:
        attn, mlp = block.self_attn, block.mlp
        ops = [attn.fused_qkv, attn.o_proj.kernel, mlp.fused_gate_up, mlp.down_proj.kernel]
        (qkv, o, gu, down) = [(k.packed, k.scales_zeros, k.bias) for k in ops]
        return (block.input_layernorm.weight, *qkv, None, None, *o, block.post_attention_layernorm.weight, *gu, *down)

    def new_cache(self) -> dict:
        return {"offset": 0, "kv": []}

    def __call__(self, tokens: torch.Tensor, cache: dict) -> torch.Tensor:
        cfg, m = self.model.cfg, self.model
        offset, n = cache["offset"], tokens.shape[1]
        h = m.model.embed_tokens(tokens)
        mask, positions = pass_inputs(n, offset, None, None, h.device)
        cos, sin = m.rope.tables(positions, h.dtype)
        seen = offset + n
        width = max(seen + (-seen % KEY_BLOCK), MIN_BLOCKS * KEY_BLOCK)
        bias = self.biases.get(mask, 1, cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, n, seen, width, h)
        if not cache["kv"] or cache["kv"][0][0].shape[2] < width:
            size = (1, cfg.num_kv_heads, width, cfg.head_dim)
            grown = [(h.new_zeros(size), h.new_zeros(size)) for _ in m.layers]
            for (k, v), (old_k, old_v) in zip(grown, cache["kv"]):
                k[:, :, :offset], v[:, :, :offset] = old_k[:, :, :offset], old_v[:, :, :offset]
            cache["kv"] = grown
        slots = torch.arange(offset, seen)
        with torch.no_grad():
            if self.mode == "per-layer":
                for (k, v), w in zip(cache["kv"], self.weights):
                    h = self.fn(h, slots, cos, sin, bias, k, v, w, self.shape)
            else:
                h = self.fn(h, slots, cos, sin, bias, cache["kv"], self.weights, self.shape)
        cache["offset"] = seen
        return m.head(m.model.norm(h))


def stack_pass(h, slots, cos, sin, bias, kv, weights, shape):
    for (k, v), w in zip(kv, weights):
        h = block_pass(h, slots, cos, sin, bias, k, v, w, shape)
    return h


def rows_are_invariant(target: CompiledTarget) -> bool:
    """7 tokens across the 256-key boundary in one pass, then one at a time: the same bits."""
    toks = [11, 22, 33, 44, 55, 66, 77]
    one, many = target.new_cache(), target.new_cache()
    for c in (one, many):
        target(torch.tensor([list(range(1000, 1252))]), c)
    together = target(torch.tensor([toks]), many)
    alone = torch.cat([target(torch.tensor([[t]]), one) for t in toks], dim=1)
    return torch.equal(together, alone)


def time_passes(eager, target: CompiledTarget, reps: int) -> list[Timing]:
    out = []
    for ctx in CONTEXTS:
        prompt = torch.tensor([list(range(1000, 1000 + ctx))])
        ec = eager.make_cache()
        prefill(eager, ec, prompt[0].tolist())
        cc = target.new_cache()
        target(prompt, cc)
        for n in WIDTHS:
            x = torch.tensor([[1234] * n])
            te, tc = [], []
            for _ in range(reps):  # interleaved: the machine's drift hits both alike
                t = time.perf_counter()
                eager(x, ec)
                te.append(time.perf_counter() - t)
                rewind(ec, n)
                t = time.perf_counter()
                target(x, cc)
                tc.append(time.perf_counter() - t)
                cc["offset"] -= n
            out.append(Timing(ctx, n, statistics.median(te) * 1e3, statistics.median(tc) * 1e3))
            t = out[-1]
            print(f"context {ctx}, {n} token(s): eager {t.eager_ms:.2f} ms, compiled {t.compiled_ms:.2f} ms, "
                  f"{t.speedup:.2f}x", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("whole-stack", "per-layer"), default="whole-stack")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out")
    args = ap.parse_args()
    eager = loading.load("default", "quantized", backend="torch:cpu").model
    target = CompiledTarget(loading.load("default", "quantized", backend="torch:cpu").model, args.mode)
    start = time.perf_counter()
    target(torch.tensor([[0]]), target.new_cache())  # one token and several: inductor's two graphs
    target(torch.tensor([[0, 0]]), target.new_cache())
    compile_s = time.perf_counter() - start
    print(f"{args.mode}: graphs ready in {compile_s:.1f} s", flush=True)
    invariant = rows_are_invariant(target)
    print(f"rows bitwise the one-token pass: {invariant}", flush=True)
    timings = time_passes(eager, target, args.reps)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"mode": args.mode, "compile_s": compile_s, "rows_invariant": invariant,
                       "torch": torch.__version__, "threads": torch.get_num_threads(),
                       "inductor_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
                       "timings": [asdict(t) | {"speedup": t.speedup} for t in timings]}, f, indent=1)


if __name__ == "__main__":
    main()
