"""The exact output distribution of the real engine, by enumerating its random choices.

All of the engine's randomness flows through two MLX primitives: ``mx.random.categorical``
(the drafter sampling a draft token, the verifier sampling the correction or bonus token) and
``mx.random.uniform`` (the verifier's accept test). ``engine_distribution`` replaces both with an
*enumerating* source and re-runs ``engine.generate`` (real drafter, real target, real cache
rollback) once per path through those choices, depth first, multiplying the probabilities of the
branches each run took. Summing over the paths gives P(first H emitted tokens = t) exactly (up to
float32 rounding inside the engine), which a test compares with the target's own joint.

* A categorical draw branches over its support with weights softmax(logits): that is its
  definition, so a drafter that samples from another distribution than the q it reports, or a
  verifier that samples from the wrong residual, shows in the result.
* The accept test of draft i branches in two: accept with weight r_i = min(1, p_i(d_i)/q_i(d_i)),
  computed here in float64 from the very p and q the engine hands to the verifier, and reject with
  1 - r_i. The verifier itself then decides, fed u = r_i / 2 (middle of the accept interval) or
  (1 + r_i) / 2 (middle of the reject interval); if its decision differs from the branch (a wrong
  threshold), the enumeration stops with an error. The accept branch of draft i is taken right
  after draft i is drawn (u_i is independent of later drafts), so a rejected draft's successors
  are never enumerated.
* Only choices that can change the first H tokens branch: a draft that lands past position H or
  follows a rejected one is drawn once (its argmax; summing its branches would give the same
  answer), and the token at position H is not re-run per value but spread over its distribution
  ("fan"), after checking that the engine emitted the value it was given.

It assumes a chain drafter (one categorical draw per draft token, in order, or none at all as
prompt lookup) and the engine calling ``ops.rejection_verify`` (``core.ops``) once per step; anything else
fails loudly rather than giving a wrong answer. Zero-probability branches are skipped; an accept
branch that turns out to have weight 0 ends its run early, and the reject branch of a draft the
target keeps with certainty is never run. What this cannot see: correlations between the engine's random keys (every draw here is
independent by construction). A small seeded sampling run covers that.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

import mlxspec  # noqa: F401  (loads the fast BLAS before mlx runs anything)
from mlxspec.core import ops as mlx_ops
from mlxspec.core.drafters.eagle3 import Eagle3Config, Eagle3Head
from mlxspec.core.events import Event, Step
from mlxspec.core.model import Llama, LlamaConfig
from mlxspec.core.sampling import SamplingParams, probs
from mlxspec.core.tree import first_line
from mlxspec.core.verify import block_stop_probabilities


class EnumerationError(AssertionError):
    """The engine did not do what the branch it was given implies."""


class _Dead(Exception):
    """The path's accept branch has probability 0: nothing under it counts."""

    def __init__(self, point: int):
        self.point = point


@dataclass
class _Point:
    branches: int
    taken: int
    weight: float | None = None  # an accept branch learns its weight at verify time

    @property
    def certain(self) -> bool:
        """The branch taken had probability 1: its siblings need no run."""
        return self.weight is not None and self.weight >= 1.0


@dataclass
class Enumeration:
    """P(first H tokens), shape (V,) * H, and what the enumeration went through."""

    joint: np.ndarray
    runs: int = 0  # engine.generate calls
    dead_runs: int = 0  # runs cut short on a zero-probability accept branch
    leaves: int = 0  # weighted outcomes summed (fans count once per value)
    # Exact expectations over the steps that produce the first H tokens: how many steps of each
    # kind ("plain": nothing drafted; "rejected": a draft refused, a correction drawn; "all kept":
    # every draft kept, then the bonus token; "past the horizon": every draft up to token H kept,
    # later ones not judged), and how many drafts were judged and kept within the horizon.
    steps: dict[str, float] = field(default_factory=dict)
    judged: float = 0.0
    accepted: float = 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.judged

    @property
    def total(self) -> float:
        return float(self.joint.sum())


