"""Tree speculation (issue 9): shapes and their bad input, the tree pass (mask and positions),
the walk rule against its float64 reference, cache compaction, greedy trees equal to
target-only decoding, and the exact joint distribution of sampled tree speculation.

The exact distribution is enumerated as tests/exact.py does for chains: the only random choice
in a tree step (static trees are drafted deterministically) is the target's sample at each node
of the walk, so an enumerating ``mx.random.categorical`` branches over each node's distribution
along the walk, the real engine runs once per path, and the paths' weights sum to the joint.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from exact import (EXACT_TV, EXACT_VOCAB, PROMPT, exact_llama, sampled_tree_chi_square, target_joint,
                   tree_engine_distribution)
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import KVCache, QuantizedKVCache
from tiny import VOCAB, features, lively_target, random_head, tiny_draft, tiny_target

import mlxspec  # noqa: F401  (loads the fast BLAS before mlx runs anything)
from mlxspec.core import engine, verify
from mlxspec.core import ops as mlx_ops
from mlxspec.core.cache import keep_rows
from mlxspec.core.drafters import Commit, ModelDrafter, NgramDrafter, Proposal
from mlxspec.core.drafters.eagle import EagleDrafter
from mlxspec.core.engine import generate, generate_plain
from mlxspec.core.events import Status, Step
from mlxspec.core.model import Llama, LlamaConfig
from mlxspec.core.prefill import prefill
from mlxspec.core.sampling import SamplingParams, probs
from mlxspec.core.target import Capabilities
from mlxspec.core.tree import (
    AUTO_NODES,
    GrowingTree,
    TreeShape,
    best_node_count,
    depths,
    first_line,
    levels,
    parse_tree,
    parse_tree_list,
    path_to,
    verify_mask,
    verify_positions,
)
from mlxspec.core.verify import (
    tree_greedy_verify,
    tree_output_distribution,
    tree_residual_decide,
    tree_residual_decide_reference,
    tree_residual_output_distribution,
    tree_verify,
)
from mlxspec.errors import MlxspecError

GREEDY = SamplingParams()


@st.composite
def trees(draw, max_nodes: int = 10) -> tuple[int, ...]:
    """Any tree: every node's parent is an earlier node or the root."""
    m = draw(st.integers(0, max_nodes))
    return tuple(draw(st.integers(-1, i - 1)) for i in range(m))


# ----------------------------------------------------------------------------- shapes


def test_static_shapes_are_breadth_first_and_capped():
    assert TreeShape(3, 2, 8).parents() == (-1, -1, 0, 0, 1, 1, 2, 2)  # the paper's 3x2, 8 nodes
    assert parse_tree("3x2").parents() == (-1, -1, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5)
    assert parse_tree("4x1").parents() == (-1, 0, 1, 2)  # a chain
    assert parse_tree("2X3", 4).parents() == (-1, -1, -1, 0)
    assert TreeShape(3, 2, 8).cut(1).parents() == (-1, -1) and TreeShape(3, 2, 8).cut(0).parents() == ()
    assert str(parse_tree(" 3x2 ")) == "3x2" and parse_tree("3x2", 8).nodes == 8
    sampled = parse_tree("3x2:sample", 8)
    assert sampled.sampled and str(sampled) == "3x2:sample" and sampled.parents() == TreeShape(3, 2, 8).parents()
    assert [str(t) for t in parse_tree_list("1x2:sample..2x2:sample")] == ["1x2:sample", "2x2:sample"]


@pytest.mark.parametrize("spec, nodes, message", [
    ("3", None, "expected DxB"), ("3x", None, "expected DxB"), ("x2", None, "expected DxB"),
    ("3*2", None, "expected DxB"), ("-3x2", None, "expected DxB"), ("0x2", None, "depth must be in 1..64"),
    ("3x0", None, "branching must be in 1..16"), ("3x17", None, "branching must be in 1..16"),
    ("65x1", None, "depth must be in 1..64"), ("6x2", None, "more than 64 nodes.*--tree-nodes"),
    ("64x16", None, "more than 64 nodes"), ("3x2", 0, "--tree-nodes must be in 1..64"),
    ("3x2", 65, "--tree-nodes must be in 1..64"), ("3x2:top", None, "expected DxB"),
    ("auto:sample", None, "sampled children go with a static shape"),
])
def test_bad_tree_specs(spec, nodes, message):
    with pytest.raises(MlxspecError, match=message):
        parse_tree(spec, nodes)


