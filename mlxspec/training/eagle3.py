"""A fresh EAGLE-3 head for a target, the start of ``train-draft --arch eagle3``, and its model
card. The architecture is ``core/drafters/eagle3.py``; the published format it is written in,
``targets/eagle3.py``; the training loop is the eagle head's (``eagle_train.py``).
"""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxspec.core.drafters.eagle3 import Eagle3Config, Eagle3Head, default_aux_layers
from mlxspec.errors import MlxspecError
from mlxspec.targets.folders import CARD_LICENCE
from mlxspec.training.eagle_train import EagleStepLog, EagleTrainConfig, time_spent
from mlxspec.training.features import FeatureSet


def config_for(target, draft_vocab: int, intermediate_size: int | None = None,
               aux_layers: tuple[int, ...] | None = None) -> Eagle3Config:
    """The head at the target's width, heads and RoPE base, tapping ``aux_layers`` (block
    indices whose input it reads, ``eagle_aux_hidden_state_layer_ids``; index L is the last
    block's output), by default the blocks vLLM and SGLang tap when a config names none."""
    t = target.config
    if not 1 <= draft_vocab <= t.vocab_size:
        raise MlxspecError(f"head vocabulary must be in 1..{t.vocab_size}, got {draft_vocab}")
    if aux_layers is None:
        if t.num_layers < 6:
            raise MlxspecError(f"an EAGLE-3 head taps blocks 2, L/2 and L-3 of the target; {target.name!r} has only "
                               f"{t.num_layers} layers")
        aux_layers = default_aux_layers(t.num_layers)
    taps = tuple(sorted(aux_layers))
    if len(taps) < 2 or len(set(taps)) != len(taps) or taps[0] < 0 or taps[-1] > t.num_layers:
        raise MlxspecError(f"--aux-layers {','.join(map(str, aux_layers))}: an EAGLE-3 head taps 2 or more distinct "
                           f"layers in 0..{t.num_layers} of {target.name!r} (one would give fc the head's own "
                           "width; see --zero-layers for a head that reads one)")
    return Eagle3Config(
        hidden_size=t.hidden_size, intermediate_size=intermediate_size or t.intermediate_size, num_heads=t.num_heads,
        num_kv_heads=t.num_kv_heads, draft_vocab=draft_vocab, target_vocab=t.vocab_size, target_hidden=t.hidden_size,
        aux_layers=taps, head_dim=t.head_dim, rms_norm_eps=t.rms_norm_eps,
        rope_theta=t.rope_theta, max_position=t.max_position,
    )


def new_head(target, vocab_ids: mx.array, seed: int = 0, aux_layers: tuple[int, ...] | None = None,
             zero_layers: tuple[int, ...] = ()) -> Eagle3Head:
    """A fresh head for ``target`` (float weights) that starts from what the target itself
    would say: ``fc`` passes the highest tapped block's state through (the highest not in
    ``zero_layers``; every other column of ``fc`` starts at zero), the layer's residual
    branches start at zero, ``norm`` and ``lm_head`` are the target's final norm and its output
    rows for ``vocab_ids``. The rest is MLX's default init drawn from ``seed``."""
    cfg = config_for(target, int(vocab_ids.shape[0]), aux_layers=aux_layers)
    live = [i for i, layer in enumerate(cfg.aux_layers) if layer not in zero_layers]
    if not live:
        raise MlxspecError(f"--zero-layers {','.join(map(str, zero_layers))} leaves the head no layer to read")
    mx.random.seed(seed)
    head = Eagle3Head(cfg, vocab_ids, target.model.model.embed_tokens)
    params = dict(tree_flatten(target.model.parameters()))
    if any(k.endswith(".scales") for k in params):
        raise MlxspecError("training a head needs the target in float weights (load it with --dtype float32)")
    d, n = cfg.hidden_size, len(cfg.aux_layers)
    pick = mx.concatenate([mx.eye(d) if i == live[-1] else mx.zeros((d, cfg.target_hidden)) for i in range(n)], axis=1)
    attn, mlp = head.midlayer.self_attn, head.midlayer.mlp
    head.load_weights([
        ("fc.weight", pick),
        ("norm.weight", params["model.norm.weight"]),
        ("lm_head.weight", params.get("lm_head.weight", params["model.embed_tokens.weight"])[vocab_ids]),
        ("midlayer.self_attn.o_proj.weight", mx.zeros_like(attn.o_proj.weight)),
        ("midlayer.mlp.down_proj.weight", mx.zeros_like(mlp.down_proj.weight)),
    ], strict=False)
    mx.eval(head.parameters())
    return head