class _Oracle:
    def __init__(self, horizon: int, vocab: int, block: bool = False):
        self.horizon, self.vocab = horizon, vocab
        self.block = block  # chains are judged whole (``block_verify``): every draft branches
        self.script: list[int] = []

    # --------------------------------------------------------------- per run / per step state
    def start_run(self) -> None:
        self.path: list[_Point] = []
        self.fan: tuple[int, np.ndarray, np.ndarray] | None = None  # (returned value, values, weights)
        self.emitted = 0
        self.start_step()

    def start_step(self) -> None:
        self.drafts = 0  # draft tokens drawn so far this step
        self.accept_points: dict[int, int] = {}  # draft index -> index of its accept point in path
        self.all_accepted = True  # every accept branch taken so far this step is "accept"
        self.in_verify = False
        self.verify_draws = 0
        self.uniform_values: np.ndarray | None = None
        self.expect: tuple[int, bool] | None = None  # (scripted accepted prefix, it ends in a rejection)

    def _choose(self, branches: int, weight: float | None = None) -> _Point:
        i = len(self.path)
        taken = self.script[i] if i < len(self.script) else 0
        if taken >= branches:
            raise EnumerationError("the engine is not deterministic under a fixed script")
        point = _Point(branches, taken, weight)
        self.path.append(point)
        return point

    # --------------------------------------------------------------- the patched primitives
    def categorical(self, logits, axis=-1, shape=None, num_samples=None, key=None):
        if shape is not None or num_samples is not None or logits.ndim != 1 or axis not in (-1, 0):
            raise EnumerationError(f"categorical over shape {logits.shape} is not enumerated")
        if not self.in_verify:
            self.drafts += 1
            # Under block verification a later draft bears on whether earlier ones are kept.
            if not self.block and (not self.all_accepted or self.emitted + self.drafts > self.horizon):
                # Follows a rejected draft, or lands past the horizon: never judged. Stay lazy.
                return mx.argmax(logits).astype(mx.uint32)
        lp = np.array(logits.astype(mx.float32), dtype=np.float64)
        w = np.exp(lp - lp.max())
        w /= w.sum()
        support = np.flatnonzero(w > 0)
        if self.in_verify:
            self.verify_draws += 1
            if self.verify_draws > 1:
                raise EnumerationError("the verifier drew more than one token in a step")
            accepted, _ = self.expect
            position = self.emitted + accepted + 1
        else:
            position = self.emitted + self.drafts
        if position > self.horizon and (self.in_verify or not self.block):  # cannot change the first tokens
            return mx.array(int(support[np.argmax(w[support])]), mx.uint32)
        if self.in_verify and position == self.horizon:
            value = int(support[0])
            self.fan = (value, support, w[support])
            return mx.array(value, mx.uint32)
        point = self._choose(len(support))
        value = int(support[point.taken])
        point.weight = float(w[value])
        if not self.in_verify and not self.block:  # its accept test, chosen now so that later drafts know
            accept = self._choose(2)
            self.accept_points[self.drafts - 1] = len(self.path) - 1
            self.all_accepted = accept.taken == 0
        return mx.array(value, mx.uint32)

    def uniform(self, low=0.0, high=1.0, shape=(), dtype=mx.float32, key=None, **kw):
        if (not self.in_verify or self.uniform_values is None or tuple(shape) != self.uniform_values.shape
                or (low, high) != (0.0, 1.0) or kw):
            raise EnumerationError(f"an unexpected uniform draw: shape {shape}, range [{low}, {high})")
        u, self.uniform_values = self.uniform_values, None
        return mx.array(u.astype(np.float32))

    def torch_categorical(self, logp, gen):
        """``categorical`` for ``torchpath.sampling.categorical(logp, gen)``: the same choices."""
        import torch

        value = self.categorical(mx.array(logp.detach().cpu().double().numpy().astype(np.float32)))
        return torch.tensor(int(np.array(value)), dtype=torch.int32)

    def take_uniforms(self) -> np.ndarray:
        """The accept uniforms the verifier chose for this step (the torch path reads them here
        instead of patching ``torch.rand``)."""
        if not self.in_verify or self.uniform_values is None:
            raise EnumerationError("an unexpected uniform draw")
        u, self.uniform_values = self.uniform_values, None
        return u

    def verifier(self, inner: Callable) -> Callable:
        def verify(draft, q, p, key):
            if isinstance(p, mx.array):
                mx.eval(draft, p, q)  # one wait for all three
            d, pn, qn = _float64(draft).astype(np.int64), _float64(p), None if q is None else _float64(q)
            u = np.full(d.shape[0], 0.5)
            accepted, rejected = 0, False
            for i, tok in enumerate(d):
                if rejected or self.emitted + i + 1 > self.horizon:
                    break
                pd, qd = pn[i, tok], (1.0 if qn is None else qn[i, tok])
                r = 1.0 if pd >= qd else pd / qd
                r = r if pd > 0 else 0.0
                j = self.accept_points.get(i)
                if j is None:  # a drafter that draws nothing (prompt lookup): choose it now
                    self._choose(2)
                    j = len(self.path) - 1
                point = self.path[j]
                keep = point.taken == 0
                point.weight = r if keep else 1.0 - r
                if point.weight <= 0:
                    raise _Dead(j)
                u[i] = r / 2 if keep else (1 + r) / 2
                accepted += keep
                rejected = not keep
            return self._judge(inner, (draft, q, p, key), (accepted, rejected), u)

        return verify

    def _judge(self, inner: Callable, args: tuple, expect: tuple[int, bool], uniforms: np.ndarray):
        """Run the real verifier on ``args``, fed ``uniforms``, expecting the decision ``expect``."""
        self.expect, self.uniform_values, self.in_verify = expect, uniforms, True
        try:
            return inner(*args)
        finally:
            self.in_verify = False

    def block_verifier(self, inner: Callable) -> Callable:
        """``verifier`` for ``block_verify``: the number of drafts kept branches K + 1 ways,
        weighted by the rule's own stop probabilities (``block_stop_probabilities``, float64
        from the engine's p and q); the verifier is fed uniforms that force that stop."""
        def verify(draft, q, p, key):
            if not self.block:
                raise EnumerationError("block_verify ran: enumerate with block=True")
            if isinstance(p, mx.array):
                mx.eval(draft, p, q)
            d, pn, qn = _float64(draft).astype(np.int64), _float64(p), _float64(q)
            k = d.shape[0]
            stops = block_stop_probabilities(d, qn[:k], pn[: k + 1])
            point = self._choose(k + 1)
            point.weight = float(stops[point.taken])
            if point.weight <= 0:
                raise _Dead(len(self.path) - 1)
            eta = np.full(k, 2.0)
            if point.taken:
                eta[point.taken - 1] = 0.0
            return self._judge(inner, (draft, q, p, key), (point.taken, point.taken < k), eta)

        return verify


