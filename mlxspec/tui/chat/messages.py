"""What the model worker posts to the app: Textual messages carrying plain-Python dataclasses,
one ``StepGenerated`` per verification step (never one per token)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from mlxspec.core.events import Status, Step
from mlxspec.core.runs import Run
from mlxspec.session import step_pieces

from .source import ModelInfo, TextDecoder


@dataclass(frozen=True)
class Piece:
    """One token's text and how it came to be."""

    text: str
    status: Status

    @property
    def emitted(self) -> bool:
        return self.status is not Status.REJECTED


@dataclass(frozen=True)
class StepData:
    """The engine's step as it came (what ``TurnStats`` collects) with its text pieces."""

    pieces: tuple[Piece, ...]  # one per engine token, rejected drafts included
    step: Step
    t: float  # the app clock when the worker received the step
    nodes: tuple[str, ...] | None = None  # a tree step's nodes as text, one per ``step.tree.tokens``

    @property
    def k(self) -> int:
        """Tokens drafted."""
        return self.step.k

    @property
    def accepted(self) -> int:
        """Drafted tokens kept."""
        return self.step.accepted

    @property
    def emitted(self) -> int:
        return sum(p.emitted for p in self.pieces)


@dataclass(frozen=True)
class TurnResult:
    stop_reason: str  # "eos" | "length" | "context" | "stopped"
    tail: str  # text the streaming decoder still held at the end
    prompt_tokens: int | None = None
    generated_tokens: int | None = None
    decode_tps: float | None = None  # the run's decode tokens/s (None when stopped)


def turn_result(run: Run, tail: str) -> TurnResult:
    """What a turn that ran to its ``Done`` ended with, from its run."""
    return TurnResult(run.stop_reason, tail, run.prompt_tokens, run.generated_tokens, run.decode_tps)


def step_data(step: Step, decoder: TextDecoder, t: float) -> StepData:
    """Decode one engine step into text pieces, and a tree step's nodes each on its own (in the
    worker thread)."""
    pieces = tuple(Piece(text, tok.status) for tok, text in step_pieces(step, decoder))
    nodes = None if step.tree is None else tuple(decoder.alone(tok) for tok in step.tree.tokens)
    return StepData(pieces, step, t, nodes)


class ModelReady(Message):
    def __init__(self, info: ModelInfo) -> None:
        self.info = info
        super().__init__()


class ModelFailed(Message):
    def __init__(self, error: str) -> None:
        self.error = error
        super().__init__()


class StepGenerated(Message):
    def __init__(self, turn: int, step: StepData) -> None:
        self.turn, self.step = turn, step
        super().__init__()


class TurnEnded(Message):
    def __init__(self, turn: int, result: TurnResult) -> None:
        self.turn, self.result = turn, result
        super().__init__()


class TargetOnlyTimed(Message):
    """The last question decoded again target-only (``ChatApp.action_time_target_only``)."""

    def __init__(self, turn: int, result: TurnResult) -> None:
        self.turn, self.result = turn, result
        super().__init__()


class TurnFailed(Message):
    def __init__(self, turn: int, error: str) -> None:
        self.turn, self.error = turn, error
        super().__init__()
