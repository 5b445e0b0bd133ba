"""Token trees: the shapes a drafter branches into (static ``DxB``, or grown by draft
probability, ``auto``), and the mask and positions one forward pass over tree nodes needs.

A tree is its ``parents``: node i's parent is node ``parents[i]``, or -1 for a child of the root
(the last committed token, which a verify pass feeds first). Parents come before their
children, so proposal order is a topological order; static shapes list their nodes breadth
first, so every level is a contiguous range of indices. A chain is the tree with
``parents[i] == i - 1``.

All of this is host-side arithmetic on small integer lists (trees have at most
``MAX_TREE_NODES`` nodes); masks come back as numpy arrays for the caller to hand to MLX.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from mlxspec.errors import MlxspecError

MAX_TREE_DEPTH = 64  # as MAX_K: a tree is never deeper than the longest chain
MAX_TREE_BRANCH = 16
MAX_TREE_NODES = 64  # the widest verify pass a tree may ask for
# --tree auto: levels drafted, nodes expanded per level (each into this many children), and the
# most nodes verified when --tree-nodes does not say.
AUTO_DEPTH, AUTO_BRANCH, AUTO_NODES = 5, 3, 16


@dataclass(frozen=True)
class TreeShape:
    """``--tree DxB``: every node expands into its top-``branch`` children, ``depth`` levels
    deep, breadth first until ``max_nodes`` nodes (the last level may be cut short; the most
    likely nodes come first in it).

    ``--tree auto`` (``auto``), as EAGLE-2 grows its trees: at each of ``depth`` levels the
    ``branch`` nodes with the highest draft path probability expand into their top-``branch``
    children; then the verify pass takes the most likely nodes, as many as pay for their cost:
    ``costs[n]`` is the ms of a target pass over n + 1 tokens (the measured verify-cost curve,
    ``best_node_count``). Without costs it takes ``max_nodes``.

    ``--tree DxB:sample`` (``sampled``): at T > 0 each node's ``branch`` children are drawn
    independently from the draft's distribution there (repeats possible) instead of being its
    top B, and verified by multi-round rejection (``verify.tree_residual_verify``); at T = 0
    the top B as usual."""

    depth: int
    branch: int
    max_nodes: int
    auto: bool = False
    costs: tuple[float, ...] = ()
    sampled: bool = False

    def parents(self) -> tuple[int, ...]:
        if self.auto:
            raise ValueError("an auto tree has no fixed parents: it grows with the draft's probabilities")
        parents: list[int] = []
        level = [-1]
        for _ in range(self.depth):
            children = []
            for p in level:
                for _ in range(self.branch):
                    if len(parents) == self.max_nodes:
                        return tuple(parents)
                    children.append(len(parents))
                    parents.append(p)
            level = children
        return tuple(parents)

    @property
    def nodes(self) -> int:
        """Nodes a verify pass takes at most."""
        return self.max_nodes if self.auto else len(self.parents())

    def cut(self, depth: int) -> TreeShape:
        """The same shape no deeper than ``depth`` (near the token limit)."""
        return replace(self, depth=max(0, min(self.depth, depth)))

    def __str__(self) -> str:
        return "auto" if self.auto else f"{self.depth}x{self.branch}" + (":sample" if self.sampled else "")


def full_size(depth: int, branch: int) -> int:
    return sum(branch**d for d in range(1, depth + 1))


def parse_tree(spec: str, max_nodes: int | None = None) -> TreeShape:
    """``"DxB"``, ``"DxB:sample"`` or ``"auto"`` (and ``--tree-nodes``) -> a checked
    ``TreeShape``; without ``max_nodes`` the whole tree, which must then fit in one verify pass
    (auto: ``AUTO_NODES``)."""
    if max_nodes is not None and not 1 <= max_nodes <= MAX_TREE_NODES:
        raise MlxspecError(f"--tree-nodes must be in 1..{MAX_TREE_NODES}, got {max_nodes}")
    if spec.strip() == "auto":
        return TreeShape(AUTO_DEPTH, AUTO_BRANCH, max_nodes or AUTO_NODES, auto=True)
    if spec.strip().startswith("auto:"):
        raise MlxspecError(f"bad --tree {spec!r}: an auto tree expands its most likely nodes; "
                           "sampled children go with a static shape (e.g. 3x2:sample)")
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*(:\s*sample\s*)?", spec)
    if m is None:
        raise MlxspecError(f"bad --tree {spec!r}: expected DxB, depth D and branching B (e.g. 3x2), "
                           "DxB:sample (children sampled from the draft), or auto")
    depth, branch = int(m[1]), int(m[2])
    if not 1 <= depth <= MAX_TREE_DEPTH:
        raise MlxspecError(f"bad --tree {spec!r}: depth must be in 1..{MAX_TREE_DEPTH}, got {depth}")
    if not 1 <= branch <= MAX_TREE_BRANCH:
        raise MlxspecError(f"bad --tree {spec!r}: branching must be in 1..{MAX_TREE_BRANCH}, got {branch}")
    size = min(full_size(depth, branch), MAX_TREE_NODES + 1)  # no huge powers for 64x16
    if max_nodes is None and size > MAX_TREE_NODES:
        raise MlxspecError(f"--tree {depth}x{branch} has more than {MAX_TREE_NODES} nodes, more than one verify "
                           f"pass takes; cap it with --tree-nodes N (N <= {MAX_TREE_NODES})")
    return TreeShape(depth, branch, size if max_nodes is None else max_nodes, sampled=m[3] is not None)


def parse_tree_list(text: str, max_nodes: int | None = None) -> list[TreeShape]:
    """``mlxspec sweep --tree``: shapes as a list ("2x2,3x2,auto"), ranges of both dimensions
    ("1x1..4x2": every DxB with D in 1..4 and B in 1..2) or both; in order, without repeats."""
    shapes: list[TreeShape] = []
    for part in (p.strip() for p in text.split(",")):
        lo, sep, hi = part.partition("..")
        if not sep:
            found = [parse_tree(part, max_nodes)]
        else:
            a, b = parse_tree(lo, max_nodes), parse_tree(hi, max_nodes)
            if a.auto or b.auto or a.depth > b.depth or a.branch > b.branch or a.sampled != b.sampled:
                raise MlxspecError(f"bad --tree range {part!r}: expected DxB..DxB, smaller first (e.g. 1x1..4x2)")
            found = [parse_tree(f"{d}x{br}" + (":sample" if a.sampled else ""), max_nodes) for d in range(a.depth, b.depth + 1)
                     for br in range(a.branch, b.branch + 1)]
        shapes += [t for t in found if t not in shapes]
    if not shapes:
        raise MlxspecError("--tree names no shapes")
    return shapes


# ----------------------------------------------------------------------------- structure


def depths(parents: Sequence[int]) -> list[int]:
    """Depth of every node: 1 for a child of the root."""
    out: list[int] = []
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"node {i}'s parent {p} does not come before it")
        out.append(1 if p < 0 else out[p] + 1)
    return out


def children(parents: Sequence[int]) -> dict[int, list[int]]:
    """Each node's children in proposal order (-1: the root's), only for nodes that have some."""
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
    return kids


def levels(parents: Sequence[int]) -> list[range]:
    """The index range of each depth, for breadth-first trees (static shapes)."""
    d = depths(parents)
    if any(b < a for a, b in zip(d, d[1:])):
        raise ValueError("not a breadth-first tree")
    return [range(d.index(k), len(d) - d[::-1].index(k)) for k in range(1, (max(d) if d else 0) + 1)]


def path_to(parents: Sequence[int], node: int) -> list[int]:
    """The nodes from the root's child down to ``node`` (empty for the root, -1)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def first_line(parents: Sequence[int], node: int) -> list[int]:
    """The drafter's own favourite continuation below ``node``: its first child, that child's
    first child, and so on (what a chain would have drafted there)."""
    line: list[int] = []
    for i, p in enumerate(parents):
        if p == (line[-1] if line else node):
            line.append(i)
    return line


