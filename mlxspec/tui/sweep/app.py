"""``mlxspec sweep --tui``: the K sweep, live.

One worker thread runs the whole sweep (``mlxspec.measure.sweep.run_sweep``: model loading,
warm-up, verify timing, every run) and so owns all MLX state. It posts plain Python values: a
progress tick, a summary of every timed run, the final ``SweepResult`` record. The app draws a chart that fills in
per K, and for ``--k auto`` (row "auto", with the mean K it chose), as runs arrive (median tokens/s against the
target-only line, share of drafts accepted),
marks the measured and predicted optima when the sweep ends, and shows the sweep's table and
verdict beneath.

    python -m mlxspec.tui.sweep.app --demo                  # scripted numbers, no model
    python -m mlxspec.tui.sweep.app --screenshot docs/sweep # docs/sweep.svg and .png from a short real sweep
"""

from __future__ import annotations

import argparse
import asyncio
import io
import math
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.style import Style
from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Footer, Header, Label, ProgressBar, Static
from textual.worker import get_current_worker

from mlxspec.errors import MlxspecError
from mlxspec.measure.runs import Run
from mlxspec.measure.verdict import style

if TYPE_CHECKING:
    from mlxspec.measure.sweep import SweepResult, SweepRun

from ..threads import wait_for_thread_exit

Progress = Callable[[int, int, str], None]
OnRun = Callable[[dict[str, Any]], None]
# Runs a whole sweep in the worker thread, reporting through the two callbacks, and returns
# ``run_sweep``'s result.
SweepRunner = Callable[[Progress, OnRun], "SweepResult"]

# Mid-saturation hues, readable on dark and light backgrounds alike.
TPS_STYLE = Style.parse("#3b82f6")
BASE_STYLE = Style.parse("bold #f59e0b")
ACC_STYLE = Style.parse("#22c55e")
EMPTY_STYLE = Style.parse("#6b7280")
EIGHTHS = " ▏▎▍▌▋▊▉"


# ----------------------------------------------------------------------------- worker -> app
class SweepProgress(Message):
    def __init__(self, done: int, total: int, label: str) -> None:
        self.done, self.total, self.label = done, total, label
        super().__init__()


class RunMeasured(Message):
    def __init__(self, run: dict[str, Any]) -> None:
        self.run = run
        super().__init__()


class SweepFinished(Message):
    def __init__(self, result: SweepResult) -> None:
        self.result = result
        super().__init__()


class SweepFailed(Message):
    def __init__(self, error: str) -> None:
        self.error = error
        super().__init__()


class SweepStopped(Message):
    pass


class _Stopped(Exception):
    """Raised inside the sweep from a callback: the only place the worker can leave it early."""


# ----------------------------------------------------------------------------- the chart
@dataclass
class Series:
    """What has been measured for one K so far (K = 0: target-only, None: auto)."""

    k: int | None
    tps: list[float] = field(default_factory=list)
    accepted: int = 0
    steps: int = 0
    rooms: int = 0  # drafts the engine allowed, summed over steps (auto: the Ks it chose)
    done: int = 0
    of: int = 0

    def add(self, run: dict[str, Any]) -> None:
        self.tps.append(run["tps"])
        self.accepted += sum(run["accepted"])
        self.steps += len(run["accepted"])
        self.rooms += sum(run.get("rooms", ()))
        self.done, self.of = run["done"], run["of"]

    @property
    def mean_k(self) -> float | None:
        """K per step: the fixed K, or auto's mean choice so far."""
        if self.k is not None:
            return float(self.k)
        return self.rooms / self.steps if self.steps else None

    @property
    def median_tps(self) -> float | None:
        return statistics.median(self.tps) if self.tps else None

    @property
    def acceptance(self) -> float | None:
        """Accepted drafts per step / K (auto: its mean K), as ``plot_sweep``: a step where the
        drafter proposed fewer than K tokens counts the missing ones as rejected, as the sweep's
        table does."""
        k = self.mean_k
        return self.accepted / (k * self.steps) if k and self.steps else None

    @property
    def accepted_per_step(self) -> float | None:
        return self.accepted / self.steps if self.steps else None


