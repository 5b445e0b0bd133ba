"""EAGLE-3 heads (issue 24): the target's tapped hidden states against mlx-lm's own classes, the
head against an independent plain-PyTorch forward written here from the public definition,
tiny checkpoints in each published layout (SafeAILab's EAGLE, SpecForge, vLLM's speculators)
loading and drafting, greedy speculation identical to target-only at K = 1..8 and with trees,
the exact joint distribution at T = 1, rollback under any accept pattern, the torch twin, our
written checkpoint read by the reference, and damaged or mismatched heads as one-line errors."""

from __future__ import annotations

import importlib
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
import torch
from exact import EXACT_TV, EXACT_VOCAB, PROMPT, engine_distribution, exact_eagle3_head, exact_joint, exact_llama, tv
from tiny import StopTraining, assert_torch_objectives_equal_mlx, stop_after
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx.utils import tree_flatten

from mlxspec.core.drafters import Commit
from mlxspec.core.drafters.eagle import EagleDrafter
from mlxspec.core.drafters.eagle3 import Eagle3Config, Eagle3Head, default_aux_layers
from mlxspec.core.engine import generate
from mlxspec.core.events import Step
from mlxspec.core.model import Llama
from mlxspec.core.sampling import SamplingParams
from mlxspec.core.tree import parse_tree
from mlxspec.errors import MlxspecError
from mlxspec.targets import families, loading
from mlxspec.targets.drafts import make_drafter
from mlxspec.targets.eagle3 import load_eagle3, published_config, save_eagle3
from mlxspec.training.eagle_train import EagleTrainConfig, make_batch, objectives, train_head, unroll
from mlxspec.training.features import FeatureSet, teacher_pass

VOCAB = 64
LAYERS = 8  # default taps 2, 4, 5: three distinct blocks
GREEDY = SamplingParams()
FAMILIES = {
    "llama": dict(model_type="llama", rope_theta=10000.0),
    "qwen2": dict(model_type="qwen2", rope_theta=1000000.0),
    "qwen3": dict(model_type="qwen3", head_dim=16, rope_theta=1000000.0),
}
DRAFT_IDS = sorted(set(range(0, VOCAB, 2)) | {1, 7, 33})  # a draft vocabulary: some tokens have q = 0
PROMPT_IDS = [3, 17, 9, 40, 2, 33, 12]
ROPE_BASE = 50000.0  # not the 10,000 a reader would fall back to: a misread base changes the logits


def mlx_lm_target(family: str, seed: int = 0, repeating: bool = False) -> SimpleNamespace:
    """A tiny random target built with mlx-lm's own class, copied into our decoder; ``ref`` is
    mlx-lm's module (what the taps are checked against). ``repeating``: tied embeddings scaled
    up, so the residual stream stays near the token's embedding and the target mostly repeats
    its last token (a head that copies can then be accepted)."""
    config = dict(hidden_size=32, num_hidden_layers=LAYERS, intermediate_size=64, num_attention_heads=4,
                  num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=VOCAB, max_position_embeddings=512,
                  tie_word_embeddings=repeating, **FAMILIES[family])
    mx.random.seed(seed)
    arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    ref = arch.Model(arch.ModelArgs.from_dict(config))
    if repeating:
        ref.model.embed_tokens.weight = ref.model.embed_tokens.weight * 8
    else:
        ref.lm_head.weight = ref.lm_head.weight * 4  # a sharper target
    mx.eval(ref.parameters())
    cfg = families.config_from_mlx_lm(config)
    model = Llama(cfg)
    model.load_weights(tree_flatten(ref.parameters()), strict=True)
    mx.eval(model.parameters())
    return SimpleNamespace(model=model, ref=ref, config=cfg, name=f"tiny-{family}", tokenizer=None, dtype="float32")


@pytest.fixture(scope="module", params=list(FAMILIES))
def target(request):
    return mlx_lm_target(request.param)


def mlx_lm_taps(ref, tokens: list[int], blocks: tuple[int, ...]) -> np.ndarray:
    """The residual stream entering each block in ``blocks`` (index = number of blocks run),
    computed with mlx-lm's own layers: the definition vLLM and SGLang tap."""
    h = ref.model.embed_tokens(mx.array([tokens]))
    taps = [h] if 0 in blocks else []
    for i, layer in enumerate(ref.model.layers, start=1):
        h = layer(h, "causal", None)
        if i in blocks:
            taps.append(h)
    return np.array(mx.concatenate(taps, axis=-1)[0])


def random_head(target, aux: tuple[int, ...] | None = None, seed: int = 1, **flags) -> Eagle3Head:
    """A head with every weight random (the output rows scaled up, so drafts vary)."""
    c = target.config
    cfg = Eagle3Config(hidden_size=c.hidden_size, intermediate_size=48, num_heads=4, num_kv_heads=2,
                       draft_vocab=len(DRAFT_IDS), target_vocab=c.vocab_size, target_hidden=c.hidden_size,
                       aux_layers=aux or default_aux_layers(c.num_layers), rms_norm_eps=1e-5, rope_theta=ROPE_BASE,
                       **flags)
    mx.random.seed(seed)
    head = Eagle3Head(cfg, mx.array(DRAFT_IDS), target.model.model.embed_tokens)
    head.load_weights([(k, mx.random.normal(v.shape) * (0.6 if k == "lm_head.weight" else 0.3))
                       for k, v in tree_flatten(head.parameters())])
    mx.eval(head.parameters())
    return head


