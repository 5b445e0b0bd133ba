"""A session: a loaded target, the drafter and K policy (or token tree) it decodes with, and the
prompt cache kept between turns. Every face builds its runs here, as every face of mlx-lm calls
``stream_generate``: the CLI, the server, the chat and the measurements open a ``Session`` and
stream the engine's events from it, never calling the engine with a dozen arguments themselves."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from mlxspec.core.autok import DEFAULT_MAX_K, k_policy
from mlxspec.core.drafters import Drafter, KPolicy, can_branch
from mlxspec.core.engine import generate, token_budget
from mlxspec.core.events import Event, Status, Step, Token
from mlxspec.core.prompt_cache import UNLIMITED, PromptCache
from mlxspec.core.sampling import GREEDY, SamplingParams
from mlxspec.core.tree import TreeShape
from mlxspec.cpuload import CpuMeter
from mlxspec.errors import MlxspecError
from mlxspec.targets import loading
from mlxspec.targets.costcurve import CostCurve, check_against_live, cost_curve, stderr_line
from mlxspec.targets.drafts import branching_kinds, make_drafter
from mlxspec.targets.tokenizer import encode_prompt, stop_token_ids

Prompt = str | list[dict[str, str]] | list[int]  # a user message, chat messages, or token ids


@dataclass(frozen=True)
class SessionOptions:
    """What a session is opened from: the command line's or the server's flags."""

    model: str = "default"
    dtype: str = "auto"
    backend: str = "mlx"  # "mlx", or "torch" / "torch:DEVICE"
    draft: str = "default"
    k: int | str | None = None  # None: auto with a drafter
    tree: TreeShape | None = None
    remeasure_cost: bool = False
    # kept caches (``serve --prompt-cache-size/-bytes``): one conversation for a chat, several
    # for a server whose clients take turns
    prompt_cache_entries: int = 1
    prompt_cache_bytes: int = UNLIMITED


class Session:
    """``lm`` decoding with ``draft`` (a spec such as ``ngram:3``, a ``Drafter``, or None) at ``k``
    (an int, ``"auto"``, a ``KPolicy``, or None: auto with a drafter) or along ``tree``.
    ``use`` switches the drafting; drafters and their ``AutoK`` are made once per spec, so a
    policy keeps learning across turns. ``log`` reports measuring the verify-cost curve.
    ``kept``: the caches kept between calls (default: the last one only). ``check_curve``: compare
    the cached verify-cost curve with the passes' live timings after each call."""

    def __init__(self, lm: Any, draft: str | Drafter | None = "none", k: Any = None, tree: TreeShape | None = None,
                 *, dtype: str = "auto", remeasure_cost: bool = False,
                 log: Callable[[str], None] | None = stderr_line, kept: PromptCache | None = None,
                 check_curve: bool = True):
        self.lm, self.dtype, self.log = lm, dtype, log
        self._check_curve = check_curve  # off where passes are shared (``serve --parallel``): their time is not the curve's
        # earlier turns' caches: a turn that continues one prefills only what is new
        self.kept = kept if kept is not None else PromptCache()
        self._remeasure = remeasure_cost
        self._curve: CostCurve | None = None  # the curve the policies were built on, once asked for
        self._drafters: dict[str, Drafter | None] = {}
        self._policies: dict[str, KPolicy] = {}
        self._policy: Any = None
        self._make_policy: Callable[[], Any] | None = None
        self.use(draft, k, tree)

    @classmethod
    def open(cls, options: SessionOptions, loaded: Any = None,
             log: Callable[[str], None] | None = stderr_line) -> Session:
        """Load the target (unless ``loaded`` is given), then make the drafter and its policy."""
        lm = loaded if loaded is not None else loading.load(options.model, options.dtype, options.backend)
        return cls(lm, options.draft, options.k, options.tree, dtype=options.dtype,
                   remeasure_cost=options.remeasure_cost, log=log,
                   kept=PromptCache(options.prompt_cache_entries, options.prompt_cache_bytes))

    def use(self, draft: str | Drafter | None, k: Any = None, tree: TreeShape | None = None) -> Session:
        """Decode with ``draft`` at ``k``, or along ``tree`` (whose depth is its K), from now on."""
        drafter = self.drafter_for(draft)
        if tree is not None:
            if drafter is None:
                raise MlxspecError(f"--tree needs a drafter, and the default for {self.lm.name} is none; "
                                   "pick one, e.g. --draft self:8")
            if not can_branch(drafter):
                raise MlxspecError(f"--tree needs a drafter that can branch ({branching_kinds()}), "
                                   f"not {draft if isinstance(draft, str) else drafter.name!r}")
            self.drafter, self.tree, self.policy = drafter, self.priced(tree), tree.depth
            return self
        self.drafter, self.tree = drafter, None
        if hasattr(k, "next_k"):  # a KPolicy made by the caller
            self.policy = k
        elif isinstance(draft, str) and drafter is not None and k in (None, "auto"):
            def shared() -> KPolicy:  # one AutoK per drafter, learning across turns
                if draft not in self._policies:
                    self._policies[draft] = k_policy(k, drafter, self.cost_curve)
                return self._policies[draft]
            self._make_policy = shared
        else:
            self._make_policy = lambda: k_policy(k, drafter, self.cost_curve)
        return self

    @property
    def policy(self) -> Any:
        """The K policy: made when first asked for, so a prompt too long for the context is
        refused before ``--k auto`` measures this machine's verify cost."""
        if self._make_policy is not None:
            self._policy, self._make_policy = self._make_policy(), None
        return self._policy

    @policy.setter
    def policy(self, value: Any) -> None:
        self._policy, self._make_policy = value, None

    def drafter_for(self, draft: str | Drafter | None) -> Drafter | None:
        if not isinstance(draft, str):
            return draft
        if draft not in self._drafters:
            self._drafters[draft] = make_drafter(draft, self.lm, self.dtype)
        return self._drafters[draft]

    def ready(self) -> Session:
        """What a first request would otherwise wait for, done now: the K policy, with this
        machine's verify-cost curve read from its cache or measured (a progress line), so that
        the first request of a session starts as fast as the later ones."""
        if self._make_policy is not None:
            self._policy, self._make_policy = self._make_policy(), None
        return self

    def cost_curve(self, passes: int = DEFAULT_MAX_K + 1) -> CostCurve:
        """This machine's cost of target passes over 1..``passes`` tokens: cached per target,
        measured once more in this session when it was opened with ``remeasure_cost``."""
        curve = cost_curve(self.lm, passes, remeasure=self._remeasure, log=self.log)
        self._remeasure, self._curve = False, curve
        return curve

    def priced(self, tree: TreeShape) -> TreeShape:
        """An ``auto`` tree with this machine's verify costs (it verifies as many nodes as pay);
        a static shape as it is."""
        if not tree.auto or tree.costs:
            return tree
        return replace(tree, costs=tuple(self.cost_curve(tree.max_nodes + 1).ms[: tree.max_nodes + 1]))

    @property
    def stop_ids(self) -> set[int]:
        return stop_token_ids(self.lm.tokenizer)

    def encode(self, prompt: Prompt, raw: bool = False) -> list[int]:
        """Token ids: given ids as they are, text or messages through the chat template (unless ``raw``)."""
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) and prompt:
            return list(prompt)
        return encode_prompt(self.lm.tokenizer, prompt, raw=raw)

    def stream(self, prompt: Prompt, params: SamplingParams = GREEDY, max_tokens: int = 256, seed: int = 0, *,
               raw: bool = False, stop_ids: set[int] | None = None, keep: bool = False,
               node_stats: bool = False, logprobs: int | None = None,
               interrupt: Callable[[], bool] | None = None) -> Iterator[Event]:
        """The engine's events for one reply. ``stop_ids``: default the target's EOS ids (an empty
        set decodes exactly ``max_tokens``); ``keep``: reuse a kept cache and keep this call's
        (``kept``); ``node_stats``: every tree node's statistics (``mlxspec study``);
        ``logprobs``: each emitted token's log-probability, with this many alternatives;
        ``interrupt``: asked between the prompt's chunks (``engine.generate``)."""
        ids = self.encode(prompt, raw)
        token_budget(ids, max_tokens, self.lm.context_length)  # before the policy measures anything
        events = generate(self.lm.model, ids, params, max_tokens,
                          self.stop_ids if stop_ids is None else stop_ids, self.lm.context_length, seed,
                          self.drafter, self.policy, self.kept if keep else None, tree=self.tree, node_stats=node_stats,
                          logprobs=logprobs, interrupt=interrupt)
        checks = self._check_curve and self._curve is not None and hasattr(self.policy, "timed_steps")
        return self._checked(events) if checks else events

    def _checked(self, events: Iterator[Event]) -> Iterator[Event]:
        """``events``, then the cached cost curve checked against the timings the policy saw."""
        meter, policy = CpuMeter(), self.policy
        yield from events
        if check_against_live(self.lm, self._curve, policy.scale, policy.timed_steps, meter.others_busy(), self.log):
            self._curve = None


class StepText:
    """A reply's text as its steps come. Committed tokens go through the streaming detokenizer
    (a piece may wait for the bytes that complete it); a rejected draft is not part of the
    reply, so it is decoded on its own."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.detok = tokenizer.detokenizer  # a fresh copy per access
        self.detok.reset()

    def add(self, token_id: int) -> str:
        self.detok.add_token(token_id)
        return self.detok.last_segment

    def alone(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def pieces(self, step: Step) -> Iterator[tuple[Token, str]]:
        return step_pieces(step, self)

    def finish(self) -> str:
        """What the detokenizer still held back."""
        self.detok.finalize()
        return self.detok.last_segment


def step_pieces(step: Step, decoder: Any) -> Iterator[tuple[Token, str]]:
    """Each token of ``step`` with its text from ``decoder`` (``add`` for the reply's tokens,
    ``alone`` for a rejected draft)."""
    for t in step.tokens:
        yield t, decoder.alone(t.id) if t.status is Status.REJECTED else decoder.add(t.id)
