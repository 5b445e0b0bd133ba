"""What the engine emits. Every consumer (CLI printer, TUI, stats, sweep) reads these."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum


class Status(str, Enum):
    ACCEPTED = "accepted"  # a draft token the target agreed with
    REJECTED = "rejected"  # a draft token the target refused: not part of the output
    CORRECTED = "corrected"  # the target's own token at the first rejection
    BONUS = "bonus"  # the target's token after a fully accepted draft
    PLAIN = "plain"  # a token from target-only decoding


@dataclass(frozen=True)
class Token:
    """One token of a step. ``logprob``: the target's log-probability of it, only when the run
    was asked for them (``generate(..., logprobs=N)``) and only for emitted tokens: the
    log-softmax of the processed logits at its position (``core.processors``). ``top_logprobs``:
    the N most likely tokens there, best first, as (id, log-probability), when N > 0."""

    id: int
    status: Status
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] | None = None

    @property
    def emitted(self) -> bool:
        return self.status is not Status.REJECTED


@dataclass(frozen=True)
class NodeStats:
    """What the target (and the drafter) thought of each node of a verified tree, computed only
    when ``generate(..., node_stats=True)`` asks (``mlxspec study``): node i was judged against
    the target's distribution at its parent's row of the verify pass (the last committed token
    for a child of the root). ``entropy[i]``: that distribution's entropy in nats;
    ``p_target[i]``: its probability of ``tokens[i]``; ``target_top[i]``: its most likely
    token. The distribution is the softmax of the logits under greedy decoding, the sampling
    distribution (temperature, top-p, ...) otherwise. ``q_draft[i]``: the drafter's probability
    of ``tokens[i]`` at the parent, on the same convention, or None when the drafter has none
    (prompt lookup)."""

    entropy: tuple[float, ...]
    p_target: tuple[float, ...]
    target_top: tuple[int, ...]
    q_draft: tuple[float, ...] | None = None

    def to_dict(self) -> dict:
        return {"entropy": list(self.entropy), "p_target": list(self.p_target), "target_top": list(self.target_top),
                "q_draft": None if self.q_draft is None else list(self.q_draft)}


@dataclass(frozen=True)
class Tree:
    """The draft tree a step verified: node i is ``tokens[i]`` below node ``parents[i]`` (-1:
    below the last committed token), and ``path`` the nodes the target accepted, root first.
    ``stats``: per-node ``NodeStats`` when the engine was asked for them, else None."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    path: tuple[int, ...]
    stats: NodeStats | None = None

    def to_dict(self) -> dict:
        d = {"tokens": list(self.tokens), "parents": list(self.parents), "path": list(self.path)}
        if self.stats is not None:
            d["stats"] = self.stats.to_dict()
        return d


@dataclass(frozen=True)
class Step:
    """One decoding step: K drafted, ``accepted`` of them kept, then one target token.
    Target-only decoding is a step with k=0 and one plain token.

    ``room`` is how many drafts the engine allowed this step (K, less near the token limit); a
    drafter may propose fewer. Acceptance by position counts only steps with room for it.

    ``tree``: the tree a tree-drafting step verified (``k`` is then its node count, ``room``
    the depth allowed, ``accepted`` the accepted path's length, and ``tokens`` show that path,
    then the drafter's own first line below it as rejected); None for chains.

    ``drafter``: the name of the drafter that proposed this step's drafts (in a cascade, the
    part that drafted); None when nothing was drafted."""

    tokens: list[Token]
    k: int
    accepted: int
    draft_ms: float
    verify_ms: float
    room: int = 0
    tree: Tree | None = None
    drafter: str | None = None

    @property
    def emitted(self) -> list[int]:
        return [t.id for t in self.tokens if t.emitted]


@dataclass(frozen=True)
class Done:
    prompt_tokens: int
    generated_tokens: int
    prefill_s: float
    decode_s: float
    stop_reason: str  # "eos" | "length" | "context"
    steps: int = 0
    accepted_lengths: list[int] = field(default_factory=list)

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        # The first token comes out of prefill, so decode time covers the rest.
        n = self.generated_tokens - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(prefill_tps=self.prefill_tps, decode_tps=self.decode_tps)
        return d


Event = Step | Done