# ----------------------------------------------------------------------------- the reference


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Hugging Face's rotary embedding: the two halves of each head rotated together."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.double()[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1).float(), torch.cat([ang.sin(), ang.sin()], -1).float()
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Reference:
    """An EAGLE-3 checkpoint folder run in plain PyTorch, as the public definition reads: fc
    over the target's tapped states; attention over [rms(embedding); rms(feature)] with the
    feature (or its norm, ``norm_before_residual``) as residual; post-attention norm and SiLU
    MLP; ``norm`` then ``lm_head`` over draft columns c mapped to target token c + d2t[c].
    The output before ``norm`` is the next step's feature. It keeps its own keys and values."""

    def __init__(self, folder: Path, target_embed: np.ndarray):
        from safetensors.torch import load_file

        meta = json.loads((folder / "config.json").read_text())
        self.layer_cfg = meta.get("transformer_layer_config", meta)
        if (folder / "model.safetensors").exists():
            w = load_file(str(folder / "model.safetensors"))
        else:
            w = torch.load(folder / "pytorch_model.bin", weights_only=True)
        self.w = {k.replace("layers.0.", "midlayer."): v.float() if v.is_floating_point() else v for k, v in w.items()}
        self.embed = self.w.get("embed_tokens.weight", torch.from_numpy(target_embed))
        self.norm_before_residual = meta.get("norm_before_residual", False)
        self.eps = self.layer_cfg["rms_norm_eps"]
        self.keys, self.values = [], []

    def step(self, features: np.ndarray, tokens: list[int], first: int) -> tuple[torch.Tensor, np.ndarray]:
        """Slots ``first``.. with these features and next tokens: (outputs before the norm,
        full-vocabulary logits, -inf outside the draft vocabulary)."""
        w, c, eps = self.w, self.layer_cfg, self.eps
        x = torch.as_tensor(np.asarray(features), dtype=torch.float32)
        if x.shape[-1] != c["hidden_size"]:
            x = x @ w["fc.weight"].T + (w["fc.bias"] if "fc.bias" in w else 0)
        e = _rms(self.embed[torch.tensor(tokens)], w["midlayer.input_layernorm.weight"], eps)
        normed = _rms(x, w["midlayer.hidden_norm.weight"], eps)
        residual = normed if self.norm_before_residual else x
        a = torch.cat([e, normed], -1)
        nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
        hd = c.get("head_dim") or c["hidden_size"] // nh
        pos = torch.arange(first, first + len(tokens))
        q = (a @ w["midlayer.self_attn.q_proj.weight"].T).view(-1, nh, hd).transpose(0, 1)
        k = (a @ w["midlayer.self_attn.k_proj.weight"].T).view(-1, nkv, hd).transpose(0, 1)
        v = (a @ w["midlayer.self_attn.v_proj.weight"].T).view(-1, nkv, hd).transpose(0, 1)
        base = c["rope_theta"] if "rope_theta" in c else c["rope_parameters"]["rope_theta"]
        q, k = _rotate(q, pos, base), _rotate(k, pos, base)
        self.keys.append(k)
        self.values.append(v)
        K, V = torch.cat(self.keys, 1).repeat_interleave(nh // nkv, 0), torch.cat(self.values, 1).repeat_interleave(nh // nkv, 0)
        scores = q @ K.transpose(1, 2) / hd**0.5
        kpos = torch.arange(K.shape[1])
        scores = scores.masked_fill(kpos[None, None] > pos[None, :, None], float("-inf"))
        attn = (scores.softmax(-1) @ V).transpose(0, 1).reshape(len(tokens), -1)
        h = residual + attn @ w["midlayer.self_attn.o_proj.weight"].T
        m = _rms(h, w["midlayer.post_attention_layernorm.weight"], eps)
        g, u = m @ w["midlayer.mlp.gate_proj.weight"].T, m @ w["midlayer.mlp.up_proj.weight"].T
        out = h + (torch.nn.functional.silu(g) * u) @ w["midlayer.mlp.down_proj.weight"].T
        reduced = _rms(out, w["norm.weight"], eps) @ w["lm_head.weight"].T
        full = torch.full((len(tokens), c["vocab_size"]), float("-inf"))
        cols = torch.arange(reduced.shape[-1])
        full[:, cols + w["d2t"]] = reduced
        return out, full.numpy()


def target_embed(target) -> np.ndarray:
    return np.array(target.model.model.embed_tokens.weight)


def agree_with_reference(head: Eagle3Head, ref: Reference, target) -> None:
    """Our head's logits equal the reference's over a prompt's slots, then for two drafts that
    read the head's own outputs (the chain drafting runs), within 1e-5."""
    tokens = PROMPT_IDS
    feats = np.array(target.model(mx.array([tokens[:-1]]), None, return_hidden=head.wants_hidden)[1][0])
    cache = head.make_cache()
    pred, z = head(mx.array(feats)[None], mx.array([tokens[1:]]), cache)
    out, want = ref.step(feats, tokens[1:], 0)
    np.testing.assert_allclose(np.array(head.full_logits(z[0])), want, atol=1e-5, rtol=1e-5)
    slot = len(tokens) - 1
    for draft in (5, 40):
        pred, z = head(pred[:, -1:], mx.array([[draft]]), cache)
        out, want = ref.step(out[-1:].numpy(), [draft], slot)
        np.testing.assert_allclose(np.array(head.full_logits(z[0])), want, atol=1e-5, rtol=1e-5)
        slot += 1


# ----------------------------------------------------------------------------- published layouts


def torch_state(weights: dict[str, mx.array]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.array(v)) for k, v in weights.items()}


