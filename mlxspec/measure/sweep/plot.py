"""A sweep's result as a PNG: throughput, acceptance and verify cost against K. Matplotlib
stays an optional import, loaded only when a plot is asked for."""

from __future__ import annotations

from pathlib import Path

from mlxspec.errors import MlxspecError
from mlxspec.measure.runs import fmt
from mlxspec.measure.sweep.records import SweepResult


def _plot_throughput(ax, result: SweepResult) -> None:
    rows, b = result.rows, result.baseline
    ks = [r.k for r in rows]
    ax.errorbar(ks, [r.tps for r in rows], yerr=[[r.tps - r.tps_min for r in rows], [r.tps_max - r.tps for r in rows]],
                marker="o", capsize=3, color="tab:blue", label="speculative, measured (median, min-max over runs)")
    ax.plot(ks, [r.predicted_tps for r in rows], "--", marker="s", markersize=4, color="tab:purple",
            alpha=0.8, label="cost model prediction")
    ax.axhline(b.tps, color="tab:gray", linestyle="-", linewidth=1.5, label=f"target-only ({b.tps:.1f} tok/s)")
    ax.axhspan(b.tps_min, b.tps_max, color="tab:gray", alpha=0.12)
    a = result.auto
    if a is not None and a.mean_k is not None:  # at the mean K it chose
        mark = " ★" if a.is_optimum else " ≈" if a.indistinguishable else ""
        ax.errorbar([a.mean_k], [a.tps], yerr=[[a.tps - a.tps_min], [a.tps_max - a.tps]], marker="P", markersize=10,
                    capsize=3, color="tab:cyan", markeredgecolor="black", linestyle="none", zorder=6,
                    label=f"auto{mark}: K per step, mean {a.mean_k:.1f} ({fmt(a.speedup, '{:.2f}x')})")
    om, op = result.optimum_measured, result.optimum_predicted
    if om:
        ax.plot([om.k], [om.tps], marker="*", markersize=18, color="gold", markeredgecolor="black",
                linestyle="none", label=f"measured optimum K={om.k} ({om.speedup:.2f}x)", zorder=5)
    if op:
        ax.plot([op.k], [op.tps], marker="D", markersize=8, color="none", markeredgecolor="tab:purple",
                linestyle="none", label=f"predicted optimum K={op.k} ({op.speedup:.2f}x)", zorder=5)
    ax.set_xlabel("K (draft tokens per step)")
    ax.set_ylabel("tokens/s (end-to-end)")
    ax.set_title("throughput")
    ax.set_xticks(ks)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")


def _plot_acceptance(ax, result: SweepResult) -> None:
    rows = result.rows
    ks = [r.k for r in rows]
    first = [r.acceptance[0] if r.acceptance and r.acceptance[0] is not None else float("nan") for r in rows]
    ax.plot(ks, first, marker="o", color="tab:green", label="acceptance at position 1")
    ax.plot(ks, [(r.mean_accepted or 0.0) / r.k for r in rows], marker="o", color="tab:olive",
            label="accepted drafts / K")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("K")
    ax.set_ylabel("acceptance rate")
    ax.set_title("acceptance")
    ax.set_xticks(ks)
    ax.grid(alpha=0.3)
    tw = ax.twinx()
    tw.plot(ks, [r.mean_accepted or 0.0 for r in rows], marker="^", linestyle=":", color="tab:red",
            label="mean accepted length")
    a = result.auto
    if a is not None and a.mean_k is not None and a.acceptance and a.acceptance[0] is not None:
        ax.plot([a.mean_k], [a.acceptance[0]], marker="P", markersize=10, color="tab:cyan", markeredgecolor="black",
                linestyle="none", label=f"auto: position 1, at its mean K {a.mean_k:.1f}")
    tw.set_ylabel("accepted drafts per step", color="tab:red")
    tw.set_ylim(0, max(1.0, 1.15 * max([r.mean_accepted or 0.0 for r in rows], default=0.0)))
    if result.optimum_measured:
        ax.axvline(result.optimum_measured.k, color="gold", linewidth=2, alpha=0.6)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = tw.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="best")


def _plot_verification(ax, result: SweepResult) -> None:
    v = result.verification
    ks = [r.k for r in result.rows]
    ax.plot(ks, [p.ratio for p in v.per_k], marker="o", color="tab:orange",
            label="measured: pass over K+1 tokens / 1 token")
    ax.plot(ks, [1.0] * len(ks), "--", color="tab:green", label="flat (batch-parallel)")
    ax.plot(ks, [k + 1 for k in ks], "--", color="tab:red", label="linear (serial)")
    ax.set_xlabel("K")
    ax.set_ylabel("cost relative to one token")
    ax.set_title(f"verification: {v.kind} (+{v.slope:.2f}/token)")
    ax.set_xticks(ks)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")


def plot_sweep(result: SweepResult, path: str | Path) -> Path:
    """PNG, three panels against K: tokens/s (measured median with min-max bars, the cost model,
    target-only as a horizontal line, the optimum starred, auto as a cross at the mean K it
    chose); acceptance (first position, mean
    over positions, accepted drafts per step); verify cost of K+1 tokens / one token against the
    flat and serial lines. Matplotlib with the Agg canvas (no display needed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError:
        raise MlxspecError("plotting needs matplotlib: pip install matplotlib") from None

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    s, h = result.settings, result.header
    fig = Figure(figsize=(15, 4.8), dpi=110, layout="constrained")
    ax1, ax2, ax3 = fig.subplots(1, 3)
    temp = "greedy" if s.temperature == 0 else f"T={s.temperature:g}"
    fig.suptitle(f"K sweep: {h.model} ({h.dtype}) + {s.draft}, {temp} — {h.backend}", fontsize=11)
    _plot_throughput(ax1, result)
    _plot_acceptance(ax2, result)
    _plot_verification(ax3, result)
    fig.savefig(path, format="png")
    return path
