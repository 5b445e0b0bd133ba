"""The suffix drafter (``core/drafters/suffix.py``): its index on hand-built sequences, its memory
bound, greedy speculation equal to target-only decoding (chains and trees, across turns that
share the index) and the exact joint distribution at T=1 on a tiny model."""

from __future__ import annotations

import time

import numpy as np
import pytest
from exact import (
    EXACT_TV,
    EXACT_VOCAB,
    NUM_TOKENS,
    engine_distribution,
    exact_joint,
    exact_llama,
    ngram_prompt,
    tv,
)
from tiny import lively_target, tiny_target

from mlxspec.core.drafters import Commit
from mlxspec.core.drafters.suffix import SuffixDrafter, SuffixIndex
from mlxspec.core.engine import generate
from mlxspec.core.events import Step
from mlxspec.core.sampling import SamplingParams
from mlxspec.core.tree import parse_tree
from mlxspec.errors import MlxspecError
from mlxspec.targets.drafts import make_drafter

GREEDY = SamplingParams()


def tokens(p) -> list[int]:
    return p.tokens.tolist()


# ----------------------------------------------------------------------------- the index


def test_counts_every_context_of_min_n_to_n_tokens():
    idx = SuffixIndex(n=3, min_n=2)
    idx.restart([1, 2, 3, 1, 2, 4, 1, 2, 3])
    assert idx.following((1, 2)) == {4: 1, 3: 2}  # 3 seen last: re-inserted after 4
    assert idx.following((2, 3)) == {1: 1}
    assert idx.following((3, 1, 2)) == {4: 1}
    assert idx.following((1,)) == {} and idx.following((1, 2, 3, 1)) == {}
    assert idx.size == 9
    nxt, n = idx.lookup([7, 3, 1, 2])
    assert (nxt, n) == ({4: 1}, 3)  # the longest earlier match wins
    assert idx.lookup([9, 1, 2]) == ({4: 1, 3: 2}, 2)
    assert idx.lookup([5, 6]) == (None, 0)
    assert idx.ranked([9, 1, 2], 2) == [(3, 2 / 4), (4, 1 / 4)]  # count / (total + 1)


def test_ties_go_to_the_latest_continuation():
    idx = SuffixIndex(n=2)
    idx.restart([5, 6, 1, 5, 6, 2, 5, 6, 1, 5, 6, 2])
    assert idx.ranked([5, 6], 1)[0][0] == 2
    assert [t for t, _ in idx.ranked([5, 6], 2)] == [2, 1]


def test_chain_follows_the_most_frequent_continuation_and_rematches():
    d = SuffixDrafter(4, min_prob=0.0)
    d.remember([1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 9])
    d.reset([7, 1, 2])
    # after [1, 2]: 3 three times; after [1, 2, 3]: 4 twice, 9 once; then 5, 1, 2 ...
    assert tokens(d.propose([7, 1, 2], 6, GREEDY, None)) == [3, 4, 5, 1, 2, 3]


def test_chain_stops_where_the_estimated_acceptance_falls_below_min_prob():
    seen = [1, 2, 3, 4, 5, 6]  # one sighting: each token's estimate is 1/2
    for min_prob, want in ((0.6, []), (0.5, [3]), (0.25, [3, 4]), (0.12, [3, 4, 5])):
        d = SuffixDrafter(4, min_prob=min_prob)
        d.remember(seen)
        d.reset([9, 1, 2])
        assert tokens(d.propose([9, 1, 2], 5, GREEDY, None)) == want, min_prob
    d = SuffixDrafter(4, min_prob=0.5)
    for _ in range(4):  # seen often: confident much further
        d.remember(seen)
    d.reset([9, 1, 2])
    assert tokens(d.propose([9, 1, 2], 5, GREEDY, None)) == [3, 4, 5]  # (4/5)^3 = 0.51


def test_needs_two_tokens_of_context_by_default():
    d = SuffixDrafter(min_prob=0.0)
    d.reset([1, 2, 3, 1, 4, 9, 1])
    assert d.propose([1, 2, 3, 1, 4, 9, 1], 3, GREEDY, None).tokens.size == 0


