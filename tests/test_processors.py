"""Logits processors (repetition, presence and frequency penalties, logit bias) and reported
log-probabilities: ``core/processors.py`` and its torch mirror.

Their definitions are held against a float64 reference written from the definitions and against
mlx-lm's own processors. Under speculation each row of a verify pass must be processed with its
own prefix, so: greedy speculative decoding equals target-only (chains and trees, with the target
itself drafting so that most drafts are accepted and the penalties act on drafted positions), and
the exact joint distribution at T = 1 of the first tokens equals target-only's (tests/exact.py
enumerates the engine's random choices). A power check breaks the per-row prefixes on purpose.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from exact import (EXACT_TV, EXACT_VOCAB, NUM_TOKENS, PROMPT, engine_distribution, exact_llama, target_joint,
                   tree_engine_distribution, tv)
from mlx_lm.sample_utils import make_logits_processors
from tiny import lively_target

import mlxspec  # noqa: F401  (loads the fast BLAS before mlx runs anything)
from mlxspec.core import engine
from mlxspec.core.drafters import ModelDrafter
from mlxspec.core.engine import generate
from mlxspec.core.events import Step
from mlxspec.core.processors import prefix_tails, process_logits
from mlxspec.core.sampling import SamplingParams
from mlxspec.core.tree import ancestry, parse_tree
from mlxspec.errors import MlxspecError

# Each control strong enough to change choices on the tiny models, with windows shorter than the
# continuations so that tokens also leave them.
CONTROLS = {
    "repetition": dict(repetition_penalty=1.8, repetition_context_size=4),
    "presence": dict(presence_penalty=1.2, presence_context_size=5),
    "frequency": dict(frequency_penalty=0.8, frequency_context_size=6),
    "bias": dict(logit_bias=((1, 1.5), (2, -2.0))),
    "all": dict(repetition_penalty=1.3, repetition_context_size=3, presence_penalty=-0.5, frequency_penalty=0.6,
                frequency_context_size=7, logit_bias=((0, 0.7),)),
}
# On the 64-token tiny target the bias goes on tokens its greedy continuation uses.
GREEDY_BIAS = dict(logit_bias=((42, -1.5), (28, 1.0)))


def reference(row: np.ndarray, prefix: list[int], params: SamplingParams) -> np.ndarray:
    """The processed logits after ``prefix``, float64, written from the definitions (mlx-lm's
    order: bias, repetition, presence, frequency)."""
    row = np.array(row, np.float64)
    for tok, bias in params.logit_bias:
        row[tok] += bias
    if params.repetition_penalty != 1:
        pen = params.repetition_penalty
        for tok in set(prefix[-params.repetition_context_size:]):
            row[tok] = row[tok] * pen if row[tok] < 0 else row[tok] / pen
    if params.presence_penalty != 0:
        for tok in set(prefix[-params.presence_context_size:]):
            row[tok] -= params.presence_penalty
    if params.frequency_penalty != 0:
        for tok in prefix[-params.frequency_context_size:]:
            row[tok] -= params.frequency_penalty
    return row


def log_softmax(x: np.ndarray) -> np.ndarray:
    return x - (np.log(np.exp(x - x.max(axis=-1, keepdims=True)).sum(axis=-1, keepdims=True)) + x.max(axis=-1, keepdims=True))


def row_prefixes(history: list[int], drafted: list[int], parents: tuple[int, ...]) -> list[list[int]]:
    anc = ancestry(parents)
    return [history] + [history + [drafted[j] for j in np.flatnonzero(anc[i])] for i in range(len(parents))]


# ----------------------------------------------------------------------------- the definitions


@pytest.mark.parametrize("name", sorted(CONTROLS))
@pytest.mark.parametrize("seed", range(4))
def test_every_row_is_processed_with_its_own_prefix(name, seed):
    """A random tree over a random history: each row of ``process_logits`` equals the reference
    after that row's prefix (the history, then the node's ancestors and the node)."""
    rng = np.random.default_rng(seed)
    params = SamplingParams(**CONTROLS[name])
    history = rng.integers(0, 8, size=int(rng.integers(1, 9))).tolist()  # short ones too: padded windows
    parents = (-1, 0, 0, 1, 3, -1, 5)[: int(rng.integers(1, 8))]
    drafted = rng.integers(0, 8, size=len(parents)).tolist()
    logits = rng.normal(size=(len(parents) + 1, 12)).astype(np.float32) * 3
    tails, real = prefix_tails(history, drafted, parents, params.window)
    got = np.array(process_logits(mx.array(logits), mx.array(tails), mx.array(real), params))
    for row, prefix, out in zip(logits, row_prefixes(history, drafted, parents), got):
        np.testing.assert_allclose(out, reference(row, prefix, params), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_torch_processes_as_mlx(name):
    torch = pytest.importorskip("torch")
    from mlxspec.torchpath.processors import process_logits as torch_process

    rng = np.random.default_rng(1)
    params = SamplingParams(**CONTROLS[name])
    history, drafted, parents = [3, 1, 1, 4, 2], [1, 5, 1], (-1, 0, 0)
    logits = rng.normal(size=(4, 12)).astype(np.float32) * 3
    tails, real = prefix_tails(history, drafted, parents, params.window)
    got = torch_process(torch.from_numpy(logits), torch.from_numpy(tails), torch.from_numpy(real), params).numpy()
    for row, prefix, out in zip(logits, row_prefixes(history, drafted, parents), got):
        np.testing.assert_allclose(out, reference(row, prefix, params), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_definitions_are_mlx_lms(name):
    """mlx-lm's processors over the same prefix give the same row."""
    c = SamplingParams(**CONTROLS[name])
    procs = make_logits_processors(dict(c.logit_bias) or None, c.repetition_penalty, c.repetition_context_size,
                                   c.presence_penalty, c.presence_context_size, c.frequency_penalty,
                                   c.frequency_context_size)
    prefix = [3, 1, 1, 4, 2, 1, 5, 3, 3, 0]
    logits = np.random.default_rng(2).normal(size=(1, 12)).astype(np.float32) * 3
    row, want = mx.array(logits), mx.array(logits)  # apart: mlx-lm's processors write into their input
    for proc in procs:
        want = proc(mx.array(prefix), want)
    tails, _ = prefix_tails(prefix, [], None, c.window)
    np.testing.assert_allclose(np.array(process_logits(row, mx.array(tails), None, c)), np.array(want), rtol=1e-6)


