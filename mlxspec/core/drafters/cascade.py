"""A cascade: prompt lookup where the text so far has an earlier match, a model's draft elsewhere.

Lookup and a draft head fail in different places: on the default target, lookup's continuation
is the target's next greedy token 0.69-0.79 of the time where a match exists, and the head is
right 0.30 of the time anywhere; taking lookup where it has a match and the head elsewhere agrees
with the target at 0.52 of positions, against 0.37 for lookup and 0.30 for the head alone
(benchmarks/notes/2026-12-01-why-drafts-are-refused.md).

Which part drafts a step depends only on the committed text, never on the target's choices, so
each step's proposal is an ordinary draft of that part and verification stays exact (q None for
lookup, a point mass; the head's own q when it samples). Every part sees every commit, whoever
drafted: lookups only read the committed text, and the eagle head re-runs the accepted slots with
the target's real features whatever proposed them. A draft model, whose cache holds its own
drafts, cannot take part.

``--k auto`` keeps one acceptance estimate per part (``autok.SourcedK``): lookup's drafts are
accepted two to three times as often as the head's and cost nothing, so they want longer chains.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlxspec.core.drafters.base import Commit, Proposal, can_branch, trait
from mlxspec.core.sampling import SamplingParams
from mlxspec.core.tree import TreeShape
from mlxspec.errors import MlxspecError


class CascadeDrafter:
    """Each step, the first of ``parts`` that ``offers`` a draft after the committed text
    proposes it; the last part always may. ``used``: the part that drafted the last proposal
    (what ``SourcedK`` credits the step to)."""

    samples_children = False

    def __init__(self, parts: Sequence[Any], name: str | None = None):
        parts = list(parts)
        if len(parts) < 2:
            raise MlxspecError("a cascade needs at least two drafters")
        first = next((p for p in parts[:-1] if trait(p, "offers") is None), None)
        if first is not None:
            raise MlxspecError(f"{first.name!r} cannot go first in a cascade: only prompt lookup (ngram:N, suffix:N) "
                               "can say in advance whether it has a draft")
        stateful = next((p for p in parts if not trait(p, "commits_any")), None)
        if stateful is not None:
            raise MlxspecError(f"{stateful.name!r} cannot take part in a cascade: its cache holds its own drafts, so it "
                               "cannot follow steps another drafter proposed (use ngram:N, suffix:N or an eagle head)")
        hidden = [p.wants_hidden for p in parts if p.wants_hidden]
        if len(hidden) > 1:
            raise MlxspecError("at most one drafter in a cascade may read the target's hidden states")
        self.parts = parts
        self.name = name or "+".join(p.name for p in parts)
        self.wants_hidden = hidden[0] if hidden else False
        self.commits_any = True
        self.history: list[int] = []
        self.used = len(parts) - 1
        self._upcoming: int | None = None  # the part chosen after ``history``, until it grows

    def reset(self, prompt: list[int], hidden: Any = None) -> None:
        for p in self.parts:
            p.reset(prompt, hidden if p.wants_hidden else None)
        self.history = list(prompt)
        self._upcoming = None

    @property
    def sources(self) -> tuple[str, ...]:
        """Its kinds of draft (``base.sources``) are its parts."""
        return tuple(p.name for p in self.parts)

    @property
    def used_source(self) -> int:
        return self.used

    @property
    def proposer(self) -> str:
        """The name of the part that drafted the last proposal (``Step.drafter``)."""
        return self.parts[self.used].name

    def upcoming_source(self) -> int:
        """The part that will draft after the committed text (asked once until the next commit)."""
        if self._upcoming is None:
            self._upcoming = self._first_offering(self.history)
        return self._upcoming

    def _first_offering(self, history: list[int]) -> int:
        return next((i for i, p in enumerate(self.parts[:-1]) if p.offers(history)), len(self.parts) - 1)

    def _part_for(self, history: list[int]) -> Any:
        """The part for ``history``: the cached choice when it is the committed text, else asked
        afresh (a caller that skipped ``reset`` or ``commit``)."""
        same = len(history) == len(self.history) and history[-1:] == self.history[-1:]
        self.used = self.upcoming_source() if same else self._first_offering(history)
        return self.parts[self.used]

    def propose(self, history: list[int], k: int, params: SamplingParams, key: Any) -> Proposal:
        return self._part_for(history).propose(history, k, params, key)

    def propose_tree(self, history: list[int], shape: TreeShape, params: SamplingParams, key: Any,
                     draft_probs: bool = False) -> Proposal:
        part = self._part_for(history)
        if not can_branch(part):
            raise MlxspecError(f"drafter {part.name!r} cannot branch")
        return part.propose_tree(history, shape, params, key, draft_probs)

    def commit(self, commit: Commit) -> None:
        for p in self.parts:
            p.commit(commit)
        self.history += commit.committed
        self._upcoming = None
