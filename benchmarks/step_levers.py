"""Each lever of a cheaper target pass alone and combined, side by side (core.model.CpuPath).

    .venv/bin/python benchmarks/step_levers.py [--rounds 7] [--k 5] [--tokens 32] [--pairs-only | --no-pairs]

First every variant against ``plain`` in adjacent pairs (3 x rounds rounds, each L, one pass
each back to back on one cache, order alternating). Then target passes over L = 1..K+1 tokens on
a cache holding a Spec-Bench prompt, timed with ``costcurve.time_verify`` (one round per variant
in rotating order; medians; ratios are medians of per-round ratios to ``plain``); what grows
with L (the pass, its head matmul alone, its layer matmuls alone); then target-only decoding
with the engine, plain vs landed, alternating, with the tokens compared. Variants:

  plain                the blocks' own per-layer path (what ran before)
  (a) fused            q/k/v and gate/up as one matmul each (concatenated copies of the weights);
                       RoPE and the causal mask per layer as before
  (c) tables           CpuPath without compile: RoPE tables and the causal mask built once per pass
  (b)+(c) landed       CpuPath as it runs: (c) with the work before/after attention mx.compile'd
                       (compile needs (c): fast.rope with an integer offset retraces every position)
  (a)+(c)              fused, with tables
  (a)+(b)+(c)          fused, with tables, compiled
"""

# ruff: noqa: I001
from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import mlxspec  # noqa: F401  (the fast BLAS must load before mlx: imports stay in this order)
import mlx.core as mx
from mlx import nn

from mlxspec.core.model import COMPILE_MAX_TOKENS, rope_tables, rotate
from mlxspec.core.sampling import SamplingParams
from mlxspec.measure.runs import encode_prompts, engine_run, spec_bench_prompts
from mlxspec.targets.costcurve import time_verify
from mlxspec.measure.sweep import verify_slope
from mlxspec.measure.verdict import median_ratio
from mlxspec.targets import loading


