"""benchmarks/refusals.py's pure parts on tiny inputs worked by hand (buckets, the n-gram
continuation counter, step positions, slot alignment), and its one-pass teacher-forced
predictions against the model's own truncated and windowed passes on a tiny random target."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="the torch extra is not installed")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "refusals.py"


@pytest.fixture(scope="module")
def rf():
    spec = importlib.util.spec_from_file_location("_benchmark_refusals", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_buckets(rf):
    assert [rf.bucket_label(x) for x in (0, 159, 160, 319, 320, 639, 640, 10_000)] == [
        "0-159", "0-159", "160-319", "160-319", "320-639", "320-639", "640+", "640+"]
    assert rf.bucket_labels((10,)) == ["0-9", "10+"]
    got = rf.rates_by_bucket([(0, True), (159, False), (700, True), (700, True)])
    assert got == [rf.Rate("0-159", 2, 0.5), rf.Rate("160-319", 0, None), rf.Rate("320-639", 0, None),
                   rf.Rate("640+", 2, 1.0)]


def test_ngram_continuations_by_hand(rf):
    seq = [1, 2, 3, 1, 2, 4, 1, 2]
    F, T = False, True
    # n = 1 from t = 3: (3,) unseen; (1,) was followed by 2 (t=4: 2, hit); (2,) last followed by 3
    # (t=5 is 4: matched, wrong); (4,) unseen; (1,) last followed by 2 at t=4 (t=7 is 2: hit)
    assert rf.ngram_continuations(seq, 3, 1) == [(F, F), (T, T), (T, F), (F, F), (T, T)]
    # n = 2: only (1, 2) at t=5 recurs, followed before by 3
    assert rf.ngram_continuations(seq, 3, 2) == [(F, F), (F, F), (T, F), (F, F), (F, F)]
    # the most recent occurrence decides: (5,) was followed by 1, then by 2
    assert rf.ngram_continuations([5, 1, 5, 2, 5, 2], 5, 1) == [(T, T)]
    assert rf.ngram_continuations([5, 2, 5, 1, 5, 2], 5, 1) == [(T, F)]
    # positions without n tokens before them never match; overlapping occurrences count
    assert rf.ngram_continuations([7, 7, 7, 7], 0, 2) == [(F, F), (F, F), (F, F), (T, T)]


def brute_force(seq, start, n):
    out = []
    for t in range(start, len(seq)):
        if t < n:
            out.append((False, False))
            continue
        ctx = seq[t - n:t]
        js = [j for j in range(n, t) if seq[j - n:j] == ctx]
        out.append((bool(js), bool(js) and seq[max(js)] == seq[t]))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_ngram_continuations_equal_a_brute_force_search(rf, seed):
    rng = random.Random(seed)
    seq = [rng.randrange(3) for _ in range(rng.randrange(1, 40))]
    start = rng.randrange(len(seq) + 1)
    for n in (1, 2, 3, 4):
        assert rf.ngram_continuations(seq, start, n) == brute_force(seq, start, n)


def test_band_mask_and_step_positions(rf):
    np.testing.assert_array_equal(rf.band_mask(4, 2), np.array(
        [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]], bool))
    # a prefill step without drafts, then K = 1 steps emitting accepted + 1
    assert rf.step_positions(10, [(0, 0, 1), (1, 1, 2), (1, 0, 1), (1, 0, 1)]) == [(11, 1), (13, 0), (14, 0)]


def test_slots_line_up_with_the_sequence(rf):
    """Prompt [10, 11, 12], output [20, 21]: the target's token at t = 3 is its argmax at 2, the
    head's guess for it comes from slot 1; at t = 4 from argmax 3 and slot 2."""
    smp = rf.Sample(1, "qa", [10, 11, 12], [20, 21], [(0, 0, 1), (1, 0, 1)])
    tf = {"target": np.array([0, 0, 20, 21, 5]), "head": np.array([0, 20, 9, 0]),
          "head_top": np.array([[0, 1], [20, 2], [9, 21], [0, 1]]), "head_step2": np.array([0, 7, 21, 0]),
          "head_window": np.array([0, 9, 21, 0]), "self:2": np.array([0, 0, 20, 9, 0])}
    slots = rf.slots_of(0, smp, tf, {20}, [2])
    assert [(s.pos, s.in_vocab, s.head, s.head_top, s.head_step2, s.head_window, s.self_layers[2], s.engine)
            for s in slots] == [(3, True, True, True, False, False, True, None),
                                (4, False, False, True, True, True, False, False)]
    # no n-gram of the prompt recurs: lookup has nothing, the cascade is the head
    assert [s.ngram for s in slots] == [{2: (False, False), 3: (False, False)}] * 2
    row = rf.category_row("qa", slots, [2])
    assert (row.engine, row.teacher_forced, row.in_vocab, row.head_given_in_vocab, row.head_top,
            row.head_after_hit, row.head_step2_after_hit, row.self_layers, row.lookup_else_head) == (
        0.0, 0.5, 0.5, 1.0, 1.0, 0.0, 1.0, {"self:2": 0.5}, {"ngram:2": 0.5, "ngram:3": 0.5})