def test_structure_helpers():
    parents = (-1, -1, 0, 0, 1, 2, 2)
    assert depths(parents) == [1, 1, 2, 2, 2, 3, 3]
    assert levels(parents) == [range(0, 2), range(2, 5), range(5, 7)]
    assert path_to(parents, 6) == [0, 2, 6] and path_to(parents, -1) == []
    assert first_line(parents, -1) == [0, 2, 5] and first_line(parents, 1) == [4] and first_line(parents, 6) == []
    mask = verify_mask(parents, 3)  # [y, nodes] after 3 cached tokens
    assert mask.shape == (8, 11) and mask[:, :4].all() and not mask[0, 4:].any()
    assert mask[1 + 6].tolist() == [True] * 4 + [True, False, True, False, False, False, True]
    assert verify_positions(parents, 3).tolist() == [3, 4, 4, 5, 5, 5, 6, 6]
    with pytest.raises(ValueError, match="does not come before it"):
        depths((-1, 1))


# ----------------------------------------------------------------------------- the tree pass


def test_best_node_count_maximises_tokens_per_ms():
    # flat costs: every node pays; steep costs: none does; in between, the likely ones
    assert best_node_count([0.9, 0.5, 0.1], [10, 10, 10, 10]) == 3
    assert best_node_count([0.9, 0.5, 0.1], [10, 30, 60, 90]) == 0
    assert best_node_count([0.9, 0.5, 0.1], [10, 12, 15, 25]) == 2  # (1.9/12, 2.4/15=0.16, 2.5/25)
    assert best_node_count([0.5, 0.5], []) == 2  # no curve: all of them
    assert best_node_count([0.9] * 10, [10, 11, 12]) == 2  # no more than the curve covers


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_grown_trees_select_ancestor_closed_breadth_first_nodes(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    tree = GrowingTree()
    rows = [-1]
    for _ in range(data.draw(st.integers(1, 4))):
        b = data.draw(st.integers(1, 3))
        lps = np.log(rng.dirichlet(np.ones(b + 1), size=len(rows))[:, :b])
        lps[rng.random(lps.shape) < 0.1] = -np.inf  # filtered children are never proposed
        new = tree.add_children(rows, rng.integers(0, 50, size=lps.shape).tolist(), lps.tolist())
        rows = tree.most_likely(new, b) or rows
        tree.fed += [r for r in rows if r >= 0 and r not in tree.fed]
    cap = data.draw(st.integers(1, 12))
    chosen, parents = tree.select([], cap)
    assert len(chosen) == min(cap, len(tree.tokens))
    assert set(chosen) >= {a for n in chosen for a in tree.ancestors(n)}
    assert all(p < i for i, p in enumerate(parents)) and depths(parents) == [tree.depth[n] for n in chosen]
    best = sorted(tree.score, reverse=True)[: len(chosen)]
    assert sorted((tree.score[n] for n in chosen), reverse=True) == best


def test_auto_tree_parses_and_says_so():
    shape = parse_tree("auto", 10)
    assert shape.auto and shape.nodes == 10 and str(shape) == "auto"
    assert parse_tree("auto").nodes == AUTO_NODES
    with pytest.raises(ValueError, match="no fixed parents"):
        shape.parents()


def tree_pass_vs_chains(model: Llama, prompt: list[int], tokens: list[int], parents: tuple[int, ...],
                        num_layers: int | None = None) -> float:
    """Largest difference between the logits of each node in one tree pass over [y, nodes] and
    those of the same context followed by its root-to-node path run as a plain chain."""
    cache = model.make_cache()[:num_layers]
    prefill(model, cache, prompt[:-1], num_layers=num_layers)
    offset = len(prompt) - 1
    logits = model(mx.array([prompt[-1:] + tokens]), cache, mask=mx.array(verify_mask(parents, offset)),
                   positions=mx.array(verify_positions(parents, offset)), num_layers=num_layers)[0]
    worst = 0.0
    for row, node in enumerate([-1, *range(len(tokens))]):
        chain = model.make_cache()[:num_layers]
        prefill(model, chain, prompt[:-1], num_layers=num_layers)
        path = [tokens[i] for i in path_to(parents, node)]
        ref = model(mx.array([prompt[-1:] + path]), chain, num_layers=num_layers)[0, -1]
        worst = max(worst, float(mx.abs(logits[row] - ref).max()))
    return worst


@pytest.fixture(scope="module")
def tiny():
    return tiny_target()


@settings(max_examples=15, deadline=None)
@given(parents=trees(12), data=st.data(), layers=st.sampled_from([None, 2]))
def test_every_tree_node_sees_exactly_its_path(tiny, parents, data, layers):
    prompt = data.draw(st.lists(st.integers(1, VOCAB - 1), min_size=2, max_size=9))
    tokens = data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=len(parents), max_size=len(parents)))
    assert tree_pass_vs_chains(tiny.model, prompt, tokens, parents, layers) < 1e-5


