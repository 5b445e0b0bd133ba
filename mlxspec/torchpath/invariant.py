"""A batch-invariant target pass for torch on the CPU: row i of a pass over n tokens has the
same bits as the one-token pass at that position, so greedy speculation equals target-only
decoding by construction rather than by the luck of near-ties.

Two kernels break that today (``benchmarks/verify_routes.py`` measures both):

* ``F.linear`` goes to MKL, whose one-row product (a GEMV) and n-row products (GEMMs, which
  agree with one another only from 4 rows up) sum in different orders. oneDNN's inner-product
  kernel on a weight packed once (``torch.ops.mkldnn._reorder_linear_weight``) gives every row
  the same bits for 2 to 64 rows, whatever their place among the rows, and for one row too
  except where the reduction is longer than 1,024 (the MLP's down projection), where its one-row
  path differs. So ``PackedWeight`` computes a single row as two (the row twice) and keeps the
  first: every pass then runs the many-row kernel. It is also flatter than MKL's: the 49,152 x 576 head costs about as much for 8 rows
  as for 1.
* ``F.scaled_dot_product_attention`` sums over the keys in blocks whose boundaries depend on
  how many keys and queries the call holds, so a query among n gives other bits than the same
  query alone. ``chunked_attention`` runs its two products through the same oneDNN kernel
  (``rows_times``) and sums over the keys in chunks of at most ``CHUNK``, added in order in
  Python, so a query sees the same sums whether it came alone or with the n - 1 after it
  (their keys are masked, and masked keys add exact zeros).

Whether a kernel is row-invariant is a property of the library build, not a documented
promise, so ``tests/test_invariant.py`` checks the whole pass bitwise (n = 1..8) and the
library pin (torch 2.13.0) keeps the build fixed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Attention sums over the keys this many at a time: oneDNN's sums past 1,024 terms are blocked
# in ways that depend on the length.
CHUNK = 1024
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
    ``state_dict``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
        self.bias = None if bias is None else bias.detach()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        single = rows.shape[0] == 1
        if single:  # oneDNN's one-row path sums long rows in another order: run the row twice
            rows = rows.repeat(2, 1)
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return (out[:1] if single else out).reshape(*x.shape[:-1], out.shape[-1])


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` whose forward is a ``PackedWeight``'s; its parameters are the replaced
    module's own, under the same names."""

    def __init__(self, linear: nn.Linear):
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.kernel = PackedWeight(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(x)


def make_batch_invariant(model: nn.Module) -> bool:
    """Switch a torch ``Llama`` (``torchpath.model``) to the row-invariant kernels in place:
    every block's projections packed for oneDNN, ``chunked_attention``, the head packed too.
    False (nothing changed) where oneDNN packing does not apply (not float32 on the CPU)."""
    head = model.lm_head.weight if hasattr(model, "lm_head") else model.model.embed_tokens.weight
    if not packing_available(head):
        return False
    for block in model.model.layers:
        for owner in (block.self_attn, block.mlp):
            for name, child in list(owner.named_children()):
                if type(child) is nn.Linear:
                    setattr(owner, name, PackedLinear(child))
        block.self_attn.attend = chunked_attention
        block.mlp.act = padded_silu
    model.packed_head = PackedWeight(head)
    return True


def lanewise(fn, x: torch.Tensor) -> torch.Tensor:
    """``fn`` elementwise over x with its last dimension padded to a multiple of ``LANES``:
    torch's vector loops leave the last (size % 32) elements of a tensor to scalar code, whose
    SiLU (for one) rounds differently, so without the padding a row's bits would depend on how
    many rows follow it. The padded columns are left in (callers slice them off)."""
    pad = -x.shape[-1] % LANES
    return fn(F.pad(x, (0, pad)) if pad else x)


def padded_silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU with every row's elements on torch's vector path (``lanewise``)."""
    return lanewise(F.silu, x)[..., : x.shape[-1]]


def rows_times(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (M, K) @ w (N, K)^T through oneDNN's inner product, whose rows have the same bits
    for any M >= 2 and whose columns the same for any N >= 2 (measured for K <= 1,024); a
    lone row or column is padded to two."""
    m, n = x.shape[0], w.shape[0]
    if m == 1:
        x = x.repeat(2, 1)
    if n == 1:
        w = w.repeat(2, 1)
    out = torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
    return out[:m, :n]


def chunked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                      scale: float) -> torch.Tensor:
    """softmax(q k^T * scale, masked) v in which no reduction's bits depend on how many
    queries the pass holds. q (B, H, L, D); k, v (B, Hkv, S, D), H a multiple of Hkv (the
    query heads of one key head consecutive, as ``enable_gqa`` reads them); ``mask`` (L, S)
    boolean, True where attended, or None (every key).

    Products go through ``rows_times``. Over the keys, the exponentials times [v | 1] (values
    and the softmax's denominator in one reduction) are summed ``CHUNK`` keys at a time, and
    the chunks' parts added in order: oneDNN's sums are unchanged by masked (zero) keys after
    the last attended one while the reduction is at most 1,024 long, so the last chunk of a
    lone query and of a query among n give the same bits, and a wholly masked chunk adds
    exact zeros."""
    B, H, L, D = q.shape
    hkv, S = k.shape[1], k.shape[2]
    group = H // hkv
    rows = group * L
    out = q.new_empty(B, hkv, rows, D)
    ones = k.new_ones(S, 1)
    for b in range(B):
        scores = torch.stack([rows_times(q[b, h * group:(h + 1) * group].reshape(rows, D), k[b, h])
                              for h in range(hkv)]) * scale  # (hkv, rows, S)
        if mask is not None:
            scores = scores.view(hkv, group, L, S).masked_fill(~mask, float("-inf")).view(hkv, rows, S)
        p = lanewise(torch.exp, scores - scores.amax(dim=-1, keepdim=True))[..., :S]  # the max is exact in any order
        for h in range(hkv):
            vt = torch.cat([v[b, h], ones], dim=-1).T.contiguous()  # (D + 1, S)
            acc = None
            for start in range(0, S, CHUNK):  # in order: a wholly masked chunk adds exact zeros
                part = rows_times(p[h, :, start:start + CHUNK].contiguous(), vt[:, start:start + CHUNK].contiguous())
                acc = part if acc is None else acc + part
            out[b, h] = acc[:, :D] / acc[:, D:]
    return out.view(B, H, L, D)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
         scale: float) -> torch.Tensor:
    """torch's fused attention (fastest, not row-invariant on the CPU)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])