def fused_weights(model) -> list[SimpleNamespace]:
    """Per block, q/k/v and gate/up concatenated (copies: the model keeps its own weights)."""
    out = []
    for b in model.layers:
        a, m = b.self_attn, b.mlp
        out.append(SimpleNamespace(qkv=mx.concatenate([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                                   gate_up=mx.concatenate([m.gate_proj.weight, m.up_proj.weight])))
        mx.eval(out[-1].qkv, out[-1].gate_up)
    return out


class Variant:
    """A forward path over the loaded model's own arrays, callable as ``model(tokens, cache)``."""

    def __init__(self, lm, fuse: bool, tables: bool):
        self.m, self.cfg, self.fuse, self.tables = lm.model, lm.config, fuse, tables
        self.blocks = fused_weights(lm.model)

    def make_cache(self):
        return self.m.make_cache()

    def before(self, x, layer, f, cos, sin, offset):
        c, a = self.cfg, layer.self_attn
        B, L, _ = x.shape
        h = mx.fast.rms_norm(x, layer.input_layernorm.weight, c.rms_norm_eps)
        if self.fuse:
            qkv = (h @ f.qkv.T).reshape(B, L, -1, c.head_dim).transpose(0, 2, 1, 3)
            nq, nk = c.num_heads, c.num_kv_heads
            q, k, v = qkv[:, :nq], qkv[:, nq : nq + nk], qkv[:, nq + nk :]
        else:
            q, k, v = (p(h).reshape(B, L, -1, c.head_dim).transpose(0, 2, 1, 3) for p in (a.q_proj, a.k_proj, a.v_proj))
        if self.tables:
            return rotate(q, cos, sin, c.rope_traditional), rotate(k, cos, sin, c.rope_traditional), v
        rope = {"traditional": c.rope_traditional, "base": c.rope_theta, "scale": 1.0, "offset": offset}
        return mx.fast.rope(q, c.head_dim, **rope), mx.fast.rope(k, c.head_dim, **rope), v

    def after(self, x, attn, layer, f):
        B, L, _ = x.shape
        h = x + layer.self_attn.o_proj(attn.transpose(0, 2, 1, 3).reshape(B, L, -1))
        n = mx.fast.rms_norm(h, layer.post_attention_layernorm.weight, self.cfg.rms_norm_eps)
        if self.fuse:
            gu = n @ f.gate_up.T
            i = self.cfg.intermediate_size
            return h + layer.mlp.down_proj(nn.silu(gu[..., :i]) * gu[..., i:])
        return h + layer.mlp(n)

    def __call__(self, tokens, cache, **_):  # prefill passes num_layers=None
        c = self.cfg
        L, offset = tokens.shape[1], cache[0].offset
        mask = "causal" if L > 1 else None
        cos = sin = None
        if self.tables:
            cos, sin = rope_tables(c, L, offset, None, mx.float32)
            if L > 1:
                mask = mx.arange(offset, offset + L)[:, None] >= mx.arange(offset + L)[None]
        h = self.m.model.embed_tokens(tokens)
        for layer, f, kv in zip(self.m.layers, self.blocks, cache):
            q, k, v = self.before(h, layer, f, cos, sin, offset)
            k, v = kv.update_and_fetch(k, v)
            o = mx.fast.scaled_dot_product_attention(q, k, v, scale=c.head_dim**-0.5, mask=mask)
            h = self.after(h, o, layer, f)
        return self.m.model.embed_tokens.as_linear(self.m.model.norm(h))


class CompiledFused(Variant):
    """(a)+(b)+(c): fused projections and tables, the work before/after attention compiled with
    the weights as inputs (one trace serves every layer), for L <= COMPILE_MAX_TOKENS."""

    def __init__(self, lm):
        super().__init__(lm, fuse=True, tables=True)
        c = self.cfg
        nq, nk, i = c.num_heads, c.num_kv_heads, c.intermediate_size

        def pre(x, nw, wqkv, cos, sin):
            B, L, _ = x.shape
            h = mx.fast.rms_norm(x, nw, c.rms_norm_eps)
            qkv = (h @ wqkv.T).reshape(B, L, -1, c.head_dim).transpose(0, 2, 1, 3)
            q, k, v = qkv[:, :nq], qkv[:, nq : nq + nk], qkv[:, nq + nk :]
            return rotate(q, cos, sin, c.rope_traditional), rotate(k, cos, sin, c.rope_traditional), v

        def post(x, attn, wo, nw, wgu, wd):
            B, L, _ = x.shape
            h = x + attn.transpose(0, 2, 1, 3).reshape(B, L, -1) @ wo.T
            gu = mx.fast.rms_norm(h, nw, c.rms_norm_eps) @ wgu.T
            return h + (nn.silu(gu[..., :i]) * gu[..., i:]) @ wd.T

        self.cpre, self.cpost = mx.compile(pre), mx.compile(post)

    def before(self, x, layer, f, cos, sin, offset):
        if x.shape[1] > COMPILE_MAX_TOKENS:
            return super().before(x, layer, f, cos, sin, offset)
        return self.cpre(x, layer.input_layernorm.weight, f.qkv, cos, sin)

    def after(self, x, attn, layer, f):
        if x.shape[1] > COMPILE_MAX_TOKENS:
            return super().after(x, attn, layer, f)
        return self.cpost(x, attn, layer.self_attn.o_proj.weight, layer.post_attention_layernorm.weight, f.gate_up,
                          layer.mlp.down_proj.weight)


class Landed:
    """The model itself: the blocks' own path (``use_cpu_path`` off), or CpuPath with or
    without compile."""

    def __init__(self, lm, cpu: bool, compiled: bool):
        self.m, self.cpu, self.compiled = lm.model, cpu, compiled

    def make_cache(self):
        return self.m.make_cache()

    def __call__(self, tokens, cache, **kw):
        self.m.use_cpu_path = self.cpu
        if self.cpu:
            self.m.cpu_path().compile_max_tokens = COMPILE_MAX_TOKENS if self.compiled else 0
        return self.m(tokens, cache, **kw)


def why(lm, prompt: list[int], sizes: list[int], rounds: int) -> None:
    """What grows with L: the landed pass, its LM head matmul alone and its 210 layer matmuls
    alone (same shapes, random inputs), the rest by difference; rounds alternate the parts."""
    m = lm.model
    W = m.model.embed_tokens.weight
    x = {L: mx.random.normal((1, L, lm.config.hidden_size)) for L in sizes}
    xi = {L: mx.random.normal((1, L, lm.config.intermediate_size)) for L in sizes}
    mx.eval(list(x.values()), list(xi.values()))

    def head(L: int) -> None:
        mx.eval(x[L] @ W.T)

    def mats(L: int) -> None:
        mx.eval([y for b in m.layers for y in (
            *(x[L] @ p.weight.T for p in (b.self_attn.q_proj, b.self_attn.k_proj, b.self_attn.v_proj,
                                          b.self_attn.o_proj, b.mlp.gate_proj, b.mlp.up_proj)),
            xi[L] @ b.mlp.down_proj.weight.T)])

    class Part:  # time_verify wants a model; these ignore the cache
        def __init__(self, fn):
            self.fn = fn

        def make_cache(self):
            return m.make_cache()

        def __call__(self, tokens, cache, **_):
            if tokens.shape[1] in x:
                self.fn(tokens.shape[1])
            for c in cache:  # keep time_verify's rewind consistent: grow as a pass would
                c.offset += tokens.shape[1]
            return mx.zeros((1, 1, 1))

    parts = {"pass (landed)": m, "LM head matmul": Part(head), "layer matmuls (210)": Part(mats)}
    times = {n: {L: [] for L in sizes} for n in parts}
    for r in range(rounds):
        for n, p in parts.items():
            for L, ms in time_verify(p, prompt, sizes, reps=1).items():
                times[n][L] += ms
    med = {n: [statistics.median(times[n][L]) for L in sizes] for n in parts}
    med["rest (difference)"] = [a - b - c for a, b, c in zip(*med.values())]
    print("what grows with L (ms, medians; per extra token = least-squares slope in ms):")
    for n, v in med.items():
        per = sum((L - 1) * (y - v[0]) for L, y in zip(sizes, v)) / sum((L - 1) ** 2 for L in sizes)
        print(f"  {n:22s}" + "".join(f"  L={L}: {y:6.1f}" for L, y in zip(sizes, v)) + f"  +{per:.1f} ms/token")


def adjacent_ab(variants: dict, prompt: list[int], sizes: list[int], rounds: int) -> None:
    """Each variant against ``plain`` in adjacent pairs (one pass each, back to back, order
    alternating) on one shared cache: the tightest pairing a drifting machine allows. Also
    compile's own effect ((b)+(c) over (c)) and fusion's on top of what landed."""
    from mlxspec.core.cache import rewind
    from mlxspec.core.prefill import prefill

    plain = variants["plain"]
    cache = plain.make_cache()
    mx.eval(prefill(plain, cache, prompt))
    toks = {L: mx.array([[prompt[i % len(prompt)] for i in range(L)]], mx.int32) for L in sizes}

    def once(v, L: int) -> float:
        t0 = time.perf_counter()
        mx.eval(v(toks[L], cache))
        dt = time.perf_counter() - t0
        rewind(cache, L)
        return dt

    pairs = [(n, "plain") for n in variants if n != "plain"] + [
        ("(b)+(c) landed", "(c) tables"), ("(a)+(b)+(c)", "(b)+(c) landed")]
    for a, b in pairs:
        for L in sizes:
            once(variants[a], L), once(variants[b], L)
    ratios: dict[tuple[str, str], list[float]] = {p: [] for p in pairs}
    for r in range(rounds):
        for a, b in pairs:
            for L in sizes:
                if (r + L) % 2:
                    tb, ta = once(variants[b], L), once(variants[a], L)
                else:
                    ta, tb = once(variants[a], L), once(variants[b], L)
                ratios[(a, b)].append(tb / ta)
    print(f"adjacent pairs ({rounds} rounds x L = {sizes[0]}..{sizes[-1]}): speedup = median of b ms / a ms, "
          "95% bootstrap interval (pairs within a round share drift)")
    for (a, b), rs in ratios.items():
        c = median_ratio(rs)
        print(f"  {a:20s} over {b:9s} {c.ratio:.3f}x [{c.interval.lo:.3f}, {c.interval.hi:.3f}] {c.kind.value}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--pairs-only", action="store_true", help="only the adjacent-pairs A/B")
    ap.add_argument("--no-pairs", action="store_true", help="skip the adjacent-pairs A/B")
    args = ap.parse_args()
    lm = loading.load("default")
    assert lm.model.cpu_path() is not None, "float weights on the CPU expected"
    variants = {
        "plain": Landed(lm, False, False),
        "(a) fused": Variant(lm, fuse=True, tables=False),
        "(c) tables": Landed(lm, True, False),
        "(b)+(c) landed": Landed(lm, True, True),
        "(a)+(c)": Variant(lm, fuse=True, tables=True),
        "(a)+(b)+(c)": CompiledFused(lm),
    }
    items, _ = spec_bench_prompts(per_category=1)
    prompt = encode_prompts(lm, items[:1], 64)[0]
    sizes = list(range(1, args.k + 2))
    # Same logits first (argmax everywhere, 1e-5 relative).
    ref = None
    for name, v in variants.items():
        cache = v.make_cache()
        v(mx.array([prompt]), cache)
        out = v(mx.array([prompt[:1] * len(sizes)]), cache)
        if ref is None:
            ref = out
        err = (mx.abs(out - ref).max() / mx.abs(ref).max()).item()
        assert err < 1e-5 and mx.array_equal(mx.argmax(out, -1), mx.argmax(ref, -1)).item(), (name, err)
    if not args.no_pairs:
        adjacent_ab(variants, prompt, sizes, args.rounds * 3)
    if args.pairs_only:
        return
    names = list(variants)
    times = {n: {L: [] for L in sizes} for n in names}
    for r in range(args.rounds):
        for n in names[r % len(names):] + names[: r % len(names)]:
            for L, ms in time_verify(variants[n], prompt, sizes, reps=1).items():
                times[n][L] += ms
        print(f"round {r + 1}/{args.rounds}", flush=True)
    def total(n: str) -> list[float]:  # per round, summed over every L
        return [sum(t) for t in zip(*(times[n][L] for L in sizes))]

    def speedup(n: str, base: str = "plain") -> str:
        c = median_ratio([b / x for b, x in zip(total(base), total(n))])
        return f"{c.ratio:.2f}x ({c.interval}, {c.kind.value})"

    print(f"target pass, ms (x plain), medians of {args.rounds} rounds; prompt {len(prompt)} tokens; "
          "speedup = median over rounds of plain ms / variant ms (summed over L), 95% bootstrap interval")
    for n in names:
        med = [statistics.median(times[n][L]) for L in sizes]
        vs = [statistics.median(a / b for a, b in zip(times[n][L], times["plain"][L])) for L in sizes]
        slope = verify_slope([L - 1 for L in sizes[1:]], [m / med[0] for m in med[1:]])
        print(f"  {n:20s}" + "".join(f"  L={L}: {m:6.1f} ({x:.2f}x)" for L, m, x in zip(sizes, med, vs))
              + f"  slope {slope:.3f}" + ("" if n == "plain" else f"  speedup {speedup(n)}"))
    print(f"  compile's own effect, (b)+(c) over (c): {speedup('(b)+(c) landed', '(c) tables')}")
    # Target-only decoding with the engine, plain vs landed, alternating.
    stop = set()
    tps: dict[bool, list[float]] = {False: [], True: []}
    toks: dict[bool, list[int]] = {}
    for r in range(args.rounds):
        for cpu in ((False, True) if r % 2 == 0 else (True, False)):
            lm.model.use_cpu_path = cpu
            run = engine_run(lm, prompt, SamplingParams(), args.tokens, stop)
            tps[cpu].append(run.decode_tps)
            toks.setdefault(cpu, run.tokens)
    lm.model.use_cpu_path = True
    why(lm, prompt, sizes, args.rounds)
    c = median_ratio([a / b for a, b in zip(tps[True], tps[False])])
    print(f"target-only decode, {args.tokens} tokens: plain {statistics.median(tps[False]):.2f} tok/s, landed "
          f"{statistics.median(tps[True]):.2f} tok/s, paired ratio {c.ratio:.2f}x ({c.interval}, {c.kind.value}); "
          f"same tokens: {toks[True] == toks[False]}")


if __name__ == "__main__":
    main()
