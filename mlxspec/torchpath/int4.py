"""The model file's own 4-bit weights, multiplied by torch's int4 kernel on the CPU.

A 4-bit GGUF (Q4_1) stores each weight as ``scale * q + bias`` with q in 0..15 and one scale
and bias per 32 weights of a row; MLX reads it into exactly that form (affine, 4 bits, groups
of 32). Dequantized to float32 for the CPU, a one-token pass streams 540 MB of weights; here it
streams the 4.5 bits a weight the file holds. torch's CPU kernel
(``aten::_weight_int4pack_mm_for_cpu``) computes ``x @ W.T`` from the packed nibbles with the
activations in bfloat16 and per-group scales and zero points in bfloat16 (it is fast only in
bfloat16 here: float16 and float32 take a scalar path 20-50x slower). It writes W as
``(q - 8) * scale + zero``, so zero = bias + 8 * scale.

So this is not the float32 target: rounding the activations, scales and outputs to bfloat16 moves
the logits by about 1e-2, and greedy text parts from float32's after a few dozen tokens at a
near-tie. It is its own exact target: every output element is one thread's sum in a fixed
order whatever the number of rows, so row i of a pass over n tokens has the bits of the
one-token pass (``tests/test_int4.py`` checks the whole pass, n = 1..8, bitwise), and greedy
speculation on it equals its own target-only decoding by construction.

Where this CPU has AVX-512 VNNI the same stored weights go to ``vnni``'s kernel instead: the
products on bytes as llama.cpp's (its activations two bytes a value), rows invariant the same
way; a head tied to the file's 8-bit embedding multiplies its stored bytes
there too (``QuantizedHead``). Elsewhere layers the kernel does not take (other bit widths, the
8-bit embedding, float layers) stay float32, dequantized; a head tied to the embedding multiplies
in bfloat16 beside them (half the bytes of a pass's largest product;
``invariant.make_batch_invariant``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as mnn
import numpy as np
import torch
from mlx.utils import tree_flatten
from torch import nn

from mlxspec.torchpath import vnni

BITS = 4
GROUP_SIZES = (32, 64, 128, 256)  # what the kernel takes
PACK = 32 // BITS  # nibbles per uint32 word, MLX's packing: element j of a word at bits 4j..4j+3


def takes(layer: Any) -> bool:
    """Whether ``layer`` (an MLX module) is a linear layer the int4 kernel runs as stored."""
    return (isinstance(layer, mnn.QuantizedLinear) and layer.bits == BITS and layer.group_size in GROUP_SIZES
            and getattr(layer, "mode", "affine") == "affine")


def _torch(x: mx.array) -> torch.Tensor:
    return torch.from_numpy(np.array(x))


class Int4Linear(nn.Module):
    """A linear layer as the file stores it: ``weight`` the nibbles in MLX's uint32 words (kept
    as int32), ``scales`` and ``biases`` per group (float32, exact copies of the file's
    float16), an optional float32 ``bias``. Its product is an ``Int4Weight``'s."""

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor,
                 bias: torch.Tensor | None, group_size: int):
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)
        self.register_buffer("biases", biases)
        self.register_buffer("bias", bias)
        self.group_size = group_size
        self.out_features, self.in_features = weight.shape[0], weight.shape[1] * PACK
        self.kernel = Int4Weight([self])

    @classmethod
    def from_mlx(cls, layer: Any) -> Int4Linear:
        if not takes(layer):
            raise ValueError(f"not a {BITS}-bit affine linear layer with groups of {GROUP_SIZES}")
        bias = _torch(layer.bias.astype(mx.float32)) if "bias" in layer else None
        return cls(_torch(layer.weight).view(torch.int32), _torch(layer.scales.astype(mx.float32)),
                   _torch(layer.biases.astype(mx.float32)), bias, layer.group_size)

    @property
    def kernel_bytes(self) -> int:
        """Bytes the kernel reads for one product: the nibbles, a bfloat16 scale and zero per
        group, the float32 bias."""
        groups = self.out_features * self.in_features // self.group_size
        bias = 0 if self.bias is None else 4 * self.out_features
        return self.out_features * self.in_features // 2 + 4 * groups + bias

    def dequantized(self) -> torch.Tensor:
        """W in float32, as ``mx.dequantize`` gives it: what the other kernels would multiply."""
        q = unpack(self.weight).float()
        g = q.reshape(self.out_features, -1, self.group_size)
        return (g * self.scales[..., None] + self.biases[..., None]).reshape(q.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(x)


def product(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, bias: torch.Tensor | None,
            group_size: int) -> torch.Tensor:
    """``x @ W.T (+ bias)`` on ``Int4Weight``'s packed operands, in float32 (the compiled pass
    calls it on the same operands): ``vnni``'s kernel where they were packed for it (float16
    scales), else torch's."""
    if scales_zeros.dtype == torch.float16:
        out = vnni.product(x, packed, scales_zeros, BITS)
        return out if bias is None else out + bias
    rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, packed, group_size, scales_zeros)
    out = out.float() if bias is None else out.float() + bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


