"""Several requests decoding together (``serve --parallel N``).

Each request runs the ordinary engine in a greenlet of its own (a slot), all on the decoder's
one thread: torch's OpenMP threads spin between passes only while their pools do not outnumber
the cores, and every thread that runs torch keeps a pool, so passes from several threads ran
1.5x slower here. Where a slot's engine calls the target, its ``SlotTarget`` hands the pass to
the ``Slots`` scheduler and the slot sleeps; once every busy slot has a pass waiting, the
scheduler runs a round: the short passes (decode and verify steps, at most ``SOLO_ROWS``
tokens each) packed into one, so the weights are read once for all of them; longer ones alone;
prompt chunks taking turns with the others' steps (``Slots._due``), so a long prompt neither
holds them for its length nor slows each of their steps by a chunk. Each pass's results are its
own pass's bits (``torchpath.packed``), so every reply is the one it gets alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import greenlet

from mlxspec.session import Session
from mlxspec.torchpath.packed import MAX_ROWS, Pass, packed_forward

SOLO_ROWS = 16  # a pass over more tokens than this (a prompt chunk) runs alone in its round
# Rows a round's packed pass holds while several slots decode, shared among them (``BusyK``):
# at 4 slots no drafts (0.50x the time of the requests one at a time), 1.5x the rows 0.55x,
# 3x 0.58x (4 clients, 64 tokens, the default drafter, 2026-12-04).
ROUND_ROWS = 4
NO_JOB = object()  # what ``Slots.serve``'s ``take`` gives when no request is waiting


@dataclass
class RoundStats:
    """What the scheduler ran: rounds, and the rows of each packed pass."""

    rounds: int = 0
    packed_rows: list[int] = field(default_factory=list)


class Slots:
    """Up to ``len(sessions)`` requests decoding together, slot i with ``sessions[i]`` (made by
    ``slot_session`` on this scheduler)."""

    def __init__(self, model: Any, run_packed: Callable[[Any, list[Pass]], list[Any]] = packed_forward):
        self.model, self.run_packed = model, run_packed
        self.stats = RoundStats()
        self._members: set[greenlet.greenlet] = set()
        self._chunks_s = self._steps_s = 0.0  # the last prompt chunk's time, the steps' since (``_due``)

    @property
    def busy(self) -> int:
        """Slots decoding a request now."""
        return len(self._members)

    def joined(self) -> bool:
        """Whether the caller is a slot decoding a request (not the scheduler)."""
        return greenlet.getcurrent() in self._members

    def wait_for(self, p: Pass) -> Any:
        """``p``'s result, after the round that runs it (a slot's call)."""
        return greenlet.getcurrent().parent.switch(p)

    def serve(self, sessions: list[Session], take: Callable[[bool], Any], decode: Callable[[Any, Session], None]) -> None:
        """Decode jobs from ``take(block)`` (a job, ``NO_JOB``, or None: stop taking) with
        ``decode(job, session)`` in free slots, rounds of their passes between, until ``take``
        said stop and every slot is done."""
        free, busy = list(range(len(sessions)))[::-1], {}  # slot -> (greenlet, what to resume it with)
        waiting: dict[int, Pass] = {}  # slot -> the pass it waits for
        taking = True
        while taking or busy:
            while taking and free:
                job = take(not busy)
                if job is NO_JOB:
                    break
                if job is None:
                    taking = False
                    break
                i = free.pop()
                g = greenlet.greenlet(lambda job=job, s=sessions[i]: decode(job, s))
                self._members.add(g)
                busy[i] = (g, ())
            for i, (g, resume) in list(busy.items()):
                if i in waiting:  # its pass is still to run
                    continue
                asked = g.throw(resume) if isinstance(resume, BaseException) else g.switch(*resume)
                if g.dead:
                    self._members.discard(g)
                    del busy[i]
                    free.append(i)
                else:
                    waiting[i] = asked
            now = self._due(waiting)
            for i, result in zip(now, self._round([waiting.pop(i) for i in now])):
                busy[i] = (busy[i][0], result if isinstance(result, BaseException) else (result,))

    def _due(self, waiting: dict[int, Pass]) -> list[int]:
        """The slots whose passes run this round. Prompt chunks share the time with the others'
        steps: while steps wait, a chunk runs only once steps have had as long since the last
        chunk as that chunk took, so a long prompt neither holds the others for its whole length
        nor makes every step of theirs wait for a chunk."""
        chunks = [i for i, p in waiting.items() if p.rows > MAX_ROWS]
        steps = [i for i in waiting if i not in chunks]
        if chunks and (not steps or self._steps_s >= self._chunks_s):
            return steps + chunks
        return steps

    def _round(self, passes: list[Pass]) -> list[Any]:
        """Each pass's result, or the exception its group failed with."""
        if not passes:
            return []
        self.stats.rounds += 1
        results: list[Any] = [None] * len(passes)
        for group in groups(passes):
            t0 = time.perf_counter()
            try:
                if len(group) == 1:  # a request decoding alone, or a prompt chunk: its own pass
                    p = passes[group[0]]
                    outs = [self.model(p.tokens, p.cache, mask=p.mask, positions=p.positions,
                                       return_hidden=p.return_hidden, logit_rows=p.logit_rows)]
                else:
                    outs = self.run_packed(self.model, [passes[j] for j in group])
                    self.stats.packed_rows.append(sum(passes[j].rows for j in group))
            except Exception as e:  # every request of the group fails with it
                outs = [e] * len(group)
            for j, out in zip(group, outs):
                results[j] = out
            took = time.perf_counter() - t0
            if passes[group[0]].rows > MAX_ROWS:
                self._chunks_s, self._steps_s = took, 0.0
            else:
                self._steps_s += took
        return results