def write_layout(head: Eagle3Head, folder: Path, layout: str, target) -> Path:
    """``head`` as a folder of one published layout, written the way each project writes it."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    ours = save_eagle3(head, folder / "ours", dtype="float32")
    config = json.loads((ours / "config.json").read_text())
    weights = mx.load(str(ours / "model.safetensors"))
    if not head.cfg.own_embedding and layout != "eagle":
        weights["embed_tokens.weight"] = target.model.model.embed_tokens.weight
    config.pop("eagle_aux_hidden_state_layer_ids")
    if layout == "eagle":  # SafeAILab: pytorch_model.bin, default taps, no embedding table
        assert head.cfg.aux_layers == default_aux_layers(LAYERS)
        torch.save(torch_state(weights), folder / "pytorch_model.bin")
    elif layout == "specforge":  # SGLang's reading: ids of block outputs, first id 1
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in head.cfg.aux_layers]}
        save_file(torch_state(weights), str(folder / "model.safetensors"))
    else:  # speculators: the layer's config nested (transformers 5: rope under rope_parameters), layers.0.*,
        # block inputs at the top level
        layer = {k: config.pop(k) for k in list(config) if k not in ("draft_vocab_size", "target_hidden_size",
                                                                        "norm_before_residual", "architectures")}
        layer["rope_parameters"] = {"rope_theta": layer.pop("rope_theta"), "rope_type": "default"}
        layer.pop("rope_scaling")
        config = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"], **config,
                  "transformer_layer_config": layer, "eagle_aux_hidden_state_layer_ids": list(head.cfg.aux_layers),
                  "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": target.name}}}
        named = {k.replace("midlayer.", "layers.0."): v for k, v in weights.items()}
        save_file(torch_state(named), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


LAYOUTS = {  # the variants each layout's projects publish
    "eagle": dict(aux=None, flags={}),
    "specforge": dict(aux=(2, 4, 6), flags=dict(own_embedding=True)),
    "speculators": dict(aux=(1, 5, 8), flags=dict(own_embedding=True, fc_bias=True, norm_before_residual=True)),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_target_taps_are_the_inputs_of_the_named_blocks(target, layout):
    aux = LAYOUTS[layout]["aux"] or default_aux_layers(LAYERS)
    ours = target.model(mx.array([PROMPT_IDS]), None, return_hidden=aux)[1][0]
    np.testing.assert_allclose(np.array(ours), mlx_lm_taps(target.ref, PROMPT_IDS, aux), atol=1e-5, rtol=1e-5)
    # the cached CPU path of a verify pass taps the same states
    cache = target.model.make_cache()
    target.model(mx.array([PROMPT_IDS[:4]]), cache)
    tail = target.model(mx.array([PROMPT_IDS[4:]]), cache, return_hidden=aux)[1][0]
    np.testing.assert_allclose(np.array(tail), np.array(ours[4:]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_published_layout_loads_drafts_and_matches_the_reference(target, layout, tmp_path):
    spec = LAYOUTS[layout]
    head = random_head(target, spec["aux"], **spec["flags"])
    folder = write_layout(head, tmp_path / layout, layout, target)
    drafter = make_drafter(str(folder), target)
    assert isinstance(drafter, EagleDrafter) and drafter.wants_hidden == head.cfg.aux_layers
    loaded = drafter.head
    assert (loaded.cfg.own_embedding, loaded.cfg.fc_bias, loaded.cfg.norm_before_residual) == (
        head.cfg.own_embedding, head.cfg.fc_bias, head.cfg.norm_before_residual)
    assert loaded.vocab_ids.tolist() == DRAFT_IDS
    agree_with_reference(loaded, Reference(folder, target_embed(target)), target)
    out = emitted(generate(target.model, PROMPT_IDS, GREEDY, 16, set(), 512, 0, drafter, 3))
    assert out == plain(target)


def test_our_written_checkpoint_round_trips_and_loads_in_the_reference(target, tmp_path):
    head = random_head(target)
    folder = save_eagle3(head, tmp_path / "e3", embed_table=target.model.model.embed_tokens.weight, dtype="float32")
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["eagle_aux_hidden_state_layer_ids"] == list(default_aux_layers(LAYERS))
    from safetensors.torch import load_file

    w = load_file(str(folder / "model.safetensors"))
    assert (torch.arange(len(DRAFT_IDS)) + w["d2t"]).tolist() == DRAFT_IDS  # target id = draft id + d2t
    assert w["t2d"].dtype == torch.bool and torch.nonzero(w["t2d"]).flatten().tolist() == DRAFT_IDS
    assert {k.split(".")[0] for k in w} == {"fc", "midlayer", "norm", "lm_head", "embed_tokens", "d2t", "t2d"}
    loaded = load_eagle3(folder, target)
    # the target's table travels with the head (a serving engine needs no more than the folder)
    ours, back = dict(tree_flatten(head.parameters())), dict(tree_flatten(loaded.parameters()))
    assert mx.array_equal(back.pop("embed_tokens.weight"), target.model.model.embed_tokens.weight)
    assert ours.keys() == back.keys() and all(mx.array_equal(ours[k], back[k]) for k in ours)
    agree_with_reference(loaded, Reference(folder, target_embed(target)), target)


def emitted(events) -> list[int]:
    return [t for ev in events if isinstance(ev, Step) for t in ev.emitted]


def plain(target, n: int = 16) -> list[int]:
    return emitted(generate(target.model, PROMPT_IDS, GREEDY, n, set(), 512))


# ----------------------------------------------------------------------------- exactness


def copying_head(target) -> Eagle3Head:
    """A head that proposes the token its slot's lowest tap is nearest to (fc passes that tap
    through, the layer's residual branches are zero, the output rows are the target's
    embeddings): on a ``repeating`` target it is often right, and wrong at every change."""
    head = random_head(target, seed=7)
    d = target.config.hidden_size
    head.load_weights([
        ("fc.weight", mx.concatenate([mx.eye(d), mx.zeros((d, 2 * d))], axis=1)),
        ("midlayer.self_attn.o_proj.weight", mx.zeros((d, 4 * 8))), ("midlayer.mlp.down_proj.weight", mx.zeros((d, 48))),
        ("norm.weight", mx.ones((d,))), ("lm_head.weight", target.model.model.embed_tokens.weight[mx.array(DRAFT_IDS)]),
    ], strict=False)
    mx.eval(head.parameters())
    return head


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_is_target_only_at_every_k_and_with_trees(family):
    target = mlx_lm_target(family, seed=2, repeating=True)
    want = plain(target, 24)
    counts = {"accepted": 0, "refused": 0}
    for head in (copying_head(target), random_head(target, seed=4)):
        for k, tree in [(k, None) for k in range(1, 9)] + [(1, parse_tree(s)) for s in ("3x2", "2x3", "4x1")]:
            events = list(generate(target.model, PROMPT_IDS, GREEDY, 24, set(), 512, 0, EagleDrafter(head, "e3"), k,
                                   tree=tree))
            assert emitted(events) == want, (k, tree)
            steps = [ev for ev in events if isinstance(ev, Step)]
            counts["accepted"] += sum(ev.accepted for ev in steps)
            counts["refused"] += sum(ev.k - ev.accepted for ev in steps)
    assert counts["accepted"] > 20 and counts["refused"] > 20, counts  # both paths exercised


def test_the_joint_distribution_at_t1_is_exactly_the_targets(monkeypatch):
    """Every path of the engine through its random choices, enumerated (tests/exact.py), with a
    head over 3 of the 4 tokens (the fourth has q = 0) tapping the target's embedding output and
    last block: the joint of the first tokens equals target-only sampling's."""
    model = exact_llama(0)
    params = SamplingParams(temperature=1.0)
    head = exact_eagle3_head(model)
    for k in (1, 2):
        run = lambda: generate(model, PROMPT, params, 3, set(), 512, seed=0, drafter=EagleDrafter(head, "e3"), k=k)  # noqa: E731
        e = engine_distribution(run, 3, EXACT_VOCAB, monkeypatch)
        assert abs(e.total - 1) < 1e-6
        assert 0.1 < e.acceptance < 0.9, e.acceptance
        assert tv(e.joint, exact_joint(model, PROMPT, params)) < EXACT_TV


