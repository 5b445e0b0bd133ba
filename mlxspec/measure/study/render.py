"""A ``StudyResult`` drawn: rich tables of our figures and of the paper's claims beside ours,
and PNG plots by depth and by target entropy (matplotlib, imported only when plotting)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.markup import escape
from rich.table import Table

from mlxspec.errors import MlxspecError
from mlxspec.measure.runs import fmt
from mlxspec.measure.study.claims import PAPER
from mlxspec.measure.study.run import StudyResult

VERDICT_STYLE = {"holds": "bold green", "does not hold": "bold red", "cannot tell": "yellow"}
CAPTION = ("E[len]: accepted drafts per tree step, 95% bootstrap over prompts; acc: accepted / judged nodes (parent "
           "accepted); alpha = min(1, p/q) over all nodes; H: target entropy (nats) at the node's parent; rho: Spearman "
           "with H [95% bootstrap over prompts]; path continues: share of steps whose accepted path, having reached "
           "depth d - 1, accepted a node at depth d = 1, 2, ...")
COLUMNS = (("domain", "left"), ("prompts", "right"), ("steps", "right"), ("nodes", "right"), ("E[len]/step", "right"),
           ("acc", "right"), ("alpha", "right"), ("H", "right"), ("rho(H, accepted)", "right"),
           ("rho(H, alpha)", "right"), ("path continues", "left"))


def _figures_table(result: StudyResult) -> Table:
    s, h = result.settings, result.header
    temp = "greedy" if s.temperature == 0 else f"T={s.temperature:g}"
    title = (f"acceptance study: {s.model} ({s.dtype}) + {s.draft}, tree {s.tree} ({s.tree_nodes} nodes), {temp}"
             + (f" — {h.backend}" if h else ""))
    table = Table(title=escape(title), caption=escape(
        f"{result.prompts} prompts, {result.nodes} tree nodes, {s.max_tokens} new tokens max per prompt; " + CAPTION))
    for col, just in COLUMNS:
        table.add_column(escape(col), justify=just)
    for r in result.domains:
        prof = " ".join(fmt(d.continues, "{:.2f}") for d in result.depths if d.domain == r.domain)
        table.add_row(*map(escape, (
            r.domain, str(r.prompts), str(r.steps), str(r.nodes), r.expected_length.cell("{:.2f}"),
            fmt(r.acceptance, "{:.2f}"), fmt(r.mean_alpha, "{:.2f}"), fmt(r.mean_entropy, "{:.2f}"),
            r.rho_accepted.cell(), r.rho_alpha.cell(), prof)))
    pooled = " ".join(fmt(d.continues, "{:.2f}") for d in result.depths if d.domain == "all")
    table.add_row("all", str(result.prompts), str(sum(r.steps for r in result.domains)), str(result.nodes),
                  "", "", "", "", "", "", pooled, style="dim")
    return table


def _claims_table(result: StudyResult) -> Table:
    claims = Table(title="the paper's findings beside ours", caption=escape(PAPER.text))
    for col in ("claim", "paper", "ours", "verdict"):
        claims.add_column(col)
    for c in result.claims:
        claims.add_row(escape(c.claim), escape(c.paper), escape(c.ours), f"[{VERDICT_STYLE[c.verdict]}]{c.verdict}[/]")
    return claims


def log_line(path: Path, before: int) -> str:
    """Where the per-node log goes, and how much of it a rerun resumes (rich markup)."""
    return f"[dim]log: {escape(str(path))}" + (f" (resuming: {before} prompts done)" if before else "") + "[/]"


def print_study(result: StudyResult, console) -> None:
    """Two rich tables: our figures by domain (with the depth profile), and the paper's claims
    beside ours; then the domain-vs-depth regression."""
    console.print(_figures_table(result))
    console.print(_claims_table(result))
    v = result.variance
    if v is not None:
        console.print(
            f"logistic regression of accepted on {v.nodes} judged nodes: null deviance {v.null_deviance:.1f}; domain "
            f"alone explains {v.domain.explained:.1f} (pseudo-R² {v.domain.pseudo_r2:.3f}), depth alone "
            f"{v.depth.explained:.1f} (pseudo-R² {v.depth.pseudo_r2:.3f}); both {v.null_deviance - v.both_deviance:.1f}. "
            f"[bold]{v.stronger or 'neither'}[/] explains more.", highlight=False)
    for n in result.notes:
        console.print(f"[yellow]note:[/] {escape(n)}", highlight=False)
    if result.log:
        console.print(f"[dim]log: {escape(result.log)}[/]", highlight=False)


def _figure(size: tuple[float, float]):
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError:
        raise MlxspecError("plotting needs matplotlib: pip install matplotlib") from None
    return Figure(figsize=size, dpi=110, layout="constrained")


def _title(result: StudyResult) -> str:
    s = result.settings
    temp = "greedy" if s.temperature == 0 else f"T={s.temperature:g}"
    return f"{s.model} + {s.draft}, tree {s.tree} ({s.tree_nodes} nodes), {temp}, {result.nodes} nodes"


PANELS = {"continues": "path continues to this depth", "acceptance": "acceptance of judged nodes",
          "mean_alpha": "mean alpha = min(1, p/q)"}


def _plot(result: StudyResult, name: str, source: list, keys: list[str], xlabel: str, path: Path) -> None:
    """One PNG: a panel per key of ``source``'s rows, a line per domain, dashed black for all."""
    fig = _figure((6 * len(keys), 4.6))
    axes = fig.subplots(1, len(keys))
    fig.suptitle(f"acceptance by {name}: {_title(result)}", fontsize=10)
    for d in [*(r.domain for r in result.domains), "all"]:
        rows = [r for r in source if r.domain == d]
        style = {"color": "black", "linestyle": "--", "linewidth": 2} if d == "all" else {}
        xs = [r.depth for r in rows] if name == "depth" else [(r.lo + r.hi) / 2 for r in rows]
        for ax, key in zip(axes, keys):
            ys = [getattr(r, key) for r in rows]
            ax.plot(xs, [np.nan if y is None else y for y in ys], marker="o", label=d, **style)
    for ax, key in zip(axes, keys):
        ax.set_ylabel(PANELS[key])
        ax.set_xlabel(xlabel)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        if name == "depth":
            ax.set_xticks(sorted({r.depth for r in result.depths}))
    fig.savefig(path, format="png")


def plot_study(result: StudyResult, prefix: str | Path) -> list[Path]:
    """Two PNGs, one line per domain (dashed black: all pooled): ``PREFIX-depth.png``, by depth
    in the tree: how often the accepted path goes on to that depth, the acceptance of judged
    nodes and mean alpha; ``PREFIX-entropy.png``: the latter two against binned target entropy."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, source, keys, xlabel in (
        ("depth", result.depths, ["continues", "acceptance", "mean_alpha"], "depth in the draft tree"),
        ("entropy", result.entropy, ["acceptance", "mean_alpha"], "target entropy at the parent (nats, bin middle)"),
    ):
        path = prefix.with_name(f"{prefix.name}-{name}.png")
        _plot(result, name, source, keys, xlabel, path)
        paths.append(path)
    return paths