@pytest.mark.model
def test_tree_pass_on_the_real_model(lm):
    from mlxspec.targets.tokenizer import encode_prompt

    prompt = encode_prompt(lm.tokenizer, "List the planets of the solar system.")
    parents = parse_tree("3x2").parents()
    tokens = np.random.default_rng(0).integers(0, 49152, len(parents)).tolist()
    # logits of magnitude ~20: float32 rounding through 30 layers; 1.02e-4 seen on an AMD EPYC's OpenBLAS
    assert tree_pass_vs_chains(lm.model, prompt, tokens, parents) < 2e-4


# ----------------------------------------------------------------------------- the walk rule


def walk_reference(tokens: list[int], parents: tuple[int, ...], choices: list[int]) -> tuple[int, int]:
    """The rule in plain Python: from the root, follow the first child equal to the choice."""
    node = -1
    while True:
        kids = [i for i, p in enumerate(parents) if p == node and tokens[i] == choices[node + 1]]
        if not kids:
            return node, choices[node + 1]
        node = kids[0]


@settings(max_examples=60, deadline=None)
@given(parents=trees(12), data=st.data())
def test_tree_verify_follows_the_target_choices(parents, data):
    vocab = data.draw(st.integers(1, 4))  # small: equal siblings and deep matches are common
    tokens = data.draw(st.lists(st.integers(0, vocab - 1), min_size=len(parents), max_size=len(parents)))
    choices = data.draw(st.lists(st.integers(0, vocab - 1), min_size=len(parents) + 1, max_size=len(parents) + 1))
    last, nxt = tree_verify(mx.array(tokens, mx.int32), parents, mx.array(choices))
    assert (last.item(), nxt.item()) == walk_reference(tokens, parents, choices)


@settings(max_examples=30, deadline=None)
@given(parents=trees(8), seed=st.integers(0, 10_000))
def test_tree_greedy_verify_takes_the_longest_agreeing_path(parents, seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(len(parents) + 1, 5)).astype(np.float32)
    argmax = logits.argmax(axis=-1)
    # distinct siblings, as our drafters make them, half of them what the target wants
    tokens = []
    for i, p in enumerate(parents):
        taken = {tokens[j] for j in range(i) if parents[j] == p}
        free = [v for v in range(5) if v not in taken] or [0]
        tokens.append(int(argmax[p + 1]) if argmax[p + 1] in free and rng.random() < 0.5 else int(rng.choice(free)))
    last, nxt = tree_greedy_verify(mx.array(tokens, mx.int32), parents, mx.array(logits))
    agreeing = [i for i in range(len(parents))
                if all(tokens[j] == argmax[parents[j] + 1] for j in path_to(parents, i))]
    longest = max([len(path_to(parents, i)) for i in agreeing], default=0)
    assert len(path_to(parents, last.item())) == longest
    assert nxt.item() == argmax[last.item() + 1]


@settings(max_examples=12, deadline=None)
@given(parents=trees(4), data=st.data())
def test_tree_verify_is_exact_against_the_float64_reference(parents, data):
    """Every vector of the target's choices, weighted by its probability: the real rule's
    output distribution equals the reference's, and both give each emitted sequence the
    product of p along it (what the target alone would give it)."""
    vocab = 3
    tokens = data.draw(st.lists(st.integers(0, vocab - 1), min_size=len(parents), max_size=len(parents)))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    p = rng.dirichlet(np.ones(vocab) * 0.7, size=len(parents) + 1)
    p[rng.random(p.shape) < 0.15] = 0.0  # some impossible tokens too
    p[:, 0] += 1e-3
    p /= p.sum(axis=-1, keepdims=True)
    rows = {(): 0}  # the row of the first node reached by each token prefix
    for i in range(len(parents)):
        prefix = tuple(tokens[j] for j in path_to(parents, i))
        p[i + 1] = p[rows.setdefault(prefix, i + 1)]  # as a target: duplicate siblings see one context
    ours: dict[tuple[int, ...], float] = {}
    for choices in itertools.product(range(vocab), repeat=len(parents) + 1):
        w = float(np.prod(p[np.arange(len(parents) + 1), choices]))
        if w == 0:
            continue
        last, nxt = tree_verify(mx.array(tokens, mx.int32), parents, mx.array(choices))
        out = tuple(tokens[i] for i in path_to(parents, last.item())) + (nxt.item(),)
        ours[out] = ours.get(out, 0.0) + w
    ref = tree_output_distribution(tokens, parents, p)
    assert ours.keys() == ref.keys() and all(abs(ours[s] - ref[s]) < 1e-12 for s in ref)
    assert abs(sum(ref.values()) - 1) < 1e-12
    for seq, prob in ref.items():
        assert abs(prob - np.prod([p[rows[seq[:d]], seq[d]] for d in range(len(seq))])) < 1e-12