@settings(max_examples=20, deadline=None)
@given(prompt=st.lists(st.integers(1, VOCAB - 1), min_size=2, max_size=8),
       rounds=st.lists(st.tuples(st.integers(0, 5), st.floats(0, 1), st.integers(1, VOCAB - 1)), min_size=1, max_size=4))
def test_rollback_under_any_accept_pattern(prompt, rounds):
    """After any proposals and accept patterns, the next first draft equals a fresh run over the
    committed history with the target's real tapped states."""
    target = ROLLBACK_TARGET
    head = random_head(target, seed=3)
    taps = lambda toks: target.model(mx.array([toks]), None, return_hidden=head.wants_hidden)[1][0]  # noqa: E731
    d = EagleDrafter(head, "e3")
    d.reset(prompt, taps(prompt[:-1]))
    history, key = list(prompt), mx.random.key(0)
    for k, frac, nxt in rounds:
        drafted = d.propose(history, k, GREEDY, key).tokens.tolist()
        n = round(frac * len(drafted))
        kept = history + drafted[:n]
        d.commit(Commit(drafted, n, nxt, taps(kept)[len(history) - 1 :]))
        history = kept + [nxt]
        ours = d.propose(history, 1, GREEDY, key)
        _, z = head(taps(history[:-1])[None], mx.array([history[1:]]))
        assert ours.tokens.item() == head.vocab_ids[mx.argmax(z[0, -1])].item()
        d.commit(Commit(ours.tokens.tolist(), 0, nxt, taps(history)[-1:]))
        history = history + [nxt]


ROLLBACK_TARGET = mlx_lm_target("qwen3", seed=5)


def test_the_torch_twin_drafts_what_mlx_does(target, monkeypatch):
    """With its products in float32 the twin's logits are MLX's to 1e-4; in bfloat16 (the
    default, ``draft_dtype``) to bfloat16's rounding, rounded to 4 bits where the VNNI kernel
    runs (``head_bits``) to that rounding, and either drafts the target's greedy text."""
    from mlxspec.torchpath import load as torch_load
    from mlxspec.torchpath.load import head_on_torch
    from mlxspec.torchpath.model import Llama as TorchLlama

    head = random_head(target, (1, 4, 8), own_embedding=True, norm_before_residual=True, seed=6)
    model = TorchLlama.from_mlx(target.model)
    half = head_on_torch(EagleDrafter(head, "e3"), SimpleNamespace(model=model, source=target))
    bits = torch_load.head_bits()
    rounded = bits is not None or torch_load.draft_dtype() == torch.bfloat16  # where oneDNN runs it natively
    monkeypatch.setattr(torch_load, "draft_dtype", lambda: torch.float32)
    monkeypatch.setattr(torch_load, "head_bits", lambda: None)
    twin = head_on_torch(EagleDrafter(head, "e3"), SimpleNamespace(model=model, source=target))
    feats = np.array(target.model(mx.array([PROMPT_IDS]), None, return_hidden=head.wants_hidden)[1][0])
    _, torch_taps = model(torch.tensor([PROMPT_IDS]), None, return_hidden=head.wants_hidden)
    np.testing.assert_allclose(torch_taps[0].numpy(), feats, atol=1e-4, rtol=1e-4)
    _, zt = twin.head(torch.from_numpy(feats)[None], torch.tensor([PROMPT_IDS[1:] + [5]]))
    _, zm = head(mx.array(feats)[None], mx.array([PROMPT_IDS[1:] + [5]]))
    np.testing.assert_allclose(zt.numpy(), np.array(zm), atol=1e-4, rtol=1e-4)
    _, zh = half.head(torch.from_numpy(feats)[None], torch.tensor([PROMPT_IDS[1:] + [5]]))
    # 4 bits on a random head's Gaussian weights: 16 levels over each group's range, ~16% at the worst logit
    assert float((zh - zt).abs().max() / zt.abs().max()) < (0.25 if bits else 3e-2) and torch.equal(zh, zt) != rounded
    for drafter in (twin, half):
        assert emitted(generate(model, PROMPT_IDS, GREEDY, 10, set(), 512, 0, drafter, 3)) == plain(target, 10)
    # --k auto's first guess at a head step's cost: dearer beside a compiled target pass
    from mlxspec.core.autok import k_policy

    assert k_policy("auto", twin, lambda n: [10.0] * n).draft_ms == pytest.approx(1.0)
    model.compiled = SimpleNamespace()  # only its presence counts here
    beside = head_on_torch(EagleDrafter(head, "e3"), SimpleNamespace(model=model, source=target))
    model.compiled = None
    assert k_policy("auto", beside, lambda n: [10.0] * n).draft_ms == pytest.approx(10 * torch_load.COMPILED_HEAD_RATIO)


# ----------------------------------------------------------------------------- bad heads


def one_line(err: MlxspecError) -> str:
    text = str(err)
    assert "\n" not in text
    return text


