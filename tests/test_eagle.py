"""The eagle drafter and its training: exact greedy decoding, feature and cache rollback under
any accept pattern, training's unrolled steps equal to what drafting computes, the chain
objective, save/load and its bad inputs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import VOCAB, StopTraining, assert_torch_objectives_equal_mlx, stop_after, tiny_target

from mlxspec.core.drafters import Commit
from mlxspec.core.drafters.eagle import EagleDrafter, EagleHead
from mlxspec.core.engine import generate
from mlxspec.core.events import Step
from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError
from mlxspec.targets.folders import load_head, save_head
from mlxspec.training.eagle import new_head
from mlxspec.training.eagle_train import (
    EagleTrainConfig,
    chain_expected_length,
    make_batch,
    objectives,
    time_spent,
    train_head,
    unroll,
)
from mlxspec.training.features import FeatureSet

GREEDY = SamplingParams()
HEAD_IDS = list(range(0, VOCAB, 2)) + [1]


def random_head(target, seed: int = 1) -> EagleHead:
    """A fresh head with every weight random, so drafts are varied and often rejected."""
    return randomised(new_head(target, mx.array(sorted(HEAD_IDS)), seed=seed))


def randomised(head: EagleHead) -> EagleHead:
    """``head`` with every weight but the output rows redrawn."""
    head.load_weights([(k, mx.random.normal(v.shape) * 0.3) for k, v in _flat(head) if not k.startswith("lm_head")],
                      strict=False)
    mx.eval(head.parameters())
    return head


def _flat(module):
    from mlx.utils import tree_flatten

    return tree_flatten(module.parameters())


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def features(target, tokens: list[int]) -> mx.array:
    _, h = target.model(mx.array([tokens]), None, return_hidden=True)
    return h[0]


def plain(target, prompt, n):
    return [t for ev in generate(target.model, prompt, GREEDY, n, set(), 512) if isinstance(ev, Step)
            for t in ev.emitted]


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_greedy_with_the_eagle_drafter_is_target_only(target, k):
    prompt = [3, 17, 9, 40, 2, 33]
    drafter = EagleDrafter(random_head(target), "eagle")
    events = list(generate(target.model, prompt, GREEDY, 30, set(), 512, 0, drafter, k))
    out = [t for ev in events if isinstance(ev, Step) for t in ev.emitted]
    assert out == plain(target, prompt, 30)
    assert any(ev.k > 0 for ev in events if isinstance(ev, Step))


def test_the_head_drafts_through_the_targets_penalties_and_bias(target):
    """With logits processors on, the head's row goes through them as the target's rows will
    (the window being the history and the drafts before it): a token biased away is never
    drafted, q is the processed distribution, and greedy drafts take the processed argmax."""
    prompt = [3, 17, 9, 40, 2, 33]
    head = random_head(target)

    def propose(params, k=3):
        drafter = EagleDrafter(head, "eagle")
        drafter.reset(prompt, features(target, prompt[:-1]))
        return drafter.propose(prompt, k, params, mx.random.key(0))

    favourite = propose(GREEDY).tokens.tolist()[0]
    banned = ((favourite, -100.0),)
    greedy = propose(SamplingParams(logit_bias=banned)).tokens.tolist()
    assert favourite not in greedy
    sampled = propose(SamplingParams(temperature=1.0, logit_bias=banned, presence_penalty=2.0), k=4)
    assert favourite not in sampled.tokens.tolist() and float(sampled.q[:, favourite].max()) == 0.0
    # the second draft's q carries the presence penalty on the first draft (and on the history)
    drafter = EagleDrafter(head, "eagle")
    drafter.reset(prompt, features(target, prompt[:-1]))
    plain_q = drafter.propose(prompt, 2, SamplingParams(temperature=1.0), mx.random.key(0)).q
    drafter.reset(prompt, features(target, prompt[:-1]))
    penal_q = drafter.propose(prompt, 2, SamplingParams(temperature=1.0, presence_penalty=2.0), mx.random.key(0)).q
    seen = 40  # in the prompt and in the head's vocabulary (even ids)
    assert float(penal_q[0, seen]) < float(plain_q[0, seen])


@settings(max_examples=25, deadline=None)
@given(prompt=st.lists(st.integers(1, VOCAB - 1), min_size=2, max_size=8),
       rounds=st.lists(st.tuples(st.integers(0, 5), st.floats(0, 1), st.integers(1, VOCAB - 1)), min_size=1, max_size=4))
def test_feature_and_cache_rollback_under_any_accept_pattern(target, prompt, rounds):
    """After any sequence of proposals and accept patterns, the head's next first-draft logits
    equal a fresh run over the committed history with the target's real features."""
    head = random_head(target)
    d = EagleDrafter(head, "eagle")
    d.reset(prompt, features(target, prompt[:-1]))
    history = list(prompt)
    key = mx.random.key(0)
    for k, frac, nxt in rounds:
        drafted = d.propose(history, k, GREEDY, key).tokens.tolist()
        n = round(frac * len(drafted))
        # what the target would hand back: its features of the last committed token and the kept drafts
        kept = history + drafted[:n]
        hidden = features(target, kept)[len(history) - 1:]
        d.commit(Commit(drafted, n, nxt, hidden))
        history = kept + [nxt]
        ours = d.propose(history, 1, GREEDY, key)
        feats = features(target, history[:-1])
        _, z = head(feats[None], mx.array([history[1:]]))
        assert ours.tokens.item() == head.vocab_ids[mx.argmax(z[0, -1])].item()
        d.commit(Commit(ours.tokens.tolist(), 0, nxt, features(target, history)[-1:]))
        history = history + [nxt]


