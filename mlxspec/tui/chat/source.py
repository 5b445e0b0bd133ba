"""What the chat app needs from the models, behind one small protocol so that tests (and
``python -m mlxspec.tui --demo``) can inject a deterministic fake.

Every method of a ``Source`` is called from the app's model worker thread only: that thread
owns all MLX state. Widgets never see a ``Source``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

import mlxspec  # noqa: F401  (loads the fast BLAS before anything imports mlx)
from mlxspec import runtime
from mlxspec.core.drafters import MAX_K
from mlxspec.core.events import Event
from mlxspec.core.prompt_cache import PromptCache
from mlxspec.core.sampling import SamplingParams
from mlxspec.core.runs import collect_run
from mlxspec.session import Session, StepText
from mlxspec.targets import loading

if TYPE_CHECKING:
    from mlxspec.core.tree import TreeShape
    from mlxspec.targets.loading import LoadedModel

# What the keys cycle through; a --draft / --temp from the command line is added if missing.
# ``chat`` adds the drafts the registry ships for its target (``shipped_drafts``).
DRAFTERS: tuple[str, ...] = ("none", "ngram:3", "suffix", "self:8")
TEMPERATURES: tuple[float, ...] = (0.0, 0.3, 0.7, 1.0)
K_MIN, K_MAX = 1, MAX_K
AUTO = "auto"  # K chosen every step (``core.autok``)


@dataclass(frozen=True)
class Settings:
    """What the next turn runs with. The keys change it; a running turn keeps its own."""

    draft: str = "default"
    k: int | str = 4  # or AUTO
    speculate: bool = True
    params: SamplingParams = SamplingParams()  # temperature (cycled by a key), filters, penalties
    max_tokens: int = 512
    seed: int = 0
    system: str | None = None  # a system message before every conversation (--system-prompt)
    tree: TreeShape | None = None  # --tree DxB: draft trees of this shape instead of chains (K unused)

    @property
    def temp(self) -> float:
        return self.params.temperature

    def with_temp(self, temp: float) -> Settings:
        return replace(self, params=replace(self.params, temperature=temp))

    @property
    def drafter(self) -> str:
        """The drafter a turn actually uses: ``none`` while speculation is off."""
        return self.draft if self.speculate else "none"

    @property
    def turn_k(self) -> int:
        """The most a turn drafts per step (auto: up to ``autok.DEFAULT_MAX_K``); 0 target-only."""
        from mlxspec.core.autok import DEFAULT_MAX_K

        if self.drafter == "none":
            return 0
        if self.tree is not None:
            return self.tree.depth
        return DEFAULT_MAX_K if self.k == AUTO else int(self.k)

    @property
    def shape(self) -> str:
        """How much is drafted per step: ``K=4``, ``K=auto`` or ``tree=3x2``."""
        return f"K={self.k}" if self.tree is None else f"tree={self.tree}"

    @property
    def label(self) -> str:
        spec = "target only" if self.drafter == "none" else f"{self.drafter} {self.shape}"
        return f"{spec} · {self.params.label}"


@dataclass(frozen=True)
class ModelInfo:
    target: str
    dtype: str
    context_length: int
    backend: str  # e.g. "MLX 0.29.1 on CPU (OpenBLAS, 2 cores)"
    device: str  # "cpu" | "gpu"
    baseline_ms: float | None  # target-only decode, ms per token, measured at start-up


class TextDecoder(Protocol):
    def add(self, token_id: int) -> str:
        """The next piece of the output text (streaming: may be '' mid-character)."""

    def alone(self, token_id: int) -> str:
        """A token that is not part of the output (a rejected draft), decoded on its own."""

    def finish(self) -> str:
        """Whatever the streaming decoder still holds at the end of the turn."""


class Source(Protocol):
    def load(self) -> ModelInfo:
        """Load the models (may raise ``MlxspecError``)."""

    def decoder(self) -> TextDecoder:
        """A fresh text decoder for one turn."""

    def events(self, messages: list[dict[str, str]], settings: Settings, keep: bool = True) -> Iterator[Event]:
        """The engine's events for the assistant's reply to ``messages``; ``keep``: leave the
        conversation's cache for the next turn (False: a reply nobody continues)."""

    def close(self) -> None:
        """The worker is done with the models (the app is exiting)."""


