"""What the chat app needs from the models, behind one small protocol so that tests (and
``python -m mlxspec.tui --demo``) can inject a deterministic fake.

Every method of a ``Source`` is called from the app's model worker thread only: that thread
owns all MLX state. Widgets never see a ``Source``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import mlxspec  # noqa: F401  (loads the fast BLAS before anything imports mlx)
from mlxspec.core.cache import PromptCache
from mlxspec.core.drafters import MAX_K
from mlxspec.core.events import Event

if TYPE_CHECKING:
    from mlxspec.core.drafters import Drafter
    from mlxspec.core.tree import TreeShape
    from mlxspec.targets.loading import LoadedModel

# What the keys cycle through; a --draft / --temp from the command line is added if missing.
DRAFTERS: tuple[str, ...] = ("default", "none", "ngram:3", "self:8")
TEMPERATURES: tuple[float, ...] = (0.0, 0.3, 0.7, 1.0)
K_MIN, K_MAX = 1, MAX_K
AUTO = "auto"  # K chosen every step (``core.autok``)


@dataclass(frozen=True)
class Settings:
    """What the next turn runs with. The keys change it; a running turn keeps its own."""

    draft: str = "default"
    k: int | str = 4  # or AUTO
    speculate: bool = True
    temp: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int = 0
    system: str | None = None  # a system message before every conversation (--system-prompt)
    tree: TreeShape | None = None  # --tree DxB: draft trees of this shape instead of chains (K unused)

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
        top_p = f" top-p={self.top_p:g}" if self.top_p < 1 else ""
        return f"{spec} · T={self.temp:g}{top_p}"


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

    def events(self, messages: list[dict[str, str]], settings: Settings) -> Iterator[Event]:
        """The engine's events for the assistant's reply to ``messages``."""

    def close(self) -> None:
        """The worker is done with the models (the app is exiting)."""


def _settle() -> None:
    """Wait for MLX work still in flight. Target-only decoding ends with one step computed
    ahead (``async_eval``) and never awaited; left running on a worker thread, it can hang or
    abort the process at exit."""
    import mlx.core as mx

    mx.synchronize()


class _StreamDecoder:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.detok = tokenizer.detokenizer
        self.detok.reset()

    def add(self, token_id: int) -> str:
        self.detok.add_token(token_id)
        return self.detok.last_segment

    def alone(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def finish(self) -> str:
        self.detok.finalize()
        return self.detok.last_segment


class ModelSource:
    """The real models: ``loading.load(target)`` and the engine, drafters made on demand."""

    def __init__(self, target: str = "default", dtype: str = "auto", *,
                 loaded: LoadedModel | None = None, baseline_tokens: int = 8,
                 auto_k: bool = False, remeasure_cost: bool = False, backend: str = "mlx"):
        self.target, self.dtype, self.backend = target, dtype, backend
        self.lm = loaded
        self.baseline_tokens = baseline_tokens  # 0: do not measure
        self.auto_k = auto_k  # load() then readies the verify-cost curve (measured once, cached)
        self.remeasure_cost = remeasure_cost
        self._drafters: dict[str, Drafter | None] = {}
        self._policies: dict[str, object] = {}  # one AutoK per drafter, learning across turns
        self._auto_trees: dict[TreeShape, TreeShape] = {}  # --tree auto, with this machine's verify costs
        self.kept = PromptCache()  # the target's cache from the last turn: a new turn prefills only itself

    def load(self) -> ModelInfo:
        from mlxspec import runtime
        from mlxspec.targets import loading

        if self.lm is None:
            self.lm = loading.load(self.target, self.dtype, self.backend)
        if self.auto_k:
            self.cost_curve()
        on_mlx = getattr(self.lm, "backend", "mlx") == "mlx"
        return ModelInfo(self.lm.name, self.lm.dtype, self.lm.context_length,
                         runtime.backend_description() if on_mlx else runtime.torch_description(self.lm.backend),
                         runtime.device_name() if on_mlx else self.lm.backend.partition(":")[2],
                         self.measure_baseline())

    def measure_baseline(self) -> float | None:
        """Median ms per token of target-only decoding (a short greedy run, EOS ignored).
        Also warms the model up."""
        from mlxspec.core.engine import generate_plain
        from mlxspec.core.sampling import SamplingParams
        from mlxspec.measure.runs import collect_run
        from mlxspec.targets.tokenizer import encode_prompt

        if self.baseline_tokens < 2:
            return None
        lm = self.lm
        ids = encode_prompt(lm.tokenizer, "Hello! Who are you?")
        run = collect_run(generate_plain(lm.model, ids, SamplingParams(), self.baseline_tokens, set(),
                                         lm.context_length))
        _settle()
        return statistics.median(run.verify_ms[1:])

    def close(self) -> None:
        _settle()

    def decoder(self) -> TextDecoder:
        return _StreamDecoder(self.lm.tokenizer)

    def cost_curve(self):
        """This machine's verify-cost curve for the target (``--k auto``), measured only once
        (and with ``--remeasure-cost`` measured again, once)."""
        from mlxspec.core.autok import DEFAULT_MAX_K
        from mlxspec.measure.costcurve import cost_curve

        curve = cost_curve(self.lm, DEFAULT_MAX_K + 1, self.remeasure_cost, log=None)
        self.remeasure_cost = False
        return curve

    def k_policy(self, settings: Settings, drafter: Drafter | None):
        """What the engine takes as K: the fixed K, or the drafter's ``AutoK`` (kept across
        turns, so its acceptance estimate follows the conversation)."""
        from mlxspec.core.autok import AutoK
        from mlxspec.measure.costcurve import k_policy

        if settings.k != AUTO or drafter is None:
            return settings.k if settings.k != AUTO else 4
        if settings.drafter not in self._policies:
            self._policies[settings.drafter] = k_policy(AUTO, self.lm, drafter, self.remeasure_cost, log=None)
            self.remeasure_cost = False
        policy = self._policies[settings.drafter]
        assert isinstance(policy, AutoK)
        return policy

    def tree(self, shape: TreeShape) -> TreeShape:
        """A tree shape as the engine takes it: ``auto`` with this machine's verify costs
        (``costcurve.tree_costs``, measured once), a static shape as it is."""
        from mlxspec.measure.costcurve import tree_costs

        if not shape.auto:
            return shape
        if shape not in self._auto_trees:
            self._auto_trees[shape] = tree_costs(shape, self.lm, self.remeasure_cost, log=None)
            self.remeasure_cost = False
        return self._auto_trees[shape]

    def drafter(self, spec: str) -> Drafter | None:
        from mlxspec.targets.drafts import make_drafter

        if spec not in self._drafters:
            self._drafters[spec] = make_drafter(spec, self.lm, self.dtype)
        return self._drafters[spec]

    def events(self, messages: list[dict[str, str]], settings: Settings) -> Iterator[Event]:
        from mlxspec.core.engine import generate
        from mlxspec.core.sampling import SamplingParams
        from mlxspec.targets.tokenizer import encode_prompt, stop_token_ids

        lm = self.lm
        params = SamplingParams(settings.temp, settings.top_p)
        drafter = self.drafter(settings.drafter)
        system = [{"role": "system", "content": settings.system}] if settings.system else []
        ids = encode_prompt(lm.tokenizer, system + messages)
        tree = self.tree(settings.tree) if drafter is not None and settings.tree is not None else None
        k = tree.depth if tree is not None else self.k_policy(settings, drafter)  # a tree's depth is its K
        events = generate(lm.model, ids, params, settings.max_tokens, stop_token_ids(lm.tokenizer),
                          lm.context_length, settings.seed, drafter, k, self.kept, tree=tree)
        try:
            yield from events
        finally:
            events.close()
            _settle()