def test_training_unroll_matches_what_drafting_computes(target):
    """Step j of the unrolled training pass at slot t is the head's j-th draft from anchor t-j+1."""
    head = random_head(target)
    seq = [4, 9, 13, 21, 2, 7, 30, 11, 5, 19]
    feats = features(target, seq)
    outs = unroll(head, feats[None, :-1], mx.array([seq[1:]]), 3)
    for anchor in range(1, 6):  # the drafter has committed seq[:anchor+1], features of seq[:anchor]
        cache = head.make_cache()
        pred, z = head(feats[None, :anchor], mx.array([seq[1 : anchor + 1]]), cache)
        for j in range(3):
            slot = anchor - 1 + j
            np.testing.assert_allclose(np.array(z[0, -1]), np.array(head.lm_head(outs[j][0, slot])), rtol=2e-4, atol=2e-4)
            # teacher-forced: the next input token is the data's, as in training
            pred, z = head(pred[:, -1:], mx.array([[seq[slot + 2]]]), cache)


def test_chain_expected_length_matches_a_loop():
    rng = np.random.default_rng(0)
    acc = [rng.uniform(size=(2, 7)) for _ in range(3)]
    got = np.array(chain_expected_length([mx.array(a) for a in acc]))
    for b in range(2):
        for u in range(7):
            want, run = 0.0, 1.0
            for j in range(3):
                run *= acc[j][b, u + j] if u + j < 7 else 0.0
                want += run
            assert got[b, u] == pytest.approx(want, rel=1e-5)


def tiny_features(target, sequences: int = 10, length: int = 24, seed: int = 0) -> FeatureSet:
    rng = np.random.default_rng(seed)
    parts = []
    for _ in range(sequences):
        seq = rng.integers(1, VOCAB, size=length).tolist()
        logits, h = target.model(mx.array([seq]), None, return_hidden=True)
        parts.append(FeatureSet(np.array(seq, np.int32), np.array(h[0].astype(mx.float16)),
                                np.array(mx.logsumexp(logits[0], axis=-1)),
                                np.array(mx.argmax(logits[0], axis=-1)).astype(np.int32),
                                np.array([length]), np.array([6]), ["test"]))
    return FeatureSet.concat(parts, {})


