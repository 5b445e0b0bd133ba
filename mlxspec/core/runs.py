"""The record of one generation, folded from the engine's events: what every face that shows a
reply (the printer, the server, the chat) and every measurement reads."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mlxspec.core.events import Done, Event, Step
from mlxspec.errors import MlxspecError


@dataclass(frozen=True)
class Run:
    """One generation. ``prefill_s`` runs from the call to the first committed tokens (for
    speculation the first step's draft and verify count as prefill), ``decode_s`` from there to
    the last token; ``first_step_tokens`` came out of that first step. Per step: accepted
    drafts, drafted tokens, the draft budget the engine allowed (``rooms``) and timings."""

    tokens: list[int]
    prompt_tokens: int
    prefill_s: float
    decode_s: float
    first_step_tokens: int = 1
    stop_reason: str = "length"
    accepted: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    rooms: list[int] = field(default_factory=list)
    draft_ms: list[float] = field(default_factory=list)
    verify_ms: list[float] = field(default_factory=list)

    @property
    def generated_tokens(self) -> int:
        return len(self.tokens)

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def steps(self) -> int:
        return len(self.accepted)

    @property
    def tps(self) -> float:
        """END-TO-END tokens/s: generated tokens / (prefill + decode) seconds."""
        return self.generated_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def decode_tokens(self) -> int:
        return self.generated_tokens - min(self.first_step_tokens, self.generated_tokens)

    @property
    def decode_tps(self) -> float | None:
        """Tokens after the first step / decode seconds; None when there are none."""
        n = self.decode_tokens
        return n / self.decode_s if n > 0 and self.decode_s > 0 else None

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
            "tokens": list(self.tokens), "stop_reason": self.stop_reason, "prefill_s": self.prefill_s,
            "decode_s": self.decode_s, "total_s": self.total_s,
            "first_step_tokens": min(self.first_step_tokens, self.generated_tokens), "tps": self.tps,
            "decode_tps": self.decode_tps, "steps": self.steps, "accepted": list(self.accepted),
            "drafted": list(self.drafted), "rooms": list(self.rooms), "draft_ms": list(self.draft_ms),
            "verify_ms": list(self.verify_ms),
        }


@dataclass
class RunCollector:
    """Folds engine events into a ``Run`` one at a time, for consumers that also show each
    event as it arrives; ``collect_run`` is the same over a whole generator."""

    tokens: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    rooms: list[int] = field(default_factory=list)
    draft_ms: list[float] = field(default_factory=list)
    verify_ms: list[float] = field(default_factory=list)
    first_step_tokens: int | None = None
    done: Done | None = None

    def add(self, ev: Event) -> None:
        if isinstance(ev, Step):
            em = ev.emitted
            self.tokens += em
            if self.first_step_tokens is None:
                self.first_step_tokens = len(em)
            self.accepted.append(ev.accepted)
            self.drafted.append(ev.k)
            self.rooms.append(ev.room)
            self.draft_ms.append(ev.draft_ms)
            self.verify_ms.append(ev.verify_ms)
        elif isinstance(ev, Done):
            self.done = ev

    def run(self) -> Run:
        if self.done is None:
            raise MlxspecError("the generation ended without its Done event")
        d = self.done
        return Run(list(self.tokens), d.prompt_tokens, d.prefill_s, d.decode_s, self.first_step_tokens or 0,
                   d.stop_reason, list(self.accepted), list(self.drafted), list(self.rooms), list(self.draft_ms),
                   list(self.verify_ms))


def collect_run(events: Iterable[Event]) -> Run:
    """The ``Run`` of one generation, from the engine's events."""
    c = RunCollector()
    for ev in events:
        c.add(ev)
    return c.run()



def acceptance_by_position(accepted: list[int], drafted: list[int], k: int) -> list[float | None]:
    """Position i (0-based) is accepted iff a step kept more than i drafts, over the steps that
    drafted more than i tokens; None where no step drafted that far."""
    out: list[float | None] = []
    for i in range(k):
        tried = [a for a, d in zip(accepted, drafted) if d > i]
        out.append(sum(a > i for a in tried) / len(tried) if tried else None)
    return out
