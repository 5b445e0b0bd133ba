"""Token trees: the static shapes a drafter branches into, and the mask and positions one
forward pass over tree nodes needs.

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


@dataclass(frozen=True)
class TreeShape:
    """``--tree DxB``: every node expands into its top-``branch`` children, ``depth`` levels
    deep, breadth first until ``max_nodes`` nodes (the last level may be cut short; the most
    likely nodes come first in it)."""

    depth: int
    branch: int
    max_nodes: int

    def parents(self) -> tuple[int, ...]:
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
        return len(self.parents())

    def cut(self, depth: int) -> TreeShape:
        """The same shape no deeper than ``depth`` (near the token limit)."""
        return replace(self, depth=max(0, min(self.depth, depth)))

    def __str__(self) -> str:
        return f"{self.depth}x{self.branch}"


def full_size(depth: int, branch: int) -> int:
    return sum(branch**d for d in range(1, depth + 1))


def parse_tree(spec: str, max_nodes: int | None = None) -> TreeShape:
    """``"DxB"`` (and ``--tree-nodes``) -> a checked ``TreeShape``; without ``max_nodes`` the
    whole tree, which must then fit in one verify pass."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", spec)
    if m is None:
        raise MlxspecError(f"bad --tree {spec!r}: expected DxB, depth D and branching B (e.g. 3x2)")
    depth, branch = int(m[1]), int(m[2])
    if not 1 <= depth <= MAX_TREE_DEPTH:
        raise MlxspecError(f"bad --tree {spec!r}: depth must be in 1..{MAX_TREE_DEPTH}, got {depth}")
    if not 1 <= branch <= MAX_TREE_BRANCH:
        raise MlxspecError(f"bad --tree {spec!r}: branching must be in 1..{MAX_TREE_BRANCH}, got {branch}")
    if max_nodes is not None and not 1 <= max_nodes <= MAX_TREE_NODES:
        raise MlxspecError(f"--tree-nodes must be in 1..{MAX_TREE_NODES}, got {max_nodes}")
    size = min(full_size(depth, branch), MAX_TREE_NODES + 1)  # no huge powers for 64x16
    if max_nodes is None and size > MAX_TREE_NODES:
        raise MlxspecError(f"--tree {depth}x{branch} has more than {MAX_TREE_NODES} nodes, more than one verify "
                           f"pass takes; cap it with --tree-nodes N (N <= {MAX_TREE_NODES})")
    return TreeShape(depth, branch, size if max_nodes is None else max_nodes)


# ----------------------------------------------------------------------------- structure


def depths(parents: Sequence[int]) -> list[int]:
    """Depth of every node: 1 for a child of the root."""
    out: list[int] = []
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"node {i}'s parent {p} does not come before it")
        out.append(1 if p < 0 else out[p] + 1)
    return out


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