def ancestry(parents: Sequence[int]) -> np.ndarray:
    """Boolean (m, m): [i, j] when node j is node i or one of its ancestors."""
    m = len(parents)
    a = np.eye(m, dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            a[i] |= a[p]
    return a


def node_mask(parents: Sequence[int], context: int, lo: int = 0, hi: int | None = None) -> np.ndarray:
    """Boolean (hi - lo, context + hi) attention mask for a pass over nodes ``lo..hi-1``, with
    the cache holding ``context`` rows every node sees, then nodes ``0..lo-1``: each node
    sees the context, its ancestors and itself, never a sibling's branch."""
    hi = len(parents) if hi is None else hi
    seen = ancestry(parents)[lo:hi, :hi]
    return np.concatenate([np.ones((hi - lo, context), dtype=bool), seen], axis=1)


def verify_mask(parents: Sequence[int], offset: int) -> np.ndarray:
    """Boolean (1 + m, offset + 1 + m) mask for the verify pass over [y, nodes] with ``offset``
    committed tokens cached before y: y sees the context and itself, a node also y."""
    m = len(parents)
    top = np.concatenate([np.ones((1, offset + 1), dtype=bool), np.zeros((1, m), dtype=bool)], axis=1)
    return np.concatenate([top, node_mask(parents, offset + 1)], axis=0)


def verify_positions(parents: Sequence[int], offset: int) -> np.ndarray:
    """Positions of [y, nodes]: y at ``offset``, a node at ``offset`` + its depth, where the
    same token would sit if its branch were decoded as a chain."""
    return np.array([offset] + [offset + d for d in depths(parents)], dtype=np.int32)


# ----------------------------------------------------------------------------- auto trees


def best_node_count(probs: Sequence[float], costs: Sequence[float]) -> int:
    """How many of the candidate nodes to verify, given their path probabilities ``probs``
    (the draft's estimate that the target keeps each, most likely first) and ``costs[n]``, the
    ms of a pass over n + 1 tokens: the n that maximises expected tokens per ms,
    (1 + probs[0] + ... + probs[n-1]) / costs[n]. All of them when there are no costs."""
    if not costs:
        return len(probs)
    n_max = min(len(probs), len(costs) - 1)
    gain = np.concatenate([[1.0], 1.0 + np.cumsum(probs[:n_max])])
    return int(np.argmax(gain / np.asarray(costs[: n_max + 1], dtype=np.float64)))


class GrowingTree:
    """The host-side bookkeeping of an ``auto`` tree while a drafter grows it: nodes in the
    order they are made (id), each with its token, parent id (-1: the root), depth and path
    log-probability; ``fed`` the ids the drafter has run through its model, in order (its
    cache rows after the committed context)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parent: list[int] = []
        self.depth: list[int] = []
        self.score: list[float] = []
        self.node_p: list[float] = []
        self.fed: list[int] = []

    def add_children(self, parents: Sequence[int], tokens: Sequence[Sequence[int]],
                     logprobs: Sequence[Sequence[float]]) -> list[int]:
        """Children ``tokens[r]`` (with their log-probabilities under the parent) of each node
        ``parents[r]``; returns the new ids."""
        new = []
        for par, toks, lps in zip(parents, tokens, logprobs):
            base, d = (0.0, 0) if par < 0 else (self.score[par], self.depth[par])
            for tok, lp in zip(toks, lps):
                if not np.isfinite(lp):  # outside the drafter's vocabulary or filtered: never proposed
                    continue
                new.append(len(self.tokens))
                self.tokens.append(int(tok))
                self.parent.append(par)
                self.depth.append(d + 1)
                self.score.append(base + float(lp))
                self.node_p.append(float(np.exp(lp)))
        return new

    def most_likely(self, ids: Sequence[int], n: int) -> list[int]:
        """The ``n`` of ``ids`` with the highest path probability (ties: made first)."""
        return sorted(ids, key=lambda i: (-self.score[i], i))[:n]

    def ancestors(self, node: int) -> list[int]:
        out = []
        while node >= 0:
            out.append(node)
            node = self.parent[node]
        return out

    def feed_mask(self, batch: Sequence[int], context: int) -> np.ndarray:
        """Boolean (len(batch), context + len(fed) + len(batch)) mask to run ``batch`` after
        the fed nodes: each sees the context, its fed ancestors and itself."""
        rows = []
        order = list(self.fed) + list(batch)
        for node in batch:
            mine = set(self.ancestors(node))
            rows.append([True] * context + [i in mine for i in order])
        return np.array(rows, dtype=bool)

    def select(self, costs: Sequence[float], max_nodes: int) -> tuple[list[int], tuple[int, ...]]:
        """The nodes to verify (ids, breadth first) and their parents as proposal indices: the
        most likely ones, as many as ``best_node_count`` finds worth their cost, at most
        ``max_nodes``. A path's probability never exceeds its parent's, so the most likely
        nodes (ties to the shallower) always include their ancestors."""
        ranked = sorted(range(len(self.tokens)), key=lambda i: (-self.score[i], self.depth[i], i))[:max_nodes]
        n = best_node_count([float(np.exp(self.score[i])) for i in ranked], costs)
        chosen = sorted(ranked[:n], key=lambda i: (self.depth[i], i))
        index = {node: j for j, node in enumerate(chosen)}
        return chosen, tuple(index[self.parent[i]] if self.parent[i] >= 0 else -1 for i in chosen)