def test_a_head_for_another_target_names_both_sides(target, tmp_path):
    head = random_head(target)
    folder = save_eagle3(head, tmp_path / "e3", dtype="float32")
    wider = replace(target.config, hidden_size=48)
    other = lambda cfg: SimpleNamespace(**{**vars(target), "config": cfg})  # noqa: E731
    for changed, pattern in [
        (replace(target.config, vocab_size=96), r"vocabulary 64 and hidden size 32; .* has 96 and 32"),
        (wider, r"vocabulary 64 and hidden size 32; .* has 64 and 48"),
        (replace(target.config, num_layers=4), r"layers \[2, 4, 5\]; .* has 4 layers"),
    ]:
        with pytest.raises(MlxspecError, match=pattern) as e:
            load_eagle3(folder, other(changed))
        one_line(e.value)


def test_damaged_heads_are_one_line_errors(target, tmp_path):
    head = random_head(target)
    good = save_eagle3(head, tmp_path / "good", dtype="float32")
    blob = (good / "model.safetensors").read_bytes()
    config = json.loads((good / "config.json").read_text())
    cases = {
        "truncated": lambda f: (f / "model.safetensors").write_bytes(blob[: len(blob) // 2]),
        "header cut": lambda f: (f / "model.safetensors").write_bytes(blob[:5]),
        "no weights": lambda f: (f / "model.safetensors").unlink(),
        "garbage bin": lambda f: ((f / "model.safetensors").unlink(), (f / "pytorch_model.bin").write_bytes(b"\x80\x02junk")),
        "bad json": lambda f: (f / "config.json").write_text("{not json"),
        "two layers": lambda f: (f / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2})),
        "repeated ids": lambda f: (f / "config.json").write_text(json.dumps({**config, "eagle_aux_hidden_state_layer_ids": [2, 2, 5]})),
        "wrong fc": lambda f: (f / "config.json").write_text(json.dumps({**config, "eagle_aux_hidden_state_layer_ids": [2, 5]})),
        "no rope base": lambda f: (f / "config.json").write_text(json.dumps(
            {k: v for k, v in config.items() if k != "rope_theta"})),
        "rope parameters a list": lambda f: (f / "config.json").write_text(json.dumps(
            {**{k: v for k, v in config.items() if k != "rope_theta"}, "rope_parameters": [50000.0]})),
        "bad d2t": lambda f: mx.save_safetensors(str(f / "model.safetensors"), {
            **mx.load(str(good / "model.safetensors")), "d2t": mx.full((len(DRAFT_IDS),), 10_000, mx.int64)}),
    }
    for name, damage in cases.items():
        folder = tmp_path / name.replace(" ", "-")
        folder.mkdir()
        for f in good.iterdir():
            (folder / f.name).write_bytes(f.read_bytes())
        damage(folder)
        with pytest.raises(MlxspecError) as e:
            make_drafter(str(folder), target) if name != "bad json" else load_eagle3(folder, target)
        assert str(folder) in one_line(e.value) or "config.json" in str(e.value), (name, str(e.value))


# What speculators 0.9.0 writes for an Eagle3SpeculatorConfig (its save_pretrained, 2026-12-04),
# less its own provenance keys (auto_map, speculators_version, transformers_version).
SPECULATORS_TOP = {"architectures", "draft_vocab_size", "eagle_aux_hidden_state_layer_ids", "embed_requires_grad",
                   "fc_norm", "norm_before_fc", "norm_before_residual", "norm_output", "speculators_config",
                   "speculators_model_type", "target_hidden_size", "transformer_layer_config"}
SPECULATORS_LAYER = {"attention_bias", "attention_dropout", "bos_token_id", "dtype", "eos_token_id", "head_dim",
                     "hidden_act", "hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings",
                     "mlp_bias", "model_type", "num_attention_heads", "num_hidden_layers", "num_key_value_heads",
                     "pad_token_id", "pretraining_tp", "rms_norm_eps", "rope_parameters", "tie_word_embeddings",
                     "use_cache", "vocab_size"}


def test_our_speculators_layout_is_speculators_own_and_reads_back(target, tmp_path):
    from safetensors.torch import load_file

    head = random_head(target, (1, 5, 8), own_embedding=True, norm_before_residual=True)
    folder = save_eagle3(head, tmp_path / "s", dtype="float32", layout="speculators",
                         verifier=("org/tiny", ["LlamaForCausalLM"]))
    config = json.loads((folder / "config.json").read_text())
    layer = config["transformer_layer_config"]
    assert set(config) == SPECULATORS_TOP and set(layer) <= SPECULATORS_LAYER
    assert layer["rope_parameters"] == {"rope_theta": ROPE_BASE, "rope_type": "default"}
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 5, 8] and config["norm_before_residual"]
    assert config["speculators_config"]["verifier"] == {"name_or_path": "org/tiny", "architectures": ["LlamaForCausalLM"]}
    names = set(load_file(str(folder / "model.safetensors")))
    assert {n.split(".")[0] for n in names} == {"fc", "layers", "norm", "lm_head", "embed_tokens", "d2t", "t2d"}
    assert not any(n.startswith("midlayer.") for n in names)
    loaded = load_eagle3(folder, target)
    assert (loaded.cfg.aux_layers, loaded.cfg.rope_theta, loaded.cfg.norm_before_residual) == ((1, 5, 8), ROPE_BASE, True)
    agree_with_reference(loaded, Reference(folder, target_embed(target)), target)
    with pytest.raises(MlxspecError, match="names its verifier"):
        save_eagle3(head, tmp_path / "v", layout="speculators")


def test_published_config_is_what_vllm_and_sglang_read():
    """The keys both engines' EAGLE-3 loaders read (their llama_eagle3.py), as this writes them."""
    model = exact_llama(0)
    cfg = Eagle3Config(hidden_size=16, intermediate_size=32, num_heads=2, num_kv_heads=1, draft_vocab=3,
                       target_vocab=EXACT_VOCAB, target_hidden=16, aux_layers=default_aux_layers(8))
    config = published_config(Eagle3Head(cfg, mx.array([0, 1, 3]), model.model.embed_tokens))
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
                "draft_vocab_size", "target_hidden_size", "rms_norm_eps", "rope_theta", "max_position_embeddings"):
        assert key in config, key
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]


# ----------------------------------------------------------------------------- training