def zero_taps(data: FeatureSet, taps: tuple[int, ...], zero: tuple[int, ...]) -> None:
    """An ablation (``--zero-layers``): the states of blocks ``zero`` among ``data.aux``'s taps
    (``taps``, ascending) set to zero in place. The head then reads only the others: the
    gradient of their ``fc`` columns is zero, so those keep ``new_head``'s zeros (no weight
    decay), and the head drafts the same whatever a serving engine feeds in their place."""
    if not zero:
        return
    width = data.aux.shape[1] // len(taps)
    for i in (taps.index(layer) for layer in zero):
        data.aux[:, i * width : (i + 1) * width] = 0


def without_taps(head: Eagle3Head, zero: tuple[int, ...], target) -> Eagle3Head:
    """``head`` reading only the taps not in ``zero``, when two or more are left: the columns of
    ``fc`` dropped with them are exactly zero after ``--zero-layers`` training, so it is the same
    function, in the layout a serving engine taps (a head trained on 2,15,27,30 without 30 is a
    head on vLLM's default 2,15,27). Otherwise ``head`` as it is."""
    taps = head.cfg.aux_layers
    keep = [i for i, layer in enumerate(taps) if layer not in zero]
    if not zero or len(keep) < 2:
        return head
    width = head.cfg.target_hidden
    columns = [head.fc.weight[:, i * width : (i + 1) * width] for i in range(len(taps))]  # fc's block per tap
    if any(mx.any(c != 0).item() for i, c in enumerate(columns) if i not in keep):
        raise MlxspecError(f"the fc columns of taps {list(zero)} are not zero: the head reads them")
    out = Eagle3Head(replace(head.cfg, aux_layers=tuple(taps[i] for i in keep)), head.vocab_ids,
                     target.model.model.embed_tokens)
    fc = mx.concatenate([columns[i] for i in keep], axis=1)
    out.load_weights([(k, v) for k, v in tree_flatten(head.parameters()) if k != "fc.weight"] + [("fc.weight", fc)])
    mx.eval(out.parameters())
    return out


def taps_named(taps: tuple[int, ...], num_layers: int) -> str:
    """Taps in words: tap i < ``num_layers`` is the state entering block i; ``num_layers`` the
    last block's output."""
    inner = [t for t in taps if t < num_layers]
    words = [f"the states entering blocks {inner}" if len(inner) > 1 else f"the state entering block {inner[0]}"] if inner else []
    return " and ".join(words + (["the last block's output"] if num_layers in taps else []))


def model_card(name: str, recipe: str, data: FeatureSet, cfg: EagleTrainConfig, head: Eagle3Head,
               history: list[EagleStepLog], seconds: float, target_layers: int, zero_layers: tuple[int, ...] = (),
               table_stored: bool = True) -> str:
    c = head.cfg
    if zero_layers and not set(zero_layers) & set(c.aux_layers):  # a shared cache's extra taps, dropped on save
        ablation = (f"\n\nTrained from a feature cache that also holds {taps_named(zero_layers, target_layers)}, "
                    "shared with other runs: those states were zeroed and their `fc` columns held at zero, so the "
                    "head never read them and is written without them.")
    else:
        ablation = (f"\n\nTrained with {taps_named(zero_layers, target_layers)} zeroed and their `fc` columns held "
                    "at zero (an ablation): the head reads only the other taps." if zero_layers else "")
    params = sum(v.size for k, v in tree_flatten(head.parameters()))
    table = ("the folder also carries the target's embedding table, as published heads do." if table_stored else
             "it stores no embedding table: mlxspec, vLLM and SGLang take the target's own at load time.")
    last = history[-min(len(history), 20):]
    mean = lambda a: sum(getattr(h, a) for h in last) / max(len(last), 1)  # noqa: E731
    cats = "\n".join(f"| {k} | {n:,} |" for k, n in data.tokens_per_category().items())
    return f"""# {name}

An EAGLE-3 draft head for `{data.meta.get('target', '?')}`, in the published EAGLE-3 layout
(`config.json` + `model.safetensors`, architecture `LlamaForCausalLMEagle3`): `fc` fuses
{taps_named(c.aux_layers, target_layers)} of the target, one decoder layer reads [embedding; feature],
and `lm_head` scores the {c.draft_vocab} tokens the target emits most in the training data
(`d2t` maps them to target ids; q = 0 elsewhere, so verification stays exact). {params / 1e6:.1f}M
parameters of its own; {table}{ablation}

Reproduce: `{recipe}`

Training: loss `{cfg.loss}` over {cfg.k} unrolled draft steps (the head reads its own outputs from
step 2 on, as when drafting), {cfg.steps} steps of {cfg.batch} x {cfg.context} slots,
{time_spent(history, seconds)}. Last {len(last)} steps: first-draft acceptance
{mean('accept_1'):.2f}, expected accepted drafts of the {cfg.k}-chain {mean('chain'):.2f}
(teacher-forced, training batches).

Data: {len(data.lengths):,} examples, {data.trained_positions():,} response positions, teacher-forced
through the target. Response tokens per category:

| category | tokens |
|---|---|
{cats}

{CARD_LICENCE}
"""
