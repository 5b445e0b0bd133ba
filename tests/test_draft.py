import json

import mlx.core as mx
import numpy as np
import pytest
from tiny import VOCAB, save_tiny, tiny_draft, tiny_target

from mlxspec.core.drafters import ModelDrafter
from mlxspec.core.engine import generate, generate_plain
from mlxspec.core.events import Step
from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError
from mlxspec.core.drafters.draft_model import DraftConfig
from mlxspec.targets.folders import (
    full_head,
    is_draft_folder,
    load_draft,
    read_draft_config,
    save_draft,
    tokenizer_fingerprint,
)


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def test_config_rejects_bad_shapes(target):
    fp = tokenizer_fingerprint(target.tokenizer)
    for bad in (dict(num_layers=0), dict(num_layers=5), dict(head_vocab=VOCAB + 1), dict(head_vocab=0),
                dict(hidden_size=48), dict(init="magic")):
        with pytest.raises(MlxspecError):
            DraftConfig.for_target(target.config, fp, **bad)
    # Another width is fine when nothing is copied from the target.
    assert DraftConfig.for_target(target.config, fp, hidden_size=48, num_heads=4, num_kv_heads=2,
                                  init="random").hidden_size == 48


def test_logits_are_minus_inf_outside_the_head_vocabulary(target):
    draft = tiny_draft(target, head_ids=range(1, VOCAB, 3))
    tokens = mx.array([[5, 9, 2, 7]])
    full = draft(tokens, None)
    reduced = draft.reduced_logits(tokens)
    ids = np.arange(1, VOCAB, 3)
    outside = np.setdiff1d(np.arange(VOCAB), ids)
    assert full.shape == (1, 4, VOCAB)
    assert np.all(np.isneginf(np.array(full)[..., outside]))
    np.testing.assert_allclose(np.array(full)[..., ids], np.array(reduced), rtol=1e-6)
    assert set(np.array(mx.argmax(full, axis=-1)).ravel()) <= set(ids)


def test_init_copies_the_targets_first_block_and_head_rows(target):
    draft = tiny_draft(target, head_ids=range(0, VOCAB, 2), layers=2)
    np.testing.assert_array_equal(np.array(draft.layers[1].mlp.up_proj.weight),
                                  np.array(target.model.layers[1].mlp.up_proj.weight))
    np.testing.assert_array_equal(np.array(draft.lm_head.weight),
                                  np.array(target.model.model.embed_tokens.weight)[::2])


def test_cached_decoding_matches_a_full_pass(target):
    draft = tiny_draft(target)
    seq = mx.array([[3, 8, 1, 4, 6, 2]])
    whole = draft.reduced_logits(seq)
    cache = draft.make_cache()
    draft.reduced_logits(seq[:, :4], cache)
    step = draft.reduced_logits(seq[:, 4:5], cache)
    np.testing.assert_allclose(np.array(step[0, 0]), np.array(whole[0, 4]), rtol=1e-4, atol=1e-5)


def test_save_load_round_trip_stores_only_the_drafts_own_weights(tmp_path, target):
    draft = tiny_draft(target)
    path = save_draft(draft, tmp_path / "d", dtype="float32")
    assert is_draft_folder(path)
    stored = mx.load(str(path / "draft.safetensors"))
    assert not any("embed" in k for k in stored)  # the embedding table is the target's
    loaded = load_draft(path, target)
    tokens = mx.array([[4, 2, 9]])
    np.testing.assert_allclose(np.array(loaded(tokens, None)), np.array(draft(tokens, None)), rtol=1e-6)
    assert loaded.num_params() == draft.num_params()


def test_load_refuses_a_draft_for_another_tokenizer(tmp_path, target):
    path = save_tiny(tmp_path, target)
    other = tiny_target(vocab={f"x{i}": i for i in range(VOCAB)})
    with pytest.raises(MlxspecError, match="different tokenizer"):
        load_draft(path, other)


