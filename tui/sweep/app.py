"""``mlxspec sweep --tui``: the K sweep, live.

One worker thread runs the whole sweep (``mlxspec.sweep.run_sweep``: model loading, warm-up,
verify timing, every run) and so owns all MLX state. It posts plain Python values: a progress
tick, a summary of every timed run, the final result dict. The app draws a chart that fills in
per K as runs arrive (median tokens/s against the target-only line, share of drafts accepted),
marks the measured and predicted optima when the sweep ends, and shows the sweep's table and
verdict beneath.

    python -m tui.sweep.app --demo                  # scripted numbers, no model
    python -m tui.sweep.app --screenshot docs/sweep # docs/sweep.svg and .png from a short real sweep
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
from typing import Any

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

from ..threads import wait_for_thread_exit

Progress = Callable[[int, int, str], None]
OnRun = Callable[[dict[str, Any]], None]
# Runs a whole sweep in the worker thread, reporting through the two callbacks, and returns
# ``run_sweep``'s result dict.
SweepRunner = Callable[[Progress, OnRun], dict[str, Any]]

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
    def __init__(self, result: dict[str, Any]) -> None:
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
    """What has been measured for one K so far (K = 0: target-only)."""

    k: int
    tps: list[float] = field(default_factory=list)
    accepted: int = 0
    steps: int = 0
    done: int = 0
    of: int = 0

    def add(self, run: dict[str, Any]) -> None:
        self.tps.append(run["tps"])
        self.accepted += sum(run["accepted"])
        self.steps += len(run["accepted"])
        self.done, self.of = run["done"], run["of"]

    @property
    def median_tps(self) -> float | None:
        return statistics.median(self.tps) if self.tps else None

    @property
    def acceptance(self) -> float | None:
        """Accepted drafts per step / K, as ``plot_sweep``: a step where the drafter proposed
        fewer than K tokens counts the missing ones as rejected, as the sweep's table does."""
        return self.accepted / (self.k * self.steps) if self.k and self.steps else None

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


def chart_text(ks: Sequence[int], series: dict[int, Series], width: int,
               result: dict[str, Any] | None = None) -> Text:
    """The live chart: a row for target-only and one per K, tokens/s as a bar (median of the runs
    so far, the target-only median as a line through every row), then the speedup, the share of
    drafts accepted as a second bar and accepted drafts per step. With ``result`` (the sweep
    has ended) the medians are the result's and the optima are marked: ★ measured, ◆ predicted."""
    rows = {r["k"]: r for r in result["rows"]} if result else {}
    base = series.get(0, Series(0))
    base_tps = result["baseline"]["tps"] if result else base.median_tps
    best = (result.get("optimum_measured") or {}).get("k") if result else None
    best_pred = (result.get("optimum_predicted") or {}).get("k") if result else None
    pays = bool(result and result.get("pays"))

    def tps_of(k: int) -> float | None:
        if k in rows:
            return rows[k]["tps"]
        return base_tps if k == 0 else series[k].median_tps if k in series else None

    values = [v for v in (tps_of(k) for k in [0, *ks]) if v is not None]
    scale = max(values) * 1.08 if values else 1.0
    name_w, value_w, acc_w = 10, 22, 28
    bar_w = max(8, width - name_w - value_w - acc_w - 1)
    mark = min(bar_w - 1, round(base_tps / scale * bar_w)) if base_tps else None

    out = Text()
    out.append("tokens/s".ljust(name_w + bar_w), "bold")
    out.append(" " * value_w)
    out.append("drafts accepted of K\n", "bold")
    out.append(" " * name_w)
    out.append("│", BASE_STYLE)
    out.append(" target-only" if base_tps else " target-only: not measured yet", EMPTY_STYLE)
    out.append("   █", TPS_STYLE)
    out.append(" speculative, median of runs so far", EMPTY_STYLE)
    if result:
        out.append("   ★ best measured   ◆ best predicted by the cost model", EMPTY_STYLE)
    out.append("\n")
    for k in [0, *ks]:
        s = series.get(k)
        tps = tps_of(k)
        name = "target" if k == 0 else f"K={k}" + (" ★" if k == best else "") + (" ◆" if k == best_pred else "")
        name_style = ("bold green" if pays else "bold yellow") if k == best else ""
        out.append(name.ljust(name_w), name_style)
        if tps is None:
            out.append(_bar(0, scale, bar_w, TPS_STYLE, mark))
            out.append("  waiting\n", EMPTY_STYLE)
            continue
        out.append(_bar(tps, scale, bar_w, BASE_STYLE if k == 0 else TPS_STYLE, None if k == 0 else mark))
        partial = s is not None and s.done < s.of and not result
        value = f" {tps:5.1f} tok/s"
        speedup = rows[k]["speedup"] if k in rows else tps / base_tps if k and base_tps else None
        if k and speedup is not None:
            value += f" {speedup:4.2f}x"
        if partial:
            value += f" {s.done}/{s.of}"
        out.append(value.ljust(value_w), "italic" if partial else "bold" if k == best else "")
        per_step = rows[k]["mean_accepted"] if k in rows else s.accepted_per_step if s else None
        if k and per_step is not None:
            acc = per_step / k
            out.append(" ")
            out.append(_bar(acc, 1.0, 10, ACC_STYLE, track="░"))
            out.append(f" {acc:4.0%} {per_step:4.2f}/step")
        out.append("\n")
    if result:
        out.append("\n")
        for i, line in enumerate(result["verdict"]):
            style = ("bold green" if pays else "bold red") if i == 0 else "red" if line.startswith(("why:", "BUG")) \
                else "yellow" if line.startswith("note:") else ""
            out.append(line + "\n", style)
    out.rstrip()
    return out


