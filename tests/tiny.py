"""A tiny random llama target and distillation set, a random eagle head on it, and checks the
batch-invariance and draft tests share, for tests that need no real model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import numpy as np

from mlxspec.core import engine
from mlxspec.core.cache import rewind
from mlxspec.core.drafters import ModelDrafter
from mlxspec.core.events import Step
from mlxspec.core.model import Llama, LlamaConfig
from mlxspec.core.sampling import SamplingParams
from mlxspec.training.distill import DistillSet
from mlxspec.core.drafters.draft_model import DraftConfig, DraftModel
from mlxspec.training.draft import init_from_target

VOCAB = 64


class _Vocab:
    def __init__(self, tokens: dict[str, int]):
        self.tokens = tokens

    def get_vocab(self) -> dict[str, int]:
        return dict(self.tokens)



# Tiny configurations of the llama-type families both backends implement: torch twins and the
# batch-invariant kernels are checked on each (tests add their own families beside these).
TWIN_BASE = dict(vocab_size=48, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
TWIN_FAMILIES = {
    "llama": {},
    "gguf-rope": dict(rope_traditional=True),
    "head_dim+bias": dict(explicit_head_dim=16, qkv_bias=True, o_bias=True, mlp_bias=True),
    "qwen3": dict(qk_norm=True, model_type="qwen3"),
    "untied": dict(tie_embeddings=False),
}


def tiny_target(seed: int = 0, vocab: dict[str, int] | None = None) -> SimpleNamespace:
    """Just what draft code reads of a ``LoadedModel``."""
    mx.random.seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2,
                      intermediate_size=64, rope_theta=10000.0)
    model = Llama(cfg)
    mx.eval(model.parameters())
    words = _Vocab(vocab or {f"t{i}": i for i in range(VOCAB)})
    # As mlx-lm's TokenizerWrapper: get_vocab forwarded to the tokenizer it wraps (_tokenizer).
    tok = SimpleNamespace(_tokenizer=words, get_vocab=words.get_vocab, eos_token_ids={0})
    return SimpleNamespace(model=model, tokenizer=tok, name="tiny", config=cfg, dtype="float32")


def lively_target(seed: int) -> SimpleNamespace:
    """``tiny_target`` with its own, sharper LM head: a tied random head mostly repeats the
    last token, which would accept every first-line draft and test nothing."""
    target = tiny_target(seed)
    mx.random.seed(seed + 10)
    target.config = replace(target.config, tie_embeddings=False)
    target.model = Llama(target.config)
    target.model.lm_head.weight = target.model.lm_head.weight * 3
    mx.eval(target.model.parameters())
    return target


def tiny_draft(target, head_ids=range(0, VOCAB, 2), layers: int = 1, init: str = "target", seed: int = 0) -> DraftModel:
    from mlxspec.targets.folders import tokenizer_fingerprint

    mx.random.seed(seed)
    cfg = DraftConfig.for_target(target.config, tokenizer_fingerprint(target.tokenizer), num_layers=layers,
                                 head_vocab=len(head_ids), init=init)
    draft = DraftModel(cfg, mx.array(list(head_ids)), target.model.model.embed_tokens)
    if init == "target":
        init_from_target(draft, target.model)
    mx.eval(draft.parameters())
    return draft


def tiny_data(target, head_ids=range(0, VOCAB, 2), sequences: int = 12, prompt: int = 5, gen: int = 10,
              seed: int = 0) -> DistillSet:
    """Random prompts continued greedily by the tiny target, with its exact teacher rows."""
    rng = np.random.default_rng(seed)
    ids = mx.array(list(head_ids))
    seqs, logps, argmaxes = [], [], []
    for _ in range(sequences):
        seq = rng.integers(1, VOCAB, size=prompt).tolist()
        for _ in range(gen):
            seq.append(int(mx.argmax(target.model(mx.array([seq]), None)[0, -1]).item()))
        logits = target.model(mx.array([seq[:-1]]), None)[0, prompt - 1 :]
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        seqs.append(np.array(seq, np.int32))
        logps.append(np.array(logp[:, ids].astype(mx.float16)))
        argmaxes.append(np.array(mx.argmax(logits, axis=-1)).astype(np.int32))
    return DistillSet(seqs, np.full(sequences, prompt), np.array(list(head_ids), np.int32),
                      np.concatenate(logps), np.concatenate(argmaxes), {"target": target.name})


def save_tiny(tmp_path: Path, target, name: str = "d") -> Path:
    from mlxspec.targets.folders import save_draft

    return save_draft(tiny_draft(target), tmp_path / name, dtype="float32")


def random_head(target, seed: int = 1):
    """An eagle head with random weights (as tests/test_eagle.py's), so drafts vary."""
    from mlx.utils import tree_flatten

    from mlxspec.training.eagle import new_head

    head = new_head(target, mx.array(sorted(list(range(0, VOCAB, 2)) + [1])), seed=seed)
    flat = [(k, mx.random.normal(v.shape) * 0.3) for k, v in tree_flatten(head.parameters())
            if not k.startswith("lm_head")]
    head.load_weights(flat, strict=False)
    mx.eval(head.parameters())
    return head


def features(target, tokens: list[int]) -> mx.array:
    """The target's last hidden states over ``tokens``: what an eagle head drafts from."""
    return target.model(mx.array([tokens]), None, return_hidden=True)[1][0]


class StopTraining(Exception):
    """Raised by ``stop_after``: a training run cut short, as by Ctrl-C, to test resuming."""


def stop_after(n: int):
    """An ``on_step`` callback that interrupts training right after step ``n``."""
    def on_step(log):
        if log.step == n:
            raise StopTraining

    return on_step


def assert_torch_objectives_equal_mlx(head, twin, batch: dict, cfg, lam: float) -> None:
    """The torch trainer optimises the MLX trainer's function: on ``batch``, every objective
    of ``training.torch_train.objectives`` (for ``twin``, ``head``'s torch twin in float32)
    and every parameter's gradient equal ``training.eagle_train.objectives``' for ``head``."""
    import mlx.nn as nn
    import torch
    from mlx.utils import tree_flatten

    from mlxspec.training import torch_train
    from mlxspec.training.eagle_train import objectives

    ours, grads = nn.value_and_grad(head, lambda b: objectives(head, b, cfg, lam))(batch)
    theirs = torch_train.objectives(twin, torch_train.to_torch_batch(batch, torch.device("cpu")), cfg, lam)
    for a, b in zip(ours, theirs):
        assert abs(b.item() - a.item()) <= max(1e-4 * abs(a.item()), 1e-6), (a.item(), b.item())
    theirs[0].backward()
    flat_grads = dict(tree_flatten(grads))
    for name, p in twin.named_parameters():
        g = np.array(flat_grads[name])
        np.testing.assert_allclose(p.grad.numpy(), g, rtol=2e-3, atol=2e-5 * max(np.abs(g).max(), 1e-3), err_msg=name)


def torch_rows_equal_one_token_passes(model, context: list[int], tokens: list[int]) -> list[list[bool]]:
    """For a torch model and n = 1..len(tokens): whether each row of one pass over tokens[:n]
    (after ``context``) equals, bitwise, the one-token pass that decodes tokens[i] at that
    position (the batch-invariance checks of test_invariant and test_int4)."""
    import torch  # an optional extra: only the torch tests call this

    with torch.inference_mode():
        cache = model.make_cache()
        model(torch.tensor([context]), cache)
        singles = [model(torch.tensor([[t]]), cache)[0, 0] for t in tokens]
        rewind(cache, len(tokens))
        out = []
        for n in range(1, len(tokens) + 1):
            rows = model(torch.tensor([tokens[:n]]), cache)[0]
            rewind(cache, n)
            out.append([torch.equal(rows[i], singles[i]) for i in range(n)])
        return out


def greedy_alone_and_self_drafted(model, ks: tuple[int, ...], n: int = 24) -> tuple[list[int], list[list[int]]]:
    """A tiny model's greedy tokens after a fixed prompt: target-only, and drafted by its own
    first layer (``self:1``) at each K in ``ks``."""
    prompt = [(5 * i + 2) % 48 for i in range(20)]

    def tokens(drafter, k):
        return [t.id for ev in engine.generate(model, prompt, SamplingParams(), n, set(), 512, drafter=drafter, k=k)
                if isinstance(ev, Step) for t in ev.tokens if t.emitted]

    return tokens(None, 1), [tokens(ModelDrafter(model, "self:1", 1), k) for k in ks]


def torch_twin(seed: int = 0, **family):
    """A tiny random MLX llama (``TWIN_BASE`` with ``family``'s changes) and its torch twin; the twin."""
    from mlxspec.torchpath.model import Llama as TorchLlama  # an optional extra: only the torch tests call this

    mx.random.seed(seed)
    m = Llama(LlamaConfig(**{**TWIN_BASE, **family}))
    mx.eval(m.parameters())
    return TorchLlama.from_mlx(m)


QUANTIZED_BASE = {**TWIN_BASE, "hidden_size": 64, "intermediate_size": 128}  # 32 and 64 wide: groups of 32


def quantized_twin(seed: int = 0, embedding_bits: int = 8, **family):
    """A tiny MLX model quantized as the default GGUF is (4-bit layers, an 8-bit embedding),
    and its torch twin on the int4 kernel."""
    import mlx.nn as mnn

    from mlxspec.torchpath.model import Llama as TorchLlama

    mx.random.seed(seed)
    m = Llama(LlamaConfig(**{**QUANTIZED_BASE, **family}))
    mnn.quantize(m, group_size=32, bits=4, class_predicate=lambda _, layer: isinstance(layer, mnn.Linear))
    mnn.quantize(m, group_size=32, bits=embedding_bits,
                 class_predicate=lambda _, layer: isinstance(layer, mnn.Embedding))
    mx.eval(m.parameters())
    return m, TorchLlama.from_mlx(m, "cpu", "quantized")