# ----------------------------------------------------------------------------- cache compaction


@settings(max_examples=60, deadline=None)
@given(prefix=st.integers(0, 300), parents=trees(12), pick=st.integers(-1, 11), quantized=st.booleans())
def test_keep_rows_leaves_exactly_the_accepted_path_in_order(prefix, parents, pick, quantized):
    """The cache after a tree pass holds [committed, y, nodes]; compaction leaves [committed, y,
    path], in order, whatever the tree and path, and the next token lands right after them."""
    node = pick if pick < len(parents) else -1
    path = path_to(parents, node)
    start = prefix + 1
    rng = np.random.default_rng(prefix * 31 + len(parents))
    keys = rng.normal(size=(1, 2, start + len(parents), 64)).astype(np.float32)
    values = rng.normal(size=keys.shape).astype(np.float32)
    c = QuantizedKVCache(group_size=32, bits=8) if quantized else KVCache()
    c.update_and_fetch(mx.array(keys[:, :, :start]), mx.array(values[:, :, :start]))  # committed + y
    full_k, full_v = c.update_and_fetch(mx.array(keys[:, :, start:]), mx.array(values[:, :, start:]))  # the tree
    keep = np.r_[np.arange(start), start + np.array(path, dtype=int)].astype(int)
    want = [np.array(a)[..., keep, :] for a in (full_k if quantized else (full_k, full_v))]
    keep_rows([c], start, path)
    assert c.offset == start + len(path)
    new = rng.normal(size=(1, 2, 1, 64)).astype(np.float32)
    after = c.update_and_fetch(mx.array(new), mx.array(new))
    got = after[0] if quantized else after
    for g, w in zip(got, want):
        assert np.array_equal(np.array(g)[..., :-1, :], w)
    if not quantized:
        assert np.array_equal(np.array(after[0])[..., -1:, :], new)


@pytest.fixture(scope="module")
def small():
    cfg = LlamaConfig(vocab_size=32, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
    mx.random.seed(3)
    m = Llama(cfg)
    mx.eval(m.parameters())
    return m


@settings(max_examples=25, deadline=None)
@given(prompt=st.lists(st.integers(0, 31), min_size=1, max_size=10),
       rounds=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 12), st.integers(0, 99),
                                 st.integers(0, 31), st.booleans()), min_size=1, max_size=3),
       layers=st.sampled_from([None, 1]))
def test_draft_model_cache_after_any_tree_commit_matches_fresh_prefill(small, prompt, rounds, layers):
    """Whatever path the target accepts in a drafted tree, the drafter's cache plus its pending
    tokens give the same next logits as a fresh prefill of everything committed."""
    d = ModelDrafter(small, "tiny", num_layers=layers)
    d.reset(prompt)
    history = list(prompt)
    for depth, branch, cap, pick, nxt, auto in rounds:
        proposal = d.propose_tree(history, TreeShape(depth, branch, cap, auto), GREEDY, None)
        drafted, parents = proposal.tokens.tolist(), proposal.parents or ()
        path = path_to(parents, pick % (len(drafted) + 1) - 1)
        d.commit(Commit(drafted, len(path), nxt, None, tuple(path)))
        history += [drafted[i] for i in path] + [nxt]
        ours = d._forward(mx.array(d.pending))
        d.pending = []  # the probe fed them: the cache holds the whole history now
        ref = prefill(small, small.make_cache()[:layers], history, num_layers=layers)
        np.testing.assert_allclose(np.array(ours), np.array(ref), rtol=1e-4, atol=1e-4)
        d.pending = [history[-1]]
        keep_rows(d.cache, d.cache[0].offset - 1, [])


@settings(max_examples=15, deadline=None)
@given(prompt=st.lists(st.integers(1, VOCAB - 1), min_size=2, max_size=8),
       rounds=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(0, 99), st.integers(1, VOCAB - 1),
                                 st.booleans()), min_size=1, max_size=3))