def groups(passes: list[Pass]) -> list[list[int]]:
    """Indices of ``passes``: long ones alone; the short ones packed, in order, into groups of
    ``MAX_ROWS`` rows at most."""
    groups: list[list[int]] = []
    packed: list[int] = []
    for j, p in enumerate(passes):
        if p.rows > SOLO_ROWS:
            groups.append([j])
            continue
        if packed and sum(passes[i].rows for i in packed) + p.rows > MAX_ROWS:
            groups.append(packed)
            packed = []
        packed.append(j)
    return groups + ([packed] if packed else [])


class SlotTarget:
    """The target as a slot's engine sees it: the model itself, but for passes over the target's
    cache made by a slot, which wait for the scheduler's round (the drafter's partial-layer
    passes, and calls outside a request, run at once)."""

    def __init__(self, model: Any, slots: Slots):
        self._model, self._slots = model, slots

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __call__(self, tokens: Any, cache: Any, mask: Any = None, positions: Any = None, num_layers: int | None = None,
                 return_hidden: bool | tuple[int, ...] = False, logit_rows: int | None = None) -> Any:
        if num_layers is not None or cache is None or not self._slots.joined():
            return self._model(tokens, cache, mask=mask, positions=positions, num_layers=num_layers,
                               return_hidden=return_hidden, logit_rows=logit_rows)
        return self._slots.wait_for(Pass(tokens, cache, mask, positions, return_hidden, logit_rows))


def slot_session(session: Session, slots: Slots, draft: str, k: Any, tree: Any) -> Session:
    """A slot's own session on ``session``'s target, seen through a ``SlotTarget``: its own
    drafter (a drafter holds one sequence's state) and K policy, the kept caches shared. Its
    passes share rounds with the other slots', so their timings are not checked against the
    verify-cost curve."""
    lm = replace(session.lm, model=SlotTarget(session.lm.model, slots))
    slot = Session(lm, draft, k, tree, dtype=session.dtype, log=session.log, kept=session.kept,
                   check_curve=False).ready()
    if hasattr(slot.policy, "next_k"):
        slot.policy = BusyK(slot.policy, slots, ROUND_ROWS)
    return slot


class BusyK:
    """A slot's K policy, drafting less while other slots decode: the int4 kernel's cost grows
    with the rows of a pass (a packed pass over 12 rows costs 1.5x one over 4), so drafts that
    pay alone cost the others more than they save. ``rows``: a round's rows the slots share."""

    def __init__(self, policy: Any, slots: Slots, rows: int):
        self.policy, self.slots, self.rows = policy, slots, rows

    def next_k(self) -> int:
        k, busy = self.policy.next_k(), self.slots.busy
        return k if busy <= 1 else min(k, max(0, self.rows // busy - 1))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)