def tapped_features(target, taps: tuple[int, ...], sequences: int = 8, length: int = 24) -> FeatureSet:
    """Random sequences teacher-forced through ``features.teacher_pass`` with taps."""
    rng = np.random.default_rng(0)
    seqs = [rng.integers(1, VOCAB, size=length).tolist() for _ in range(sequences)]
    rows = teacher_pass(target.model, seqs, taps)
    parts = [FeatureSet(np.array(s, np.int32), *r[:3], np.array([length]), np.array([6]), ["test"], {}, r[3])
             for s, r in zip(seqs, rows)]
    return FeatureSet.concat(parts, {})


def test_the_tapped_teacher_pass_gives_the_taps_and_the_final_feature(target):
    taps = default_aux_layers(LAYERS)
    seq = PROMPT_IDS * 3
    feats, lse, argmax, aux = teacher_pass(target.model, [seq, seq[:10]], taps)[1]
    logits, final = target.model(mx.array([seq[:10]]), None, return_hidden=True)
    np.testing.assert_allclose(aux, mlx_lm_taps(target.ref, seq[:10], taps), atol=2e-2, rtol=1e-2)  # float16
    np.testing.assert_allclose(feats, np.array(final[0]), atol=2e-2, rtol=1e-2)
    assert argmax.tolist() == np.array(mx.argmax(logits[0], axis=-1)).tolist()


def test_training_unroll_matches_what_drafting_computes(target):
    """Step j of the unrolled training pass at slot t is the head's j-th draft from anchor t-j+1,
    the first step reading taps and later ones the head's own outputs."""
    head = random_head(target)
    seq = [4, 9, 13, 21, 2, 7, 30, 11, 5, 19]
    taps = target.model(mx.array([seq]), None, return_hidden=head.wants_hidden)[1][0]
    outs = unroll(head, taps[None, :-1], mx.array([seq[1:]]), 3)
    for anchor in range(1, 6):
        cache = head.make_cache()
        pred, _ = head(taps[None, :anchor], mx.array([seq[1 : anchor + 1]]), cache)
        for j in range(3):
            slot = anchor - 1 + j
            np.testing.assert_allclose(np.array(pred[0, -1]), np.array(outs[j][0, slot]), atol=1e-4, rtol=1e-4)
            pred, _ = head(pred[:, -1:], mx.array([[seq[slot + 2]]]), cache)


TRAINING = EagleTrainConfig(loss="eal", steps=6, batch=4, context=20, k=3, lr=3e-3, warmup=1, checkpoint_every=3,
                            feature_weight=0.0)


def fixed_chain(data: FeatureSet, rows: mx.array):
    """The expected 3-chain of a head over one fixed batch of ``data`` (``rows``: the
    teacher's output rows for ``DRAFT_IDS``), to compare a head before and after training."""
    col_of = np.full(VOCAB, -1, np.int32)
    col_of[np.array(DRAFT_IDS)] = np.arange(len(DRAFT_IDS))
    batch = make_batch(data, np.arange(8), 20, np.random.default_rng(1), col_of)
    batch["teacher_rows"] = rows

    def chain(head) -> float:
        _, _, feat, _, c = objectives(head, batch, TRAINING, 0.0)
        assert feat.item() == 0.0  # no feature regression for an EAGLE-3 head
        return c.item()

    return chain


def test_training_improves_the_chain_and_resumes_exactly(tmp_path):
    from mlxspec.training.eagle3 import new_head

    target = mlx_lm_target("llama", seed=3)
    data = tapped_features(target, default_aux_layers(LAYERS))
    ids = mx.array(DRAFT_IDS)
    rows = target.model.lm_head.weight[ids]
    cfg = TRAINING
    chain = fixed_chain(data, rows)
    whole = new_head(target, ids)
    before = chain(whole)
    train_head(whole, data, rows, cfg, tmp_path / "whole")
    assert chain(whole) > before
    with pytest.raises(StopTraining):  # interrupted right after the step-3 checkpoint
        train_head(new_head(target, ids), data, rows, cfg, tmp_path / "cut", on_step=stop_after(3))
    assert (tmp_path / "cut" / "checkpoint" / "model.safetensors").is_file()
    resumed = new_head(target, ids)
    history = train_head(resumed, data, rows, cfg, tmp_path / "cut", resume=True)
    assert [h.step for h in history] == list(range(1, 7))
    for (k, a), (_, b) in zip(tree_flatten(whole.parameters()), tree_flatten(resumed.parameters())):
        np.testing.assert_array_equal(np.array(a), np.array(b), err_msg=k)


def test_aux_layers_choose_the_taps_and_zero_layers_train_a_head_that_reads_only_the_others(tmp_path):
    """--aux-layers sets the taps (index L: the last block's output); --zero-layers, an ablation,
    zeroes some taps' states: their fc columns stay exactly zero through training, so the head
    drafts the same whatever a serving engine feeds there."""
    from mlxspec.training.eagle3 import config_for, new_head, zero_taps

    target = mlx_lm_target("llama", seed=3)
    taps = (2, 4, LAYERS)
    assert config_for(target, 8, aux_layers=(LAYERS, 2, 4)).aux_layers == taps
    for bad in ((LAYERS,), (2, 2), (2, LAYERS + 1), (-1, 3)):
        with pytest.raises(MlxspecError, match="taps 2 or more distinct layers") as e:
            config_for(target, 8, aux_layers=bad)
        one_line(e.value)
    data = tapped_features(target, taps)
    kept = data.aux[:, 2 * 32 :].copy()
    zero_taps(data, taps, (2, 4))
    assert not data.aux[:, : 2 * 32].any() and np.array_equal(data.aux[:, 2 * 32 :], kept)
    ids = mx.array(DRAFT_IDS)
    head = new_head(target, ids, aux_layers=taps, zero_layers=(2, 4))
    fc = np.array(head.fc.weight)
    assert not fc[:, : 2 * 32].any() and np.array_equal(fc[:, 2 * 32 :], np.eye(32))
    cfg = EagleTrainConfig(loss="eal", steps=4, batch=4, context=20, k=3, lr=3e-3, warmup=1, feature_weight=0.0)
    train_head(head, data, target.model.lm_head.weight[ids], cfg, tmp_path / "z")
    fc = np.array(head.fc.weight)
    assert not fc[:, : 2 * 32].any() and not np.array_equal(fc[:, 2 * 32 :], np.eye(32))
    with pytest.raises(MlxspecError, match="no layer to read"):
        new_head(target, ids, aux_layers=taps, zero_layers=taps)