def test_bad_values_are_refused():
    for kw, msg in [(dict(repetition_penalty=0.0), "repetition penalty"), (dict(presence_penalty=2.5), "presence"),
                    (dict(frequency_penalty=float("nan")), "frequency"), (dict(presence_context_size=0), "context size"),
                    (dict(logit_bias=((3, 101.0),)), "logit bias"), (dict(logit_bias=((3, 1.0), (3, 2.0))), "distinct"),
                    (dict(logit_bias=((-1, 1.0),)), "distinct and >= 0")]:
        with pytest.raises(MlxspecError, match=msg):
            SamplingParams(**kw)
    assert not SamplingParams(temperature=0.5, top_k=3).processes
    assert SamplingParams(presence_penalty=0.1).processes and SamplingParams(logit_bias=((1, 0.0),)).processes


def test_a_bias_outside_the_vocabulary_is_one_error():
    t = lively_target(3)
    for drafter in (None, ModelDrafter(t.model, "self")):
        with pytest.raises(MlxspecError, match="token id 64 is outside the vocabulary"):
            list(generate(t.model, [5, 9], SamplingParams(logit_bias=((64, 1.0),)), 4, set(), 64, 0, drafter))


# ----------------------------------------------------------------------------- greedy: speculative == target-only


def emitted(events, field: str = "id") -> list:
    return [getattr(t, field) for ev in events if isinstance(ev, Step) for t in ev.tokens if t.emitted]


PROMPT64 = [5, 9, 12, 5, 9]


@pytest.mark.parametrize("name", sorted(CONTROLS))
@pytest.mark.parametrize("tree", [None, "3x2"])
def test_greedy_speculation_is_target_only(name, tree):
    t = lively_target(3)
    params = SamplingParams(**(GREEDY_BIAS if name == "bias" else CONTROLS[name]))

    def run(drafter):
        return list(generate(t.model, PROMPT64, params, 30, set(), 256, 0, drafter, 4,
                             tree=parse_tree(tree) if tree else None))

    plain, spec = run(None), run(ModelDrafter(t.model, "self"))
    assert emitted(spec) == emitted(plain)
    assert emitted(plain) != emitted(list(generate(t.model, PROMPT64, SamplingParams(), 30, set(), 256)))  # it acts
    assert sum(ev.accepted for ev in spec if isinstance(ev, Step)) >= 6  # on drafted positions too


def test_plain_decoding_follows_the_reference_row_by_row():
    """Target-only decoding (its pipelined path) picks the argmax of the reference rows, and
    reports their log-softmax, at every position, as the window fills and then slides."""
    t = lively_target(3)
    params = SamplingParams(**CONTROLS["all"])
    events = list(generate(t.model, PROMPT64, params, 24, set(), 256, logprobs=2))
    ids, lps = emitted(events), emitted(events, "logprob")
    seq = PROMPT64 + ids
    logits = np.array(t.model(mx.array([seq]), t.model.make_cache())[0], np.float64)
    for i, tok in enumerate(ids):
        pos = len(PROMPT64) - 1 + i
        ref = log_softmax(reference(logits[pos], seq[: pos + 1], params))
        assert tok == int(np.argmax(ref))
        assert lps[i] == pytest.approx(ref[tok], abs=1e-4)


