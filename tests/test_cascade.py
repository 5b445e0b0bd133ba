"""The cascade drafter (lookup where it matches, else the head) and ``SourcedK``: exact greedy
and sampled decoding, the head's rollback after steps lookup drafted, and who drafts when."""

from __future__ import annotations

import math

import mlx.core as mx
import pytest
from exact import (
    EXACT_TV,
    EXACT_VOCAB,
    PROMPT,
    engine_distribution,
    exact_eagle3_head,
    exact_joint,
    exact_llama,
    tv,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import VOCAB, features, random_head, tiny_target

from mlxspec.core.autok import AutoK, SourcedK, k_policy
from mlxspec.core.drafters import Commit, NgramDrafter
from mlxspec.core.drafters.cascade import CascadeDrafter
from mlxspec.core.drafters.eagle import EagleDrafter
from mlxspec.core.drafters.suffix import SuffixDrafter
from mlxspec.core.engine import generate
from mlxspec.core.events import Step
from mlxspec.core.sampling import SamplingParams
from mlxspec.core.tree import parse_tree
from mlxspec.errors import MlxspecError
from mlxspec.targets.drafts import check_draft_spec, make_drafter

GREEDY = SamplingParams()
PROMPT_IDS = [3, 17, 9, 40, 2, 33, 3, 17]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


class Logged(CascadeDrafter):
    """A cascade that records which part drafted each non-empty proposal."""

    def __init__(self, parts):
        super().__init__(parts)
        self.drafted_by: list[int] = []

    def propose(self, history, k, params, key):
        p = super().propose(history, k, params, key)
        if p.tokens.size:
            self.drafted_by.append(self.used)
        return p

    def propose_tree(self, history, shape, params, key, draft_probs=False):
        p = super().propose_tree(history, shape, params, key, draft_probs)
        if p.tokens.size:
            self.drafted_by.append(self.used)
        return p


def emitted(events) -> list[int]:
    return [t for ev in events if isinstance(ev, Step) for t in ev.emitted]


def plain(target, prompt, n):
    return emitted(generate(target.model, prompt, GREEDY, n, set(), 512))


def flat_curve(n: int) -> list[float]:
    return [10.0 + 0.1 * i for i in range(n)]


@pytest.mark.parametrize("lookup", [lambda: NgramDrafter(2), lambda: SuffixDrafter(4, min_prob=0.0)])
def test_greedy_is_target_only_at_every_k_auto_and_with_trees(target, lookup):
    want = plain(target, PROMPT_IDS, 40)
    sources: list[int] = []
    runs = [(k, None) for k in range(1, 9)] + [("auto", None)] + [(1, parse_tree(s)) for s in ("3x2", "2x3")]
    for k, tree in runs:
        drafter = Logged([lookup(), EagleDrafter(random_head(target), "eagle")])
        policy = k_policy(k, drafter, flat_curve)
        events = list(generate(target.model, PROMPT_IDS, GREEDY, 40, set(), 512, 0, drafter, policy, tree=tree))
        assert emitted(events) == want, (k, tree)
        steps = [ev for ev in events if isinstance(ev, Step)]
        assert [ev.drafter for ev in steps if ev.k] == [drafter.parts[i].name for i in drafter.drafted_by]
        assert all(ev.drafter is None for ev in steps if not ev.k)
        sources += drafter.drafted_by
    assert sources.count(0) > 10 and sources.count(1) > 10, sources  # both parts drafted


def test_the_joint_distribution_at_t1_is_exactly_the_targets(monkeypatch):
    """Every path through the engine's random choices (tests/exact.py): 1-gram lookup (a point
    mass, q None) where the last token occurred before, else an EAGLE-3 head that samples over 3
    of the 4 tokens (the fourth has q = 0). The joint of the first tokens is the target's."""
    model = exact_llama(0)
    params = SamplingParams(temperature=1.0)
    head = exact_eagle3_head(model)
    sources: list[int] = []
    for k in (1, 2):
        def run(k=k):
            d = Logged([NgramDrafter(1, min_n=1), EagleDrafter(head, "e3")])
            d.drafted_by = sources
            return generate(model, PROMPT, params, 3, set(), 512, seed=0, drafter=d, k=k)

        e = engine_distribution(run, 3, EXACT_VOCAB, monkeypatch)
        assert abs(e.total - 1) < 1e-6
        assert 0.1 < e.acceptance < 0.9, e.acceptance
        assert tv(e.joint, exact_joint(model, PROMPT, params)) < EXACT_TV
    assert 0 in sources and 1 in sources


class Scripted:
    """A lookup that offers a draft exactly when the script says so (to drive every mix of
    sources), proposing the last committed tokens again."""

    name, wants_hidden, commits_any = "scripted", False, True

    def __init__(self):
        self.script: list[bool] = []

    def offers(self, history):
        return self.script.pop(0) if self.script else False

    def reset(self, prompt, hidden=None):
        pass

    def propose(self, history, k, params, key):
        from mlxspec.core.drafters.base import Proposal

        return Proposal(mx.array(history[-k:] if k else [], dtype=mx.int32))

    def commit(self, commit):
        pass


@settings(max_examples=25, deadline=None)
@given(prompt=st.lists(st.integers(1, VOCAB - 1), min_size=2, max_size=8),
       rounds=st.lists(st.tuples(st.booleans(), st.integers(0, 4), st.floats(0, 1), st.integers(1, VOCAB - 1)),
                       min_size=1, max_size=5))
def test_the_head_rolls_back_whoever_drafted(target, prompt, rounds):
    """After any mix of lookup and head proposals and any accept patterns, the head's next first
    draft equals a fresh run of it over the committed text with the target's real features."""
    head = random_head(target)
    lookup = Scripted()
    d = CascadeDrafter([lookup, EagleDrafter(head, "eagle")])
    d.reset(prompt, features(target, prompt[:-1]))
    history, key = list(prompt), mx.random.key(0)
    for from_lookup, k, frac, nxt in rounds:
        lookup.script = [from_lookup]
        drafted = d.propose(history, k, GREEDY, key).tokens.tolist()
        assert d.used == (0 if from_lookup else 1)
        n = round(frac * len(drafted))
        kept = history + drafted[:n]
        d.commit(Commit(drafted, n, nxt, features(target, kept)[len(history) - 1 :]))
        history = kept + [nxt]
        assert d.history == history
        lookup.script = [False]
        ours = d.propose(history, 1, GREEDY, key)
        _, z = head(features(target, history[:-1])[None], mx.array([history[1:]]))
        assert ours.tokens.item() == head.vocab_ids[mx.argmax(z[0, -1])].item()
        d.commit(Commit(ours.tokens.tolist(), 0, nxt, features(target, history)[-1:]))
        history = history + [nxt]


def test_lookup_drafts_where_it_matches_and_the_head_elsewhere(target):
    d = CascadeDrafter([NgramDrafter(2), EagleDrafter(random_head(target), "eagle")])
    prompt = [5, 6, 7, 8, 5, 6]  # [5, 6] occurred before: lookup proposes what followed it
    d.reset(prompt, features(target, prompt[:-1]))
    assert d.upcoming_source() == 0
    assert d.propose(prompt, 3, GREEDY, mx.random.key(0)).tokens.tolist() == [7, 8, 5]
    d.commit(Commit([7, 8, 5], 0, 9, features(target, prompt)[-1:]))
    assert d.history == prompt + [9] and d.upcoming_source() == 1  # [6, 9] never occurred
    assert d.propose(d.history, 2, GREEDY, mx.random.key(0)).tokens.size == 2 and d.used == 1


def test_sourced_k_learns_each_part_on_its_own_steps(target):
    d = CascadeDrafter([NgramDrafter(2), EagleDrafter(random_head(target), "eagle")])
    policy = k_policy("auto", d, flat_curve)
    assert isinstance(policy, SourcedK) and all(isinstance(p, AutoK) for p in policy.policies)
    lookup, head = policy.policies
    assert lookup.draft_ms < head.draft_ms  # lookup starts from a near-free draft cost
    parts = [0] * 30 + [1] * 30
    for part in parts:  # the engine gives a run's timings when it ends, in step order
        d.used = part
        policy.observe(4, 4 if part == 0 else 0)
    for part in parts:
        policy.observe_timing(0.05 if part == 0 else 8.0, 12.0, 4)
    assert lookup.acceptance()[0] > 0.9 and head.acceptance()[0] < 0.1
    assert lookup.draft_ms < 0.1 and head.draft_ms > 1.0
    assert math.isclose(lookup.scale, head.scale) and policy.scale == lookup.scale and policy.timed_steps == 60
    assert lookup.best() > 0 and head.best() == 0
    d.reset([5, 6, 7, 5, 6])  # [5, 6] occurred before: lookup drafts next
    assert policy.next_k() == lookup.best()
    assert set(policy.describe()) == {"ngram:2", "eagle"}
    fresh = policy.fresh()
    assert fresh.drafter is d and fresh.policies[0].acceptance()[0] == pytest.approx(lookup.prior)


@pytest.mark.parametrize("spec, says", [
    ("self:1+ngram:3", "cannot go first in a cascade"),
    ("ngram:3+self:1", "cannot take part in a cascade"),
    ("ngram:3+none", "every part of a cascade"),
    ("ngram:3+", "every part of a cascade"),
    ("ngram:x+ngram:3", "expected ngram:N"),
])
def test_bad_cascades_are_one_line_errors(target, spec, says):
    with pytest.raises(MlxspecError, match=says):
        make_drafter(spec, target)


def test_a_cascade_spec_names_its_parts(target):
    check_draft_spec("ngram:3+suffix:8")
    d = make_drafter("ngram:3+suffix:8", target)
    assert isinstance(d, CascadeDrafter) and d.name == "ngram:3+suffix:8" and d.wants_hidden is False
    assert [type(p) for p in d.parts] == [NgramDrafter, SuffixDrafter]


@pytest.mark.model
@pytest.mark.parametrize("backend, head", [("mlx", "smollm2-135m-eagle"), ("torch:cpu", "smollm2-135m-eagle"),
                                           ("torch:cpu", "smollm2-135m-eagle3")])
def test_greedy_with_the_shipped_heads_on_the_real_model_is_target_only(backend, head):
    from mlxspec.targets.loading import load

    lm = load("default", backend=backend)
    ids = lm.tokenizer.encode("List the days of the week, then list them again in reverse order.")
    drafter = make_drafter(f"ngram:3+{head}", lm)
    want = emitted(generate(lm.model, ids, GREEDY, 48, set(), 2048))
    events = list(generate(lm.model, ids, GREEDY, 48, set(), 2048, 0, drafter, k_policy("auto", drafter, flat_curve)))
    assert emitted(events) == want
    assert sum(ev.accepted for ev in events if isinstance(ev, Step)) > 0