def _float64(x) -> np.ndarray:
    """An MLX array or a torch tensor as float64 numpy."""
    if isinstance(x, mx.array):
        return np.array(x.astype(mx.float32), dtype=np.float64)
    return x.detach().cpu().double().numpy()


def torch_engine_distribution(run: Callable[[], Iterator[Event]], horizon: int, vocab: int, monkeypatch,
                              max_runs: int = 200_000, block: bool = False) -> Enumeration:
    """``engine_distribution`` for a torch target and drafter. torch's draws all go through
    ``torchpath.sampling.categorical`` or ``draw`` (on weights), replaced by the enumerating one; the verifier
    is torch's ``rejection_decide`` given the uniforms the enumeration chose, then that same
    categorical on its residual (``rejection_verify``'s own draw is checked by sampling in
    tests/test_torch_verify.py)."""
    import torch

    from mlxspec.torchpath import ops as torch_ops
    from mlxspec.torchpath import sampling as torch_sampling
    from mlxspec.torchpath import verify as torch_verify

    oracle = _Oracle(horizon, vocab, block)

    def rejection(draft, q, p, key):
        u = torch.as_tensor(oracle.take_uniforms(), dtype=p.dtype)
        n, residual = torch_verify.rejection_decide(draft, q, p, u)
        return n, torch_sampling.categorical(torch.log(residual), None)

    def block_rule(draft, q, p, key):
        eta = torch.as_tensor(oracle.take_uniforms(), dtype=p.dtype)
        n, row = torch_verify.block_decide(draft, q, p, eta)
        return n, torch_sampling.categorical(torch.log(row), None)

    with monkeypatch.context() as mp:
        mp.setattr(torch_ops, "rejection_verify", oracle.verifier(rejection))
        mp.setattr(torch_ops, "block_verify", oracle.block_verifier(block_rule))
        mp.setattr(torch_sampling, "categorical", oracle.torch_categorical)
        mp.setattr(torch_sampling, "draw", lambda weights, gen: oracle.torch_categorical(torch.log(weights), gen))
        return _enumerate(oracle, run, horizon, vocab, max_runs)