def test_load_refuses_another_architecture(tmp_path, target):
    path = save_tiny(tmp_path, target)
    meta = json.loads((path / "config.json").read_text())
    meta["draft"]["num_experts"] = 8
    (path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(MlxspecError, match="unknown fields"):
        read_draft_config(path)
    meta["draft"].pop("num_experts")
    meta["draft"]["num_layers"] = 2  # weights hold one block
    (path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(MlxspecError, match="do not match"):
        load_draft(path, target)


def test_full_head_places_rows_at_their_ids(target):
    draft = tiny_draft(target, head_ids=[3, 10, 40])
    w = np.array(full_head(draft))
    np.testing.assert_array_equal(w[[3, 10, 40]], np.array(draft.lm_head.weight))
    assert not w[[0, 1, 2, 63]].any()


@pytest.mark.parametrize("k", [1, 3, 6])
def test_speculative_greedy_with_a_reduced_head_draft_equals_target_only(target, k):
    """Exactness does not depend on the draft: q = 0 outside the head just means those
    tokens are never proposed."""
    draft = tiny_draft(target, head_ids=range(0, VOCAB, 2))
    prompt, params = [5, 3, 9, 12], SamplingParams()
    plain = [t.id for e in generate_plain(target.model, prompt, params, 30, set(), 512) if isinstance(e, Step)
             for t in e.tokens]
    spec_events = list(generate(target.model, prompt, params, 30, set(), 512, drafter=ModelDrafter(draft, "d"), k=k))
    spec = [i for e in spec_events if isinstance(e, Step) for i in e.emitted]
    assert spec == plain


@pytest.mark.model
def test_trained_draft_on_the_real_target_is_exact_and_accepted(lm, quick_draft):
    from mlxspec.targets.drafts import make_drafter
    from mlxspec.targets.tokenizer import encode_prompt

    out, _ = quick_draft
    drafter = make_drafter(str(out), lm)
    ids = encode_prompt(lm.tokenizer, "Write a Python function that adds two numbers.")
    stop = set(lm.tokenizer.eos_token_ids)
    plain = [i for e in generate_plain(lm.model, ids, SamplingParams(), 40, stop, lm.context_length)
             if isinstance(e, Step) for i in e.emitted]
    steps = [e for e in generate(lm.model, ids, SamplingParams(), 40, stop, lm.context_length, drafter=drafter, k=4)
             if isinstance(e, Step)]
    assert [i for s in steps for i in s.emitted] == plain
    assert sum(s.accepted for s in steps) > 0


@pytest.mark.model
def test_export_gives_an_mlx_lm_draft_model(tmp_path, lm, quick_draft):
    from mlx_lm.generate import stream_generate
    from mlx_lm.utils import load as mlx_lm_load

    from mlxspec.targets.export import to_mlx_lm
    from mlxspec.targets.tokenizer import encode_prompt

    out, _ = quick_draft
    from typer.testing import CliRunner

    from mlxspec.cli import app

    r = CliRunner().invoke(app, ["export-draft", "--draft", str(out), "--out", str(tmp_path / "mlx")])
    assert r.exit_code == 0, r.output
    ref_draft, _ = mlx_lm_load(str(tmp_path / "mlx"))
    ours = load_draft(out, lm)
    ids = encode_prompt(lm.tokenizer, "Name three colours.")
    # Same next-token choice as our reduced head wherever its best logit is positive.
    z_ref = ref_draft(mx.array([ids]))[0]
    z_ours = ours(mx.array([ids]), None)[0]
    positive = np.array(z_ours.max(axis=-1)) > 0
    assert positive.mean() > 0.5
    np.testing.assert_array_equal(np.array(mx.argmax(z_ref, -1))[positive], np.array(mx.argmax(z_ours, -1))[positive])
    target = to_mlx_lm(lm.model)
    plain = [r.token for r in stream_generate(target, lm.tokenizer, ids, max_tokens=16)]
    spec = [r.token for r in stream_generate(target, lm.tokenizer, ids, max_tokens=16, draft_model=ref_draft,
                                            num_draft_tokens=3)]
    assert spec == plain


def test_as_llama_scores_head_tokens_as_the_draft_and_others_zero(target):
    from mlxspec.targets.folders import as_llama

    draft = tiny_draft(target, head_ids=range(0, VOCAB, 4), layers=2)
    plain = as_llama(draft, target)
    tokens = mx.array([[3, 17, 42, 8]])
    z_plain, z_draft = np.array(plain(tokens, None)), np.array(draft(tokens, None))
    ids = np.arange(0, VOCAB, 4)
    np.testing.assert_allclose(z_plain[..., ids], z_draft[..., ids], rtol=1e-5, atol=1e-5)
    others = np.setdiff1d(np.arange(VOCAB), ids)
    assert not z_plain[..., others].any()