def test_eagle_state_after_any_tree_commit_matches_a_fresh_run(tiny, prompt, rounds):
    head = random_head(tiny)
    d = EagleDrafter(head, "eagle")
    d.reset(prompt, features(tiny, prompt[:-1]))
    history = list(prompt)
    for depth, branch, pick, nxt, auto in rounds:
        proposal = d.propose_tree(history, TreeShape(depth, branch, 10, auto), GREEDY, None)
        drafted, parents = proposal.tokens.tolist(), proposal.parents or ()
        path = path_to(parents, pick % (len(drafted) + 1) - 1)
        kept = history + [drafted[i] for i in path]
        d.commit(Commit(drafted, len(path), nxt, features(tiny, kept)[len(history) - 1:], tuple(path)))
        history = kept + [nxt]
        ours = d.propose(history, 1, GREEDY, mx.random.key(0))
        _, z = head(features(tiny, history[:-1])[None], mx.array([history[1:]]))
        assert ours.tokens.item() == head.vocab_ids[mx.argmax(z[0, -1])].item()
        d.commit(Commit(ours.tokens.tolist(), 0, nxt, features(tiny, history)[-1:]))
        history = history + [nxt]


# ----------------------------------------------------------------------------- greedy trees


def emitted(events) -> list[int]:
    return [t for e in events if isinstance(e, Step) for t in e.emitted]


def tree_drafters(target):
    mx.random.seed(5)
    other = Llama(target.config)  # an unrelated draft: many rejections, many side branches
    mx.eval(other.parameters())
    return [ModelDrafter(target.model, "self:1", 1), ModelDrafter(other, "other"),
            ModelDrafter(tiny_draft(target, init="random", seed=2), "trained"), NgramDrafter(2, 1),
            EagleDrafter(random_head(target), "eagle")]


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_tree_speculation_is_target_only(seed):
    target = lively_target(seed)
    prompt = [3, 17, 9, 40, 2, 33, 3, 17]
    plain = emitted(generate_plain(target.model, prompt, GREEDY, 40, set(), 512))
    side_paths = 0  # accepted paths that leave the drafter's first line: compaction moved rows
    for drafter in tree_drafters(target):
        for shape in ("1x1", "2x2", "3x2:8", "3x3", "4x2:10", "5x1", "auto:6", "auto", "auto:10:costed", "2x2;sample"):
            spec, _, cap = shape.partition(":")
            cap, _, costed = cap.partition(":")
            if drafter.name.startswith("ngram") and "sample" in spec:
                continue
            tree = parse_tree(spec.replace(";", ":"), int(cap) if cap else None)
            if costed:  # a budget that stops short of the cap on most steps
                tree = replace(tree, costs=tuple(50.0 + 12.0 * n for n in range(tree.max_nodes + 1)))
            events = list(generate(target.model, prompt, GREEDY, 40, set(), 512, 0, drafter, 4, tree=tree))
            assert emitted(events) == plain, (drafter.name, shape)
            for s in (e for e in events if isinstance(e, Step) and e.tree):
                side_paths += list(s.tree.path) != first_line(s.tree.parents, -1)[: len(s.tree.path)]
    assert side_paths > 0


def test_tree_steps_tell_their_tree():
    target = lively_target(0)
    prompt = [3, 17, 9, 40, 2, 33]
    events = list(generate(target.model, prompt, GREEDY, 30, set(), 512, 0, tree_drafters(target)[0], 4,
                           tree=parse_tree("3x2")))
    steps = [e for e in events if isinstance(e, Step)]
    assert all(s.tree is not None for s in steps[:-1])  # the last may have had no room
    for s in (s for s in steps if s.tree):
        t = s.tree
        assert s.k == len(t.tokens) == len(t.parents) == parse_tree("3x2").cut(s.room).nodes
        assert s.accepted == len(t.path)
        assert list(t.path) == path_to(t.parents, t.path[-1] if t.path else -1)
        below = first_line(t.parents, t.path[-1] if t.path else -1)
        ids = [x.id for x in s.tokens]
        assert ids[: s.accepted] == [t.tokens[i] for i in t.path]
        assert ids[s.accepted: s.accepted + len(below)] == [t.tokens[i] for i in below]
        assert [x.status for x in s.tokens] == ([Status.ACCEPTED] * s.accepted + [Status.REJECTED] * len(below)
                                                + [Status.CORRECTED if below else Status.BONUS])
    done = events[-1]
    assert done.accepted_lengths == [s.accepted for s in steps]


@pytest.mark.model
def test_greedy_tree_on_the_real_model_is_target_only(lm):
    from mlxspec.targets.drafts import make_drafter
    from mlxspec.targets.tokenizer import encode_prompt

    ids = encode_prompt(lm.tokenizer, "List the planets of the solar system.")
    eos = set(lm.tokenizer.eos_token_ids)
    plain = emitted(generate_plain(lm.model, ids, GREEDY, 24, eos, lm.context_length))
    # self:24: the shallower self-drafts of this model rarely agree with it at all
    events = list(generate(lm.model, ids, GREEDY, 24, eos, lm.context_length, 0, make_drafter("self:24", lm), 4,
                           tree=parse_tree("3x2", 8)))
    assert emitted(events) == plain
    assert sum(e.accepted for e in events if isinstance(e, Step)) > 0


