"""The timing schedule every measurement shares: untimed warm-up rounds, then timed rounds in
which every method runs once, back to back, its order turning from round to round.

A machine drifts while it is measured (it warms up, throttles, another process wakes), so a
method that always ran first would be judged on a different machine from one that always ran
last; turning the order spreads that drift over every method. Bench, sweep and the verify-cost
curve (``targets.costcurve``) all time with these functions, so their results stay comparable.
Pure Python: a "method" is any value (a K, a pass length, a column's key).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

M = TypeVar("M")
R = TypeVar("R")
Turn = Callable[[Sequence[M], int], list[M]]


def rotated(methods: Sequence[M], shift: int) -> list[M]:
    """``methods`` started at index ``shift`` (modulo their number), wrapping round: over n
    consecutive shifts each method runs in each position once."""
    if not methods:
        return []
    s = shift % len(methods)
    return [*methods[s:], *methods[:s]]


def alternated(methods: Sequence[M], shift: int) -> list[M]:
    """``methods`` in order for an even ``shift``, reversed for an odd one: each method's mean
    position over two rounds is the same (enough for two methods; rotation spreads more)."""
    return list(methods) if shift % 2 == 0 else list(methods)[::-1]


def warmup_rounds(methods: Sequence[M], rounds: int, each: int = 1) -> list[list[M]]:
    """The untimed runs before timing: ``rounds`` passes over ``methods`` in their order, each
    method ``each`` times back to back within a pass."""
    return [[m for m in methods for _ in range(each)] for _ in range(rounds)]


def timed_rounds(methods: Sequence[M], rounds: Iterable[R], start: int = 0,
                 turn: Turn = rotated) -> list[tuple[R, list[M]]]:
    """Each of ``rounds`` (whatever names a round: a prompt, a repeat) with the order its
    methods run in: round i gets ``turn(methods, start + i)``."""
    return [(r, turn(methods, start + i)) for i, r in enumerate(rounds)]