@pytest.mark.parametrize("loss", ["kl", "eal", "wtv"])
def test_quick_training_improves_its_objective(target, tmp_path, loss):
    data = tiny_features(target)
    head = new_head(target, mx.array(sorted(HEAD_IDS)))
    rows = target.model.model.embed_tokens.weight[head.vocab_ids]
    cfg = EagleTrainConfig(loss=loss, steps=30, batch=4, context=20, k=3, lr=3e-3, warmup=2, kl_anneal=0.3)
    col_of = np.full(VOCAB, -1, np.int32)
    col_of[np.array(head.vocab_ids)] = np.arange(len(HEAD_IDS))

    def objective() -> float:
        b = make_batch(data, np.arange(10), 20, np.random.default_rng(1), col_of)
        b["teacher_rows"] = rows
        _, kl, feat, first, chain = objectives(head, b, cfg, 1.0)
        return {"kl": kl.item(), "eal": -chain.item(), "wtv": -chain.item()}[loss] + feat.item()

    before = objective()
    train_head(head, data, rows, cfg, tmp_path / "run")
    assert objective() < before


def test_resume_is_exact(target, tmp_path):
    data = tiny_features(target)
    ids = mx.array(sorted(HEAD_IDS))
    rows = target.model.model.embed_tokens.weight[ids]
    cfg = EagleTrainConfig(steps=6, batch=2, context=16, k=2, checkpoint_every=3)
    whole = new_head(target, ids)
    train_head(whole, data, rows, cfg, tmp_path / "whole")
    with pytest.raises(StopTraining):  # interrupted right after the step-3 checkpoint
        train_head(new_head(target, ids), data, rows, cfg, tmp_path / "cut", on_step=stop_after(3))
    resumed = new_head(target, ids)
    history = train_head(resumed, data, rows, cfg, tmp_path / "cut", resume=True)
    assert [h.step for h in history] == [1, 2, 3, 4, 5, 6]
    for (k, a), (_, b) in zip(_flat(whole), _flat(resumed)):
        np.testing.assert_array_equal(np.array(a), np.array(b), err_msg=k)
    # The card's time counts the steps run before the interruption too, not only the last run's.
    assert all(h.seconds > 0 for h in history)
    minute = [replace(h, seconds=60.0) for h in history]
    assert time_spent(minute, 30.0) == "6.0 min of training steps in all, 0.5 min for the last run with its data"


# ----------------------------------------------------------------------------- training on torch


def torch_twin_target(target):
    torch = pytest.importorskip("torch", reason="the torch extra is not installed")
    from mlxspec.torchpath.model import Llama as TorchLlama

    return torch, TorchLlama.from_mlx(target.model)


@pytest.mark.parametrize("loss, lam, min_p, fit_top", [
    ("kl", 1.0, 0.0, 0), ("eal", 0.4, 0.0, 0), ("eal", 0.0, 0.0, 0), ("wtv", 0.7, 0.0, 0), ("wtv", 0.0, 0.0, 0),
    ("wtv", 0.0, 0.1, 0), ("wtv", 0.7, 0.3, 0), ("wtv", 0.0, 0.0, 3), ("eal", 0.0, 0.0, 2), ("wtv", 0.2, 0.1, 3)])
@pytest.mark.parametrize("temp", [1.0, 0.6])
def test_torch_objectives_and_gradients_equal_mlx(target, loss, lam, min_p, fit_top, temp):
    """The torch trainer optimises the same function: every objective and every parameter's
    gradient equal MLX's on the same batch, for each loss, blend weight, temperature, teacher
    filter and fit mask."""
    from mlxspec.torchpath.model import EagleHead as TorchHead

    torch, tt = torch_twin_target(target)
    head = random_head(target, seed=3)
    rows = target.model.model.embed_tokens.weight[head.vocab_ids]
    col_of = np.full(VOCAB, -1, np.int32)
    col_of[np.array(head.vocab_ids)] = np.arange(len(HEAD_IDS))
    batch = make_batch(tiny_features(target), np.arange(4), 20, np.random.default_rng(2), col_of)
    batch["teacher_rows"] = rows
    cfg = EagleTrainConfig(loss=loss, k=3, temp=temp, min_p=min_p, fit_top=fit_top, batch=4, context=20)
    assert_torch_objectives_equal_mlx(head, TorchHead.from_mlx(head, tt).float().requires_grad_(True), batch, cfg, lam)