def engine_distribution(run: Callable[[], Iterator[Event]], horizon: int, vocab: int, monkeypatch,
                        max_runs: int = 200_000, block: bool = False) -> Enumeration:
    """Enumerate every path of ``run()`` (a fresh ``engine.generate`` iterator per call) through
    its random choices; return the exact distribution of its first ``horizon`` emitted tokens.

    ``monkeypatch`` (pytest's) installs the enumerating primitives and wraps whatever
    ``ops.rejection_verify`` (``core.ops``) is at call time (so a test may have replaced it first).
    ``block``: the engine judges sampled chains with ``block_verify`` (every draft then branches)."""
    oracle = _Oracle(horizon, vocab, block)
    with monkeypatch.context() as mp:
        mp.setattr(mlx_ops, "rejection_verify", oracle.verifier(mlx_ops.rejection_verify))
        mp.setattr(mlx_ops, "block_verify", oracle.block_verifier(mlx_ops.block_verify))
        mp.setattr(mx.random, "categorical", oracle.categorical)
        mp.setattr(mx.random, "uniform", oracle.uniform)
        return _enumerate(oracle, run, horizon, vocab, max_runs)


def _enumerate(oracle: _Oracle, run, horizon: int, vocab: int, max_runs: int) -> Enumeration:
    result = Enumeration(np.zeros((vocab,) * horizon))
    while True:
        result.runs += 1
        if result.runs > max_runs:
            raise EnumerationError(f"more than {max_runs} runs: is the horizon or vocabulary too large?")
        oracle.start_run()
        cut = None
        try:
            tokens, kinds = _one_run(oracle, run, horizon)
        except _Dead as dead:
            result.dead_runs += 1
            cut = dead.point
        if cut is None:
            weight = float(np.prod([pt.weight for pt in oracle.path]))
            if oracle.fan is None:
                result.joint[tuple(tokens[:horizon])] += weight
                result.leaves += 1
            else:
                value, values, weights = oracle.fan
                if tokens[horizon - 1] != value:
                    raise EnumerationError(f"token {horizon} is {tokens[horizon - 1]}, the verifier drew {value}")
                for v, wv in zip(values, weights):
                    result.joint[tuple(tokens[: horizon - 1]) + (int(v),)] += weight * wv
                result.leaves += len(values)
            for kind, judged, accepted in kinds:
                result.steps[kind] = result.steps.get(kind, 0.0) + weight
                result.judged += weight * judged
                result.accepted += weight * accepted
        # Next path: the deepest choice with an untried branch (not below a dead accept branch).
        path = oracle.path if cut is None else oracle.path[: cut + 1]
        i = len(path) - 1
        while i >= 0 and (path[i].taken + 1 >= path[i].branches or path[i].certain):
            i -= 1
        if i < 0:
            return result
        oracle.script = [pt.taken for pt in path[:i]] + [path[i].taken + 1]