# ----------------------------------------------------------------------------- refusals


class ChainOnly:
    name, wants_hidden = "chain-only", False

    def reset(self, prompt, hidden=None):
        pass

    def propose(self, history, k, params, key):
        return Proposal(mx.array([1], mx.int32))

    def commit(self, commit):
        pass


class NoMasks:
    """Our llama behind a seam that declares no tree masks (as mlx-lm's classes)."""

    capabilities = Capabilities()

    def __init__(self, model):
        self.model = model

    def make_cache(self):
        return self.model.make_cache()

    def __call__(self, *a, **kw):
        return self.model(*a, **kw)


def test_trees_are_refused_where_they_cannot_run(tiny):
    run = lambda model, drafter, prompt=(1, 2, 3), context=512: list(  # noqa: E731
        generate(model, list(prompt), GREEDY, 5, set(), context, 0, drafter, 4, tree=parse_tree("3x2")))
    with pytest.raises(MlxspecError, match="cannot verify a draft tree.*--k"):
        run(NoMasks(tiny.model), NgramDrafter(2))
    with pytest.raises(MlxspecError, match="'chain-only' cannot branch"):
        run(tiny.model, ChainOnly())
    with pytest.raises(MlxspecError, match="3x2 tree of 14 nodes does not fit in the model's context of 20"):
        run(tiny.model, NgramDrafter(2), prompt=range(1, 7), context=20)
    assert emitted(run(tiny.model, NgramDrafter(2), prompt=range(1, 6), context=20))  # 5 + 14 < 20: fits


def test_ngram_branches_into_a_trie():
    d = NgramDrafter(2)
    hist = [1, 2, 7, 8, 1, 2, 7, 9, 1, 2, 5, 1, 2]
    p = d.propose_tree(hist, TreeShape(3, 3, 64), GREEDY, None)
    # continuations, latest first: 5 1 2 | 7 9 1 | 7 8 1, merged where they agree
    assert p.tokens.tolist() == [5, 1, 2, 7, 9, 1, 8, 1] and p.parents == (-1, 0, 1, -1, 3, 4, 3, 6)
    capped = d.propose_tree(hist, TreeShape(3, 3, 5), GREEDY, None)
    assert capped.tokens.tolist() == [5, 1, 2, 7, 9] and capped.parents == (-1, 0, 1, -1, 3)
    assert d.propose_tree(hist, TreeShape(2, 1, 64), GREEDY, None).tokens.tolist() == [5, 1]  # one branch: a chain
    assert d.propose_tree([1, 2, 3], TreeShape(3, 2, 64), GREEDY, None).tokens.size == 0


# ----------------------------------------------------------------------------- sampled children


def sampled_tree(parents: tuple[int, ...], vocab: int, rng: np.random.Generator) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Tokens drawn as a sampling drafter draws them (each node from its parent's q, siblings
    sharing that row), the per-node q rows, and a target p with some impossible tokens."""
    rows = {r: rng.dirichlet(np.ones(vocab)) for r in (-1, *range(len(parents)))}
    tokens = [int(rng.choice(vocab, p=rows[par])) for par in parents]
    q = np.array([rows[par] for par in parents]).reshape(len(parents), vocab)
    p = rng.dirichlet(np.ones(vocab) * 0.7, size=len(parents) + 1)
    p[rng.random(p.shape) < 0.15] = 0.0
    p[:, 0] += 1e-3
    return tokens, q.astype(np.float32), (p / p.sum(axis=-1, keepdims=True)).astype(np.float32)


@settings(max_examples=60, deadline=None)
@given(parents=trees(10), seed=st.integers(0, 10_000))
def test_tree_residual_decide_matches_the_float64_reference(parents, seed):
    rng = np.random.default_rng(seed)
    tokens, q, p = sampled_tree(parents, 4, rng)  # small: repeated siblings are common
    u = rng.random(len(parents)).astype(np.float32)
    last, residual = tree_residual_decide(mx.array(tokens, mx.int32), parents, mx.array(q), mx.array(p), mx.array(u))
    ref_last, ref_residual = tree_residual_decide_reference(tokens, parents, q, p, u)
    assert last.item() == ref_last
    np.testing.assert_allclose(np.array(residual), ref_residual, atol=1e-6)


def sampled_children_law(parents: tuple[int, ...], q_at: Callable, p_at: Callable, vocab: int) -> dict:
    """The exact distribution of one step's output when every node's children are drawn from
    ``q_at(prefix)`` and verified by the multi-round rule: every draw of the tree enumerated,
    weighted by its probability under q, times the rule's own law for that tree."""
    out: dict[tuple[int, ...], float] = {}
    prefixes = [(), *(None for _ in parents)]
    for tokens in itertools.product(range(vocab), repeat=len(parents)):
        weight = 1.0
        for i, par in enumerate(parents):
            prefix = prefixes[par + 1]
            weight *= q_at(prefix)[tokens[i]]
            prefixes[i + 1] = prefix + (tokens[i],)
        if weight == 0:
            continue
        q = np.array([q_at(prefixes[par + 1]) for par in parents]).reshape(len(parents), vocab)
        p = np.array([p_at(prefixes[r]) for r in range(len(parents) + 1)])
        for seq, w in tree_residual_output_distribution(tokens, parents, q, p).items():
            out[seq] = out.get(seq, 0.0) + weight * w
    return out


