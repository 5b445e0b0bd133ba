"""Architectures only mlx-lm implements, run through its own classes behind the target seam:
tiny random models built with mlx-lm's classes and saved as mlx-lm folders, offline."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models.cache import make_prompt_cache
from typer.testing import CliRunner

from mlxspec.core.cache import check_trimmable, rewind
from mlxspec.core.drafters import ModelDrafter, NgramDrafter
from mlxspec.core.engine import generate
from mlxspec.core.events import Step
from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError
from mlxspec.targets import loading
from mlxspec.targets.drafts import make_drafter
from mlxspec.targets.mlxlm import MlxLmTarget, WindowedKVCache

VOCAB = 128
GREEDY = SamplingParams(0.0)
PROMPT = [5, 9, 13, 5, 9, 21, 34]
# Small members of families our own module does not implement (mlx-lm 0.32's argument names).
STARCODER2 = dict(model_type="starcoder2", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256)
OLMO3 = dict(model_type="olmo3", hidden_size=32, num_hidden_layers=3, intermediate_size=64, num_attention_heads=4,
             num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=VOCAB, max_position_embeddings=256,
             sliding_window=6, rope_theta=10000.0,
             layer_types=["sliding_attention", "sliding_attention", "full_attention"])
COHERE2 = dict(model_type="cohere2", hidden_size=32, head_dim=8, num_hidden_layers=4, intermediate_size=64,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB, sliding_window=5,
               sliding_window_pattern=2, max_position_embeddings=256)
MAMBA = dict(model_type="mamba", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, state_size=8,
             num_hidden_layers=2, conv_kernel=4, use_bias=False, use_conv_bias=True, time_step_rank=4)


def save_tokenizer(folder: Path) -> None:
    """A character-level tokenizer (printable ASCII), eos ``</s>``."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "</s>": 1, **{chr(c): c - 30 for c in range(32, 127)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>").save_pretrained(str(folder))


def build(config: dict, seed: int):
    """A random model of mlx-lm's own class. Weights at their initial scale give near-uniform
    attention and one token repeated forever; scaled up 4x, greedy output varies, so drafts are
    both accepted and rejected."""
    mx.random.seed(seed)
    arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = arch.Model(arch.ModelArgs.from_dict(config))
    model.update(tree_map(lambda p: p * 4 if p.ndim == 2 else p, model.parameters()))
    mx.eval(model.parameters())
    return model


def save_folder(folder: Path, config: dict, model) -> Path:
    """An mlx-lm folder: config.json, model.safetensors, tokenizer."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": 1}))
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    save_tokenizer(folder)
    return folder


def draft_of(target, config: dict, **smaller):
    """The target's embeddings, first layers, norm and head as a smaller model (``smaller``:
    the config changes that make it so): a draft that agrees with it now and then."""
    draft = build({**config, **smaller}, seed=0)
    names = dict(tree_flatten(draft.parameters()))
    draft.load_weights([(k, v) for k, v in tree_flatten(target.parameters()) if k in names], strict=True)
    return draft


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mlxlm")
    target = build(STARCODER2, seed=0)
    return {"target": save_folder(root / "starcoder2", STARCODER2, target),
            "draft": save_folder(root / "starcoder2-draft", {**STARCODER2, "num_hidden_layers": 1},
                                 draft_of(target, STARCODER2, num_hidden_layers=1)),
            "olmo3": save_folder(root / "olmo3", OLMO3, build(OLMO3, seed=0)),
            "cohere2": save_folder(root / "cohere2", COHERE2, build(COHERE2, seed=3)),
            "mamba": save_folder(root / "mamba", MAMBA, build(MAMBA, seed=4))}


@pytest.fixture(scope="module")
def lm(folders):
    return loading.load(str(folders["target"]), "float32")


def emitted(events) -> list[int]:
    return [t for ev in events if isinstance(ev, Step) for t in ev.emitted]


def decode(lm, drafter=None, k: int = 4, n: int = 24, prompt=PROMPT) -> list[int]:
    """Greedy tokens, end-of-sequence ignored so every run is ``n`` long."""
    return emitted(generate(lm.model, prompt, GREEDY, n, set(), lm.context_length, drafter=drafter, k=k))


def reference(module, prompt: list[int], n: int) -> list[int]:
    """mlx-lm's own greedy decoding: its model on its own caches (rotating ones included)."""
    cache = make_prompt_cache(module)
    logits = module(mx.array([prompt]), cache=cache)
    out = []
    for _ in range(n):
        out.append(int(mx.argmax(logits[0, -1]).item()))
        logits = module(mx.array([[out[-1]]]), cache=cache)
    return out