# ----------------------------------------------------------------------------- exact joint at T = 1


def reference_joint(target, params: SamplingParams) -> np.ndarray:
    def next_probs(seqs):
        logits = np.array(target(mx.array(seqs, dtype=mx.int32), target.make_cache())[:, -1], np.float64)
        rows = np.stack([reference(row, seq, params) for row, seq in zip(logits, seqs)]) / params.temperature
        return np.exp(log_softmax(rows))

    return target_joint(next_probs, PROMPT, EXACT_VOCAB, NUM_TOKENS)


@pytest.fixture(scope="module")
def exact_pair():
    return exact_llama(0), exact_llama(1)


@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_chain_speculation_samples_the_processed_target_exactly(exact_pair, name, monkeypatch):
    target, draft = exact_pair
    params = SamplingParams(temperature=1.0, **CONTROLS[name])

    def run():
        return generate(target, PROMPT, params, 3, set(), 64, 0, ModelDrafter(draft, "tiny"), 2)

    e = engine_distribution(run, NUM_TOKENS, EXACT_VOCAB, monkeypatch)
    ref = reference_joint(target, params)
    assert abs(e.total - 1) < 1e-6 and 0.1 < e.acceptance < 0.9
    assert tv(e.joint, ref) < EXACT_TV
    assert tv(ref, reference_joint(target, SamplingParams(temperature=1.0))) > 0.02  # the control matters


@pytest.mark.parametrize("name", ["frequency", "all"])
def test_tree_speculation_samples_the_processed_target_exactly(exact_pair, name, monkeypatch):
    target, draft = exact_pair
    params = SamplingParams(temperature=1.0, **CONTROLS[name])

    def run():
        return generate(target, PROMPT, params, 12, set(), 64, 0, ModelDrafter(draft, "draft"), 4,
                        tree=parse_tree("2x2"))

    joint, side = tree_engine_distribution(run, NUM_TOKENS, monkeypatch)
    assert tv(joint, reference_joint(target, params)) < EXACT_TV
    assert side > 0.1  # second branches were accepted, with their own prefixes


def test_the_exact_check_sees_rows_processed_with_the_wrong_prefix(exact_pair, monkeypatch):
    """Power: processing every row of a pass with the committed tokens only (as if drafts were
    not part of the prefix) shows in the joint."""
    target, draft = exact_pair
    params = SamplingParams(temperature=1.0, **CONTROLS["frequency"])
    real = engine.prefix_tails
    monkeypatch.setattr(engine, "prefix_tails", lambda h, d, p, w: real(h, [h[-1]] * len(d), p, w))

    def run():
        return generate(target, PROMPT, params, 3, set(), 64, 0, ModelDrafter(draft, "tiny"), 2)

    e = engine_distribution(run, NUM_TOKENS, EXACT_VOCAB, monkeypatch)
    assert tv(e.joint, reference_joint(target, params)) > 10 * EXACT_TV


def test_torch_speculation_samples_the_processed_target_exactly(exact_pair, monkeypatch):
    pytest.importorskip("torch")
    from exact import torch_engine_distribution

    from mlxspec.torchpath.model import Llama as TorchLlama

    target, draft = exact_pair
    params = SamplingParams(temperature=1.0, **CONTROLS["all"])
    torch_target, torch_draft = TorchLlama.from_mlx(target), TorchLlama.from_mlx(draft)

    def run():
        return generate(torch_target, PROMPT, params, 3, set(), 64, 0, ModelDrafter(torch_draft, "tiny"), 2)

    e = torch_engine_distribution(run, NUM_TOKENS, EXACT_VOCAB, monkeypatch)
    assert tv(e.joint, reference_joint(target, params)) < EXACT_TV


# ----------------------------------------------------------------------------- reported log-probabilities