def test_taps_are_named_as_blocks_and_the_last_output():
    from mlxspec.training.eagle3 import taps_named

    assert taps_named((2, 15, 27), 30) == "the states entering blocks [2, 15, 27]"
    assert taps_named((30,), 30) == "the last block's output"
    assert taps_named((4, 30), 30) == "the state entering block 4 and the last block's output"


def test_train_draft_checks_aux_and_zero_layers():
    from mlxspec.training.run import TrainOptions

    for flags, match in ((dict(arch="eagle", aux_layers="2,4"), "--aux-layers and --zero-layers choose"),
                         (dict(arch="eagle3", zero_layers="2"), "each must be one of --aux-layers"),
                         (dict(arch="eagle3", aux_layers="2,4", zero_layers="3"), "each must be one of --aux-layers"),
                         (dict(arch="eagle3", aux_layers="2,x"), "expected comma-separated block indices"),
                         (dict(arch="eagle", share_embeddings=True), "--share-embeddings is for --arch eagle3"),
                         (dict(arch="eagle3", format="onnx"), "unknown --format 'onnx'"),
                         (dict(arch="draft", format="speculators"), "--format and --verifier choose"),
                         (dict(arch="eagle3", verifier="org/x"), "--verifier names the target inside")):
        with pytest.raises(MlxspecError, match=match):
            TrainOptions(out=Path("x"), **flags).checked()
    assert TrainOptions(out=Path("x"), arch="eagle3", aux_layers="2,4,8", zero_layers="2,4").checked().taps() == \
        ((2, 4, 8), (2, 4))


def test_a_head_trained_for_another_tokenizer_is_refused(target, tmp_path):
    folder = save_eagle3(random_head(target), tmp_path / "e3", dtype="float32",
                         extra={"mlxspec": {"tokenizer_sha256": "0" * 64}})
    other = SimpleNamespace(**{**vars(target), "tokenizer": SimpleNamespace(get_vocab=lambda: {"a": 0})})
    with pytest.raises(MlxspecError, match="trained for a different tokenizer") as e:
        load_eagle3(folder, other)
    one_line(e.value)


def test_the_tapped_teacher_pass_on_torch_is_mlxs(target):
    """Features for --backend torch: the same taps, final feature, logsumexp and argmax."""
    from mlxspec.torchpath.model import Llama as TorchLlama

    taps = (2, 4, LAYERS)
    rng = np.random.default_rng(5)
    seqs = [rng.integers(1, VOCAB, size=n).tolist() for n in (24, 17, 9)]
    twin = TorchLlama.from_mlx(target.model)
    for ours, theirs in zip(teacher_pass(target.model, seqs, taps), teacher_pass(twin, seqs, taps)):
        for a, b in zip(ours, theirs):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_allclose(b.astype(np.float32), a.astype(np.float32), atol=2e-2, rtol=1e-2)
        assert theirs[2].tolist() == ours[2].tolist()


def test_torch_objectives_and_gradients_equal_mlx(target):
    """--backend torch trains an EAGLE-3 head on the same function: objectives and every
    parameter's gradient equal MLX's on one batch (the first step reads three taps, the next
    ones the head's own outputs; no feature regression)."""
    from mlxspec.torchpath.model import Eagle3Head as TorchHead
    from mlxspec.torchpath.model import Llama as TorchLlama

    head = random_head(target, seed=4)
    data = tapped_features(target, head.wants_hidden)
    col_of = np.full(VOCAB, -1, np.int32)
    col_of[np.array(DRAFT_IDS)] = np.arange(len(DRAFT_IDS))
    batch = make_batch(data, np.arange(4), 20, np.random.default_rng(2), col_of)
    batch["teacher_rows"] = target.model.lm_head.weight[head.vocab_ids]
    cfg = EagleTrainConfig(loss="eal", k=3, temp=1.0, batch=4, context=20, feature_weight=0.0)
    twin = TorchHead.from_mlx(head, TorchLlama.from_mlx(target.model)).float().requires_grad_(True)
    assert_torch_objectives_equal_mlx(head, twin, batch, cfg, 0.3)


def test_torch_training_improves_the_chain_governs_threads_and_saves_what_it_trained(tmp_path):
    from mlxspec.torchpath.model import Llama as TorchLlama
    from mlxspec.training.eagle3 import new_head
    from mlxspec.training.torch_train import TorchStepper

    target = mlx_lm_target("llama", seed=3)
    twin = TorchLlama.from_mlx(target.model)
    data = tapped_features(SimpleNamespace(model=twin), default_aux_layers(LAYERS))  # built on torch too
    ids = mx.array(DRAFT_IDS)
    rows = target.model.lm_head.weight[ids]
    chain = fixed_chain(data, rows)
    head = new_head(target, ids)
    before = chain(head)
    twin.threads = SimpleNamespace(ticks=0)
    twin.threads.tick = lambda: setattr(twin.threads, "ticks", twin.threads.ticks + 1)
    train_head(head, data, rows, TRAINING, tmp_path / "t", stepper=TorchStepper(head, TRAINING, twin))
    assert chain(head) > before
    assert twin.threads.ticks == TRAINING.steps  # each step sizes torch's threads to the cores left free
    saved = load_eagle3(tmp_path / "t" / "checkpoint", target)
    for (k, a), (_, b) in zip(tree_flatten(head.parameters()), tree_flatten(saved.parameters())):
        np.testing.assert_array_equal(np.array(a), np.array(b), err_msg=k)