def _one_run(oracle: _Oracle, run, horizon: int) -> tuple[list[int], list[tuple[str, int, int]]]:
    tokens: list[int] = []
    kinds: list[tuple[str, int, int]] = []
    gen = run()
    try:
        for ev in gen:
            if not isinstance(ev, Step):
                continue
            if oracle.expect is None:
                raise EnumerationError("a step that did not go through rejection_verify")
            accepted, rejected = oracle.expect
            if rejected and ev.accepted != accepted or not rejected and ev.accepted < accepted:
                raise EnumerationError(
                    f"the verifier kept {ev.accepted} drafts where the branch taken keeps {accepted}"
                    f"{' then rejects' if rejected else ''} (its accept threshold is not min(1, p/q))")
            kind = ("plain" if ev.k == 0 else "rejected" if rejected else "all kept" if accepted == ev.k
                    else "past the horizon")
            kinds.append((kind, accepted + rejected, accepted))
            tokens += ev.emitted
            if len(tokens) >= horizon:
                break
            oracle.emitted = len(tokens)
            oracle.start_step()
    finally:
        gen.close()
    if len(tokens) < horizon:
        raise EnumerationError(f"the engine emitted {len(tokens)} tokens, fewer than the horizon {horizon}")
    return tokens, kinds


def target_joint(next_probs: Callable[[list[list[int]]], np.ndarray], prompt: list[int], vocab: int,
                 horizon: int) -> np.ndarray:
    """P(first ``horizon`` tokens) of target-only sampling, by enumerating every prefix;
    ``next_probs(sequences)`` gives the (len, V) float64 next-token distributions."""
    joint = np.ones(())
    for depth in range(horizon):
        prefixes = [prompt + list(t) for t in itertools.product(range(vocab), repeat=depth)]
        joint = joint[..., None] * next_probs(prefixes).reshape((vocab,) * depth + (vocab,))
    return joint


# ----------------------------------------------------------------------------- the 4-token models
# What tests/test_equivalence.py, tests/test_tree.py and tests/test_torchpath.py check engines
# against: two tiny random Llamas over a 4-token vocabulary and the target's exact joint.

EXACT_VOCAB = 4
EXACT_CFG = LlamaConfig(
    vocab_size=EXACT_VOCAB, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32,
    tie_embeddings=False,
)
OUT_SCALE = 1.5  # LM head x1.5: somewhat peaked, every cell still likely enough to matter
PROMPT = [1, 2, 3]
NUM_TOKENS = 3  # the joint distribution of this many first tokens is tested
EXACT_TV = 1e-5  # float32 inside the engine vs the float64 reference; broken engines: > 1e-2


def exact_llama(seed: int) -> Llama:
    mx.random.seed(seed)
    m = Llama(EXACT_CFG)
    m.lm_head.weight = m.lm_head.weight * OUT_SCALE
    mx.eval(m.parameters())
    return m


def next_token_probs(model: Llama, sequences: list[list[int]], params: SamplingParams) -> np.ndarray:
    """float64 (len(sequences), V): the processed next-token distribution after each sequence,
    from one batched forward pass of equal-length sequences."""
    logits = model(mx.array(sequences, dtype=mx.int32), model.make_cache())[:, -1]
    p = np.array(probs(logits, params), dtype=np.float64)
    return p / p.sum(axis=-1, keepdims=True)