@pytest.mark.parametrize("parents", [(-1, -1), (-1, -1, -1), (-1, -1, 0, 0, 1, 1), (-1, 0, 0, -1, 3)])
def test_sampled_children_keep_the_target_law_exactly(parents, monkeypatch):
    """Summed over every tree the drafter can sample (repeats included), what the multi-round
    rule emits, continued by the target, has the product of p along it: the target's own law.
    Without the residual update it does not (the check has power)."""
    vocab, rng = 3, np.random.default_rng(len(parents))
    table: dict = {}

    def dist(kind: str, prefix: tuple[int, ...]) -> np.ndarray:
        if (kind, prefix) not in table:
            d = rng.dirichlet(np.ones(vocab) * (0.6 if kind == "p" else 1.5))
            table[kind, prefix] = d / d.sum()
        return table[kind, prefix]

    def p_along(seq: tuple[int, ...], start: int = 0) -> float:
        return float(np.prod([dist("p", seq[:d])[seq[d]] for d in range(start, len(seq))]))

    def target_law(law: dict) -> float:
        """Largest error over sequences of the tree's depth + 1 tokens, each output of the
        step continued by the target itself (as the next steps do), against p along them."""
        length = max(depths(parents)) + 1
        worst = 0.0
        for seq in itertools.product(range(vocab), repeat=length):
            got = sum(w * p_along(seq, len(o)) for o, w in law.items() if seq[: len(o)] == o)
            worst = max(worst, abs(got - p_along(seq)))
        return worst

    law = sampled_children_law(parents, lambda pre: dist("q", pre), lambda pre: dist("p", pre), vocab)
    assert abs(sum(law.values()) - 1) < 1e-12 and target_law(law) < 1e-12
    monkeypatch.setattr(verify, "MIN_RESIDUAL_MASS", np.inf)  # every residual update skipped
    broken = sampled_children_law(parents, lambda pre: dist("q", pre), lambda pre: dist("p", pre), vocab)
    assert target_law(broken) > 1e-3


def test_sampled_tree_speculation_samples_the_target_by_chi_square():
    """The engine with a sampling drafter's trees (q in the proposal, the multi-round rule):
    the first two tokens over many seeded runs against the target's exact joint. (A q squared
    and renormalised before the rule, a plumbing error of that size, gives p < 1e-3.)"""
    pvalue, steps = sampled_tree_chi_square(exact_llama(0), ModelDrafter(exact_llama(1), "draft"))
    assert pvalue > 1e-3
    # children really were sampled: some steps repeat a sibling, and side branches were taken
    assert any(len(set(s.tree.tokens[:2])) < 2 for s in steps)
    assert any(s.tree.path and s.tree.path[0] == 1 for s in steps)


def test_sampled_children_need_a_drafter_with_a_distribution():
    target = lively_target(0)
    with pytest.raises(MlxspecError, match="cannot sample a tree's children.*drop ':sample'"):
        list(generate(target.model, [1, 2, 3], SamplingParams(temperature=1.0), 4, set(), 512, 0, NgramDrafter(2), 4,
                      tree=parse_tree("2x2:sample")))


# ----------------------------------------------------------------------------- the exact distribution

HORIZON = 3  # (tests/exact.py: the 4-token models, PROMPT, EXACT_TV)


def target_only_joint(target: Llama, params: SamplingParams) -> np.ndarray:
    def next_probs(seqs):
        logits = target(mx.array(seqs, dtype=mx.int32), target.make_cache())[:, -1]
        p = np.array(probs(logits, params), dtype=np.float64)
        return p / p.sum(axis=-1, keepdims=True)

    return target_joint(next_probs, PROMPT, EXACT_VOCAB, HORIZON)


def exact_tree_run(target, draft, params, shape, monkeypatch):
    def run():
        return generate(target, PROMPT, params, 12, set(), 64, 0, ModelDrafter(draft, "draft"), 4, tree=shape)

    return tree_engine_distribution(run, HORIZON, monkeypatch)


