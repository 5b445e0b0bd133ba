"""Passes of several sequences packed into one (``mlxspec/torchpath/packed.py``): each
sequence's logits, hidden states and cache have the bits its own pass gives, for the float
and the int4 targets, whatever the sequences' lengths, widths, masks and taps."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlxspec  # noqa: F401  (loads the fast BLAS before mlx runs anything)

torch = pytest.importorskip("torch", reason="the torch extra is not installed: pip install 'mlxspec[torch]'")

from mlxspec.core.tree import verify_mask, verify_positions  # noqa: E402
from mlxspec.torchpath import invariant  # noqa: E402
from mlxspec.torchpath.packed import MAX_ROWS, Pass, packed_forward  # noqa: E402
from tiny import quantized_twin, torch_twin  # noqa: E402

MODELS = {}


def model_of(kind: str):
    if kind not in MODELS:
        model = torch_twin(4) if kind == "float" else quantized_twin(5)[1]
        assert invariant.make_batch_invariant(model)
        MODELS[kind] = model
    return MODELS[kind]


def prefilled(model, context: list[int]):
    cache = model.make_cache()
    with torch.inference_mode():
        model(torch.tensor([context]), cache)
    return cache


def as_pass(model, context: int, width: int, seed: int, tree: bool, hidden) -> Pass:
    rng = np.random.default_rng(seed)
    cache = prefilled(model, rng.integers(0, 48, context).tolist())
    tokens = torch.tensor([rng.integers(0, 48, width).tolist()])
    mask = positions = None
    if tree and width > 1:  # each node under a random earlier one (the first row is y)
        parents = tuple(int(rng.integers(-1, i)) for i in range(width - 1))
        mask = torch.from_numpy(verify_mask(parents, context))
        positions = torch.from_numpy(verify_positions(parents, context))
    return Pass(tokens, cache, mask, positions, hidden)


def outputs(result) -> list[torch.Tensor]:
    return list(result) if isinstance(result, tuple) else [result]


@settings(max_examples=12, deadline=None)
@given(kind=st.sampled_from(["float", "int4"]),
       shapes=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 9), st.booleans(),
                                 st.sampled_from([False, True, (0, 2)])), min_size=1, max_size=5),
       seed=st.integers(0, 1000))
def test_each_sequence_gets_the_bits_of_its_own_pass(kind, shapes, seed):
    model = model_of(kind)
    passes = [as_pass(model, c, w, seed + i, tree, hidden) for i, (c, w, tree, hidden) in enumerate(shapes)]
    alone = copy.deepcopy(passes)
    with torch.inference_mode():
        got = packed_forward(model, passes)
        want = [model(p.tokens, p.cache, mask=p.mask, positions=p.positions, return_hidden=p.return_hidden)
                for p in alone]
    for g, w, p, a in zip(got, want, passes, alone):
        assert all(torch.equal(x, y) for x, y in zip(outputs(g), outputs(w)))
        assert all(c.offset == d.offset and torch.equal(c.state[0], d.state[0]) and torch.equal(c.state[1], d.state[1])
                   for c, d in zip(p.cache, a.cache))


def test_logit_rows_and_the_row_limit():
    model = model_of("float")
    passes = [as_pass(model, 10, 8, 1, False, False), as_pass(model, 20, 5, 2, False, True)]
    passes[0].logit_rows = 1
    alone = copy.deepcopy(passes)
    with torch.inference_mode():
        got = packed_forward(model, passes)
        want = model(alone[0].tokens, alone[0].cache, logit_rows=1)
    assert got[0].shape[1] == 1 and torch.equal(got[0], want)
    assert got[1][0].shape[1] == 5 and got[1][1].shape[1] == 5
    with pytest.raises(ValueError, match="rows"):
        packed_forward(model, [as_pass(model, 1, MAX_ROWS // 2 + 1, s, False, False) for s in range(2)])


@pytest.mark.parametrize("width", [1, 3])
def test_steps_of_one_width_take_the_no_copy_path_with_the_same_bits(width):
    model = model_of("int4")
    passes = [as_pass(model, c, width, c, False, True) for c in (3, 40, 255, 300)]
    alone = copy.deepcopy(passes)
    with torch.inference_mode():
        got = packed_forward(model, passes)
        want = [model(p.tokens, p.cache, return_hidden=True) for p in alone]
    assert all(torch.equal(g[0], w[0]) and torch.equal(g[1], w[1]) for g, w in zip(got, want))
