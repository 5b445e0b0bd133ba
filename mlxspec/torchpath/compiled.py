"""The quantized target's blocks as one compiled graph: 1.6-1.9x faster, rows still invariant.

The one-token pass on the CPU is dispatch-bound: ~6,100 torch calls, most of them small
elementwise ones and the Python between them, beside the int4 products and the head
(benchmarks/notes/2026-12-04-compiled-target-pass.md). Inductor fuses the norms, RoPE, cache
writes, softmax and residual adds of all the blocks into a few C++ loops around the library
products (the int4 kernel, the batched attention products). Where the VNNI kernels load
(``vnni``), the products and the whole attention are theirs (``attend.cpp``: the batched
products and softmax took ~2 ms of a 7.7 ms pass at 200 tokens of context, it takes ~1).

Exactness is kept the way ``invariant`` keeps it, within the compiled pass: a row of a verify
pass has the bits of the one-token pass at its position (products on at least 4 rows, the
softmax summed per key block, then the blocks in order), which the tests check bitwise for
chains, trees and both thread counts. The compiled pass's bits are not the eager pass's
(inductor orders the norm's and the softmax's sums its own way, a last-bit difference), so a
model decodes either every pass compiled or none: ``takes`` covers every pass of one sequence
on plain caches; a packed pass of several (``serve --parallel``) runs eager, with the
compiled stack set aside for the server's life.

Compiled ahead of time (``mlxspec models pull`` does it, a minute or two here) with torch's AOT
precompile, two graphs (one token; two or more: dynamo specializes a size of 1), the token count
and key width dynamic, saved in the store keyed by torch, Python, this file and the model's
shapes; a process loads them in under a second without tracing again. The graphs take the
weights as inputs, so a file serves any model of the same shapes.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mlxspec.torchpath import vnni
from mlxspec.torchpath.cache import KVCache
from mlxspec.torchpath.int4 import Int4Linear, Int4Weight, product
from mlxspec.torchpath.invariant import KEY_BLOCK, LANES, MaskBiases
from mlxspec.torchpath.model import rotate

GRAPHS = ("one", "many")
BUILD_FILE = "build"  # beside the graphs: the ``build()`` that made them
# The graphs sum attention's keys this many at a time and attend over the keys held rounded up to
# it (their bits are their own anyway): with ``invariant.KEY_BLOCK``'s 256 and two blocks at least,
# a pass at 100 tokens of context attended over 512 keys.
ATTEND_BLOCK = 64
# With one key block inductor specializes the block sums into another graph: every pass attends
# over two or more (a wholly masked block adds exact zeros).
MIN_BLOCKS = 2


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor,
            scale: float) -> torch.Tensor:
    """``invariant.chunked_attention``'s arithmetic over the first ``bias.shape[-1]`` positions of
    the cache's buffers: q (1, H, L, D); keys, values (1, Hkv, capacity, D); ``bias`` (matrices,
    padded rows, width), width a multiple of ``ATTEND_BLOCK``. Both products batched library calls
    on operands of at least 4 rows and two matrices; the softmax's sums per key block, then the
    blocks in order, so a query's bits do not depend on the rows beside it."""
    _, H, L, D = q.shape
    heads = keys.shape[1]
    mats, rows, width = bias.shape
    queries = F.pad(q.reshape(heads, H // heads * L, D), (0, 0, 0, rows - H // heads * L, 0, mats - heads))
    k, v = keys[0, :, :width], values[0, :, :width]  # read in place: a copy was 24 MB a pass at 512 keys
    if mats > heads:  # one key head: the products batch two matrices (``invariant._batched``)
        k, v = F.pad(k, (0, 0, 0, 0, 0, mats - heads)), F.pad(v, (0, 0, 0, 0, 0, mats - heads))
    scores = torch.baddbmm(bias, queries, k.transpose(1, 2), alpha=scale)
    blocks = width // ATTEND_BLOCK
    p = torch.exp(scores - scores.amax(dim=-1, keepdim=True)).view(mats, rows, blocks, ATTEND_BLOCK)
    total = p.sum(dim=-1).sum(dim=-1)
    out = torch.matmul(p.transpose(1, 2), v.view(mats, blocks, ATTEND_BLOCK, D)).sum(dim=1)
    return (out[:heads, : H // heads * L] / total[:heads, : H // heads * L, None]).view(1, H, L, D)


def _attend_native(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor,
                   scale: float) -> torch.Tensor:
    """``_attend`` in one library call (``attend.cpp``): each KV head's keys read once for all
    its query rows, a query's bits its own."""
    _, H, L, D = q.shape
    heads = keys.shape[1]
    out = torch.ops.mlxspec_vnni.attend(q.reshape(heads, H // heads * L, D).contiguous(), keys, values, bias, scale)
    return out.view(1, H, L, D)


def block(h: torch.Tensor, slots: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor,
          keys: torch.Tensor, values: torch.Tensor, weights: tuple, shape: tuple) -> torch.Tensor:
    """One llama block (``model.Block`` with ``invariant``'s kernels) over ``h`` (1, L, hidden),
    writing its keys and values into the cache's buffers at positions ``slots`` (L,)."""
    (norm1, qkv, qkv_sz, qkv_bias, o, o_sz, o_bias, norm2, gate_up, gate_up_sz, gate_up_bias,
     down, down_sz, down_bias) = weights
    heads, kv_heads, head_dim, eps, scale, traditional, group, native = shape
    _, L, _ = h.shape
    x = F.rms_norm(h, (h.shape[-1],), norm1, eps)
    qk, v = product(x, qkv, qkv_sz, qkv_bias, group).split([(heads + kv_heads) * head_dim, kv_heads * head_dim],
                                                           dim=-1)
    q, k = rotate(qk.reshape(1, L, -1, head_dim).transpose(1, 2), cos, sin, traditional).split(
        [heads, kv_heads], dim=1)
    keys.index_copy_(2, slots, k)
    values.index_copy_(2, slots, v.reshape(1, L, kv_heads, head_dim).transpose(1, 2))
    out = (_attend_native if native else _attend)(q, keys, values, bias, scale).transpose(1, 2).reshape(1, L, -1)
    h = h + product(out, o, o_sz, o_bias, group)
    x = F.rms_norm(h, (h.shape[-1],), norm2, eps)
    gate, up = product(x, gate_up, gate_up_sz, gate_up_bias, group).chunk(2, dim=-1)
    return h + product(F.silu(gate) * up, down, down_sz, down_bias, group)


def stack(h: torch.Tensor, slots: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor,
          kv: list, weights: list, shape: tuple) -> tuple[torch.Tensor, ...]:
    """Every block in turn, the function compiled: the output, then the residual stream entering
    each block (an EAGLE-3 head drafts from some of them; writing them all costs little)."""
    entering = []
    for (keys, values), w in zip(kv, weights):
        entering.append(h)
        h = block(h, slots, cos, sin, bias, keys, values, w, shape)
    return (h, *entering)


def supported(model: Any) -> bool:
    """The graph is written for llama blocks on the int4 kernel with the row-invariant attention:
    the default's file read quantized, every block's q, k, v fused, no q/k norms."""
    cfg = model.cfg
    if not getattr(model, "batch_invariant", False) or cfg.qk_norm:
        return False
    if cfg.hidden_size % LANES or cfg.intermediate_size % LANES:
        return False  # inductor's elementwise loops run flat over the rows: whole vectors per row keep a row's bits
    if vnni.active() and (cfg.head_dim % 16 or cfg.head_dim > 256):
        return False  # attend.cpp's vectors
    for b in model.layers:
        kernels = (b.self_attn.fused_qkv, b.self_attn.o_proj, b.mlp.fused_gate_up, b.mlp.down_proj)
        if not (isinstance(kernels[0], Int4Weight) and isinstance(kernels[2], Int4Weight)
                and isinstance(kernels[1], Int4Linear) and isinstance(kernels[3], Int4Linear)):
            return False
    return True


def build() -> str:
    """What every compiled file depends on beside a model's shapes: torch, Python (the saved
    bytecode) and this file."""
    text = f"{torch.__version__}|{sys.version_info[:3]}|".encode()
    return hashlib.sha256(text + Path(__file__).read_bytes()).hexdigest()[:16]


def key(model: Any) -> str:
    """What a compiled file is valid for: ``build()`` and the model's shapes."""
    cfg = model.cfg
    shapes = (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
              cfg.rms_norm_eps, cfg.attn_scale, model.rope.traditional, cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias,
              model.layers[0].self_attn.fused_qkv.group_size, "vnni" if vnni.active() else "int4")
    return hashlib.sha256(f"{build()}|{shapes}".encode()).hexdigest()[:16]


class CompiledStack:
    """``model``'s blocks through the two compiled graphs, on its ``KVCache`` list."""

    def __init__(self, model: Any, graphs: dict[str, Callable]):
        cfg = model.cfg
        model(torch.tensor([[0]]), None)  # packs the int4 weights (their packing is lazy)
        self.graphs = graphs
        self.shape = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps, cfg.attn_scale,
                      model.rope.traditional, model.layers[0].self_attn.fused_qkv.group_size,
                      vnni.active())  # the attention kernel with the products'
        self.weights = [_weights(b) for b in model.layers]
        self.kv_heads, self.group = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads
        self.biases = MaskBiases()

    def takes(self, h: torch.Tensor, cache: Any, mask: Any) -> bool:
        """A pass of one sequence on plain caches with one mask for it: every pass of a decode."""
        return (h.shape[0] == 1 and bool(cache) and type(cache[0]) is KVCache
                and (mask is None or mask.dim() == 2))

    def inputs(self, h: torch.Tensor, cache: Sequence[KVCache], mask: torch.Tensor | None, cos: torch.Tensor,
               sin: torch.Tensor) -> tuple:
        """The graphs' arguments for a pass of ``h`` after the cached positions, the caches grown
        to hold it and a key block to spare (the graphs were traced with buffers wider than the
        keys attended)."""
        offset, n = cache[0].offset, h.shape[1]
        seen = offset + n
        width = max(seen + (-seen % ATTEND_BLOCK), MIN_BLOCKS * ATTEND_BLOCK)
        for c in cache:
            c.reserve(width + KEY_BLOCK, (1, self.kv_heads, self.shape[2]), h.dtype, h.device)
        bias = self.biases.get(mask, 1, self.kv_heads, self.group, n, seen, width, h)
        slots = torch.arange(offset, seen, device=h.device)
        return h, slots, cos, sin, bias, [(c.keys, c.values) for c in cache], self.weights, self.shape

    def __call__(self, h: torch.Tensor, cache: Sequence[KVCache], mask: torch.Tensor | None,
                 cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The blocks' output and the residual stream entering each block."""
        n = h.shape[1]
        with torch.no_grad():
            h, *entering = self.graphs["one" if n == 1 else "many"](*self.inputs(h, cache, mask, cos, sin))
        for c in cache:
            c.offset += n
        return h, tuple(entering)


def _weights(b: Any) -> tuple:
    attn, mlp = b.self_attn, b.mlp
    ops = [attn.fused_qkv, attn.o_proj.kernel, mlp.fused_gate_up, mlp.down_proj.kernel]
    (qkv, o, gate_up, down) = [(k.packed, k.scales_zeros, k.bias) for k in ops]
    return (b.input_layernorm.weight, *qkv, *o, b.post_attention_layernorm.weight, *gate_up, *down)


def _keep_serializable(entries: list) -> list[bool]:
    """The guards a saved graph can carry, less the global-state one: it includes torch's thread
    count, which the ThreadGovernor changes with the load (the graphs read it when they run)."""
    from torch._dynamo.guards import CheckFunctionManager

    unsaved = CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    return [not (e.is_global or e.guard_type == "GLOBAL_STATE" or e.guard_type in unsaved) for e in entries]


# Inductor checks every input's sizes and strides on each call by default: ~600 checks a pass
# here, one per weight tensor, which ``CompiledStack.inputs`` already vouches for.
OPTIONS = {"guard_filter_fn": _keep_serializable, "size_asserts": False}


def _example(model: Any, tokens: int) -> tuple:
    """The arguments of a pass of ``tokens`` after 300 cached ones, sizes marked dynamic where
    they vary."""
    cache = model.make_cache()
    with torch.no_grad():
        model(torch.zeros((1, 300), dtype=torch.long), cache)
    h = model.model.embed_tokens(torch.zeros((1, tokens), dtype=torch.long))
    mask = None if tokens == 1 else torch.ones((tokens, 300 + tokens), dtype=torch.bool).tril(300)
    cos, sin = model.rope.tables(torch.arange(300, 300 + tokens), h.dtype)
    args = CompiledStack(model, {}).inputs(h, cache, mask, cos, sin)
    h, slots, cos, sin, bias, kv = args[:6]
    for k, v in kv:
        torch._dynamo.mark_dynamic(k, 2)
        torch._dynamo.mark_dynamic(v, 2)
    torch._dynamo.mark_dynamic(bias, 2)
    if tokens > 1:
        for x, dim in ((h, 1), (slots, 0), (cos, 2), (sin, 2), (bias, 1)):
            torch._dynamo.mark_dynamic(x, dim)
    return args


@contextmanager
def _inductor_cache(folder: Path) -> Iterator[None]:
    """Inductor builds the graphs' C++ into its cache folder when a process loads them: kept
    beside the graphs, a later load takes seconds instead of a rebuild (16 s here). Torch reads
    the variable at every use, so whatever it held before comes back afterwards."""
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder / "inductor")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


def compile_to(model: Any, folder: Path, log: Callable[[str], None] = lambda _: None) -> Path:
    """Compile ``model``'s two graphs into ``folder/<key>/`` (minutes on two cores); the folder."""
    if not supported(model):
        raise ValueError("only a llama-type target read quantized on the int4 kernel compiles")
    out = folder / key(model)
    out.mkdir(parents=True, exist_ok=True)
    for i, (name, tokens) in enumerate(zip(GRAPHS, (1, 3)), start=1):
        log(f"compiling the target's {'one-token' if tokens == 1 else 'several-token'} pass ({i}/2) ...")
        start = time.perf_counter()
        fn = torch.compile(stack, fullgraph=True, options=OPTIONS)
        with _inductor_cache(folder):
            compiled = fn.aot_compile((_example(model, tokens), {}))
        compiled.save_compiled_function(str(out / f"{name}.bin"))
        log(f"  done in {time.perf_counter() - start:.0f} s")
    (out / BUILD_FILE).write_text(build())
    if stale := prune_stale(folder):
        log(f"removed {len(stale)} compiled pass(es) of earlier builds, which no load can read")
    return out


def prune_stale(folder: Path) -> list[Path]:
    """Remove the graphs in ``folder`` that another build made (another torch, Python or version
    of this file: their key can never match again); the folders removed. A folder holding
    anything but graphs is left alone. Another mlxspec sharing the store compiles its own again."""
    current, removed = build(), []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and p.name not in ("inductor", "kernels")):
        names = {f.name for f in sub.iterdir()}
        made_by = (sub / BUILD_FILE).read_text().strip() if BUILD_FILE in names else None
        if made_by == current or not names <= {f"{g}.bin" for g in GRAPHS} | {BUILD_FILE}:
            continue
        for f in sub.iterdir():
            f.unlink()
        sub.rmdir()
        removed.append(sub)
    return removed


def load_from(model: Any, folder: Path) -> CompiledStack | None:
    """``model``'s compiled stack from ``folder`` (``compile_to``'s), or None where it has none."""
    if not supported(model):
        return None
    files = [folder / key(model) / f"{name}.bin" for name in GRAPHS]
    if not all(f.exists() for f in files):
        return None
    graphs = {}
    for name, f in zip(GRAPHS, files):
        with open(f, "rb") as fh, _inductor_cache(folder):
            graphs[name] = torch.compiler.load_compiled_function(fh, f_globals=globals())
        # Dynamo's guards would check ~500 tensors a call (0.5 ms here) and refuse inference-mode
        # tensors; ``CompiledStack`` builds every input itself, of the shapes the key vouches for.
        graphs[name].disable_guard_check()
    return CompiledStack(model, graphs)
