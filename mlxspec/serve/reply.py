"""One reply as text: streaming detokenisation, stop strings cut out, usage and speculation
counted from the engine's events. Pure: tested without a model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlxspec.core.events import Status, Step
from mlxspec.core.runs import RunCollector
from mlxspec.serve.logprobs import TokenLogprob, token_logprobs
from mlxspec.session import StepText


class StopScanner:
    """Cuts streamed text at the first stop string. Text that could still be the start of one is
    held back until the next piece settles it, so a client never sees part of a stop string."""

    def __init__(self, stops: tuple[str, ...] = ()):
        self.stops = stops
        self.held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """The text that is now certain to be output (nothing once a stop string was seen)."""
        if self.stopped:
            return ""
        buf = self.held + text
        hits = [i for s in self.stops if (i := buf.find(s)) >= 0]
        if hits:
            self.stopped, self.held = True, ""
            return buf[: min(hits)]
        keep = max((n for s in self.stops for n in range(min(len(s) - 1, len(buf)), 0, -1)
                    if s.startswith(buf[len(buf) - n:])), default=0)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """At the end of the reply: what was held back was not a stop string after all."""
        out, self.held = ("" if self.stopped else self.held), ""
        return out


class Tally(RunCollector):
    """Usage and speculation statistics of one reply, from the engine's events as ``RunCollector``
    folds them. A reply cut short (stop string, client gone) has no ``Done``; its steps still
    count what was decoded."""

    def __init__(self, prompt_tokens: int):
        super().__init__()
        self.prompt_tokens = prompt_tokens

    @property
    def stop_reason(self) -> str | None:
        """The engine's: "eos" | "length" | "context"; None before its ``Done``."""
        return self.done.stop_reason if self.done is not None else None

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": len(self.tokens),
                "total_tokens": self.prompt_tokens + len(self.tokens)}

    def speculation(self, drafter: str | None, k: int | str) -> dict:
        """``acceptance`` is accepted / drafted (None when nothing was drafted);
        ``tokens_per_step`` the output tokens per target pass."""
        steps, drafted, accepted = len(self.drafted), sum(self.drafted), sum(self.accepted)
        return {"drafter": drafter, "k": k if drafter else 0, "steps": steps, "drafted": drafted,
                "accepted": accepted, "acceptance": round(accepted / drafted, 4) if drafted else None,
                "tokens_per_step": round(len(self.tokens) / steps, 4) if steps else None,
                "draft_ms": round(sum(self.draft_ms), 2), "verify_ms": round(sum(self.verify_ms), 2)}


@dataclass(frozen=True)
class Delta:
    """What one engine step adds to the reply: its text (after stop strings), its tokens, and
    the log-probabilities of those emitted (when the request asked for them)."""

    text: str
    tokens: list[dict] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)


class Reply:
    """One reply's events as text: streaming detokenisation (rejected drafts decoded on their
    own, outside the reply), stop strings, and the tally."""

    def __init__(self, tokenizer: Any, stops: tuple[str, ...], prompt_tokens: int):
        self.text = StepText(tokenizer)
        self.scanner = StopScanner(stops)
        self.tally = Tally(prompt_tokens)
        self.decoded = 0  # characters the detokeniser has given out (where the next token's text starts)
        self.sent = 0  # characters of the reply given out, after stop strings

    @property
    def stopped(self) -> bool:
        return self.scanner.stopped

    def step(self, ev: Step) -> Delta:
        self.tally.add(ev)
        pieces = list(self.text.pieces(ev))
        kept = [piece for t, piece in pieces if t.status is not Status.REJECTED]
        tokens = [{"id": t.id, "text": piece, "status": t.status.value} for t, piece in pieces]
        logprobs = token_logprobs(ev.tokens, kept, self.text.alone, self.decoded)
        self.decoded += sum(map(len, kept))
        out = self.scanner.feed("".join(kept))
        self.sent += len(out)
        if self.scanner.stopped:  # tokens that only made up the stop string are not part of the reply
            logprobs = [e for e in logprobs if e.offset < self.sent]
        return Delta(out, tokens, logprobs)

    def finish(self) -> Delta:
        """The text the detokeniser and the stop scanner still hold."""
        return Delta(self.scanner.feed(self.text.finish()) + self.scanner.flush())

    @property
    def finish_reason(self) -> str:
        return "stop" if self.stopped or self.tally.stop_reason == "eos" else "length"