def test_loads_through_mlx_lm(lm):
    assert isinstance(lm.model, MlxLmTarget)
    assert lm.model.capabilities.tree_masks is False
    assert (lm.config.model_type, lm.config.vocab_size, lm.config.num_layers) == ("starcoder2", VOCAB, 2)
    assert lm.context_length == 256 and lm.tokenizer.eos_token_ids == {1}
    assert decode(lm, n=12) == reference(lm.model.module, PROMPT, 12)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_greedy_chain_speculation_is_exact(lm, folders, k):
    plain = decode(lm)
    assert decode(lm, NgramDrafter(2, min_n=1), k) == plain
    draft = loading.load(str(folders["draft"]), "float32")
    assert isinstance(draft.model, MlxLmTarget)
    assert decode(lm, ModelDrafter(draft.model, "d"), k) == plain
    # The target as its own draft: every draft accepted, the bonus path taken each step.
    assert decode(lm, ModelDrafter(lm.model, "same"), k) == plain


def test_a_draft_folder_of_an_mlx_lm_architecture_is_a_model_drafter(lm, folders):
    d = make_drafter(str(folders["draft"]), lm)
    assert isinstance(d, ModelDrafter) and isinstance(d.model, MlxLmTarget)


@pytest.mark.parametrize(("name", "config", "smaller"), [
    ("olmo3", OLMO3, {"num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"]}),
    ("cohere2", COHERE2, {"num_hidden_layers": 2}),
])
def test_sliding_window_stays_exact_past_the_window(folders, name, config, smaller):
    """The rotating caches are swapped for windowed ones that roll back: target-only decoding
    matches mlx-lm's own (rotating) decoding far past the window, and speculation matches that,
    with rejections rolling back the target's caches and the draft's."""
    lm = loading.load(str(folders[name]), "float32")
    assert any(isinstance(c, WindowedKVCache) for c in lm.model.make_cache())
    n = 30  # the windows are 5-6 tokens
    plain = decode(lm, n=n)
    assert plain == reference(lm.model.module, PROMPT, n)
    draft = MlxLmTarget(draft_of(lm.model.module, config, **smaller))
    for k in (1, 3, 4):
        assert decode(lm, ModelDrafter(draft, "first layers"), k, n) == plain
        assert decode(lm, ModelDrafter(lm.model, "same"), k, n) == plain
        assert decode(lm, NgramDrafter(2, min_n=1), k, n) == plain


@pytest.mark.parametrize("name", ["olmo3", "cohere2"])
def test_windowed_cache_rolls_back_to_mlx_lm_logits(folders, name):
    """Verify passes of 1..5 tokens with random rejections, far past the window: every judged
    row equals mlx-lm's own pass over the committed sequence (its rotating cache, from scratch).
    With mlx-lm's rotating caches rolled back instead, rows are off by 0.1-2 logits."""
    lm = loading.load(str(folders[name]), "float32")
    module = lm.model.module
    rng = np.random.default_rng(0)
    seq = list(PROMPT)
    cache = check_trimmable(lm.model.make_cache(), "target")
    lm.model(mx.array([seq[:-1]]), cache)
    for step in range(14):
        k = step % 5
        drafts = rng.integers(2, VOCAB, size=k).tolist()
        logits = lm.model(mx.array([[seq[-1]] + drafts]), cache)[0]
        keep = int(rng.integers(0, k + 1))
        for i in range(keep + 1):
            ref = module(mx.array([seq + drafts[:i]]), cache=make_prompt_cache(module))[0, -1]
            np.testing.assert_allclose(np.array(logits[i]), np.array(ref), atol=1e-4, rtol=1e-4)
        rewind(cache, k - keep)
        seq += drafts[:keep] + [int(rng.integers(2, VOCAB))]
    assert len(seq) > 4 * OLMO3["sliding_window"]


