"""Does a model at given sampling settings loop on everyday questions? The measurement behind
the chat's defaults (``benchmarks/chat_loops.py``, ``benchmarks/notes/2026-12-01-chat-defaults.md``).

A reply *repeats* when some run of ``LOOP_NGRAM`` tokens occurs ``LOOP_TIMES`` times or more in
it, and *loops* when it repeats and runs to the token limit instead of ending: a small model
stuck in a cycle repeats a phrase verbatim until it is cut off. Repeating alone is not enough:
digits are single tokens here, so "15% of 80" said three times is eight tokens three times
over, and a list of three items built alike ("X is often associated with ...") repeats too,
yet both end by themselves."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from mlxspec.core.events import Done, Step
from mlxspec.core.sampling import SamplingParams
from mlxspec.session import Session

LOOP_NGRAM = 8
LOOP_TIMES = 3

# Twenty questions a new user might ask first: facts, arithmetic, advice, short writing,
# definitions, with and without a length instruction. The first is the one issue 25 saw loop.
EVERYDAY_QUESTIONS: tuple[str, ...] = (
    "What is 2+2? Answer in one word.",
    "What is the capital of France?",
    "Why is the sky blue?",
    "Give me three tips for sleeping better.",
    "How many days are there in a leap year?",
    "Write a haiku about autumn.",
    "What does a CPU do?",
    "Translate 'good morning' into Spanish.",
    "Who wrote Romeo and Juliet?",
    "How do I boil an egg?",
    "What is photosynthesis? Explain in two sentences.",
    "Suggest a name for a grey cat.",
    "What is the difference between weather and climate?",
    "Is a tomato a fruit or a vegetable?",
    "How far is the Moon from the Earth?",
    "Write a one-line birthday message for my sister.",
    "What is 15% of 80?",
    "Name three primary colours.",
    "How can I stay focused while studying?",
    "What is the boiling point of water in Fahrenheit?",
)


def repeated_ngram(tokens: Sequence[int], n: int = LOOP_NGRAM, times: int = LOOP_TIMES) -> bool:
    """Whether some ``n`` consecutive tokens occur at least ``times`` times in ``tokens``
    (occurrences may overlap: a cycle shorter than ``n`` repeats its n-grams too)."""
    counts = Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    return any(c >= times for c in counts.values())


@dataclass(frozen=True)
class Reply:
    question: str
    tokens: list[int]
    stop_reason: str  # "eos", "length" or "context"
    repeats: bool

    @property
    def loops(self) -> bool:
        return self.repeats and self.stop_reason != "eos"


@dataclass(frozen=True)
class LoopResult:
    """One sampling setting over the questions."""

    params: SamplingParams
    max_tokens: int
    seed: int
    replies: list[Reply]

    @property
    def repeated(self) -> int:
        return sum(r.repeats for r in self.replies)

    @property
    def looped(self) -> int:
        return sum(r.loops for r in self.replies)

    @property
    def at_limit(self) -> int:
        """Replies that ran to ``max_tokens`` (looping or merely long)."""
        return sum(r.stop_reason != "eos" for r in self.replies)

    @property
    def mean_tokens(self) -> float:
        return sum(len(r.tokens) for r in self.replies) / max(1, len(self.replies))


def measure_loops(session: Session, params: SamplingParams, max_tokens: int = 128, seed: int = 0,
                  questions: Sequence[str] = EVERYDAY_QUESTIONS) -> LoopResult:
    """Each question as a chat's first turn (chat template, no system prompt beyond the
    template's own), decoded as ``session`` is set up, with ``seed`` as the chat's first turn."""
    replies = []
    for q in questions:
        tokens, reason = [], "length"
        for ev in session.stream([{"role": "user", "content": q}], params, max_tokens, seed):
            if isinstance(ev, Step):
                tokens += [t.id for t in ev.tokens if t.emitted]
            elif isinstance(ev, Done):
                reason = ev.stop_reason
        replies.append(Reply(q, tokens, reason, repeated_ngram(tokens)))
    return LoopResult(params, max_tokens, seed, replies)