def _bar(value: float, scale: float, width: int, style: Style, mark: int | None = None,
         track: str = " ") -> Text:
    """A horizontal bar in eighths of a cell, ``width`` cells, the target-only line at cell
    ``mark``, the unfilled cells drawn with ``track``."""
    eighths = max(0, min(width * 8, round(value / scale * width * 8))) if scale > 0 else 0
    full, part = divmod(eighths, 8)
    text = Text()
    for i in range(width):
        ch = "█" if i < full else EIGHTHS[part] if i == full and part else None
        if i == mark:
            # Drawn over a filled cell in the bar's colour, so the line shows through the bar.
            text.append("│", BASE_STYLE + Style(bgcolor=style.color) if ch == "█" else BASE_STYLE)
        elif ch is None:
            text.append(track, EMPTY_STYLE)
        else:
            text.append(ch, style)
    return text


@dataclass(frozen=True)
class _Layout:
    """Column widths and the tokens/s scale of one drawing of the chart."""

    width: int
    scale: float
    mark: int | None  # the cell of the target-only line
    name_w: int = 10
    value_w: int = 22
    acc_w: int = 34

    @property
    def bar_w(self) -> int:
        return max(8, self.width - self.name_w - self.value_w - self.acc_w - 1)


def _layout(width: int, values: Sequence[float], base_tps: float | None) -> _Layout:
    scale = max(values) * 1.08 if values else 1.0
    bar_w = _Layout(width, scale, None).bar_w
    return _Layout(width, scale, min(bar_w - 1, round(base_tps / scale * bar_w)) if base_tps else None)


def _chart_legend(lay: _Layout, measured: bool, ended: bool, auto: bool = False) -> Text:
    out = Text()
    out.append("tokens/s".ljust(lay.name_w + lay.bar_w), "bold")
    out.append(" " * lay.value_w)
    out.append("drafts accepted of K\n", "bold")
    out.append(" " * lay.name_w)
    out.append("│", BASE_STYLE)
    out.append(" target-only" if measured else " target-only: not measured yet", EMPTY_STYLE)
    out.append("   █", TPS_STYLE)
    out.append(" speculative, median of runs so far", EMPTY_STYLE)
    if auto:
        out.append("   auto: K chosen per step (K: its mean)", EMPTY_STYLE)
    if ended:
        out.append("   ★ best measured   ◆ best predicted by the cost model   ≈ indistinguishable from ★", EMPTY_STYLE)
    out.append("\n")
    return out


@dataclass(frozen=True)
class _Point:
    """What one chart row shows: K (0 = target-only, None = auto), tokens/s, speedup, accepted
    per step, and for auto the mean K it chose."""

    k: int | None
    tps: float | None
    speedup: float | None = None
    per_step: float | None = None
    progress: str = ""  # "done/of" while the K is partly measured
    name: str = ""
    name_style: str = ""
    value_style: str = ""
    mean_k: float | None = None


def _chart_row(p: _Point, lay: _Layout) -> Text:
    out = Text()
    out.append(p.name.ljust(lay.name_w), p.name_style)
    if p.tps is None:
        out.append(_bar(0, lay.scale, lay.bar_w, TPS_STYLE, lay.mark))
        out.append("  waiting\n", EMPTY_STYLE)
        return out
    out.append(_bar(p.tps, lay.scale, lay.bar_w, BASE_STYLE if p.k == 0 else TPS_STYLE, None if p.k == 0 else lay.mark))
    value = f" {p.tps:5.1f} tok/s" + (f" {p.speedup:4.2f}x" if p.k != 0 and p.speedup is not None else "")
    value += f" {p.progress}" if p.progress else ""
    out.append(value.ljust(lay.value_w), "italic" if p.progress else p.value_style)
    k = p.k if p.k is not None else p.mean_k
    if p.k != 0 and p.per_step is not None and k:
        acc = p.per_step / k
        out.append(" ")
        out.append(_bar(acc, 1.0, 10, ACC_STYLE, track="░"))
        out.append(f" {acc:4.0%} {p.per_step:4.2f}/step")
    if p.k is None and p.mean_k is not None:
        out.append(f" K {p.mean_k:.1f}")
    out.append("\n")
    return out