def test_commit_extends_the_current_sequence():
    d = SuffixDrafter(3, min_prob=0.0)
    d.reset([1, 2, 3, 4, 1, 2])
    assert tokens(d.propose([1, 2, 3, 4, 1, 2], 2, GREEDY, None)) == [3, 4]
    d.commit(Commit([3, 4], 1, 8))  # kept 3, then the target said 8
    assert d.index.current.tokens == [1, 2, 3, 4, 1, 2, 3, 8]
    assert d.index.following((2, 3)) == {4: 1, 8: 1}
    d.commit(Commit([5, 6, 7], 2, 1, path=(0, 2)))  # a tree: nodes 0 and 2 accepted
    assert d.index.current.tokens[-3:] == [5, 7, 1]


def test_the_index_survives_reset_and_shares_a_conversations_prefix():
    d = SuffixDrafter(3, min_prob=0.0)
    turn1 = [1, 2, 3, 4, 5, 6]
    d.reset(turn1[:3])
    d.commit(Commit([4, 5], 2, 6))
    assert d.index.current.tokens == turn1
    # the next turn continues the conversation: its shared prefix is indexed once
    d.reset(turn1 + [7, 1, 2])
    assert d.index.size == 9 and not d.index.frozen
    assert d.index.following((1, 2)) == {3: 1}
    # a request sharing only a system prompt [1, 2, 3]: the rest of the conversation is kept
    # apart, nothing counted twice
    d.reset([1, 2, 3, 9, 9])
    assert d.index.size == 9 + 2 and len(d.index.frozen) == 1
    assert d.index.following((1, 2)) == {3: 1}
    assert d.index.following((2, 3)) == {4: 1, 9: 1}
    assert d.index.counts == recount(d.index)
    # an unrelated request: the previous one is kept whole
    d.reset([9, 8, 4, 5])
    assert d.index.size == 11 + 4 and len(d.index.frozen) == 2
    assert tokens(d.propose([9, 8, 4, 5], 2, GREEDY, None)) == [6, 7]
    assert d.index.counts == recount(d.index)


def test_a_caller_that_skips_reset_is_followed():
    d = SuffixDrafter(2, min_prob=0.0)
    assert tokens(d.propose([1, 2, 3, 1, 2], 1, GREEDY, None)) == [3]
    assert tokens(d.propose([4, 4, 1, 2], 1, GREEDY, None)) == [3]  # the old sequence is remembered


def recount(idx: SuffixIndex) -> dict:
    """The counts rebuilt from the sequences the index holds."""
    fresh = SuffixIndex(idx.n, idx.min_n, 10**9)
    for seq in [*idx.frozen, idx.current]:
        fresh._apply(seq.tokens, seq.start, len(seq.tokens), 1)
    return fresh.counts


def test_memory_bound_drops_the_oldest_first():
    rng = np.random.default_rng(0)
    d = SuffixDrafter(4, max_tokens=200, min_prob=0.0)
    old = [int(t) for t in rng.integers(0, 50, 150)]
    d.remember(old)
    for turn in range(6):
        d.reset([int(t) for t in rng.integers(0, 50, 40)])
        for _ in range(10):
            d.commit(Commit([int(rng.integers(0, 50))], 1, int(rng.integers(0, 50))))
        assert d.index.size <= 200
        assert d.index.counts == recount(d.index), turn  # eviction removed exactly what it added
    assert sum(len(s.tokens) for s in [*d.index.frozen, d.index.current]) <= 200 + 4 * (len(d.index.frozen) + 1)
    # one sequence longer than the bound: its own front goes
    d = SuffixDrafter(4, max_tokens=100)
    d.reset(list(range(1000)))
    assert d.index.size <= 100 and len(d.index.current.tokens) <= 100 + 4
    assert d.index.counts == recount(d.index)
    assert d.index.following((0, 1)) == {} and d.index.following((997, 998)) == {999: 1}


def test_propose_is_fast_on_a_long_history():
    rng = np.random.default_rng(1)
    text = [int(t) for t in rng.integers(0, 2000, 400)]
    history = (text * 60)[:24_000] + text[:5]  # repetitive, as the default target is
    d = SuffixDrafter()
    t0 = time.perf_counter()
    d.reset(history)
    index_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(50):
        p = d.propose(history, 8, GREEDY, None)
    per_ms = (time.perf_counter() - t0) / 50 * 1e3
    print(f"index {len(history)} tokens {index_s:.2f}s, propose 8: {per_ms:.3f} ms")
    assert tokens(p) == text[5:13]
    assert per_ms < 1.0  # typically ~0.03 ms


