"""What every drafter is: the protocol the engine drafts through, what a drafter proposes, what
the engine tells it back, and the K it may ask for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

import mlx.core as mx
import numpy as np

from mlxspec.core.sampling import SamplingParams, node_probs, top_children  # noqa: F401  (drafters import them here)
from mlxspec.core.tree import GrowingTree, TreeShape
from mlxspec.errors import MlxspecError

MAX_K = 64


@dataclass(frozen=True)
class Proposal:
    """Draft tokens offered for one verify pass.

    ``tokens``: (m,) int32, may be lazy. ``parents[i]``: the index in ``tokens`` of token i's
    parent, -1 for a child of the last committed token; None is a chain (token i follows i-1),
    the degenerate tree. Parents come before their children. ``q``: (m, V), the distribution
    each token was sampled from, or None for a deterministic drafter (a point mass on each
    token). A tree is verified without q (``verify.tree_verify``, exact for any tree drawn
    independently of the target's choices); our drafters pick its children deterministically,
    top-B, and leave q None. ``node_q``: (m,) the drafter's probability of each node's token at
    its parent, only when ``propose_tree(..., draft_probs=True)`` asked for it (``NodeStats``)."""

    tokens: mx.array
    q: mx.array | None = None
    parents: tuple[int, ...] | None = None
    node_q: mx.array | None = None

    @property
    def is_chain(self) -> bool:
        return self.parents is None or all(p == i - 1 for i, p in enumerate(self.parents))

    @property
    def tree_parents(self) -> tuple[int, ...]:
        """``parents``, spelled out for a chain too."""
        return self.parents if self.parents is not None else tuple(range(-1, len(self.tokens) - 1))


# Built from data, not from an op: a lazy module-level array would be bound to the importing
# thread's stream, and the TUI drafts from a worker thread.
NO_DRAFT = Proposal(mx.array([], dtype=mx.int32))


def no_draft(ops: ModuleType) -> Proposal:
    """Nothing to propose, as an array of the drafter's backend (``NO_DRAFT`` on MLX)."""
    return NO_DRAFT if ops.name == "mlx" else Proposal(ops.tokens([]))


@dataclass(frozen=True)
class Commit:
    """What the target decided about a proposal: it kept ``drafted[:accepted]``, then emitted
    ``next_token``. ``hidden``: the target's hidden states (accepted + 1, D) of the tokens the
    verify pass consumed and kept (the previous last token, then the accepted drafts), of the
    kind the drafter reads (``wants_hidden``); None otherwise.

    ``path``: for a tree, the proposal indices of the accepted nodes, root first (``accepted``
    of them; ``drafted`` is then every node); None for a chain, whose path is its first
    ``accepted`` tokens."""

    drafted: list[int]
    accepted: int
    next_token: int
    hidden: mx.array | None = None
    path: tuple[int, ...] | None = None

    @property
    def accepted_nodes(self) -> list[int]:
        """The indices of the accepted drafts, in order."""
        return list(range(self.accepted)) if self.path is None else list(self.path)

    @property
    def committed(self) -> list[int]:
        """The tokens the step added to the text: the accepted drafts, then ``next_token``."""
        return [self.drafted[i] for i in self.accepted_nodes] + [self.next_token]


class Drafter(Protocol):
    """What the engine drafts through. Beside the methods, a drafter may declare traits (class
    attributes; ``trait`` reads them with the defaults below, so a drafter that declares none is
    the most restricted kind)."""

    name: str
    # The engine then returns the target's hidden states in reset and commit: True for the final
    # (normed) state, block indices for the residual stream entering those blocks (EAGLE-3).
    wants_hidden: bool | tuple[int, ...]

    def reset(self, prompt: list[int], hidden: mx.array | None = None) -> None:
        """Start a new sequence whose committed tokens are ``prompt``; ``hidden`` holds the
        target's hidden states of ``prompt[:-1]`` (its last token is not run yet)."""

    def propose(self, history: list[int], k: int, params: SamplingParams, key: mx.array) -> Proposal:
        """Up to ``k`` draft tokens after ``history``."""

    def commit(self, commit: Commit) -> None:
        """Roll back to what the target kept."""


# A drafter's traits and their defaults: ``samples_children``, it can draw a tree's children
# from its q (``--tree DxB:sample``); ``commits_any``, its state follows whatever the target
# kept, even steps another drafter proposed (so it may take part in a cascade);
# ``draft_prior_ratio``, its step's cost as a share of a target pass until ``--k auto`` has
# timed it; ``offers``, a method ``offers(history) -> bool`` saying in advance whether it would
# draft (only such a drafter can go first in a cascade); ``proposer``, the name of what drafted
# the last proposal (a cascade's part); ``sources``, the names of the kinds of draft it can tell
# apart before drafting (prompt lookup: how long a match it found), with ``upcoming_source()``,
# the kind it would draft after the committed text, and ``used_source``, the kind it last drafted,
# so that a K policy can learn each kind's acceptance on its own (``autok.SourcedK``).
TRAITS: dict[str, Any] = {"samples_children": False, "commits_any": False, "draft_prior_ratio": 0.1,
                          "offers": None, "proposer": None, "sources": None}


def sources(drafter: Any) -> tuple[str, ...]:
    """The kinds of draft ``drafter`` tells apart before drafting: its ``sources``, or its name."""
    return tuple(trait(drafter, "sources") or (drafter.name,))


def upcoming_source(drafter: Any) -> int:
    """The index in ``sources(drafter)`` of the kind it would draft after the committed text."""
    return drafter.upcoming_source() if trait(drafter, "sources") else 0


def used_source(drafter: Any) -> int:
    """The index in ``sources(drafter)`` of the kind it drafted last."""
    return drafter.used_source if trait(drafter, "sources") else 0


def trait(drafter: Any, name: str) -> Any:
    """A drafter's declared trait, or its default (``TRAITS``)."""
    return getattr(drafter, name, TRAITS[name])


class TreeDrafter(Drafter, Protocol):
    """A drafter that can branch (``--tree``)."""

    def propose_tree(self, history: list[int], shape: TreeShape, params: SamplingParams, key: mx.array,
                     draft_probs: bool = False) -> Proposal:
        """A tree of ``shape`` (or smaller) after ``history``, nodes breadth first, children
        the drafter chose deterministically (q None): the target walks it along its own
        choices (``verify.tree_verify``). ``draft_probs``: also give ``Proposal.node_q``
        where the drafter has probabilities (``node_probs``)."""


def can_branch(drafter: Drafter) -> bool:
    return callable(getattr(drafter, "propose_tree", None))


def processed_row(ops: ModuleType, logits: Any, params: SamplingParams, history: list[int], drafted: list[Any]) -> Any:
    """A drafter's row of logits after ``history`` and the (lazy) tokens ``drafted`` so far,
    through the target's logits processors, so that its guesses follow the penalties the target's
    rows will have. Its q is then this processed distribution: exactness only needs q to be what
    the draft was drawn from; agreeing with the target raises acceptance."""
    if not params.processes:
        return logits
    width = params.window
    from_history = max(0, width - len(drafted))
    head = ops.tokens(history[max(0, len(history) - from_history):] if from_history else [])
    tail = ops.concatenate([head] + [t.reshape(1) for t in drafted[len(drafted) - min(width, len(drafted)):]])
    return ops.process_logits(logits[None], tail[None], None, params)[0]


def child_picks(parents: tuple[int, ...], level: range, previous: range | None) -> tuple[list[int], list[int]]:
    """For the nodes of a breadth-first ``level``: the row of its parent among the
    ``previous`` level's nodes (0 for the root) and its rank among its siblings, to index
    ``top_children`` of the previous level's logits (as ``ops.tokens``)."""
    rows, ranks = [], []
    for i in level:
        p = parents[i]
        rows.append(0 if previous is None else p - previous.start)
        ranks.append(i - parents.index(p))  # siblings are consecutive, best first
    return rows, ranks


def grow_tree(shape: TreeShape, logits: Any, expand: Callable[[list[int], GrowingTree], Any], params: SamplingParams,
              ops: ModuleType, to_tokens: Callable[[Any], Any] | None = None) -> GrowingTree:
    """Grow an ``auto`` tree (``TreeShape``): from the root's logits (1, V), each level keeps
    every node's top-``branch`` children with their path log-probability, and the level's
    ``branch`` most likely nodes are run through the drafter (``expand(ids, tree)``: feeds
    them after ``tree.fed``, returns their logits) to make the next level. One host sync per
    level: which nodes expand depends on the values. ``to_tokens``: columns -> token ids (a
    head over part of the vocabulary)."""
    tree = GrowingTree()
    rows = [-1]
    for depth in range(1, shape.depth + 1):
        top = ops.top_children(logits, shape.branch)
        lp = ops.child_logprobs(logits, top, params)
        tokens = top if to_tokens is None else to_tokens(top)
        ops.evaluate(tokens, lp)
        new = tree.add_children(rows, tokens.tolist(), lp.tolist())
        if depth == shape.depth or not new:
            break
        rows = tree.most_likely(new, shape.branch)
        logits = expand(rows, tree)
        tree.fed += rows
    return tree


def auto_proposal(tree: GrowingTree, shape: TreeShape, draft_probs: bool, ops: ModuleType) -> tuple[Proposal, list[int]]:
    """The nodes of a grown tree worth verifying (``GrowingTree.select``), as a proposal, and
    their ids in ``tree`` (for the drafter's own bookkeeping of what it fed)."""
    chosen, parents = tree.select(shape.costs, shape.max_nodes)
    if not chosen:
        return no_draft(ops), chosen
    node_q = ops.from_numpy(np.array([tree.node_p[i] for i in chosen], np.float32)) if draft_probs else None
    return Proposal(ops.tokens([tree.tokens[i] for i in chosen]), None, parents, node_q), chosen


class KPolicy(Protocol):
    """Chooses how many tokens to draft each step (``--k auto``); 0 means a plain target step."""

    def next_k(self) -> int:
        """K for the coming step, before the engine caps it by the tokens still allowed."""

    def observe(self, drafted: int, accepted: int) -> None:
        """What the step just verified did: ``drafted`` proposed, ``accepted`` of them kept."""

    def observe_timing(self, draft_ms: float, verify_ms: float, drafted: int) -> None:
        """How long that step's drafting and verification took."""


class FixedK:
    """The same K every step: what ``--k N`` means."""

    def __init__(self, k: int):
        self.k = parse_k(k)

    def next_k(self) -> int:
        return self.k

    def observe(self, drafted: int, accepted: int) -> None:
        pass

    def observe_timing(self, draft_ms: float, verify_ms: float, drafted: int) -> None:
        pass


def parse_k(k: int) -> int:
    if not 1 <= k <= MAX_K:
        raise MlxspecError(f"--k must be in 1..{MAX_K}, got {k}")
    return k