def test_windowed_cache_supplies_the_window_a_model_leaves_to_its_cache():
    from mlx_lm.models.base import create_causal_mask

    c = WindowedKVCache(4)
    c.update_and_fetch(mx.zeros((1, 1, 6, 2)), mx.zeros((1, 1, 6, 2)))
    for n in (1, 3):  # no window_size passed: a rotating cache would have supplied its own
        assert c.make_mask(n).tolist() == create_causal_mask(n, 6, window_size=4).tolist()
    assert WindowedKVCache(8).make_mask(3) == "causal"  # nothing has left the window yet


def test_recurrent_state_decodes_target_only_and_refuses_speculation(folders):
    lm = loading.load(str(folders["mamba"]), "float32")
    assert decode(lm, n=10) == reference(lm.model.module, PROMPT, 10)
    with pytest.raises(MlxspecError, match=r"the target uses a cache that cannot be rolled back \(ArraysCache.*--draft none"):
        decode(lm, NgramDrafter(2, min_n=1))
    d = make_drafter(str(folders["mamba"]), lm)
    with pytest.raises(MlxspecError, match=r"cannot be rolled back \(ArraysCache"):
        d.reset(PROMPT)


def test_a_kept_recurrent_cache_is_reused_only_where_it_need_not_roll_back(folders):
    """Chat turns keep the target's cache: recurrent state is reused when the new prompt extends
    what it holds, started afresh when it diverges, and refused for speculation."""
    from mlxspec.core.prompt_cache import PromptCache

    lm = loading.load(str(folders["mamba"]), "float32")
    kept = PromptCache()

    def turn(prompt, drafter=None):
        return emitted(generate(lm.model, prompt, GREEDY, 6, set(), lm.context_length, drafter=drafter, kept=kept))

    first = turn(PROMPT)
    assert turn(PROMPT + first + [7, 8]) == decode(lm, n=6, prompt=PROMPT + first + [7, 8])  # extends it
    assert turn([40, 41, 42] + PROMPT) == decode(lm, n=6, prompt=[40, 41, 42] + PROMPT)  # diverges at once
    assert turn(PROMPT[:3] + [50, 51]) == decode(lm, n=6, prompt=PROMPT[:3] + [50, 51])  # diverges later
    turn(PROMPT)
    with pytest.raises(MlxspecError, match="cannot be rolled back"):
        turn(PROMPT + [9, 9], NgramDrafter(2, min_n=1))


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_features_of_supported_families_are_refused_in_one_line(lm):
    with pytest.raises(MlxspecError) as e:
        make_drafter("self:1", lm)
    assert "needs a model family mlxspec implements itself (llama" in one_line(e) and "starcoder2" in one_line(e)
    tokens, cache = mx.array([[1, 2, 3]]), lm.model.make_cache()
    with pytest.raises(MlxspecError, match="tree verification") as e:
        lm.model(tokens, cache, mask=mx.ones((3, 3), mx.bool_), positions=mx.arange(3))
    one_line(e)
    with pytest.raises(MlxspecError, match="hidden states") as e:
        lm.model(tokens, cache, return_hidden=True)
    one_line(e)


@pytest.mark.parametrize("name", ["smollm2-135m-draft", "smollm2-135m-eagle", "smollm2-135m-eagle3"])
def test_shipped_drafts_that_read_the_target_are_refused(lm, name):
    from mlxspec.targets import store

    if store.draft_path(name) is None or not store.draft_path(name).is_dir():
        pytest.skip(f"{name} is not shipped in this checkout")
    with pytest.raises(MlxspecError, match="needs a model family mlxspec implements") as e:
        make_drafter(name, lm)
    one_line(e)


def test_unknown_model_type_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "no_such_arch"}')
    with pytest.raises(MlxspecError, match=r"unsupported architecture 'no_such_arch'.*llama") as e:
        loading.load(str(tmp_path))
    one_line(e)


def test_cli_generate_with_prompt_lookup(folders, tmp_path, monkeypatch):
    from mlxspec.cli import app

    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))  # --k auto measures a cost curve here
    r = CliRunner().invoke(app, ["generate", "-m", str(folders["target"]), "-d", "ngram:3", "--temp", "0",
                                 "--max-tokens", "8", "hi"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["generate", "-m", str(folders["mamba"]), "-d", "ngram:3", "--k", "2", "-n", "4", "hi"])
    assert r.exit_code == 2 and "cannot be rolled back" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["generate", "-m", str(folders["mamba"]), "-d", "none", "-n", "4", "hi"])
    assert r.exit_code == 0, r.output