# ----------------------------------------------------------------------------- greedy: exactly target-only


def emitted(events) -> list[int]:
    return [t for e in events if isinstance(e, Step) for t in e.emitted]


def steps(events) -> list[Step]:
    return [e for e in events if isinstance(e, Step)]


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_speculation_equals_target_only_across_turns(seed):
    target = (tiny_target if seed == 0 else lively_target)(seed)
    prompts = [[3, 17, 9, 40, 2, 33, 3, 17], [5, 6, 3, 17, 9, 12]]
    plain = [emitted(generate(target.model, p, GREEDY, 40, set(), 512)) for p in prompts]
    accepted = 0
    for k, tree in ((1, None), (3, None), (6, None), (4, "2x2"), (4, "3x3:6"), (4, "4x1")):
        d = SuffixDrafter(6, min_prob=0.1)
        shape = None if tree is None else parse_tree(tree.split(":")[0], int(tree[4:]) if ":" in tree else None)
        for turn in range(2):  # the second turn drafts from the first one's index too
            for p, want in zip(prompts, plain):
                events = list(generate(target.model, p, GREEDY, 40, set(), 512, 0, d, k, tree=shape))
                assert emitted(events) == want, (k, tree, turn)
                accepted += sum(s.accepted for s in steps(events))
    assert accepted > 0


def test_a_second_turn_drafts_from_the_first():
    target = tiny_target(0)
    p = [3, 17, 9, 40, 2, 33]
    d = SuffixDrafter(8)
    first = list(generate(target.model, p, GREEDY, 30, set(), 512, 0, d, 4))
    again = list(generate(target.model, p, GREEDY, 30, set(), 512, 0, d, 4))
    assert emitted(first) == emitted(again)
    assert len(steps(again)) < len(steps(first))  # it remembered the reply
    assert sum(s.accepted for s in steps(again)) >= 20


# ----------------------------------------------------------------------------- T=1: exactly the target's joint


def test_engine_with_suffix_drafter_is_exactly_the_targets(monkeypatch):
    """No q, like prompt lookup: acceptance is p(d), the residual p without d. A fresh drafter per
    enumerated run (its index must not carry one path into another), seeded with a remembered
    sequence so that it drafts from the first step."""
    target = exact_llama(0)
    params = SamplingParams(temperature=1.0)
    prompt, _ = ngram_prompt(target, params)
    a, b, c = prompt[:3]
    proposals = []

    def run():
        d = SuffixDrafter(3, min_prob=0.0)
        d.remember([b, c, a, b, c, a, b, a, c, c])
        propose = d.propose

        def logged(*args):
            proposals.append(propose(*args))
            return proposals[-1]

        d.propose = logged
        return generate(target, prompt, params, 5, set(), 64, seed=0, drafter=d, k=4)

    e = engine_distribution(run, NUM_TOKENS, EXACT_VOCAB, monkeypatch)
    dist = tv(e.joint, exact_joint(target, prompt, params))
    print(f"TV={dist:.1e} runs={e.runs} acceptance={e.acceptance:.2f} steps={e.steps}")
    assert abs(e.total - 1) < 1e-6
    assert dist < EXACT_TV
    assert 0.1 < e.acceptance < 0.9
    assert e.steps.get("rejected", 0) > 0.05
    assert max(p.tokens.size for p in proposals) >= 2


# ----------------------------------------------------------------------------- specs


def test_make_drafter_specs():
    assert make_drafter("suffix", None).name == "suffix:8"
    d = make_drafter("suffix:5", None)
    assert isinstance(d, SuffixDrafter) and d.n == 5 and d.min_n == 2


@pytest.mark.parametrize("spec, message", [("suffix:x", "expected suffix:N"), ("suffix:0", "must be in 1..32"),
                                           ("suffix:-1", "expected suffix:N")])
def test_bad_suffix_specs(spec, message):
    with pytest.raises(MlxspecError, match=message):
        make_drafter(spec, None)


def test_bad_suffix_spec_is_a_one_line_error():
    from helpers import invoke, one_line_error

    one_line_error(invoke("generate", "Hi", "--draft", "suffix:x"), "expected suffix:N")