def test_a_min_p_teacher_is_for_wtv_and_changes_what_it_scores(target):
    """--min-p filters wtv's teacher only, within [0, 1); filtered, the first-draft overlap it
    reports is another number than the whole teacher's."""
    with pytest.raises(MlxspecError, match="--min-p"):
        EagleTrainConfig(loss="eal", min_p=0.1).validate()
    with pytest.raises(MlxspecError, match="--min-p"):
        EagleTrainConfig(loss="wtv", min_p=1.0).validate()
    with pytest.raises(MlxspecError, match="--fit-top"):
        EagleTrainConfig(loss="kl", fit_top=3).validate()
    head = random_head(target, seed=3)
    col_of = np.full(VOCAB, -1, np.int32)
    col_of[np.array(head.vocab_ids)] = np.arange(len(HEAD_IDS))
    batch = make_batch(tiny_features(target), np.arange(4), 20, np.random.default_rng(2), col_of)
    batch["teacher_rows"] = target.model.model.embed_tokens.weight[head.vocab_ids]
    firsts = [objectives(head, batch, EagleTrainConfig(loss="wtv", k=3, min_p=m, batch=4, context=20), 0.0)[3].item()
              for m in (0.0, 0.2)]
    assert 0.0 < firsts[0] < 1.0 and 0.0 < firsts[1] < 1.0 and abs(firsts[0] - firsts[1]) > 1e-3, firsts


def test_torch_training_improves_its_objective_and_resumes_exactly(target, tmp_path):
    torch, tt = torch_twin_target(target)
    from mlxspec.training.torch_train import TorchStepper

    data = tiny_features(target)
    ids = mx.array(sorted(HEAD_IDS))
    rows = target.model.model.embed_tokens.weight[ids]
    cfg = EagleTrainConfig(loss="eal", steps=6, batch=2, context=16, k=2, lr=3e-3, warmup=1, checkpoint_every=3)
    def run(head, out, **kw):
        return train_head(head, data, rows, cfg, out, stepper=TorchStepper(head, cfg, tt), **kw)

    whole = new_head(target, ids)
    history = run(whole, tmp_path / "whole")
    assert history[-1].loss < history[0].loss
    with pytest.raises(StopTraining):
        run(new_head(target, ids), tmp_path / "cut", on_step=stop_after(3))
    with pytest.raises(MlxspecError, match="trained on torch, not mlx"):
        train_head(new_head(target, ids), data, rows, cfg, tmp_path / "cut", resume=True)
    resumed = new_head(target, ids)
    history = run(resumed, tmp_path / "cut", resume=True)
    assert [h.step for h in history] == [1, 2, 3, 4, 5, 6]
    for (k, a), (_, b) in zip(_flat(whole), _flat(resumed)):
        np.testing.assert_array_equal(np.array(a), np.array(b), err_msg=k)
    saved = load_head(tmp_path / "whole" / "checkpoint", target)  # what it saved is what it trained
    for (k, a), (_, b) in zip(_flat(whole), _flat(saved)):
        np.testing.assert_array_equal(np.array(a), np.array(b), err_msg=k)


def test_save_and_load_round_trip(target, tmp_path):
    head = random_head(target)
    save_head(head, tmp_path / "h", dtype="float32")
    again = load_head(tmp_path / "h", target)
    f = features(target, [1, 2, 3])
    a, b = head(f[None], mx.array([[2, 3, 4]])), again(f[None], mx.array([[2, 3, 4]]))
    np.testing.assert_allclose(np.array(a[1]), np.array(b[1]), rtol=1e-6)


