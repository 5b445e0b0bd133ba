"""A batch-invariant target pass for torch on the CPU: row i of a pass over n tokens has the
same bits as the one-token pass at that position, so greedy speculation equals target-only
decoding by construction rather than by the luck of near-ties.

Three things break that today (``benchmarks/verify_routes.py`` measures the routes):

* ``F.linear`` goes to MKL, whose one-row product (a GEMV) and n-row products (GEMMs, which
  agree with one another only from 4 rows up) sum in different orders. oneDNN's inner-product
  kernel on a weight packed once (``torch.ops.mkldnn._reorder_linear_weight``) gives every row
  the same bits for 2 to 64 rows, whatever their place among the rows, and for one row too
  except where the reduction is longer than 1,024 (the MLP's down projection), where its one-row
  path differs. So ``PackedWeight`` pads fewer than ``MIN_ROWS`` rows with zero rows: every
  pass then runs the many-row kernel, which is also the faster one, and flatter than MKL's.
* ``F.scaled_dot_product_attention`` sums over the keys in blocks whose boundaries depend on
  how many keys and queries the call holds, so a query among n gives other bits than the same
  query alone. ``chunked_attention`` writes attention out with batched MKL products whose rows
  are independent of one another (at least 4 rows, two matrices) and sums over the keys in
  blocks of ``KEY_BLOCK``, added in order in Python: a query sees the same sums whether it
  came alone or with the n - 1 after it (their keys are masked, and masked keys add exact
  zeros).
* torch's vectorised elementwise loops hand a tensor's last (size % 32) elements to scalar
  code, whose SiLU rounds differently; ``padded_silu`` keeps every element on the vector path.

Whether a kernel is row-invariant is a property of the library build, not a documented
promise, so ``tests/test_invariant.py`` checks the whole pass bitwise (n = 1..8) and the
library pin (torch 2.13.0) keeps the build fixed.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from mlxspec.torchpath import int4
from mlxspec.torchpath.int4 import Int4Linear, Int4Weight, QuantizedWeight

# Products get at least this many rows (zero rows padded, their outputs dropped). MKL's GEMM
# rows agree from 4 rows up (see ``_batched``); oneDNN's from 2 (its one-row path sums long rows
# in another order), and in a whole pass its kernel for 4 rows costs less than the one for 1 or
# 2 (a projection 180 us against 280 us for 2 rows, one thread; the head 6.3 ms against 7.9 for
# one row): padding changes nothing but the time.
MIN_ROWS = 4
# Attention sums over the keys this many at a time (the KV cache grows by 256 positions too).
KEY_BLOCK = 256
# Elements per iteration of torch's vectorised elementwise loops (two AVX-512 registers); the
# rest of a tensor runs scalar code.
LANES = 32


def packing_available(weight: torch.Tensor) -> bool:
    """oneDNN packing applies to float32 weights on the CPU of a torch built with it."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32
            and torch.backends.mkldnn.is_available())