def exact_joint(model: Llama, prompt: list[int], params: SamplingParams, n: int = NUM_TOKENS) -> np.ndarray:
    """P(first n sampled tokens = (t_1..t_n)) under target-only sampling, shape (V,) * n."""
    joint = target_joint(lambda seqs: next_token_probs(model, seqs, params), prompt, EXACT_VOCAB, n)
    assert abs(joint.sum() - 1) < 1e-9
    return joint


def tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a - b).sum())


def ngram_prompt(target, params) -> tuple[list[int], float]:
    """A prompt [a, b, c, a, b] after which prompt lookup proposes c, ..., chosen so the target's
    probability of c is nearest 1/2 (accepted and rejected alike)."""
    cands = [(a, b, c) for a, b, c in itertools.permutations(range(EXACT_VOCAB), 3)]
    p = next_token_probs(target, [[a, b, c, a, b] for a, b, c in cands], params)
    pc = p[np.arange(len(cands)), [c for _, _, c in cands]]
    i = int(np.argmin(np.abs(pc - 0.5)))
    a, b, c = cands[i]
    return [a, b, c, a, b], float(pc[i])


def sampled_tree_chi_square(target, drafter, runs: int = 3000) -> tuple[float, list[Step]]:
    """Seeded runs of the engine drafting 2x2:sample trees at T = 1: the p-value of their first
    two tokens against the target's exact joint (``target`` runs on ``exact_llama``'s weights)."""
    from scipy.stats import chisquare

    from mlxspec.core.engine import generate
    from mlxspec.core.tree import parse_tree

    mlx_target = exact_llama(0)
    params = SamplingParams(temperature=1.0)
    shape = parse_tree("2x2:sample")
    counts = np.zeros((EXACT_VOCAB,) * 2)
    steps = []
    for seed in range(runs):
        events = list(generate(target, PROMPT, params, 2, set(), 64, seed, drafter, 4, tree=shape))
        counts[tuple([t for e in events if isinstance(e, Step) for t in e.emitted][:2])] += 1
        steps += [e for e in events if isinstance(e, Step) and e.tree]
    want = target_joint(lambda seqs: np.array(probs(mlx_target(mx.array(seqs, dtype=mx.int32), mlx_target.make_cache())[:, -1],
                                                    params), dtype=np.float64), PROMPT, EXACT_VOCAB, 2)
    want = want / want.sum()
    return chisquare(counts.ravel(), want.ravel() * counts.sum()).pvalue, steps


# ----------------------------------------------------------------------------- trees
# The exact joint of a tree-drafting engine whose trees are verified by ``tree_sample_verify``
# (deterministic children): tests/test_tree.py and tests/test_processors.py check it.


@dataclass
class _TreePoint:
    branches: int
    taken: int
    weight: float = 1.0