class SweepChart(Widget):
    """Draws ``chart_text`` from what the app holds; re-rendered on every run."""

    DEFAULT_CSS = "SweepChart { height: auto; }"

    def render(self) -> Text:
        app = self.app
        assert isinstance(app, SweepApp)
        return chart_text(app.ks, app.series, self.content_size.width or 100, app.result)


class _Printed:
    """``mlxspec.sweep.print_sweep`` (the CLI's table, parallelism and verdict) at the width given."""

    def __init__(self, result: dict[str, Any]) -> None:
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

    def __init__(self, runner: SweepRunner, ks: Sequence[int], description: str = "") -> None:
        super().__init__()
        self.runner = runner
        self.ks = sorted(ks)
        self.description = description
        self.series: dict[int, Series] = {}
        self.result: dict[str, Any] | None = None
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
        om = r.get("optimum_measured")
        self.query_one("#phase", Label).update(
            f"done: best K = {om['k']}, {om['speedup']:.2f}x target-only" if om else "done")
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

    def run(progress: Progress, on_run: OnRun) -> dict[str, Any]:
        from mlxspec.measure.sweep import run_sweep

        return run_sweep(progress=progress, on_run=on_run, **kwargs)

    return run


def describe(ks: Sequence[int], model: str, draft: str, temp: float, max_tokens: int, repeats: int) -> str:
    ks = sorted(ks)
    span = f"{ks[0]}..{ks[-1]}" if ks == list(range(ks[0], ks[-1] + 1)) and len(ks) > 2 else ",".join(map(str, ks))
    mode = "greedy" if temp == 0 else f"T={temp:g}"
    return f"{model} + {draft}, K {span}, {mode}, {max_tokens} tokens, {repeats} repeat(s)"