@pytest.fixture(scope="module")
def exact_pair():
    return exact_llama(0), exact_llama(1)  # an unrelated draft: side branches carry real probability


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("spec, nodes", [("2x2", None), ("3x2", 8), ("auto", 6)])
def test_sampled_tree_speculation_has_the_target_joint_exactly(exact_pair, monkeypatch, temperature, spec, nodes):
    target, draft = exact_pair
    params = SamplingParams(temperature=temperature)
    joint, side = exact_tree_run(target, draft, params, parse_tree(spec, nodes), monkeypatch)
    ref = target_only_joint(target, params)
    assert 0.5 * np.abs(joint - ref).sum() < EXACT_TV
    assert side > 0.1  # the second branches mattered


@pytest.mark.parametrize("broken", ["compaction", "mask"])
def test_the_exact_check_sees_a_broken_tree_step(exact_pair, monkeypatch, broken):
    """Power: keeping the first rows instead of the accepted path's, or letting nodes see their
    siblings, shows in the joint."""
    target, draft = exact_pair
    params = SamplingParams(temperature=1.0)
    with monkeypatch.context() as mp:
        if broken == "compaction":
            real = mlx_ops.keep_rows
            mp.setattr(mlx_ops, "keep_rows", lambda cache, start, rows: real(cache, start, list(range(len(rows)))))
        else:
            mp.setattr(engine, "verify_mask", lambda parents, offset: np.tril(
                np.ones((len(parents) + 1, offset + len(parents) + 1), dtype=bool), k=offset))
        joint, _ = exact_tree_run(target, draft, params, parse_tree("2x2"), monkeypatch)
    assert 0.5 * np.abs(joint - target_only_joint(target, params)).sum() > 10 * EXACT_TV


# ----------------------------------------------------------------------------- the command line


@pytest.mark.parametrize("args, message", [
    (["--tree", "3y2"], r"bad --tree '3y2': expected DxB"),
    (["--tree", "0x2"], r"depth must be in 1\.\.64"),
    (["--tree", "6x2"], r"more than 64 nodes.*--tree-nodes"),
    (["--tree", "3x2", "--tree-nodes", "99"], r"--tree-nodes must be in 1\.\.64"),
    (["--tree-nodes", "8"], r"--tree-nodes caps a --tree"),
    (["--tree", "3x2", "--draft", "none"], r"--tree needs a drafter, but --draft is none"),
    (["--tree", "3x2", "-k", "3"], r"give --k or --tree, not both"),
])
def test_cli_bad_trees_are_one_line_errors(args, message):
    from helpers import invoke, one_line_error

    one_line_error(invoke("generate", "hi", *args), message)


@pytest.mark.model
def test_cli_refuses_a_tree_without_a_drafter_or_room(tmp_path, monkeypatch):
    from helpers import invoke, one_line_error

    from mlxspec.targets import store

    monkeypatch.setattr(store, "default_draft", lambda target, backend="mlx": "none")  # a target whose default is target-only
    one_line_error(invoke("generate", "hi", "--tree", "3x2"), r"--tree needs a drafter, and the default for .* is none")
    monkeypatch.undo()
    f = tmp_path / "long.txt"
    f.write_text("hello " * 8140)  # 8,141 tokens: they fit in the context of 8,192, a 64-node tree does not
    one_line_error(invoke("generate", "-f", str(f), "--raw", "--draft", "ngram:3", "--tree", "6x2", "--tree-nodes", "64"),
                   r"6x2 tree of 64 nodes does not fit in the model's context of 8192 after the 8141-token prompt")


@pytest.mark.model
def test_cli_generate_with_a_tree_streams_its_steps():
    import json

    from helpers import invoke

    r = invoke("generate", "List the planets of the solar system.", "--json", "-n", "12", "--draft", "self:24",
               "--tree", "3x2", "--tree-nodes", "8", "-t", "0")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    plain = invoke("generate", "List the planets of the solar system.", "--json", "-n", "12", "--draft", "none", "-t", "0")
    text = lambda rs: "".join(x["text"] for x in rs if x.get("status") not in (None, "rejected"))  # noqa: E731
    assert text(rows) == text([json.loads(line) for line in plain.stdout.splitlines()])
    steps = [x["step"] for x in rows if "step" in x]
    assert all(len(s["tree"]["tokens"]) == len(s["tree"]["parents"]) == s["k"] and len(s["tree"]["path"]) == s["accepted"]
               for s in steps if "tree" in s) and any("tree" in s for s in steps)
    assert rows[-1]["tree"] == "3x2" and rows[-1]["tree_nodes"] == 8