class TreeOracle:
    """Stands in for ``mx.random.categorical`` inside ``tree_sample_verify``: it walks the tree
    itself, branching over the target's distribution at each node it reaches within the horizon
    (weights softmax of the very logits the rule samples from), answers with those choices
    (anything in a row the walk does not reach), and checks that the rule ends where the walk
    does. Past the horizon a row is drawn once, as its most likely token (its branches would
    sum to 1)."""

    def __init__(self, horizon: int):
        self.horizon = horizon
        self.script: list[int] = []
        self.side_weight = 0.0  # probability that some accepted path leaves the first line

    def start_run(self) -> None:
        self.path: list[_TreePoint] = []
        self.emitted = 0
        self.tree: tuple[list[int], tuple[int, ...]] | None = None
        self.expect: tuple[int, int] | None = None
        self.side = False

    def _choose(self, branches: int) -> _TreePoint:
        i = len(self.path)
        point = _TreePoint(branches, self.script[i] if i < len(self.script) else 0)
        self.path.append(point)
        return point

    def verifier(self, inner: Callable) -> Callable:
        def verify(tokens, parents, p, key):
            mx.eval(tokens, p)
            self.tree = (tokens.tolist(), tuple(parents))
            try:
                last, nxt = inner(tokens, parents, p, key)
            finally:
                self.tree = None
            if (last.item(), nxt.item()) != self.expect:
                raise EnumerationError(f"the rule ended at {(last.item(), nxt.item())}, the walk at {self.expect}")
            return last, nxt

        return verify

    def categorical(self, logits, axis=-1, shape=None, num_samples=None, key=None):
        if self.tree is None or logits.ndim != 2 or shape is not None or num_samples is not None:
            raise EnumerationError(f"an unexpected categorical draw over shape {logits.shape}")
        tokens, parents = self.tree
        lp = np.array(logits.astype(mx.float32), dtype=np.float64)
        w = np.exp(lp - lp.max(axis=-1, keepdims=True))
        w /= w.sum(axis=-1, keepdims=True)
        choices = w.argmax(axis=-1)
        node, depth = -1, 0
        while True:
            row = w[node + 1]
            if self.emitted + depth + 1 > self.horizon:
                value = int(row.argmax())
            else:
                support = np.flatnonzero(row > 0)
                point = self._choose(len(support))
                value = int(support[point.taken])
                point.weight = float(row[value])
            choices[node + 1] = value
            kids = [i for i, p in enumerate(parents) if p == node and tokens[i] == value]
            if not kids:
                break
            if self.emitted + depth + 1 <= self.horizon and kids[0] != first_line(parents, node)[:1][0]:
                self.side = True
            node, depth = kids[0], depth + 1
        self.expect = (node, value)
        return mx.array(choices.astype(np.uint32))


def tree_engine_distribution(run: Callable, horizon: int, monkeypatch, max_runs: int = 20_000):
    """The exact joint of the first ``horizon`` tokens ``run()`` emits, and the probability
    that an accepted path leaves the drafter's first line within them."""
    oracle = TreeOracle(horizon)
    joint = np.zeros((EXACT_VOCAB,) * horizon)
    side = 0.0
    with monkeypatch.context() as mp:
        mp.setattr(mlx_ops, "tree_sample_verify", oracle.verifier(mlx_ops.tree_sample_verify))
        mp.setattr(mx.random, "categorical", oracle.categorical)
        for _ in range(max_runs):
            oracle.start_run()
            tokens = []
            gen = run()
            try:
                for ev in gen:
                    if isinstance(ev, Step):
                        if ev.tree is None:
                            raise EnumerationError("a step without a tree")
                        tokens += ev.emitted
                        oracle.emitted = len(tokens)
                        if len(tokens) >= horizon:
                            break
            finally:
                gen.close()
            weight = float(np.prod([pt.weight for pt in oracle.path]))
            joint[tuple(tokens[:horizon])] += weight
            side += weight * oracle.side
            i = len(oracle.path) - 1
            while i >= 0 and oracle.path[i].taken + 1 >= oracle.path[i].branches:
                i -= 1
            if i < 0:
                return joint, side
            oracle.script = [pt.taken for pt in oracle.path[:i]] + [oracle.path[i].taken + 1]
    raise EnumerationError(f"more than {max_runs} runs")


def exact_eagle3_head(model: Llama):
    """An EAGLE-3 head on ``exact_llama`` over 3 of its 4 tokens (the fourth gets q = 0),
    tapping the embedding output and the last block, with a sharpened head so drafts vary."""
    cfg = Eagle3Config(hidden_size=EXACT_CFG.hidden_size, intermediate_size=32, num_heads=2, num_kv_heads=1,
                       draft_vocab=3, target_vocab=EXACT_VOCAB, target_hidden=EXACT_CFG.hidden_size, aux_layers=(0, 1))
    mx.random.seed(2)
    head = Eagle3Head(cfg, mx.array([0, 1, 3]), model.model.embed_tokens)
    head.lm_head.weight = head.lm_head.weight * 3.0
    mx.eval(head.parameters())
    return head