@pytest.mark.parametrize("tree", [None, "3x2"])
def test_logprobs_are_the_targets_with_or_without_a_drafter(tree):
    """Greedy: the same tokens and log-probabilities (to float rounding: a verify pass batches
    rows) with a drafter as without; and they are a direct forward's log-softmax of the
    processed rows, with the top alternatives best first."""
    t = lively_target(3)
    params = SamplingParams(**CONTROLS["presence"])
    shape = parse_tree(tree) if tree else None
    plain = list(generate(t.model, PROMPT64, params, 20, set(), 256, logprobs=3))
    spec = list(generate(t.model, PROMPT64, params, 20, set(), 256, 0, ModelDrafter(t.model, "self"), 4,
                         tree=shape, logprobs=3))
    assert emitted(spec) == emitted(plain)
    np.testing.assert_allclose(emitted(spec, "logprob"), emitted(plain, "logprob"), atol=1e-4)
    seq = PROMPT64 + emitted(spec)
    logits = np.array(t.model(mx.array([seq]), t.model.make_cache())[0], np.float64)
    for i, (lp, top) in enumerate(zip(emitted(spec, "logprob"), emitted(spec, "top_logprobs"))):
        pos = len(PROMPT64) - 1 + i
        ref = log_softmax(reference(logits[pos], seq[: pos + 1], params))
        assert lp == pytest.approx(ref[seq[pos + 1]], abs=1e-4)
        assert [tok for tok, _ in top] == np.argsort(-ref)[:3].tolist()
        np.testing.assert_allclose([v for _, v in top], np.sort(ref)[::-1][:3], atol=1e-4)


def test_sampled_logprobs_are_reported_for_the_tokens_drawn():
    """At T > 0 the reported values are still the processed rows' log-softmax (before
    temperature and filters), for whatever was drawn, accepted draft or target token alike."""
    t = lively_target(3)
    params = SamplingParams(temperature=0.8, top_k=5, **CONTROLS["frequency"])
    drafter = ModelDrafter(t.model, "self:2", num_layers=2)  # not the target: some drafts are refused
    events = list(generate(t.model, PROMPT64, params, 20, set(), 256, 3, drafter, 3, logprobs=0))
    seq = PROMPT64 + emitted(events)
    logits = np.array(t.model(mx.array([seq]), t.model.make_cache())[0], np.float64)
    for i, (lp, top) in enumerate(zip(emitted(events, "logprob"), emitted(events, "top_logprobs"))):
        pos = len(PROMPT64) - 1 + i
        assert top is None
        assert lp == pytest.approx(log_softmax(reference(logits[pos], seq[: pos + 1], params))[seq[pos + 1]], abs=1e-4)
    rejected = [t for ev in events if isinstance(ev, Step) for t in ev.tokens if not t.emitted]
    assert rejected and all(t.logprob is None for t in rejected)  # a refused draft is not reported


def test_no_logprobs_unless_asked():
    t = lively_target(3)
    events = list(generate(t.model, PROMPT64, SamplingParams(), 6, set(), 256, 0, ModelDrafter(t.model, "self"), 3))
    assert all(tok.logprob is None and tok.top_logprobs is None
               for ev in events if isinstance(ev, Step) for tok in ev.tokens)


def test_torch_greedy_with_controls_is_target_only_and_reports_the_same_logprobs():
    pytest.importorskip("torch")
    from mlxspec.torchpath.model import Llama as TorchLlama

    t = lively_target(3)
    torch_target = TorchLlama.from_mlx(t.model)
    params = SamplingParams(**CONTROLS["all"])
    mlx_plain = list(generate(t.model, PROMPT64, params, 16, set(), 256, logprobs=2))
    plain = list(generate(torch_target, PROMPT64, params, 16, set(), 256, logprobs=2))
    spec = list(generate(torch_target, PROMPT64, params, 16, set(), 256, 0, ModelDrafter(torch_target, "self"), 3,
                         logprobs=2))
    assert emitted(plain) == emitted(spec) == emitted(mlx_plain)
    np.testing.assert_allclose(emitted(spec, "logprob"), emitted(mlx_plain, "logprob"), atol=1e-4)
    np.testing.assert_allclose(emitted(plain, "logprob"), emitted(mlx_plain, "logprob"), atol=1e-4)
    assert [[i for i, _ in top] for top in emitted(spec, "top_logprobs")] == \
        [[i for i, _ in top] for top in emitted(mlx_plain, "top_logprobs")]


@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_a_drafter_processes_its_own_draft_as_the_target_will(name):
    """The target drafting for itself (all its layers) with the processors applied along its own
    draft proposes exactly the target's greedy tokens: every draft is accepted, so its windows
    over drafted positions are the verify rows' windows."""
    t = lively_target(3)
    params = SamplingParams(**(GREEDY_BIAS if name == "bias" else CONTROLS[name]))
    steps = [ev for ev in generate(t.model, PROMPT64, params, 40, set(), 256, 0, ModelDrafter(t.model, "self"), 4)
             if isinstance(ev, Step)]
    assert sum(ev.k for ev in steps) > 20 and all(ev.accepted == ev.k for ev in steps)