def _live_points(ks: Sequence[int], series: dict[int | None, Series], auto: bool = False) -> list[_Point]:
    """Rows while the sweep runs: medians of the runs so far; auto last if it is swept."""
    base_tps = series[0].median_tps if 0 in series else None
    out = [_Point(0, base_tps, name="target")]
    for k in [*ks, *([None] if auto or None in series else [])]:
        s = series.get(k)
        tps = s.median_tps if s else None
        out.append(_Point(k, tps, tps / base_tps if tps is not None and base_tps else None,
                          s.accepted_per_step if s else None, f"{s.done}/{s.of}" if s and s.done < s.of else "",
                          "auto" if k is None else f"K={k}", mean_k=s.mean_k if s and k is None else None))
    return out


def _final_points(result: SweepResult) -> list[_Point]:
    """Rows once the sweep has ended: the result's medians, the optima marked."""
    best_pred = result.optimum_predicted.k if result.optimum_predicted else None
    headline = style(result.verdict[0].kind) if result.verdict else ""
    out = [_Point(0, result.baseline.tps, name="target")]
    for r in result.all_rows:
        mark = " ★" if r.is_optimum else " ≈" if r.indistinguishable else ""
        name = "auto" if r.k is None else f"K={r.k}"
        out.append(_Point(r.k, r.tps, r.speedup, r.mean_accepted, "", name + mark + (" ◆" if r.k == best_pred else ""),
                          (headline or "bold") if r.is_optimum else "", "bold" if r.is_optimum else "",
                          r.mean_k if r.k is None else None))
    return out


def chart_text(ks: Sequence[int], series: dict[int | None, Series], width: int,
               result: SweepResult | None = None, auto: bool = False) -> Text:
    """The live chart: a row for target-only, one per K and one for auto (with ``auto``, or once
    an auto run arrived: the mean K it chose at the end of the row), tokens/s as a bar (median of the runs
    so far, the target-only median as a line through every row), then the speedup, the share of
    drafts accepted as a second bar and accepted drafts per step. With ``result`` (the sweep
    has ended) the medians are the result's and the optima are marked: ★ measured, ◆ predicted,
    ≈ indistinguishable from the best; the verdict follows, each line coloured by its kind."""
    points = _final_points(result) if result else _live_points(ks, series, auto)
    base_tps = points[0].tps
    lay = _layout(width, [p.tps for p in points if p.tps is not None], base_tps)
    out = _chart_legend(lay, base_tps is not None, result is not None, any(p.k is None for p in points))
    for p in points:
        out.append(_chart_row(p, lay))
    if result:
        out.append("\n")
        for line in result.verdict:
            out.append(line.text + "\n", style(line.kind))
    out.rstrip()
    return out


class SweepChart(Widget):
    """Draws ``chart_text`` from what the app holds; re-rendered on every run."""

    DEFAULT_CSS = "SweepChart { height: auto; }"

    def render(self) -> Text:
        app = self.app
        assert isinstance(app, SweepApp)
        return chart_text(app.ks, app.series, self.content_size.width or 100, app.result, app.auto)


class _Printed:
    """``mlxspec.measure.sweep.print_sweep`` (the CLI's table, parallelism and verdict) at the
    width given."""

    def __init__(self, result: SweepResult) -> None:
        self.result = result

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from mlxspec.measure.sweep import print_sweep

        buf = io.StringIO()
        print_sweep(self.result, Console(file=buf, width=options.max_width, force_terminal=True,
                                         color_system="truecolor", highlight=False))
        yield Text.from_ansi(buf.getvalue())


