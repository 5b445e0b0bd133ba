"""``mlxspec chat``: a multi-turn chat that shows speculative decoding at work.

One long-lived worker thread owns every model and all MLX state: it loads the models, then
serves one turn request at a time from a queue, posting a ``StepGenerated`` message per
verification step. The UI thread only renders those messages, so it stays responsive while a
step runs (MLX releases the GIL while it computes).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.timer import Timer
from textual.widgets import Footer, Header, HelpPanel
from textual.worker import get_current_worker

from mlxspec.core.events import Done, Step
from mlxspec.core.sampling import SamplingParams
from mlxspec.core.tree import MAX_TREE_NODES, TreeShape, full_size, parse_tree
from mlxspec.errors import MlxspecError
from mlxspec.core.runs import RunCollector
from mlxspec.targets import store
from mlxspec.targets.drafts import is_head
from mlxspec.targets.loading import resolve
from mlxspec.targets.sampling_defaults import model_sampling

from mlxspec.runtime import wait_for_thread_exit
from .messages import (
    ModelFailed,
    ModelReady,
    StepData,
    StepGenerated,
    TargetOnlyTimed,
    TurnEnded,
    TurnFailed,
    TurnResult,
    step_data,
    turn_result,
)
from .source import (
    DRAFTERS,
    AUTO,
    K_MAX,
    K_MIN,
    TEMPERATURES,
    ModelInfo,
    ModelSource,
    Settings,
    Source,
)
from .saving import SavedTurn, save_conversation
from .stats import Baseline, TurnStats
from .widgets import Answer, Legend, Prompt, StatsPanel, Transcript, TreePanel, summary_line

# Seconds from a step's arrival to drawing it, batching the steps that arrive meanwhile (0: on
# the next turn of the event loop, with ``call_later``: a 0 s Textual timer never fires, it
# divides by its interval). Drawing a line of the answer re-lays out the screen; done after every
# step it competes with decoding, batched it does not (BENCHMARKS.md, chat drawing overhead).
RENDER_DELAY = 0.1
STEPS_SOURCE = "measured: this chat's K=0 steps"  # a baseline from a speculative turn's undrafted steps
TIMED_SOURCE = "measured: last question, ^f"  # the question re-decoded target-only
STARTUP_SOURCE = "measured at start-up, greedy"  # a short reply at a short context
STATS_INTERVAL = 0.5  # seconds between side-panel redraws while generating (each costs ~7 ms)
DEFAULT_TREE = parse_tree("3x2", 8)  # what ^g first turns on: `mlxspec study`'s shape (the paper's)


@dataclass(frozen=True)
class TurnRequest:
    turn: int
    messages: list[dict[str, str]]
    settings: Settings
    stop: threading.Event
    timing: bool = False  # decode target-only to time it: nothing shown, the conversation's cache kept


def _cycle(options: Sequence, current) -> object:
    options = list(options)
    return options[(options.index(current) + 1) % len(options)] if current in options else options[0]


class ChatApp(App[None], inherit_bindings=False):
    CSS_PATH = "chat.tcss"
    TITLE = "mlxspec chat"
    # Ctrl keys, so that they work while typing (the prompt gives up its own ^k and ^d).
    # Not inheriting App's bindings keeps ^q at the end of the footer.
    BINDINGS = [
        Binding("ctrl+k", "change_k(1)", "K+"),
        Binding("ctrl+j", "change_k(-1)", "K-"),
        Binding("ctrl+o", "toggle_auto_k", "auto"),
        Binding("ctrl+b", "toggle_speculation", "spec"),
        Binding("ctrl+t", "cycle_temperature", "temp"),
        Binding("ctrl+d", "cycle_drafter", "draft"),
        Binding("ctrl+r", "toggle_rejected", "rejected"),
        Binding("ctrl+g", "toggle_tree", "tree"),
        Binding("escape", "stop", "stop"),
        Binding("ctrl+n", "new_chat", "new"),
        Binding("ctrl+s", "save", "save"),
        Binding("ctrl+f", "time_target_only", "time the last question target-only: the speedup's baseline", show=False),
        Binding("ctrl+q", "quit", "quit", priority=True),
        Binding("ctrl+c", "help_quit", show=False, system=True),
    ]

    settings: reactive[Settings] = reactive(Settings, init=False)
    show_rejected: reactive[bool] = reactive(False, init=False)
    show_tree: reactive[bool] = reactive(False, init=False)

    def __init__(self, source: Source, settings: Settings = Settings(), *,
                 drafters: Sequence[str] = DRAFTERS, temperatures: Sequence[float] = TEMPERATURES,
                 clock: Callable[[], float] = time.perf_counter, loading_label: str = "the model",
                 sampling_note: str = "") -> None:
        super().__init__()
        self.source, self.clock = source, clock
        self.drafters = list(drafters) + ([settings.draft] if settings.draft not in drafters else [])
        self.temperatures = sorted(set(temperatures) | {settings.temp})
        self.set_reactive(ChatApp.settings, settings)
        self.set_reactive(ChatApp.show_tree, settings.tree is not None)  # the tree panel: on with --tree
        self.loading_label = loading_label
        self.sampling_note = sampling_note  # said once the model is ready: the sampling and its source
        self.info: ModelInfo | None = None
        self.baseline = Baseline()
        self.history: list[dict[str, str]] = []
        self.turns: list[tuple[str, Answer]] = []  # each question with its reply's box, for ^s
        self.stats: TurnStats | None = None  # the turn on screen
        self.answer: Answer | None = None
        self.turn = 0  # number of the turn on screen
        self.running: TurnRequest | None = None  # the turn the worker is serving
        self.asked: TurnRequest | None = None  # the last question's request, for ^f
        self._requests: queue.Queue[TurnRequest] = queue.Queue()
        self._stats_shown = 0.0  # time.monotonic() of the last side-panel redraw
        self._stats_timer: Timer | None = None
        self._unshown: list[StepData] = []  # steps received, not drawn yet
        self._show_timer: Timer | None = None
        self._show_pending = False  # a _show_steps is on its way (timer or call_later)
        self.render_delay = RENDER_DELAY
        self._fixed_k = settings.k if isinstance(settings.k, int) else 4  # what ^o returns to from auto
        self._tree = settings.tree or DEFAULT_TREE  # what ^g turns on: the last tree drafted, else 3x2
        self.worker_thread_id: int | None = None  # the OS thread that owns the models

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                with Horizontal(id="body"):
                    yield Transcript(id="transcript")
                    panel = TreePanel(id="tree")
                    panel.display = self.show_tree
                    panel.note = self._tree_note(self.settings, before=True)
                    yield panel
                yield Legend(id="legend")
                yield Prompt(placeholder="Ask something: Enter sends, ^l starts a new line, Up recalls",
                             id="prompt")
            yield StatsPanel(self.settings, id="stats")
        yield Footer()

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    def on_mount(self) -> None:
        self.sub_title = f"loading {self.loading_label}…"
        self.loading_note = self.transcript.add_note(f"Loading {self.loading_label}…")
        self.query_one(Prompt).focus()
        self.run_model()

    # ------------------------------------------------------------------ the worker
    @work(thread=True, exclusive=True, name="model", exit_on_error=False)
    def run_model(self) -> None:
        """Owns the models: load them, then serve turns until the app exits."""
        worker = get_current_worker()
        self.worker_thread_id = threading.get_native_id()
        try:
            info = self.source.load()
        except Exception as e:  # MlxspecError carries a user-facing message; show others too
            self.post_message(ModelFailed(str(e) if isinstance(e, MlxspecError) else f"{type(e).__name__}: {e}"))
            return
        self.post_message(ModelReady(info))
        try:
            while not worker.is_cancelled:
                try:
                    request = self._requests.get(timeout=0.1)
                except queue.Empty:
                    continue
                try:
                    result = self._serve(request, worker)
                except MlxspecError as e:
                    self.post_message(TurnFailed(request.turn, str(e)))
                except Exception as e:  # never a traceback: the app survives and says what broke
                    self.post_message(TurnFailed(request.turn, f"{type(e).__name__}: {e}"))
                else:
                    self.post_message((TargetOnlyTimed if request.timing else TurnEnded)(request.turn, result))
        finally:
            self.source.close()

    def _serve(self, request: TurnRequest, worker) -> TurnResult:
        decoder = self.source.decoder()
        run = RunCollector()
        events = self.source.events(request.messages, request.settings, keep=not request.timing)
        for event in events:
            run.add(event)
            if isinstance(event, Step):
                if not request.timing:
                    self.post_message(StepGenerated(request.turn, step_data(event, decoder, self.clock())))
                if request.stop.is_set() or worker.is_cancelled:
                    getattr(events, "close", lambda: None)()
                    return TurnResult("stopped", decoder.finish())
            elif isinstance(event, Done):
                return turn_result(run.run(), decoder.finish())
        return TurnResult("stopped", decoder.finish())

    # ------------------------------------------------------------------ worker messages
    def on_model_ready(self, message: ModelReady) -> None:
        self.info = info = message.info
        if info.baseline_ms:
            self.baseline = Baseline(info.baseline_ms, STARTUP_SOURCE)
        self._update_header()
        self.loading_note.remove()  # loaded: the Ready line says so, and what with
        self.transcript.add_note(f"Ready: {info.target} ({info.dtype}, context {info.context_length}) "
                                 f"on {info.backend}. Type a question and press Enter."
                                 + (f" {self.sampling_note}" if self.sampling_note else ""))
        self._refresh_stats()

    def on_model_failed(self, message: ModelFailed) -> None:
        self.sub_title = "no model loaded"
        self.transcript.add_error(f"Could not load the model: {message.error}")

    def on_step_generated(self, message: StepGenerated) -> None:
        if message.turn != self.turn or self.answer is None or self.stats is None:
            return  # a turn the user has already cleared away
        self.stats.add(message.step)
        self._unshown.append(message.step)  # drawn by _show_steps, see RENDER_DELAY
        if not self._show_pending:
            self._show_pending = True
            if self.render_delay > 0:
                self._show_timer = self.set_timer(self.render_delay, self._show_steps)
            else:  # a 0 s Timer never fires (Textual divides by its interval): the next loop turn
                self.call_later(self._show_steps)

    def _show_steps(self) -> None:
        self._show_pending = False
        if self._show_timer is not None:
            self._show_timer.stop()
            self._show_timer = None
        steps, self._unshown = self._unshown, []
        if steps and self.answer is not None:
            self._show_tree(self.answer, steps)
            self.answer.add(steps)
            self._refresh_stats(throttle=True)

    def _show_tree(self, answer: Answer, steps: list[StepData]) -> None:
        """Hand the tree panel the batch's last tree step (once per batch, however many steps
        and tokens it holds), with the text of the token its tree grew from."""
        last = max((i for i, st in enumerate(steps) if st.nodes is not None), default=None)
        if last is None:
            return
        root = next((p.text for st in reversed(steps[:last]) for p in reversed(st.pieces) if p.emitted), None)
        if root is None:
            root = next((p.text for p in reversed(answer.pieces) if p.emitted), None)
        number = len(self.stats.steps) - len(steps) + last + 1 if self.stats is not None else None
        self.query_one(TreePanel).show_step(steps[last], root, number)

    def on_turn_ended(self, message: TurnEnded) -> None:
        self._worker_idle(message.turn)
        if message.turn != self.turn or self.answer is None or self.stats is None:
            return
        self._show_steps()
        result = self.stats.result = message.result
        self.answer.finish(result.tail, summary_line(self.stats, result))
        self.history.append({"role": "assistant", "content": self.answer.output})
        if ms := self.stats.target_only_ms():
            self.baseline = Baseline(ms, "measured: last target-only turn")
        elif ms := self.stats.one_token_ms():
            self.baseline = Baseline(ms, STEPS_SOURCE)
        if result.stop_reason == "context":
            self.transcript.add_error("The context is full: start a new chat with ^n.")
        self._refresh_stats()

    def on_target_only_timed(self, message: TargetOnlyTimed) -> None:
        self._worker_idle(message.turn)
        tps, turn = message.result.decode_tps, self.stats.result if self.stats is not None else None
        if message.turn != self.turn or message.result.stop_reason == "stopped" or not tps:
            self.notify("Timing stopped: the speedup's baseline is as it was.", timeout=3)
            return
        self.baseline = Baseline(1000.0 / tps, TIMED_SOURCE)
        ran = f"; the turn ran {turn.decode_tps / tps:.2f}x it" if turn is not None and turn.decode_tps else ""
        self.transcript.add_note(f"Target-only, the last question again with the same settings and seed: "
                                 f"{tps:.1f} tok/s{ran}.")
        self._refresh_stats()

    def on_turn_failed(self, message: TurnFailed) -> None:
        self._worker_idle(message.turn)
        if message.turn != self.turn:
            return
        if self.asked is not None and self.asked.timing:  # a failed ^f: the turn stands
            self.notify(f"Could not time it: {message.error}", severity="error")
            return
        if self.answer is not None and not self.answer.pieces:
            self.answer.remove()
            self.turns = [t for t in self.turns if t[1] is not self.answer]
        self.answer = None
        if self.history and self.history[-1]["role"] == "user":
            self.history.pop()  # so the next question does not carry the failed one
        self.transcript.add_error(f"error: {message.error}")
        self._refresh_stats()

    def _worker_idle(self, turn: int) -> None:
        if self.running is not None and self.running.turn == turn:
            self.running = None

    # ------------------------------------------------------------------ user input
    def on_prompt_submitted(self, event: Prompt.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        if self.info is None:
            self.notify("The model is not loaded.", severity="warning")
            return
        if self.running is not None:
            self.notify("Still generating: press Esc to stop it first.", severity="warning")
            return
        event.prompt.remember(text)
        self.history.append({"role": "user", "content": text})
        self.turn += 1
        settings = replace(self.settings, seed=self.settings.seed + self.turn)
        self.transcript.add_user(text)
        self.answer = self.transcript.add_answer(settings.label, self.show_rejected)
        self.turns.append((text, self.answer))
        self.query_one(TreePanel).show_note(self._tree_note(settings))
        self.stats = TurnStats(started=self.clock(), k=settings.turn_k)
        self.running = self.asked = TurnRequest(self.turn, list(self.history), settings, threading.Event())
        self._requests.put(self.running)
        self._refresh_stats()

    def action_time_target_only(self) -> None:
        """Decode the last question again target-only, with its settings and seed, shown
        nowhere and keeping the conversation's cache: the speedup's baseline is then that
        question's own, at its context and sampling (a start-up baseline had neither)."""
        if self.running is not None:
            self.notify("Still generating: ^f times the last question once it is done.", severity="warning")
            return
        last = self.asked
        if last is None or last.turn != self.turn or self.stats is None or self.stats.result is None:
            self.notify("Ask something first: ^f times the last question target-only.", severity="warning")
            return
        self.running = self.asked = replace(last, settings=replace(last.settings, speculate=False),
                                            stop=threading.Event(), timing=True)
        self._requests.put(self.running)
        self.notify("Timing the last question target-only… (Esc stops)", timeout=3)

    def action_change_k(self, delta: int) -> None:
        """K+/K-; with a tree, its depth. From auto, one more or less than the K auto was
        using (the last turn's mean, as the panel's "K in use" shows it; the last fixed K
        before any turn), not the last fixed K plus one, which jumped from auto to 5."""
        if self.settings.tree is not None:
            self._change_depth(delta)
            return
        k = self.settings.k
        base = k if k != AUTO else self._auto_k_in_use()
        self.settings = replace(self.settings, k=max(K_MIN, min(K_MAX, base + delta)))

    def _auto_k_in_use(self) -> int:
        mean = self.stats.mean_k() if self.stats is not None and not self.stats.tree else None
        return self._fixed_k if mean is None else round(mean)

    def _change_depth(self, delta: int) -> None:
        """The tree one level deeper or shallower: same branching, same node cap (if any)."""
        tree = self.settings.tree
        if tree.auto:
            self.notify("An auto tree grows its own shape each step; start with --tree DxB for a fixed one.",
                        severity="warning")
            return
        cap = None if tree.max_nodes == min(full_size(tree.depth, tree.branch), MAX_TREE_NODES + 1) else tree.max_nodes
        try:
            deeper = parse_tree(f"{max(1, tree.depth + delta)}x{tree.branch}", cap)
        except MlxspecError as e:
            self.notify(str(e), severity="warning")
            return
        self.settings = replace(self.settings, tree=deeper)

    def action_toggle_auto_k(self) -> None:
        """Auto K on, or back to the last fixed K."""
        if self.settings.tree is not None:
            self.notify("A tree keeps its shape (^k / ^j change its depth); auto K picks chain lengths.",
                        severity="warning")
            return
        k = self.settings.k
        if k != AUTO:
            self._fixed_k = k
        self.settings = replace(self.settings, k=self._fixed_k if k == AUTO else AUTO)

    def action_toggle_speculation(self) -> None:
        s = self.settings
        if not s.speculate and s.draft == "none":  # turning it on needs a drafter
            s = replace(s, draft=next(d for d in self.drafters if d != "none"))
        self.settings = replace(s, speculate=not s.speculate)

    def action_cycle_temperature(self) -> None:
        self.settings = self.settings.with_temp(_cycle(self.temperatures, self.settings.temp))

    def action_cycle_drafter(self) -> None:
        draft = _cycle(self.drafters, self.settings.draft)
        self.settings = replace(self.settings, draft=draft, speculate=draft != "none" or self.settings.speculate)

    def action_toggle_rejected(self) -> None:
        self.show_rejected = not self.show_rejected

    def action_toggle_tree(self) -> None:
        """Trees on (the last tree shape drafted, else 3x2 capped at 8 nodes, with the panel
        showing it) or off (chains of K again, the panel hidden)."""
        s = self.settings
        if s.tree is not None:
            self._tree = s.tree
            self.settings = replace(s, tree=None)
        elif s.drafter == "none":
            self.notify("A tree needs a drafter: pick one with ^d (or ^s) first.", severity="warning")
            return
        else:
            self.settings = replace(s, tree=self._tree)
            panel = self.query_one(TreePanel)
            if panel.step is None:
                panel.show_note(self._tree_note(self.settings, before=True))
        self.show_tree = self.settings.tree is not None

    def action_stop(self) -> None:
        if self.screen.query(HelpPanel):  # Esc closes the key help (^p, "Keys") before it stops a turn
            self.action_hide_help_panel()
            return
        if self.running is not None:
            self.running.stop.set()
            self.notify("Stopping after this step…", timeout=2)

    def action_new_chat(self) -> None:
        if self.running is not None:
            self.running.stop.set()
        self.turn += 1  # whatever is still running belongs to no visible turn now
        self._show_steps()
        self.history.clear()
        self.turns.clear()
        self.answer = self.stats = None
        self.transcript.clear()
        self.transcript.add_note("New chat.")
        self.query_one(TreePanel).show_note(self._tree_note(self.settings, before=True))
        self._refresh_stats()

    def action_save(self) -> None:
        """The conversation so far as Markdown and JSON (each token's status) under
        ``$MLXSPEC_HOME/chats``."""
        if not self.turns:
            self.notify("Nothing to save yet.", severity="warning")
            return
        turns = [SavedTurn(q, tuple(a.pieces), str(a.border_title or ""), str(a.border_subtitle or ""))
                 for q, a in self.turns]
        try:
            md, js = save_conversation(store.home() / "chats", self.info.target if self.info else "model", turns)
        except OSError as e:
            self.notify(f"Could not save: {e}", severity="error")
            return
        self.notify(f"Saved {md} and {js.name}", timeout=6)

    def watch_settings(self, settings: Settings) -> None:
        self._update_header()
        self._refresh_stats()

    def watch_show_rejected(self, show: bool) -> None:
        self.transcript.set_show_rejected(show)
        self.query_one(Legend).set_show_rejected(show)

    def watch_show_tree(self, show: bool) -> None:
        panel = self.query_one(TreePanel)
        panel.display = show
        if show:
            panel.rerender()

    @staticmethod
    def _tree_note(settings: Settings, before: bool = False) -> str:
        """What the tree panel says until a tree step comes (if one does)."""
        if settings.drafter == "none":
            return "No tree: this turn decodes with the target alone."
        if settings.tree is None:
            return "No tree: this turn drafts a chain. ^g drafts trees (or start the chat with --tree DxB)."
        shape = "an auto" if settings.tree.auto else f"a {settings.tree}"
        return ("No tree yet: " if before else "Waiting for the first step: ") + \
            f"each step drafts {shape} tree of up to {settings.tree.nodes} nodes."

    def wait_for_worker_exit(self, timeout: float = 2.0) -> None:
        """Call after ``run()`` returns, before the process exits (see ``wait_for_thread_exit``)."""
        wait_for_thread_exit(self.worker_thread_id, timeout)

    # ------------------------------------------------------------------ helpers
    def _update_header(self) -> None:
        if self.info is None:
            return
        i, s = self.info, self.settings
        draft = f"{s.drafter} {s.shape}" if s.drafter != "none" else "no draft"
        self.sub_title = f"{i.target} {i.dtype} + {draft} │ {i.backend}"

    def _refresh_stats(self, throttle: bool = False) -> None:
        """Redraw the side panel; with ``throttle``, at most every STATS_INTERVAL seconds
        (a redraw costs the UI thread a few ms of CPU the model could use)."""
        if throttle:
            wait = self._stats_shown + STATS_INTERVAL - time.monotonic()
            if self._stats_timer is not None or wait > 0:
                if self._stats_timer is None:
                    self._stats_timer = self.set_timer(wait, self._refresh_stats)
                return
        if self._stats_timer is not None:
            self._stats_timer.stop()
            self._stats_timer = None
        self._stats_shown = time.monotonic()
        self.query_one(StatsPanel).show(self.stats, self.settings, self.live_baseline(), self.running is not None)

    def live_baseline(self) -> Baseline:
        """The speedup's denominator: the turn's own one-token passes once it has enough (see
        ``TurnStats.one_token_ms``; from its end on, the next turns' too), else the last
        measured."""
        ms = self.stats.one_token_ms() if self.stats is not None and self.running is not None else None
        return Baseline(ms, STEPS_SOURCE) if ms else self.baseline