def _settle() -> None:
    """Wait for MLX work still in flight. Target-only decoding ends with one step computed
    ahead (``async_eval``) and never awaited; left running on a worker thread, it can hang or
    abort the process at exit."""
    import mlx.core as mx

    mx.synchronize()


class ModelSource:
    """The real models: ``loading.load(target)`` and the engine, drafters made on demand."""

    def __init__(self, target: str = "default", dtype: str = "auto", *,
                 loaded: LoadedModel | None = None, baseline_tokens: int = 16,
                 auto_k: bool = False, remeasure_cost: bool = False, backend: str = "mlx"):
        self.target, self.dtype, self.backend = target, dtype, backend
        self.lm = loaded
        self.baseline_tokens = baseline_tokens  # 0: do not measure
        self.auto_k = auto_k  # load() then readies the verify-cost curve (measured once, cached)
        self.remeasure_cost = remeasure_cost
        # made with the model: at once for a model given loaded, else by ``load``
        self.session = None if loaded is None else self._open(loaded)

    def load(self) -> ModelInfo:
        if self.lm is None:
            self.lm = loading.load(self.target, self.dtype, self.backend)
        self.session = self.session or self._open(self.lm)
        if self.auto_k:  # measured (or read from its cache) now, not during the first turn
            self.session.cost_curve()
        self.session.ready()
        on_mlx = getattr(self.lm, "backend", "mlx") == "mlx"
        return ModelInfo(self.lm.name, self.lm.dtype, self.lm.context_length,
                         runtime.backend_description() if on_mlx else runtime.torch_description(self.lm.backend),
                         runtime.device_name() if on_mlx else self.lm.backend.partition(":")[2],
                         self.measure_baseline())

    def _open(self, lm: LoadedModel) -> Session:
        return Session(lm, dtype=self.dtype, remeasure_cost=self.remeasure_cost, log=None)

    @property
    def kept(self) -> PromptCache:
        """The target's cache from the last turn: a new turn prefills only itself."""
        assert self.session is not None
        return self.session.kept

    def measure_baseline(self) -> float | None:
        """Ms per token of target-only decoding, as a turn's speed is measured (wall time
        after the first step: ``Run.decode_tps``), on a short greedy run, EOS ignored. Also
        warms the model up."""
        if self.baseline_tokens < 2:
            return None
        run = collect_run(Session(self.lm, log=None).stream("Hello! Who are you?", max_tokens=self.baseline_tokens,
                                                            stop_ids=set()))
        _settle()
        return 1000.0 / run.decode_tps if run.decode_tps else None

    def close(self) -> None:
        _settle()

    def decoder(self) -> TextDecoder:
        return StepText(self.lm.tokenizer)

    def drafting(self, settings: Settings) -> Session:
        """The session set to draft as ``settings`` say: drafters and each one's ``AutoK`` made
        once and kept across turns, so an acceptance estimate follows the conversation."""
        assert self.session is not None
        drafter = self.session.drafter_for(settings.drafter)
        tree = settings.tree if drafter is not None else None  # a tree's depth is its K
        k = None if settings.k == AUTO else settings.k
        return self.session.use(settings.drafter, k, tree)

    def events(self, messages: list[dict[str, str]], settings: Settings, keep: bool = True) -> Iterator[Event]:
        params = settings.params
        system = [{"role": "system", "content": settings.system}] if settings.system else []
        events = self.drafting(settings).stream(system + messages, params, settings.max_tokens, settings.seed,
                                                keep=keep)
        try:
            yield from events
        finally:
            events.close()
            _settle()
