"""A deterministic stand-in for the models: scripted engine events, a word-per-token
"tokenizer" and a virtual clock. Used by the tests and by ``python -m mlxspec.tui --demo``."""

from __future__ import annotations

import time
from collections.abc import Iterator

from mlxspec.core.events import Done, Event, Status, Step, Token
from mlxspec.errors import MlxspecError

from .source import ModelInfo, Settings

A, R, C, B, P = Status.ACCEPTED, Status.REJECTED, Status.CORRECTED, Status.BONUS, Status.PLAIN

# One entry per verification step: (draft ms, verify ms, [(text, status), ...]) in engine order
# (rejected drafts just before the correction that replaced them).
SCRIPT: list[tuple[float, float, list[tuple[str, Status]]]] = [
    (1.0, 100.0, [("Speculative", P)]),
    (2.0, 150.0, [(" decoding", A), (" lets", A), (" a", A), (" small", B)]),
    (2.0, 150.0, [(" draft", A), (" guess", R), (" ahead", R), (" propose", C)]),
    (2.0, 140.0, [(" tokens", A), (" that", A), (" the", A), (" big", R), (" target", C)]),
    (2.0, 140.0, [(" checks", A), (" in", A), (" one", A), (" pass", A), (".", B)]),
    (1.0, 110.0, [(" Mismatches", P)]),
    (2.0, 150.0, [(" are", R), ("\n", R), (" dropped", R), (" are", C)]),
    (2.0, 150.0, [(" struck", A), (" through", A), (".", A), (" Done", B)]),
]


class FakeDecoder:
    def __init__(self, vocab: dict[int, str]):
        self.vocab = vocab

    def add(self, token_id: int) -> str:
        return self.vocab[token_id]

    def alone(self, token_id: int) -> str:
        return self.vocab[token_id]

    def finish(self) -> str:
        return ""


class FakeSource:
    """Replays ``SCRIPT`` (with the steps' K and acceptance derived from the statuses).

    ``delay`` sleeps that many seconds per step (for stop tests and demos); ``fail_load`` and
    ``fail_turn`` raise ``MlxspecError`` from ``load`` / the first event.
    """

    def __init__(self, script=SCRIPT, delay: float = 0.0, fail_load: str | None = None,
                 fail_turn: str | None = None, baseline_ms: float | None = 110.0):
        self.script, self.delay = script, delay
        self.fail_load, self.fail_turn, self.baseline_ms = fail_load, fail_turn, baseline_ms
        self.ids: dict[str, int] = {}  # one "token" per distinct text
        for _, _, pieces in script:
            for text, _ in pieces:
                self.ids.setdefault(text, len(self.ids) + 1)
        self.vocab = {i: t for t, i in self.ids.items()}
        self.now = 0.0  # virtual clock, seconds: advances by each step's draft + verify time
        self.requests: list[tuple[list[dict[str, str]], Settings]] = []

    def clock(self) -> float:
        return self.now

    def load(self) -> ModelInfo:
        if self.fail_load:
            raise MlxspecError(self.fail_load)
        return ModelInfo("fake-target", "float32", 64, "fake backend", "cpu", self.baseline_ms)

    def decoder(self) -> FakeDecoder:
        return FakeDecoder(self.vocab)

    def close(self) -> None:
        pass

    def steps(self) -> list[Step]:
        out = []
        for draft_ms, verify_ms, pieces in self.script:
            tokens = [Token(self.ids[t], s) for t, s in pieces]
            k = sum(s in (A, R) for _, s in pieces)
            accepted = sum(s is A for _, s in pieces)
            out.append(Step(tokens, k=k, accepted=accepted, draft_ms=draft_ms, verify_ms=verify_ms))
        return out

    def events(self, messages: list[dict[str, str]], settings: Settings) -> Iterator[Event]:
        self.requests.append((messages, settings))
        return self._events()

    def _events(self) -> Iterator[Event]:
        if self.fail_turn:
            raise MlxspecError(self.fail_turn)
        steps = self.steps()
        self.now += 0.5  # prefill
        first = None
        for step in steps:
            if self.delay:
                time.sleep(self.delay)
            self.now += (step.draft_ms + step.verify_ms) / 1000
            first = self.now if first is None else first
            yield step
        n = sum(len(s.emitted) for s in steps)
        yield Done(12, n, prefill_s=0.5, decode_s=self.now - first, stop_reason="eos", steps=len(steps),
                   accepted_lengths=[s.accepted for s in steps])