def test_lookup_and_head_combine(rf):
    def slot(head, matched, correct):
        return rf.Slot(0, "qa", 3, 3, True, head, head, head, head, {}, None, {2: (matched, correct), 3: (False, False)})

    # lookup right / head wrong (twice); lookup wrong / head right; no lookup, head right; neither
    slots = [slot(False, True, True), slot(True, True, False), slot(True, False, False), slot(False, False, False),
             slot(False, True, True)]
    row = rf.category_row("qa", slots, [])
    assert row.lookup_else_head == {"ngram:2": 0.6, "ngram:3": 0.4}  # ngram:3 never matches: the head alone
    assert row.head_or_lookup == {"ngram:2": 0.8, "ngram:3": 0.4}


def test_a_hit_after_a_hit_counts_consecutive_positions_of_one_prompt(rf):
    def slot(prompt, pos, hit):
        return rf.Slot(prompt, "qa", 3, pos, True, hit, hit, not hit, hit, {}, None)

    slots = [slot(0, 3, True), slot(0, 4, True), slot(0, 5, False), slot(0, 6, True),  # 3->4 hit, 4->5 miss
             slot(1, 7, True),  # another prompt: 6->7 is no pair
             slot(1, 9, True)]  # not consecutive
    assert rf.after_hits(slots) == [True, False]
    assert rf.after_hits(slots, "head_step2") == [False, True]


def test_teacher_forced_pass_equals_the_models_own_passes(rf, monkeypatch):
    """Every layer kept in one pass gives what a pass truncated to L layers gives; the head's
    windowed guesses are what it predicts over just the last ``WINDOW`` slots at their positions."""
    import torch
    from tiny import lively_target, random_head

    from mlxspec.torchpath.model import EagleHead as TorchHead
    from mlxspec.torchpath.model import Llama as TorchLlama

    target = lively_target(4)
    model = TorchLlama.from_mlx(target.model)
    head = TorchHead.from_mlx(random_head(target, seed=2), model)
    seq = [int(x) for x in np.random.default_rng(0).integers(0, 64, 12)]
    monkeypatch.setattr(rf, "WINDOW", 3)
    out = rf.teacher_forced(model, head, seq, [1, 2])
    late = rf.teacher_forced(model, head, seq, [1, 2], start=5)
    for key in ("self:1", "self:2", "target"):
        assert (late[key][:5] == -1).all()
        np.testing.assert_array_equal(late[key][5:], out[key][5:])
    tok = torch.tensor([seq])
    with torch.inference_mode():
        for L in (1, 2):
            np.testing.assert_array_equal(out[f"self:{L}"], model(tok, None, num_layers=L).argmax(-1)[0].numpy())
        logits, feat = model(tok, None, return_hidden=True)
        np.testing.assert_array_equal(out["target"], logits.argmax(-1)[0].numpy())
        _, z = head(feat[:, :-1], tok[:, 1:])
        np.testing.assert_array_equal(out["head"], head.vocab_ids[z.argmax(-1)[0]].numpy())
        np.testing.assert_array_equal(out["head_top"][:, 0], out["head"])
        best = np.sort(z[0].numpy(), axis=-1)[:, ::-1][:, :rf.TOP_K]  # the top-k logits, in order
        got = np.take_along_axis(z[0].numpy(), np.searchsorted(head.vocab_ids.numpy(), out["head_top"]), axis=-1)
        np.testing.assert_array_equal(got, best)
        windowed = []
        for i in range(len(seq) - 1):
            lo = max(0, i - 2)
            _, zi = head(feat[:, lo:i + 1], tok[:, lo + 1:i + 2], positions=torch.arange(lo, i + 1))
            windowed.append(int(head.vocab_ids[zi[0, -1].argmax()]))
        assert out["head_window"].tolist() == windowed
        # a second draft as the drafter makes it: real features up to slot u - 1, then the head's
        # own prediction of f_u at slot u
        second = []
        for u in range(1, len(seq) - 1):
            own = head.predict(feat[:, :u], tok[:, 1:u + 1])[:, -1:]
            _, zu = head(torch.cat([feat[:, :u], own], dim=1), tok[:, 1:u + 2])
            second.append(int(head.vocab_ids[zu[0, -1].argmax()]))
        assert out["head_step2"][1:].tolist() == second
        assert second != out["head"][1:].tolist(), "own and real features agree everywhere: the test is weak"
        assert out["head_window"].tolist() != out["head"].tolist(), "the window changed nothing: the test is weak"