class PackedWeight:
    """``F.linear(x, weight, bias)`` through oneDNN on a copy of ``weight`` packed once,
    row-invariant. Not a module: it holds an opaque oneDNN tensor and adds nothing to a
    ``state_dict``. ``weight`` may be several weights (and ``bias`` their biases) that read
    the same input: one product gives all their outputs side by side, each column the bits
    its own product gives (``fuse_projections``)."""

    def __init__(self, weight: torch.Tensor | Sequence[torch.Tensor],
                 bias: torch.Tensor | Sequence[torch.Tensor | None] | None = None, min_rows: int = MIN_ROWS,
                 dtype: torch.dtype = torch.float32):
        self.weights = (weight,) if isinstance(weight, torch.Tensor) else tuple(weight)
        self.biases = (bias,) if bias is None or isinstance(bias, torch.Tensor) else tuple(bias)
        self.min_rows, self.dtype = min_rows, dtype  # dtype: of the packed copy and the product's input
        self.packed, self.bias, self.packed_versions = None, None, None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # packed again whenever a weight changed in place (torch counts in-place writes), so
        # the copy never goes stale (parity's power check scales a weight, for one)
        versions = tuple(t._version for t in (*self.weights, *self.biases) if t is not None)
        if versions != self.packed_versions:
            self.packed, self.bias = self._pack()
            self.packed_versions = versions
        rows = x.reshape(-1, x.shape[-1])
        n = rows.shape[0]
        if n < self.min_rows:  # see MIN_ROWS: zero rows, whose outputs are dropped
            rows = F.pad(rows, (0, 0, 0, self.min_rows - n))
        out = torch.ops.mkldnn._linear_pointwise(rows.to(self.dtype), self.packed, self.bias, "none", [], "")
        return out[:n].to(x.dtype).reshape(*x.shape[:-1], out.shape[-1])

    def _pack(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        weight = torch.cat([w.detach() for w in self.weights]) if len(self.weights) > 1 else self.weights[0].detach()
        bias = int4.joined_bias(self.biases, [w.shape[0] for w in self.weights])
        bias = None if bias is None else bias.to(self.dtype)
        return torch.ops.mkldnn._reorder_linear_weight(weight.to(self.dtype)), bias


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` whose forward is a ``PackedWeight``'s (or, given ``bits``, an
    ``int4.QuantizedWeight``'s where its rows are whole groups); its parameters are the replaced module's own, under the same names."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype = torch.float32, bits: int | None = None):
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.kernel = (QuantizedWeight([linear.weight], [linear.bias], bits)
                       if bits is not None and QuantizedWeight.takes([linear.weight])
                       else PackedWeight(linear.weight, linear.bias, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(x)


def pack_linears(module: nn.Module, dtype: torch.dtype = torch.float32, bits: int | None = None) -> bool:
    """Every ``nn.Linear`` inside ``module`` (a drafter's) through oneDNN on weights packed once
    (in ``dtype``), q, k, v and gate, up fused, for speed alone: MKL's one-row product on a
    small weight costs far more than its arithmetic here (the eagle head's 8,192 x 576 head 1.7
    ms against oneDNN's 0.22, a whole head step 3.6 ms against 1.7), and packed, a head step is
    its weights' bytes (36 MB in float32). ``bits``: each product's weights rounded to that many
    bits on ``vnni``'s kernel instead (``int4.QuantizedWeight``; the kernel must be active).
    Inference only: the packed product has no gradient. False (nothing changed) where packing
    does not apply."""
    linears = [(owner, name, child) for owner in module.modules() for name, child in owner.named_children()
               if type(child) is nn.Linear]
    if not linears or not packing_available(linears[0][2].weight):
        return False
    for owner, name, child in linears:
        setattr(owner, name, PackedLinear(child, dtype, bits))
    for owner in module.modules():  # torchpath.model's Attention and MLP: one product for q, k, v; gate, up
        if hasattr(owner, "fused_qkv"):
            owner.fused_qkv = fuse_projections([owner.q_proj, owner.k_proj, owner.v_proj], dtype, bits)
        if hasattr(owner, "fused_gate_up"):
            owner.fused_gate_up = fuse_projections([owner.gate_proj, owner.up_proj], dtype, bits)
    return True


def fuse_projections(linears: Sequence[nn.Module], dtype: torch.dtype = torch.float32,
                     bits: int | None = None) -> PackedWeight | Int4Weight | QuantizedWeight | None:
    """One product for projections that read the same input (q, k, v; gate, up): a oneDNN
    call costs ~0.1 ms on top of its arithmetic here, so one product for three or two made the
    one-token pass 0.88x as long (41.1 ms against 46.7, BENCHMARKS.md), with the same bits in
    every column. The file's 4-bit layers fuse into one int4 product; a mix of 4-bit and float
    layers does not fuse (None). ``bits``: float layers rounded as ``pack_linears`` says."""
    if any(isinstance(m, Int4Linear) for m in linears):
        return int4.fuse(linears)
    if bits is not None and QuantizedWeight.takes([m.weight for m in linears]):
        return QuantizedWeight([m.weight for m in linears], [m.bias for m in linears], bits)
    return PackedWeight([m.weight for m in linears], [m.bias for m in linears], dtype=dtype)


def make_batch_invariant(model: nn.Module) -> bool:
    """Switch a torch ``Llama`` (``torchpath.model``) to the row-invariant kernels in place:
    every block's projections packed for oneDNN (q, k and v as one product, gate and up as
    another; the file's 4-bit layers stay ``int4``'s row-invariant kernel, fused the same way),
    ``chunked_attention``, the head packed too.
    False (nothing changed) where oneDNN packing does not apply (not float32 on the CPU)."""
    if not packing_available(model.model.embed_tokens.weight):
        return False
    attend = partial(chunked_attention, biases=MaskBiases())  # the model's layers share each pass's bias
    for block in model.model.layers:
        for owner in (block.self_attn, block.mlp):
            for name, child in list(owner.named_children()):
                if type(child) is nn.Linear:
                    setattr(owner, name, PackedLinear(child))
        attn, mlp = block.self_attn, block.mlp
        attn.fused_qkv = fuse_projections([attn.q_proj, attn.k_proj, attn.v_proj])
        mlp.fused_gate_up = fuse_projections([mlp.gate_proj, mlp.up_proj])
        attn.attend = attend
        mlp.act = padded_silu
    head = getattr(model, "lm_head", None)
    if isinstance(head, Int4Linear):
        model.packed_head = head.kernel
    elif getattr(model, "quantized_head", None) is not None:
        model.packed_head = model.quantized_head
    else:
        # Beside the file's 4-bit layers (whose kernel rounds its activations to bfloat16 anyway) the
        # head reads its 49,152 x 576 table in bfloat16: 1.9 ms a pass against 3.6 in float32.
        bf16_head = any(isinstance(m, Int4Linear) for m in model.modules()) and bf16_native()
        model.packed_head = PackedWeight(model.model.embed_tokens.weight if head is None else head.weight,
                                         dtype=torch.bfloat16 if bf16_head else torch.float32)
    model.batch_invariant = True
    return True


def bf16_native() -> bool:
    """Whether oneDNN runs bfloat16 products natively on this CPU."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def padded_silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU with the last dimension zero-padded to a multiple of ``LANES``, so every element
    runs torch's vector code whatever the number of rows (the scalar tail's SiLU rounds
    differently)."""
    pad = -x.shape[-1] % LANES
    return F.silu(F.pad(x, (0, pad)))[..., : x.shape[-1]] if pad else F.silu(x)


def _batched(x: torch.Tensor) -> torch.Tensor:
    """x (G, M, K) with at least ``MIN_ROWS`` rows and two matrices, zero-padded: MKL's
    float32 GEMM gives a row the same bits wherever it sits among 4 or more rows when a
    batched product runs each matrix on one thread (two or more matrices); fewer rows, or a
    lone matrix split across threads, sum in other orders."""
    g, m, _ = x.shape
    if g >= 2 and m >= MIN_ROWS:
        return x
    return F.pad(x, (0, 0, 0, max(0, MIN_ROWS - m), 0, max(0, 2 - g)))


def _widened(x: torch.Tensor, width: int) -> torch.Tensor:
    """x (B, Hkv, S, D) as ``width`` >= S positions, the ones past S masked by the caller: a
    view of the storage past S where x is a view of a larger buffer that holds them in place
    (the KV cache's, allocated 256 positions at a time, so a pass copies no keys), else zero
    padded. Whatever finite values a masked position holds, it adds exact zeros."""
    B, H, S, D = x.shape
    if width == S:
        return x
    stride = x.stride()
    room = x.untyped_storage().nbytes() // x.element_size()
    last = x.storage_offset() + (B - 1) * stride[0] + (H - 1) * stride[1] + (width - 1) * stride[2] + D - 1
    if stride[3] == 1 and stride[1] >= width * stride[2] and stride[0] >= H * stride[1] and last < room:
        return x.as_strided((B, H, width, D), stride)
    return F.pad(x, (0, 0, 0, width - S))


def chunked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                      scale: float, biases: MaskBiases | None = None) -> torch.Tensor:
    """softmax(q k^T * scale, masked) v in which no reduction's bits depend on how many
    queries the pass holds. q (B, H, L, D); k, v (B, Hkv, S, D), H a multiple of Hkv (the
    query heads of one key head consecutive, as ``enable_gqa`` reads them); ``mask`` (L, S) or
    per row (B, 1, L, S), boolean, True where attended, or None (every key).

    The keys are padded with masked ones to a multiple of ``KEY_BLOCK`` (a multiple of
    ``LANES``: the exponentials run on torch's vector path only); the mask is an additive bias
    built once per pass. Both products are batched MKL GEMMs on ``_batched`` operands. The
    second, and the softmax's denominator, sum over the keys one ``KEY_BLOCK`` at a time, and
    the blocks' parts are added in order in Python: a query meets the same blocks whether it
    came alone or with the n - 1 after it (their keys are masked, and a masked key adds an
    exact zero), and a wholly masked block adds exact zeros. ``biases``: where the layers of a
    pass share the bias built by the first (``make_batch_invariant`` gives each model one)."""
    B, H, L, D = q.shape
    hkv, S = k.shape[1], k.shape[2]
    group, rows = H // hkv, H // hkv * L
    width = S + (-S % KEY_BLOCK)
    blocks, mats = width // KEY_BLOCK, B * hkv
    padded_rows = max(rows, MIN_ROWS)  # and at least two matrices (``_batched``)
    queries = _batched(q.reshape(mats, rows, D))
    keys = _batched(_widened(k, width).reshape(mats, width, D))
    bias = (biases or MaskBiases()).get(mask, B, hkv, group, L, S, width, q)  # (matrices, padded rows, width)
    scores = torch.baddbmm(bias, queries, keys.transpose(1, 2), alpha=scale)
    p = torch.exp(scores - scores.amax(dim=-1, keepdim=True))  # the max is exact in any order
    sums = p.view(-1, padded_rows, blocks, KEY_BLOCK).sum(dim=-1)  # per block: one shape for every query
    values = _batched(_widened(v, width).reshape(mats, width, D))
    acc, total = None, None
    for i in range(blocks):  # in order: a wholly masked block adds exact zeros
        cols = slice(i * KEY_BLOCK, (i + 1) * KEY_BLOCK)
        part = torch.bmm(p[:, :, cols], values[:, cols])
        acc, total = (part, sums[..., i]) if acc is None else (acc + part, total + sums[..., i])
    return (acc[:mats, :rows] / total[:mats, :rows, None]).view(B, H, L, D)


class MaskBiases:
    """The additive mask of ``chunked_attention``'s scores, built once per pass: the last one
    built, with what it was built for, replaced as one tuple so that concurrent passes never
    pair one pass's key with another's bias."""

    def __init__(self) -> None:
        self.last: tuple | None = None

    def get(self, mask: torch.Tensor | None, B: int, hkv: int, group: int, L: int, S: int, width: int,
            like: torch.Tensor) -> torch.Tensor:
        """0 where attended, -inf at masked and padded keys, shaped as the scores (``_batched``:
        matrices, padded rows, width). The key holds the mask itself, so its id is not reused
        while the bias is kept."""
        key = (mask, B, hkv, group, L, S, width, like.dtype, like.device)
        entry = self.last
        if entry is not None and entry[0][0] is mask and entry[0][1:] == key[1:]:
            return entry[1]
        keep = torch.ones(L, S, dtype=torch.bool, device=like.device) if mask is None else mask
        keep = keep.reshape(-1, L, S)  # (1 or B, L, S): one mask for the pass, or one per row (left padding)
        bias = torch.zeros(keep.shape[0], L, width, dtype=like.dtype, device=like.device)
        bias.masked_fill_(~F.pad(keep, (0, width - S)), float("-inf"))
        bias = _batched(bias[:, None, None].expand(B, hkv, group, L, width).reshape(B * hkv, group * L, width))
        self.last = (key, bias)
        return bias


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
         scale: float) -> torch.Tensor:
    """torch's fused attention (fastest, not row-invariant on the CPU)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])