def test_a_wider_head_starts_as_the_identity_and_round_trips(target, tmp_path):
    """``intermediate_size`` widens only the block's MLP: the fresh head still predicts
    f_{t+1} = f_t, the folder records the width, and loading rebuilds it."""
    ids = mx.array(sorted(HEAD_IDS))
    wide = new_head(target, ids, intermediate_size=3 * target.config.intermediate_size)
    assert wide.block.mlp.gate_proj.weight.shape[0] == 3 * target.config.intermediate_size
    f = features(target, [1, 2, 3])
    pred, _ = wide(f[None], mx.array([[2, 3, 4]]))
    np.testing.assert_allclose(np.array(pred[0]), np.array(f), rtol=1e-5, atol=1e-5)
    wide = randomised(wide)
    again = load_head(save_head(wide, tmp_path / "w", dtype="float32"), target)
    assert again.cfg.intermediate_size == 3 * target.config.intermediate_size
    a, b = wide(f[None], mx.array([[2, 3, 4]])), again(f[None], mx.array([[2, 3, 4]]))
    np.testing.assert_allclose(np.array(a[1]), np.array(b[1]), rtol=1e-6)
    with pytest.raises(MlxspecError, match="MLP width must be >= 1, got 0"):
        new_head(target, ids, intermediate_size=0)