# ----------------------------------------------------------------------------- the app
class SweepApp(App[None], inherit_bindings=False):
    CSS_PATH = "sweep.tcss"
    TITLE = "mlxspec sweep"
    BINDINGS = [
        Binding("q", "stop_or_quit", "quit"),
        Binding("ctrl+q", "stop_or_quit", show=False, priority=True),
        Binding("ctrl+c", "help_quit", show=False, system=True),
    ]

    def __init__(self, runner: SweepRunner, ks: Sequence[int], description: str = "", auto: bool = True) -> None:
        super().__init__()
        self.runner = runner
        self.ks = sorted(ks)
        self.auto = auto  # an auto row (waiting until its first run) next to the fixed Ks
        self.description = description
        self.series: dict[int | None, Series] = {}
        self.result: SweepResult | None = None
        self.error: str | None = None
        self.finished = False  # the worker has returned, whatever the outcome
        self.stopping = False
        self._stop = threading.Event()
        self.worker_thread_id: int | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="progress"):
            yield ProgressBar(id="bar", show_eta=False)
            yield Label("loading the model…", id="phase")
        yield SweepChart(id="chart")
        with VerticalScroll(id="results"):
            yield Static("The table and the verdict appear here when the sweep ends.", id="table")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.description
        self.run_sweep()

    @work(thread=True, exclusive=True, name="sweep", exit_on_error=False)
    def run_sweep(self) -> None:
        worker = get_current_worker()
        self.worker_thread_id = threading.get_native_id()

        def check() -> None:
            if self._stop.is_set() or worker.is_cancelled:
                raise _Stopped

        def progress(done: int, total: int, label: str) -> None:
            check()
            self.post_message(SweepProgress(done, total, label))

        def on_run(run: dict[str, Any]) -> None:
            self.post_message(RunMeasured(dict(run)))
            check()

        try:
            result = self.runner(progress, on_run)
        except _Stopped:
            self.post_message(SweepStopped())
        except MlxspecError as e:
            self.post_message(SweepFailed(str(e)))
        except Exception as e:  # never a traceback: say what broke and keep the screen
            self.post_message(SweepFailed(f"{type(e).__name__}: {e}"))
        else:
            self.post_message(SweepFinished(result))

    def on_sweep_progress(self, message: SweepProgress) -> None:
        self.query_one(ProgressBar).update(total=message.total, progress=message.done)
        self.query_one("#phase", Label).update(message.label)

    def on_run_measured(self, message: RunMeasured) -> None:
        run = message.run
        self.series.setdefault(run["k"], Series(run["k"])).add(run)
        self.query_one(SweepChart).refresh(layout=True)

    def on_sweep_finished(self, message: SweepFinished) -> None:
        self.finished = True
        self.result = r = message.result
        bar = self.query_one(ProgressBar)
        bar.update(total=bar.total or 1, progress=bar.total or 1)
        om = r.optimum_measured
        a = r.auto
        auto = f"; auto {a.speedup:.2f}x (K {a.mean_k:.1f})" if a and a.speedup is not None and a.mean_k is not None else ""
        self.query_one("#phase", Label).update(
            f"done: best K = {om.k}, {om.speedup:.2f}x target-only{auto}" if om else "done")
        self.query_one(SweepChart).refresh(layout=True)
        self.query_one("#table", Static).update(_Printed(r))

    def on_sweep_failed(self, message: SweepFailed) -> None:
        self.finished = True
        self.error = message.error
        self.query_one("#phase", Label).update("failed")
        self.query_one("#table", Static).update(Text(f"error: {message.error}", "bold red"))

    def on_sweep_stopped(self, message: SweepStopped) -> None:
        self.finished = True
        self.exit()

    def action_stop_or_quit(self) -> None:
        if self.finished or self.stopping:
            # A second press while stopping exits at once; asyncio.run still joins the worker
            # thread on its way out, so the process does not end under running MLX work.
            self.exit()
            return
        self.stopping = True
        self._stop.set()
        self.sub_title = "stopping after the current measurement… (q again: quit now)"

    def wait_for_worker_exit(self, timeout: float = 2.0) -> None:
        """Call after ``run()`` returns, before the process exits (see ``wait_for_thread_exit``)."""
        wait_for_thread_exit(self.worker_thread_id, timeout)


# ----------------------------------------------------------------------------- sources
def sweep_runner(**kwargs: Any) -> SweepRunner:
    """The real sweep: ``run_sweep(**kwargs)`` with the app's callbacks."""

    def run(progress: Progress, on_run: OnRun) -> SweepResult:
        from mlxspec.measure.sweep import run_sweep

        return run_sweep(progress=progress, on_run=on_run, **kwargs)

    return run


def describe(ks: Sequence[int], model: str, draft: str, temp: float, max_tokens: int, repeats: int,
             auto: bool = False) -> str:
    ks = sorted(ks)
    span = f"{ks[0]}..{ks[-1]}" if ks == list(range(ks[0], ks[-1] + 1)) and len(ks) > 2 else ",".join(map(str, ks))
    mode = "greedy" if temp == 0 else f"T={temp:g}"
    return f"{model} + {draft}, K {span}{' + auto' if auto else ''}, {mode}, {max_tokens} tokens, {repeats} repeat(s)"