def test_a_head_trained_without_some_taps_is_written_without_them(target):
    """--zero-layers 8 of taps 2,4,8 leaves a head on 2,4: dropping the zero fc columns keeps the
    same function whatever block 8 holds; with one tap left the head stays as it is."""
    from mlxspec.training.eagle3 import without_taps

    head = random_head(target, aux=(2, 4, LAYERS))
    w = np.array(head.fc.weight)
    w[:, 2 * 32 :] = 0
    head.load_weights([("fc.weight", mx.array(w))], strict=False)
    two = without_taps(head, (LAYERS,), target)
    assert two.cfg.aux_layers == (2, 4) and two.fc.weight.shape == (32, 64)
    seq = mx.array([PROMPT_IDS])
    taps = target.model(seq, None, return_hidden=(2, 4, LAYERS))[1]
    np.testing.assert_allclose(np.array(two(taps[..., : 2 * 32], seq)[1]), np.array(head(taps, seq)[1]),
                               atol=1e-5, rtol=1e-5)
    assert without_taps(head, (2, 4), target) is head and without_taps(head, (), target) is head
    with pytest.raises(MlxspecError, match="not zero"):
        without_taps(head, (2,), target)


@pytest.mark.model
@pytest.mark.parametrize("backend", ["mlx", "torch"])
def test_quick_eagle3_training_writes_the_published_format_and_drafts_exactly(tmp_path, lm, backend):
    """`train-draft --arch eagle3 --quick` on the real target end to end, on either backend: the
    folder is the published layout, loads as --draft, and greedy speculation with it is the
    target's own. The torch run also leaves the embedding table out (--share-embeddings), as the
    shipped head does, and writes speculators' layout (--format speculators)."""
    from typer.testing import CliRunner

    from mlxspec.cli import app
    from mlxspec.targets.tokenizer import encode_prompt

    out, shared = tmp_path / "e3", backend == "torch"
    r = CliRunner().invoke(app, ["train-draft", "--arch", "eagle3", "--quick", "--backend", backend, "--out", str(out),
                                 "--json"] + ["--share-embeddings", "--format", "speculators"] * shared)
    assert r.exit_code == 0, r.output
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == (["Eagle3Speculator"] if shared else ["LlamaForCausalLMEagle3"])
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert ("embed_tokens.weight" in mx.load(str(out / "model.safetensors"))) is not shared
    card = (out / "README.md").read_text()
    assert "Reproduce: `mlxspec train-draft --arch eagle3" in card
    assert "fuses\nthe states entering blocks [2, 15, 27] of the target" in card
    assert ("--share-embeddings" in card and "stores no embedding table" in card) is shared
    assert ("--format speculators" in card) is shared
    ids = encode_prompt(lm.tokenizer, "Name three rivers in Europe.")
    stop = set(lm.tokenizer.eos_token_ids)
    want = emitted(generate(lm.model, ids, GREEDY, 24, stop, lm.context_length))
    for k, tree in ((1, None), (4, None), (8, None), (1, parse_tree("3x2"))):
        got = emitted(generate(lm.model, ids, GREEDY, 24, stop, lm.context_length, 0, make_drafter(str(out), lm), k,
                               tree=tree))
        assert got == want, (k, tree)


def test_a_hub_id_in_the_hub_cache_is_found_offline(target, tmp_path, monkeypatch):
    import shutil

    import huggingface_hub

    head = random_head(target)
    folder = save_eagle3(head, tmp_path / "made", dtype="float32")
    rev = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--tiny-eagle3"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(rev)
    shutil.copytree(folder, repo / "snapshots" / rev)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    drafter = make_drafter("someone/tiny-eagle3", target)
    assert isinstance(drafter.head, Eagle3Head) and drafter.head.vocab_ids.tolist() == DRAFT_IDS
    with pytest.raises(MlxspecError, match="unknown drafter 'someone/not-cached'"):
        make_drafter("someone/not-cached", target)


def test_a_shipped_eagle3_head_is_found_by_its_registry_name(target, tmp_path, monkeypatch):
    import json

    from mlxspec.targets import store

    save_eagle3(random_head(target), tmp_path / "tiny-eagle3", dtype="float32")
    entry = {"target": "tiny", "folder": "tiny-eagle3", "description": "a test head"}
    registry = {"models": {}, "drafts": {"tiny-eagle3": entry}}
    (tmp_path / "registry.json").write_text(json.dumps(registry))
    monkeypatch.setattr(store, "REGISTRY_PATH", tmp_path / "registry.json")
    drafter = make_drafter("tiny-eagle3", target)
    assert isinstance(drafter.head, Eagle3Head) and drafter.head.vocab_ids.tolist() == DRAFT_IDS
    [listed] = store.drafts()
    assert listed["present"] and listed["size"] == (tmp_path / "tiny-eagle3" / "model.safetensors").stat().st_size


def test_export_draft_says_an_eagle3_head_needs_no_conversion(target, tmp_path, monkeypatch):
    from helpers import invoke, one_line_error

    from mlxspec.targets import published

    folder = save_eagle3(random_head(target), tmp_path / "e3", dtype="float32")
    for module in (loading, published):  # published holds its own name for it: patched there, not bound at import
        monkeypatch.setattr(module, "load", lambda *a, **k: pytest.fail("loaded a model for nothing"))
    one_line_error(invoke("export-draft", "--draft", str(folder), "--out", str(tmp_path / "x")),
                   r"is an EAGLE-3 head: .* vLLM and SGLang load its folder as it is")


def test_a_kept_cache_serves_only_a_drafter_reading_the_same_states():
    """Chat turns keep the target's cache with the hidden states of its tokens; a drafter that
    reads other ones (the final state vs an EAGLE-3 head's taps) must prefill afresh."""
    from mlxspec.core.prompt_cache import PromptCache

    model = exact_llama(0)
    for kept_kind, wanted, reused in [((0, 1), (0, 1), True), ((0, 1), True, False), (True, (0, 1), False),
                                      ((0, 1), False, True)]:
        kept = PromptCache()
        cache = model.make_cache()
        model(mx.array([[1, 2, 3]]), cache)
        kept.keep(cache, [1, 2, 3], mx.zeros((3, 8)), kept_kind)
        reuse = kept.take([1, 2, 3], wanted)
        assert (reuse.cache is not None and reuse.n == 3) == reused, (kept_kind, wanted)