def unpack(words: torch.Tensor, bits: int = BITS) -> torch.Tensor:
    """(N, K * bits / 32) words -> (N, K) int32 in 0..2**bits - 1."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    return ((words[..., None] >> shifts) & (2**bits - 1)).reshape(words.shape[0], -1)


class Int4Weight:
    """``x @ W.T (+ bias)`` for one or more ``Int4Linear`` that read the same input (q, k, v;
    gate, up): one kernel call gives their outputs side by side, each column the bits its own
    layer's call gives (an output column's sum reads only its own row of W). Packed for the
    kernel once, and again if a layer's stored weights change in place."""

    def __init__(self, layers: Sequence[Int4Linear]):
        if len({m.group_size for m in layers}) != 1 or len({m.in_features for m in layers}) != 1:
            raise ValueError("fused int4 layers must share their input width and group size")
        self.layers = tuple(layers)
        self.group_size = layers[0].group_size
        self.packed = self.scales_zeros = self.bias = self.versions = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # read from the buffer dicts: through nn.Module's attribute lookup this check cost
        # 10 us a call, 1.2 ms of a 20 ms pass
        versions = [t._version for m in self.layers for t in m._buffers.values() if t is not None]
        if versions != self.versions:
            self._pack()
            self.versions = versions
        return product(x, self.packed, self.scales_zeros, self.bias, self.group_size)

    def _pack(self) -> None:
        q = unpack(torch.cat([m.weight for m in self.layers]))
        scales = torch.cat([m.scales for m in self.layers])
        biases = torch.cat([m.biases for m in self.layers])
        # every layer's rows in whole blocks of the kernel's, so a layer alone and fused agree
        if vnni.active() and all(m.out_features % vnni.LANES == 0 for m in self.layers):
            self.packed, self.scales_zeros = vnni.repack(q, scales, biases, BITS)
        else:
            zeros = biases + 8 * scales  # the kernel's (q - 8) * scale + zero
            self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
            self.scales_zeros = torch.stack([scales.T, zeros.T], dim=-1).contiguous().to(torch.bfloat16)
        self.bias = joined_bias([m.bias for m in self.layers], [m.out_features for m in self.layers])


class QuantizedHead:
    """A head tied to the file's quantized embedding, multiplied from its stored bytes on
    ``vnni``'s kernel: 28 MB a pass for SmolLM2's 8-bit table against 57 MB in bfloat16."""

    def __init__(self, embedding: Any):
        q = unpack(_torch(embedding.weight).view(torch.int32), embedding.bits)
        scales, biases = (_torch(t.astype(mx.float32)) for t in (embedding.scales, embedding.biases))
        self.bits, self.vocab = embedding.bits, q.shape[0]
        self.packed, self.scales_biases = vnni.repack(q, scales, biases, embedding.bits)

    @staticmethod
    def takes(model: Any) -> bool:
        """Whether ``model`` (an MLX model) has a head this class runs, with the kernel active."""
        e = getattr(getattr(model, "model", None), "embed_tokens", None)
        return (vnni.active() and getattr(getattr(model, "cfg", None), "tie_embeddings", False)
                and isinstance(e, mnn.QuantizedEmbedding) and e.bits in (4, 8) and e.group_size % vnni.GROUP == 0
                and getattr(e, "mode", "affine") == "affine")

    @property
    def kernel_bytes(self) -> int:
        """Bytes one product reads: the stored bytes and a float16 scale and bias a group."""
        return self.packed.numel() + self.scales_biases.numel() * 2

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return vnni.product(h, self.packed, self.scales_biases, self.bits, self.vocab)