def demo_runner(ks: Sequence[int] = (1, 2, 3, 4, 6, 8), prompts: int = 3, delay: float = 0.0,
                before_run: Callable[[], None] | None = None) -> SweepRunner:
    """Scripted, deterministic numbers in ``run_sweep``'s shape, no model: for tests and
    ``--demo``. ``before_run`` is called before each timed run (tests use it to hold the sweep)."""
    from mlxspec.measure.sweep import diagnose

    ks = sorted(ks)
    target_ms, draft_ms = 110.0, 0.4
    acc = {k: [0.62 * 0.9 ** i for i in range(k)] for k in ks}
    verify = {k: target_ms * (1 + 0.12 * k) for k in ks}
    jitter = [1.0, 0.93, 1.06, 0.97, 1.03, 0.9, 1.08]

    def steps(k: int, n: int = 24) -> tuple[list[int], list[int]]:
        if k == 0:
            return [0] * n, [0] * n
        rng, out = random.Random(k), []
        for _ in range(n):
            a = 0
            while a < k and rng.random() < acc[k][a]:
                a += 1
            out.append(a)
        return out, [k] * n

    def tps(k: int, i: int) -> float:
        if k == 0:
            return 1e3 / target_ms * jitter[i % len(jitter)]
        e = 1 + sum(math.prod(acc[k][: j + 1]) for j in range(k))
        return 1e3 * e / (k * draft_ms + verify[k]) * 0.85 * jitter[(i + k) % len(jitter)]

    def run(progress: Progress, on_run: OnRun) -> dict[str, Any]:
        methods = [0, *ks]
        total = len(methods) + 3 + prompts * len(methods)
        done = 0

        def tick(label: str) -> None:
            nonlocal done
            done += 1
            time.sleep(delay)
            progress(done, total, label)

        for m in methods:
            tick(f"warm-up 1/1 · {'target-only' if m == 0 else f'K={m}'}")
        for r in range(3):
            tick(f"verify cost · {r + 1}/3 rounds")
        runs: dict[int, list[float]] = {m: [] for m in methods}
        for p in range(prompts):
            rot = p % len(methods)
            for m in methods[rot:] + methods[:rot]:
                if before_run is not None:
                    before_run()
                runs[m].append(tps(m, p))
                a, d = steps(m)
                on_run({"k": m, "prompt_id": p, "category": "demo", "repeat": 0, "tps": runs[m][-1],
                        "accepted": a, "drafted": d, "done": len(runs[m]), "of": prompts})
                tick(f"{'target-only' if m == 0 else f'K={m}'} · demo #{p} · repeat 1/1")
        return _demo_result(ks, runs, acc, verify, target_ms, draft_ms, prompts, diagnose)

    return run


def _demo_result(ks, runs, acc, verify, target_ms, draft_ms, prompts, diagnose) -> dict[str, Any]:
    med = {m: statistics.median(v) for m, v in runs.items()}
    speed = {k: statistics.median(a / b for a, b in zip(runs[k], runs[0])) for k in ks}
    d = diagnose(ks, [med[k] for k in ks], [speed[k] for k in ks], [acc[k] for k in ks],
                 [draft_ms] * len(ks), [verify[k] for k in ks], target_ms, med[0])
    best = d["optimum_measured"]["k"]
    rows = []
    for k, pm in zip(ks, d["predicted"]):
        rows.append({
            "k": k, "tps": med[k], "tps_min": min(runs[k]), "tps_max": max(runs[k]), "speedup": speed[k],
            "acceptance": acc[k], "mean_accepted": pm["expected_tokens"] - 1, "draft_ms_per_token": draft_ms,
            "verify_ms_per_step": verify[k], "verify_ms": verify[k], "verify_ratio": verify[k] / target_ms,
            "predicted_tps": pm["tps"], "predicted_speedup": pm["speedup"], "is_optimum": k == best,
        })
    return {
        "model": "demo", "dtype": "scripted", "backend": "no model",
        "settings": {"ks": list(ks), "draft": "demo", "temperature": 0.0, "top_p": 1.0, "max_tokens": 48,
                     "warmup": 1, "repeats": 1, "verify_reps": 3},
        "note": "demo data: scripted numbers, no model ran",
        "prompts": [{"id": p} for p in range(prompts)],
        "baseline": {"tps": med[0], "tps_min": min(runs[0]), "tps_max": max(runs[0]),
                     "ms_per_token": target_ms},
        "rows": rows,
        "verification": {"target_ms": target_ms, "slope": d["verify_slope"], "kind": d["verify_kind"],
                         "per_k": [{"k": k, "tokens": k + 1, "ratio": verify[k] / target_ms} for k in ks]},
        "optimum_measured": d["optimum_measured"], "optimum_predicted": d["optimum_predicted"],
        "pays": d["pays"], "causes": d["causes"], "verdict": d["verdict"],
    }


def run_sweep_tui(ks: Sequence[int], description: str = "", **kwargs: Any) -> dict[str, Any] | None:
    """Run the sweep in the live app until the user quits. Returns the result, or None when
    the user stopped it first; a failure shown in the app is raised again as ``MlxspecError``
    once the app has closed, so the CLI reports it as any other error."""
    app = SweepApp(sweep_runner(ks=ks, **kwargs), ks, description)
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
    ap = argparse.ArgumentParser(prog="python -m tui.sweep.app", description="mlxspec sweep --tui, standalone.")
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
                       ks, describe(ks, "default", a.draft, 0.0, a.max_tokens, 1))
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