@dataclass(frozen=True)
class _Script:
    """The demo's made-up machine: costs, acceptance falling with the draft position, and a
    run-to-run jitter, turned into the run records a real sweep collects."""

    target_ms: float = 110.0
    draft_ms: float = 0.4
    tokens: int = 48
    jitter: tuple[float, ...] = (1.0, 0.93, 1.06, 0.97, 1.03, 0.9, 1.08)

    def acceptance(self, k: int) -> list[float]:
        return [0.62 * 0.9 ** i for i in range(k)]

    def verify_ms(self, k: int) -> float:
        return self.target_ms * (1 + 0.12 * k)

    def tps(self, k: int, i: int) -> float:
        if k == 0:
            return 1e3 / self.target_ms * self.jitter[i % len(self.jitter)]
        acc = self.acceptance(k)
        e = 1 + sum(math.prod(acc[: j + 1]) for j in range(k))
        return 1e3 * e / (k * self.draft_ms + self.verify_ms(k)) * 0.85 * self.jitter[(i + k) % len(self.jitter)]

    def steps(self, k: int, i: int) -> list[int]:
        """Accepted drafts per step until ``tokens`` are out (one token per step for K = 0)."""
        rng, out, emitted = random.Random(1000 * k + i), [], 0
        while emitted < self.tokens:
            a = 0
            while a < k and rng.random() < self.acceptance(k)[a]:
                a += 1
            out.append(a)
            emitted += a + 1
        return out

    def run(self, k: int, i: int) -> Run:
        acc = self.steps(k, i)
        total = self.tokens / self.tps(k, i)
        n = len(acc)
        return Run(list(range(self.tokens)), 20, 0.1 * total, 0.9 * total, acc[0] + 1, "length", acc, [k] * n,
                   [k] * n, [self.draft_ms * k] * n, [self.verify_ms(k) if k else self.target_ms] * n)

    def auto_run(self, i: int) -> Run:
        """``--k auto``: K chosen per step around the best fixed K (the model's, without jitter),
        about as fast as it but with its own jitter, so the two pair up noisily."""
        best = max(range(1, 9), key=lambda k: self.tps(k, -k))  # jitter index (i + k) = 0: no jitter
        rng, acc, rooms, emitted = random.Random(7000 + i), [], [], 0
        while emitted < self.tokens:
            room, a = max(1, best + rng.choice((-1, 0, 0, 1))), 0
            while a < room and rng.random() < self.acceptance(room)[a]:
                a += 1
            acc.append(a)
            rooms.append(room)
            emitted += a + 1
        total = self.tokens / self.tps(best, i + 3)
        return Run(list(range(self.tokens)), 20, 0.1 * total, 0.9 * total, acc[0] + 1, "length", acc, rooms, rooms,
                   [self.draft_ms * r for r in rooms], [self.verify_ms(r) for r in rooms])


def _demo_summary(ks: list[int], runs_by: dict[int | None, list[SweepRun]], script: _Script,
                  prompts: int) -> SweepResult:
    """The scripted runs through the sweep's own summary, as a real sweep's."""
    from mlxspec.measure.runs import Machine, RunHeader
    from mlxspec.measure.sweep import SweepSettings, summarise

    vt = {1: [script.target_ms] * 3, **{k + 1: [script.verify_ms(k)] * 3 for k in ks}}
    header = RunHeader("demo", Machine("demo", "demo", None), "no model", None, "-", None, "demo", "scripted")
    settings = SweepSettings(list(ks), "demo", 0.0, 1.0, ["demo"], None, None, script.tokens, 1, 1, 1, 0, 3,
                             auto_max_k=8 if None in runs_by else None)
    return summarise(ks, runs_by, vt, 20, header, settings, "demo data: scripted numbers, no model ran",
                     [{"id": p, "category": "demo", "prompt_tokens": 20} for p in range(prompts)])