class QuantizedWeight:
    """``x @ W.T (+ bias)`` for float weights rounded once to ``bits`` (affine, groups of 32,
    ``mx.quantize``'s) and multiplied on ``vnni``'s kernel: a drafter's products at a quarter
    (4 bits) of bfloat16's bytes. A draft head's step comes right after the target's pass has
    swept its weights out of the cache, so its cost is its bytes: 0.38 ms cold in 4 bits against
    0.84 in bfloat16 for the eagle head. Rounding moves the drafts, never the reply: q is what they
    were drawn from. Several weights that read the same input give one product, side by side;
    rows invariant as the kernel's are. Quantized again if a weight changes in place."""

    def __init__(self, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None], bits: int):
        self.weights, self.biases, self.bits = tuple(weights), tuple(biases), bits
        self.rows = sum(w.shape[0] for w in weights)
        self.packed = self.scales_biases = self.bias = self.versions = None

    @staticmethod
    def takes(weights: Sequence[torch.Tensor]) -> bool:
        """Whether the kernel multiplies these weights: rows of whole groups."""
        return all(w.shape[-1] % vnni.GROUP == 0 for w in weights)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        versions = [t._version for t in (*self.weights, *self.biases) if t is not None]
        if versions != self.versions:
            self._quantize()
            self.versions = versions
        out = vnni.product(x, self.packed, self.scales_biases, self.bits, self.rows)
        return (out if self.bias is None else out + self.bias).to(x.dtype)

    def _quantize(self) -> None:
        w = torch.cat([t.detach().float().cpu() for t in self.weights])
        # float16 scales and biases, as the kernel holds them, so its W is exactly the rounded one
        words, scales, biases = mx.quantize(mx.array(w.numpy()).astype(mx.float16), group_size=vnni.GROUP,
                                            bits=self.bits)
        q = unpack(_torch(words).view(torch.int32), self.bits)
        self.packed, self.scales_biases = vnni.repack(q, _torch(scales.astype(mx.float32)),
                                                      _torch(biases.astype(mx.float32)), self.bits)
        self.bias = joined_bias(self.biases, [t.shape[0] for t in self.weights])


def joined_bias(biases: Sequence[torch.Tensor | None], rows: Sequence[int]) -> torch.Tensor | None:
    """The biases of products fused side by side, in float32, zeros for a layer of ``rows``
    outputs without one; None when none has a bias."""
    if all(b is None for b in biases):
        return None
    return torch.cat([b.detach().float() if b is not None else torch.zeros(n) for b, n in zip(biases, rows)])


def fuse(layers: Sequence[nn.Module]) -> Int4Weight | None:
    """One product for ``layers`` when every one of them is an ``Int4Linear``, else None."""
    return Int4Weight(layers) if all(isinstance(m, Int4Linear) for m in layers) else None


def split_layers(mlx_model: Any) -> tuple[dict[str, Int4Linear], dict[str, mx.array]]:
    """The layers of a quantized MLX model the kernel runs as stored (by module name, as
    ``Int4Linear``), and every other parameter in float32 (other quantized layers dequantized
    with their own settings) by parameter name, for ``load_state_dict``."""
    kept = {name: Int4Linear.from_mlx(m) for name, m in mlx_model.named_modules() if takes(m)}
    dense: dict[str, mx.array] = {}
    for name, m in mlx_model.named_modules():
        if name in kept or not isinstance(m, (mnn.QuantizedLinear, mnn.QuantizedEmbedding)):
            continue
        dense[f"{name}.weight"] = mx.dequantize(m.weight, m.scales, m.get("biases"), group_size=m.group_size,
                                                bits=m.bits, mode=getattr(m, "mode", "affine"))
    for key, value in tree_flatten(mlx_model.parameters()):
        base, _, leaf = key.rpartition(".")
        if base in kept or (f"{base}.weight" in dense and leaf in ("scales", "biases")):
            continue  # held by an Int4Linear, or folded into a dequantized weight
        dense.setdefault(key, value)  # a dequantized weight stays
    return kept, {k: v.astype(mx.float32) for k, v in dense.items()}


def install(model: nn.Module, layers: dict[str, Int4Linear]) -> None:
    """Put each ``Int4Linear`` in the place of the module of the same name."""
    for name, layer in layers.items():
        owner_name, _, leaf = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        if not isinstance(getattr(owner, leaf, None), nn.Linear):
            raise ValueError(f"{name} is not a linear layer of the torch model")
        setattr(owner, leaf, layer)