def test_a_head_for_another_target_is_refused_naming_both(target, tmp_path):
    save_head(random_head(target), tmp_path / "h", dtype="float32")
    other = tiny_target(vocab={f"w{i}": i for i in range(VOCAB)})
    other.name = "other"
    with pytest.raises(MlxspecError, match=r"different tokenizer than target 'other'"):
        load_head(tmp_path / "h", other)
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    cfg["head"]["hidden_size"] = 64
    (tmp_path / "h" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(MlxspecError, match=r"hidden size 64; 'tiny' has 64 and 32|vocabulary 64 and hidden size 64"):
        load_head(tmp_path / "h", target)


def test_corrupt_or_truncated_head_folders_are_clear_errors(target, tmp_path):
    path = save_head(random_head(target), tmp_path / "h", dtype="float32")
    weights = path / "head.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(MlxspecError, match="cannot read head.safetensors"):
        load_head(path, target)
    (path / "config.json").write_text("{not json")
    with pytest.raises(MlxspecError, match="not a readable mlxspec eagle head"):
        load_head(path, target)


def test_make_drafter_finds_an_eagle_folder(target, tmp_path):
    from mlxspec.targets.drafts import make_drafter

    path = save_head(random_head(target), tmp_path / "h", dtype="float32")
    d = make_drafter(str(path), target)
    assert isinstance(d, EagleDrafter) and d.wants_hidden


def test_dummy_path_is_not_an_eagle_folder(tmp_path: Path):
    from mlxspec.targets.folders import is_head_folder

    assert not is_head_folder(tmp_path)


# ----------------------------------------------------------------------------- on the real target


@pytest.fixture(scope="module")
def quick_eagle(tmp_path_factory):
    """`mlxspec train-draft --arch eagle --quick` on the real target (about two minutes), with
    the target's own answers to four corpus prompts in the data."""
    from typer.testing import CliRunner

    from mlxspec.cli import app

    out = tmp_path_factory.mktemp("eagle") / "head"
    r = CliRunner().invoke(app, ["train-draft", "--arch", "eagle", "--quick", "--loss", "eal", "--target-written", "4",
                                   "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    return out, json.loads(r.stdout)


@pytest.mark.model
def test_quick_eagle_training_improves_acceptance_and_writes_a_card(quick_eagle):
    from mlxspec.training.eagle_train import corpus_examples

    out, summary = quick_eagle
    history = summary["history"]
    first = np.mean([h["accept_1"] for h in history[:5]])
    last = np.mean([h["accept_1"] for h in history[-5:]])
    assert last > first
    card = (out / "README.md").read_text()
    assert (out / "head.safetensors").is_file() and "Reproduce: `mlxspec train-draft --arch eagle" in card
    assert "--target-written 4" in card
    written = {c: n for c, n in summary["data"]["tokens_per_category"].items() if c.endswith(" (target)")}
    # the target answered the corpus's first 4 prompts, one category each in turn: as many
    # categories as the sources present have (3 on a machine without the optional Debian text)
    first_four = {f"{e.category} (target)" for e in corpus_examples(2, 0)[0][:4]}
    assert set(written) == first_four and all(n > 0 for n in written.values())


@pytest.mark.model
def test_greedy_with_the_trained_head_on_the_real_model_is_target_only(quick_eagle, lm):
    from mlxspec.targets.drafts import make_drafter
    from mlxspec.targets.tokenizer import encode_prompt

    out, _ = quick_eagle
    ids = encode_prompt(lm.tokenizer, "Name three rivers in Europe.")
    stop = set(lm.tokenizer.eos_token_ids)
    want = [t for ev in generate(lm.model, ids, GREEDY, 24, stop, lm.context_length) if isinstance(ev, Step)
            for t in ev.emitted]
    for k in (1, 4, 8):
        drafter = make_drafter(str(out), lm)
        got = [t for ev in generate(lm.model, ids, GREEDY, 24, stop, lm.context_length, 0, drafter, k)
               if isinstance(ev, Step) for t in ev.emitted]
        assert got == want, k


@pytest.mark.model
def test_cli_bad_heads_and_arch_are_one_line_errors(quick_eagle, tmp_path):
    import shutil

    from typer.testing import CliRunner

    from mlxspec.cli import app
    from mlxspec.training.eagle_train import corpus_examples

    out, _ = quick_eagle
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    (broken / "head.safetensors").write_bytes((broken / "head.safetensors").read_bytes()[:64])
    r = CliRunner().invoke(app, ["generate", "hi", "-n", "4", "--draft", str(broken), "--k", "2"])
    assert r.exit_code == 2 and r.output.count("error:") == 1 and "cannot read head.safetensors" in r.output
    r = CliRunner().invoke(app, ["train-draft", "--arch", "medusa", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "unknown --arch 'medusa'" in r.output
    r = CliRunner().invoke(app, ["train-draft", "--arch", "eagle", "--quick", "--target-written", "1000",
                                 "--out", str(tmp_path / "y")])
    # --quick takes 2 examples a category; how many prompts that makes depends on the sources present
    prompts = len(corpus_examples(2, 0)[0])
    assert 0 < 2 * prompts < 1000  # each prompt can be answered twice
    assert r.exit_code == 2 and r.output.count("error:") == 1 and f"the corpus has {prompts} prompts" in r.output
    assert "answered at most twice" in r.output
    r = CliRunner().invoke(app, ["train-draft", "--target-written", "5", "--out", str(tmp_path / "z")])
    assert r.exit_code == 2 and "--target-written is for --arch eagle" in r.output


def test_feature_shards_are_shared_by_sets_with_a_common_prefix(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from mlxspec.training import features

    built = []

    def fake_shard(target, chunk, max_tokens, batch, taps=()):
        built.append([e.prompt for e in chunk])
        n = len(chunk)
        return features.FeatureSet(np.arange(2 * n, dtype=np.int32), np.zeros((2 * n, 4), np.float16),
                                   np.zeros(2 * n, np.float32), np.zeros(2 * n, np.int32), np.full(n, 2),
                                   np.ones(n, np.int64), [e.category for e in chunk])

    monkeypatch.setattr(features, "_build_shard", fake_shard)
    monkeypatch.setattr(features, "SHARD", 2)
    examples = [SimpleNamespace(category="c", prompt=f"p{i}", response="r") for i in range(5)]
    target = SimpleNamespace(name="t")
    small = features.build(target, examples[:3], tmp_path)
    assert built == [["p0", "p1"], ["p2"]] and len(small.lengths) == 3
    built.clear()
    large = features.build(target, examples, tmp_path)
    # the [p0, p1] shard is reused; [p2] alone was a different chunk from [p2, p3]
    assert built == [["p2", "p3"], ["p4"]] and len(large.lengths) == 5
    built.clear()
    assert len(features.build(target, examples, tmp_path).lengths) == 5 and built == []


def test_gathered_shards_equal_the_shards_concatenated(tmp_path):
    """``FeatureSet.gather`` (one shard at a time into arrays allocated once) is the set that
    loading every shard and concatenating gives, tapped states included; a set without them
    in the mix keeps none."""
    from mlxspec.training.features import FeatureSet

    rng = np.random.default_rng(0)

    def shard(n_examples: int, aux: bool) -> FeatureSet:
        lengths = rng.integers(3, 9, n_examples)
        n = int(lengths.sum())
        return FeatureSet(rng.integers(0, 99, n).astype(np.int32), rng.standard_normal((n, 4)).astype(np.float16),
                          rng.standard_normal(n).astype(np.float32), rng.integers(0, 99, n).astype(np.int32),
                          lengths, rng.integers(0, 3, n_examples), [f"c{i}" for i in range(n_examples)], {},
                          rng.standard_normal((n, 8)).astype(np.float16) if aux else None)

    parts = [shard(3, True), shard(1, True), shard(4, True)]
    paths = [p.save(tmp_path / f"{i}.npz") for i, p in enumerate(parts)]
    got, want = FeatureSet.gather(paths, {"k": 1}), FeatureSet.concat(parts, {"k": 1})
    for f in ("tokens", "features", "lse", "argmax", "lengths", "response_start", "aux"):
        a, b = getattr(got, f), getattr(want, f)
        assert a.dtype == b.dtype and np.array_equal(a, b), f
    assert got.categories == want.categories and got.meta == {"k": 1}
    untapped = shard(2, False).save(tmp_path / "plain.npz")
    assert FeatureSet.gather([*paths, untapped], {}).aux is None
    with pytest.raises(MlxspecError, match="not a feature set"):
        FeatureSet.gather([tmp_path / "missing.npz"], {})


def test_target_written_past_the_corpus_answers_its_first_prompts_again(monkeypatch):
    """--target-written N > the corpus's P prompts: every prompt answered once, then the first
    N - P again in the other regime; progress counts the N answers as one task."""
    from types import SimpleNamespace

    from mlxspec.training import eagle_train

    class Stop(Exception):
        pass

    examples = [f"prompt {i}" for i in range(5)]
    calls, seen = [], []
    monkeypatch.setattr(eagle_train, "corpus_examples", lambda per_category, seed: (examples, {}))
    monkeypatch.setattr(eagle_train, "build_shards", lambda target, rows, *a, **k: [])
    monkeypatch.setattr(eagle_train, "set_meta", lambda *a: {"key": "k"})

    def answers(target, part, cache, progress, flipped, **kw):
        calls.append((list(part), flipped))
        if progress:
            progress(len(part), len(part))
        return [f"answer to {p}" for p in part]

    monkeypatch.setattr(eagle_train, "written_examples", answers)
    monkeypatch.setattr(eagle_train.FeatureSet, "gather", lambda paths, meta: (_ for _ in ()).throw(Stop()))
    progress = lambda what, i, n: seen.append((what, i, n))  # noqa: E731
    with pytest.raises(Stop):
        eagle_train.prepare_features(SimpleNamespace(name="t"), 1, None, 0, 64, target_written=7, progress=progress)
    assert calls == [(examples, False), (examples[:2], True)]
    assert [x for x in seen if x[0] == "target answers"] == [("target answers", 5, 7), ("target answers", 7, 7)]
    calls.clear()
    with pytest.raises(Stop):
        eagle_train.prepare_features(SimpleNamespace(name="t"), 1, None, 0, 64, target_written=3)
    assert calls == [(examples[:3], False)]  # within the corpus: no second answers
    with pytest.raises(MlxspecError, match="answered at most twice"):
        eagle_train.prepare_features(SimpleNamespace(name="t"), 1, None, 0, 64, target_written=11)
