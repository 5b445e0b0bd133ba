"""The sweep's live chart as rich text: a row for target-only, one per K and one for auto,
tokens/s as a bar (the target-only median as a line through every row), the speedup, the share
of drafts accepted as a second bar. Pure rendering of what the app holds: ``Series`` of the
runs so far while the sweep runs, the result once it has ended."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.style import Style
from rich.text import Text

from mlxspec.measure.sweep import SweepResult
from mlxspec.measure.verdict import style

# Mid-saturation hues, readable on dark and light backgrounds alike.
TPS_STYLE = Style.parse("#3b82f6")
BASE_STYLE = Style.parse("bold #f59e0b")
ACC_STYLE = Style.parse("#22c55e")
EMPTY_STYLE = Style.parse("#6b7280")
EIGHTHS = " ▏▎▍▌▋▊▉"


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
