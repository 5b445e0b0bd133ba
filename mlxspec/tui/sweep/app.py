"""``mlxspec sweep --tui``: the K sweep, live.

One worker thread runs the whole sweep (``mlxspec.measure.sweep.run_sweep``: model loading,
warm-up, verify timing, every run) and so owns all MLX state. It posts plain Python values: a
progress tick, a summary of every timed run, the final ``SweepResult`` record. The app draws a
chart (``chart``) that fills in per K, and for ``--k auto`` (row "auto", with the mean K it
chose), as runs arrive, marks the measured and predicted optima when the sweep ends, and shows
the sweep's table and verdict beneath. Its numbers come from ``sources``.

    python -m mlxspec.tui.sweep.app --demo                  # scripted numbers, no model
    python -m mlxspec.tui.sweep.app --screenshot docs/sweep # docs/sweep.svg and .png from a short real sweep
"""

from __future__ import annotations

import argparse
import asyncio
import io
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
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
from mlxspec.measure.sweep import SweepOptions, SweepResult, parse_ks, print_sweep
from mlxspec.tui.screenshot import svg_to_png
from mlxspec.tui.sweep.chart import Series, chart_text
from mlxspec.tui.sweep.sources import SweepRunner, demo_runner, describe, sweep_runner
from mlxspec.runtime import wait_for_thread_exit


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


def run_sweep_tui(options: SweepOptions, description: str = "") -> SweepResult | None:
    """Run the sweep in the live app until the user quits. Returns the result, or None when
    the user stopped it first; a failure shown in the app is raised again as ``MlxspecError``
    once the app has closed, so the CLI reports it as any other error."""
    app = SweepApp(sweep_runner(options), options.ks, description, auto=options.auto)
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

    ks = parse_ks(a.k)
    if a.demo:
        app = SweepApp(demo_runner(ks, delay=0.0 if a.screenshot else 0.3), ks, "demo: scripted numbers, no model")
    else:
        options = SweepOptions(ks, draft=a.draft, max_tokens=a.max_tokens, per_category=a.per_category,
                               categories=a.category)
        app = SweepApp(sweep_runner(options), ks, describe(options, "default"))
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
    png = svg_to_png(svg)
    if png:
        print(f"wrote {png}")


if __name__ == "__main__":
    main()