def shipped_drafts(target: str) -> tuple[str, ...]:
    """The registry's drafts for ``target`` (none for a target it does not know), each head
    that reads the target's states (eagle, EAGLE-3) also behind prompt lookup (``ngram:3+HEAD``),
    for ^d."""
    try:
        name = resolve(target)[0]
    except MlxspecError:  # reported in the UI once loading fails
        return ()
    names = [d["name"] for d in store.drafts() if d["target"] == name and d["present"]]
    return tuple(n for d in names for n in ([d, f"ngram:3+{d}"] if is_head(d) else [d]))


def run_chat(target: str = "default", draft: str = "default", k: int | str = AUTO, temp: float | None = None,
             top_p: float | None = None, max_tokens: int = 512, dtype: str = "auto", remeasure_cost: bool = False,
             system: str | None = None, backend: str = "mlx", tree: TreeShape | None = None,
             top_k: int | None = None, min_p: float | None = None, sampling: SamplingParams | None = None) -> None:
    """Run the chat UI until the user quits. Bad options raise ``MlxspecError`` before the UI
    starts; a model that fails to load is reported inside the UI. ``tree``: draft trees of that
    shape (``--tree``, checked by the CLI) instead of chains of K; it needs a drafter. Sampling
    settings not given are the model's recommended ones (``model_sampling``); ``sampling``: the
    other controls (penalties, logit bias), checked."""
    from mlxspec.core.autok import parse_k_option
    from mlxspec.runtime import DTYPES

    k = parse_k_option(k)
    params, note = model_sampling(target, temp, top_p, top_k, min_p, sampling)
    if dtype not in DTYPES:
        raise MlxspecError(f"unknown dtype {dtype!r}; choose one of: {', '.join(DTYPES)}")
    if max_tokens <= 0:
        raise MlxspecError(f"--max-tokens must be > 0, got {max_tokens}")
    if tree is not None and draft in ("none", ""):
        raise MlxspecError("--tree needs a drafter, but --draft is none (try --draft self:8)")
    if tree is not None and k == AUTO:
        k = 4  # unused while the tree is on; nothing to measure for it
    settings = Settings(draft=draft or "none", k=k, speculate=draft not in ("none", ""), params=params,
                        max_tokens=max_tokens, system=system, tree=tree)
    if backend not in ("mlx", "auto"):  # refuse a missing torch or device before the UI starts
        from mlxspec.torchpath import pick_device, split_backend

        pick_device(split_backend(backend))
    source = ModelSource(target, dtype, auto_k=k == AUTO, remeasure_cost=remeasure_cost, backend=backend)
    app = ChatApp(source, settings, drafters=DRAFTERS + shipped_drafts(target),
                  loading_label=f"model {target!r}", sampling_note=note)
    app.run()
    app.wait_for_worker_exit()