def demo_runner(ks: Sequence[int] = (1, 2, 3, 4, 6, 8), prompts: int = 6, delay: float = 0.0,
                before_run: Callable[[], None] | None = None, auto: bool = True) -> SweepRunner:
    """Scripted, deterministic runs through ``run_sweep``'s summary, no model: for tests and
    ``--demo``. ``before_run`` is called before each timed run (tests use it to hold the sweep).
    ``auto``: an auto row too (scripted ``--k auto``), in the same rotation as the fixed Ks."""
    from mlxspec.measure.sweep import SweepRun

    ks = sorted(ks)
    script = _Script()

    def name(m: int | None) -> str:
        return "target-only" if m == 0 else "auto" if m is None else f"K={m}"

    def run(progress: Progress, on_run: OnRun) -> SweepResult:
        methods: list[int | None] = [0, *ks, *([None] if auto else [])]
        total = len(methods) + 3 + prompts * len(methods)
        done = 0

        def tick(label: str) -> None:
            nonlocal done
            done += 1
            time.sleep(delay)
            progress(done, total, label)

        for m in methods:
            tick(f"warm-up 1/1 · {name(m)}")
        for r in range(3):
            tick(f"verify cost · {r + 1}/3 rounds")
        runs_by: dict[int | None, list[SweepRun]] = {m: [] for m in methods}
        for p in range(prompts):
            rot = p % len(methods)
            got: dict[int | None, Run] = {}
            for m in methods[rot:] + methods[:rot]:
                if before_run is not None:
                    before_run()
                got[m] = x = script.auto_run(p) if m is None else script.run(m, p)
                on_run({"k": m, "prompt_id": p, "category": "demo", "repeat": 0, "tps": x.tps,
                        "accepted": list(x.accepted), "drafted": list(x.drafted), "rooms": list(x.rooms),
                        "done": p + 1, "of": prompts})
                tick(f"{name(m)} · demo #{p} · repeat 1/1")
            for m in methods:
                runs_by[m].append(SweepRun(m, p, "demo", 0, got[m], got[m].tps / got[0].tps if m != 0 else None))
        return _demo_summary(ks, runs_by, script, prompts)

    return run


def run_sweep_tui(ks: Sequence[int], description: str = "", **kwargs: Any) -> SweepResult | None:
    """Run the sweep in the live app until the user quits. Returns the result, or None when
    the user stopped it first; a failure shown in the app is raised again as ``MlxspecError``
    once the app has closed, so the CLI reports it as any other error."""
    app = SweepApp(sweep_runner(ks=ks, **kwargs), ks, description, auto=kwargs.get("auto", True))
    app.run()
    app.wait_for_worker_exit()
    if app.error is not None:
        raise MlxspecError(app.error)
    return app.result


# ----------------------------------------------------------------------------- screenshot
async def _shoot(app: SweepApp, svg: Path, size: tuple[int, int]) -> None:
    async with app.run_test(size=size) as pilot:
        while not app.finished:
            await pilot.pause(0.2)
        await pilot.pause(0.3)
        svg.write_text(app.export_screenshot(title="mlxspec sweep"))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m mlxspec.tui.sweep.app", description="mlxspec sweep --tui, standalone.")
    ap.add_argument("--demo", action="store_true", help="scripted numbers, no model")
    ap.add_argument("--screenshot", metavar="PATH", help="run headless and write PATH.svg (and .png)")
    ap.add_argument("--k", default="1..4")
    ap.add_argument("--draft", default="ngram:3")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--category", action="append", help="Spec-Bench category (repeatable)")
    ap.add_argument("--size", default="120x44", help="screenshot size, COLSxROWS")
    a = ap.parse_args()

    from mlxspec.measure.sweep import parse_ks

    ks = parse_ks(a.k)
    if a.demo:
        app = SweepApp(demo_runner(ks, delay=0.0 if a.screenshot else 0.3), ks, "demo: scripted numbers, no model")
    else:
        app = SweepApp(sweep_runner(ks=ks, draft=a.draft, max_tokens=a.max_tokens, per_category=a.per_category,
                                    categories=a.category),
                       ks, describe(ks, "default", a.draft, 0.0, a.max_tokens, 1, auto=True))
    if not a.screenshot:
        app.run()
        app.wait_for_worker_exit()
        return
    out = Path(a.screenshot)
    out.parent.mkdir(parents=True, exist_ok=True)
    svg = out.with_suffix(".svg")
    cols, rows = map(int, a.size.split("x"))
    asyncio.run(_shoot(app, svg, (cols, rows)))
    app.wait_for_worker_exit()
    print(f"wrote {svg}")
    from ..screenshot import svg_to_png

    png = svg_to_png(svg)
    if png:
        print(f"wrote {png}")


if __name__ == "__main__":
    main()
