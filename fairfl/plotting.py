"""One plotting style for every notebook, and ``save_figure`` writing PNG + PDF atomically
(a failed run never leaves a half-written figure)."""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import matplotlib
import matplotlib.lines

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import LogFormatter, MaxNLocator

from .paths import figures_root
from .atomic import atomic_write
from .history import History


# JupyterLab shows a figure at its natural size up to the width of the notebook's column and
# scales a wider one down, text included. At the default layout (file browser open, window 1366 to
# 1500 px wide) the column is about 900 px; figures meant to be read in a notebook are made that
# wide at the inline backend's dpi (use_style), so that their text keeps the size it was set in.
COLUMN_INCHES = 8.4
INLINE_DPI = 110


def _fit(title: str, chars: int = 72) -> str:
    """A suptitle wrapped to the width of a column-wide figure (about 72 characters of its size),
    its own line breaks kept."""
    import textwrap
    return "\n".join(part for line in title.splitlines() for part in textwrap.wrap(line, chars) or [""])


def round_axis(ax, axis: str = "x") -> None:
    """Integer ticks on an axis of rounds: a run of two rounds otherwise gets 0.5 and 1.5. The
    steps are matplotlib's default locator's (0, 20, 40, not 0, 15, 30)."""
    locator = MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10], integer=True)
    (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(locator)


class PlainLogFormatter(LogFormatter):
    """A log axis's tick labels as decimals (0.3, 2, 10), on the ticks matplotlib labels."""

    def __call__(self, x, pos=None):
        return f"{x:.3g}" if super().__call__(x, pos) else ""


def plain_log_ticks(ax, axis: str = "y") -> None:
    """Decimal tick labels on a log axis (0.3, 0.5, 2 rather than 3×10⁻¹, 2×10⁰): a loss that
    spans less than a decade gets labelled minor ticks, which the default writes in scientific
    notation. The choice of which ticks carry a label is matplotlib's, unchanged."""
    a = ax.xaxis if axis == "x" else ax.yaxis
    a.set_major_formatter(PlainLogFormatter(labelOnlyBase=False))
    a.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False))


def use_style() -> None:
    import seaborn as sns
    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")
    matplotlib.rcParams.update({"figure.dpi": INLINE_DPI, "savefig.dpi": 150, "savefig.bbox": "tight",
                                "axes.titlesize": "medium"})


def save_figure(fig: matplotlib.figure.Figure, name: str, folder: Path | None = None) -> list[Path]:
    """Write ``<figures>/<name>.png`` and ``.pdf``; returns the paths."""
    folder = Path(folder or figures_root())
    paths = []
    for ext in ("png", "pdf"):
        path = folder / f"{name}.{ext}"
        # no creation date in the PDF: re-plotting unchanged results gives an unchanged file
        metadata = {"CreationDate": None} if ext == "pdf" else None
        atomic_write(path, lambda p, ext=ext, md=metadata: fig.savefig(p, format=ext, metadata=md))
        paths.append(path)
    return paths


def partition_heatmap(counts: np.ndarray, ax=None, title: str = "", class_names: Sequence[str] = (),
                      max_clients: int = 50):
    """Clients × labels heatmap of sample counts (the first ``max_clients`` clients)."""
    import seaborn as sns
    ax = ax or plt.gca()
    shown = counts[:max_clients]
    sns.heatmap(shown, ax=ax, cmap="viridis", cbar_kws={"label": "samples", "pad": 0.02},
                xticklabels=list(class_names) or "auto", yticklabels=max(1, len(shown) // 10))
    ax.set_xlabel("label")
    ax.set_ylabel("client")
    ax.set_title(title)
    return ax


def partitions(counts: dict[str, np.ndarray], class_names: Sequence[str] = (), title: str = "",
               max_clients: int = 30, columns: int = 2) -> matplotlib.figure.Figure:
    """One :func:`partition_heatmap` per partition (``counts``: {title: clients × labels}), in a
    grid of ``columns`` panels a row, as wide as a notebook's column: four heatmaps in one row
    were scaled to less than half their size in JupyterLab, their labels unreadable."""
    rows = -(-len(counts) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(COLUMN_INCHES, 3.4 * rows + 0.4), layout="constrained",
                             squeeze=False, dpi=INLINE_DPI)
    for ax, (name, c) in zip(axes.flat, counts.items()):
        partition_heatmap(c, ax=ax, title=name, class_names=class_names, max_clients=max_clients)
        ax.tick_params(axis="x", labelrotation=90)
        ax.tick_params(axis="y", labelrotation=0)
    for ax in axes.flat[len(counts):]:
        ax.set_axis_off()
    if title:
        fig.suptitle(_fit(title))
    return fig


def series_style(i: int) -> dict[str, str]:
    """The colour and line style of the i-th series: the ten colours of the cycle, then again dashed,
    then dotted, so that no two of up to 30 series look alike."""
    return {"color": f"C{i % 10}", "linestyle": ("-", "--", ":")[min(i // 10, 2)]}


def curves(histories: dict[str, Sequence[History]], metric: str = "mean_acc", ax=None,
           logy: bool = False, band: str = "std"):
    """Mean over seeds ± a band (std or min–max) of a per-evaluation metric against rounds.
    ``metric``: "mean_acc" (average user test accuracy, in %) or "train_loss"."""
    ax = ax or plt.gca()
    for i, (label, runs) in enumerate(histories.items()):
        rounds = np.asarray(runs[0].eval_rounds)
        ys = np.stack([100 * r.mean_acc() if metric == "mean_acc" else np.asarray(r.train_loss) for r in runs])
        mu = ys.mean(0)
        lo, hi = ((mu - ys.std(0), mu + ys.std(0)) if band == "std" else (ys.min(0), ys.max(0)))
        line, = ax.plot(rounds, mu, label=label, **series_style(i))
        if len(runs) > 1:
            ax.fill_between(rounds, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("round")
    round_axis(ax)
    ax.set_ylabel({"mean_acc": "average user test accuracy (%)", "train_loss": "averaged training loss"}[metric])
    if logy:
        ax.set_yscale("log")
        plain_log_ticks(ax)
    ax.legend()
    return ax


def accuracy_and_loss(histories: dict[str, Sequence[History]], title: str = "") -> matplotlib.figure.Figure:
    """Three panels against rounds, mean ± std over seeds: the average user test accuracy, the
    averaged training loss, and that loss on a log scale."""
    fig, axes = plt.subplots(1, 3, figsize=(COLUMN_INCHES, 3.4), layout="constrained", dpi=INLINE_DPI)
    curves(histories, "mean_acc", ax=axes[0])
    curves(histories, "train_loss", ax=axes[1])
    curves(histories, "train_loss", ax=axes[2], logy=True)
    axes[0].set_title("average user test accuracy")
    axes[1].set_title("training loss")
    axes[2].set_title("training loss (log scale)")
    if title:
        fig.suptitle(_fit(title))
    return fig


def final_vs(series: dict[str, dict[Any, Sequence[float]]], ax=None, xlabel: str = "", ylabel: str = "",
             fmt: Callable[[Any], str] = "{:g}".format):
    """A final value against a factor's values, one line per series: the mean over seeds with
    ± std error bars (ddof 0). ``series``: {label: {factor value: the seeds' values}}. The factor's
    values sit evenly spaced, labelled with ``fmt`` (ε = 0, 0.01, 0.05, 0.1, 0.5, 1 would crowd the
    left end of a linear axis), so that their order is what the eye reads."""
    ax = ax or plt.gca()
    xs = list(dict.fromkeys(x for by_x in series.values() for x in by_x))
    for label, by_x in series.items():
        pos = [xs.index(x) for x in by_x]
        v = [np.asarray(by_x[x], dtype=np.float64) for x in by_x]
        ax.errorbar(pos, [a.mean() for a in v], yerr=[a.std() for a in v], marker="o", capsize=4, label=label)
    ax.set_xticks(range(len(xs)), [fmt(x) for x in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if len(series) > 1:
        ax.legend()
    return ax


def accuracy_vs_fairness(table, x: str = "mean", y: str = "worst10", ax=None, xlabel: str = "", ylabel: str = "",
                         off_front: Sequence[str] = ()):
    """One point per method: metric ``y`` against metric ``x`` of a :func:`fairfl.protocol.summary`
    table of one federation, track and criterion (one row per method and metric, with ``mean``,
    ``low``, ``high``), with the seed intervals
    as error bars in both directions and the Pareto front of the means drawn through its members (a
    dashed line), which are named beside their points; the first ten methods are circles, the next
    squares, with :func:`series_style`'s colours. σ ("std") is better lower, every other metric higher.
    The methods in ``off_front`` (a personalised method scored at its clients' own models) are drawn
    hollow and neither join nor bound the front."""
    from .protocol import pareto_front
    ax = ax or plt.gca()
    wide = {m: table[table.metric == m].set_index("method") for m in (x, y)}
    methods = [m for m in wide[x].index if m in wide[y].index]
    xs, ys = (np.array([wide[k].loc[m, "mean"] for m in methods], dtype=np.float64) for k in (x, y))
    on = np.array([m not in off_front for m in methods], dtype=bool)
    front = np.zeros(len(methods), dtype=bool)
    if on.any():
        front[on] = pareto_front(xs[on], ys[on], maximise=(x != "std", y != "std"))
    for i, m in enumerate(methods):
        err = lambda k, v: [[max(0.0, v - wide[k].loc[m, "low"])], [max(0.0, wide[k].loc[m, "high"] - v)]] \
            if np.isfinite(wide[k].loc[m, "low"]) else None
        style = series_style(i)
        ax.errorbar(xs[i], ys[i], xerr=err(x, xs[i]), yerr=err(y, ys[i]), color=style["color"],
                    marker="osD"[min(i // 10, 2)], capsize=3, linestyle="none", label=m,
                    markerfacecolor=style["color"] if on[i] else "none")
        if front[i]:      # only the front is named on the axes (names of clustered points would overlap): the legend has all
            ax.annotate(m, (xs[i], ys[i]), textcoords="offset points", xytext=(4, 3), fontsize=8, fontweight="bold")
    order = np.argsort(xs[front])
    ax.plot(xs[front][order], ys[front][order], color="0.3", linestyle="--", linewidth=1, zorder=0,
            label="Pareto front")
    ax.set_xlabel(xlabel or x)
    ax.set_ylabel(ylabel or y)
    return ax


def accuracy_distribution(final_acc: dict[str, np.ndarray], ax=None):
    """Distribution of the clients' final test accuracies, one violin + strip per method, in %.
    ``final_acc``: {method: accuracies as fractions}, as ``History.final_acc()`` gives them."""
    import pandas as pd
    import seaborn as sns
    ax = ax or plt.gca()
    largest = max((np.nanmax(np.abs(v)) for v in map(np.asarray, final_acc.values()) if v.size), default=0.0)
    if largest > 1:
        raise ValueError(f"accuracy_distribution takes accuracies as fractions in [0, 1] (History.final_acc()) "
                         f"and shows them in %; got values up to {largest:g}")
    df = pd.concat([pd.DataFrame({"method": k, "accuracy": 100 * np.asarray(v, dtype=np.float64).ravel()})
                    for k, v in final_acc.items()])
    sns.violinplot(df, x="method", y="accuracy", ax=ax, inner=None, cut=0, color="0.85")
    # The strip's horizontal jitter is drawn from numpy's global generator: drawn from a fixed seed
    # (and the caller's generator left as it was), the same results give the same figure, byte for byte.
    state = np.random.get_state()
    np.random.seed(0)
    try:
        sns.stripplot(df, x="method", y="accuracy", ax=ax, size=3, alpha=0.6, hue="method", legend=False)
    finally:
        np.random.set_state(state)
    ax.set_ylabel("client test accuracy (%)")
    return ax


def seed_band(ax, ys: np.ndarray, label: str, **kw):
    """Mean over seeds (rows of ``ys``, one column per round) with a band from the lowest to the
    highest seed (positive, so it works on a log scale); returns the line."""
    x = np.arange(ys.shape[1])
    line, = ax.plot(x, ys.mean(0), label=label, **kw)
    if len(ys) > 1:
        ax.fill_between(x, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.15, linewidth=0)
    return line


def task_curves(curves: dict[str, np.ndarray], axes: Sequence, tasks: Sequence[str] = ("L", "R"),
                threshold: float | None = None, title: str = "", ylabel: str = "training loss"):
    """One panel per task: each curve's mean over seeds with a min–max band, log scale.
    ``curves``: {label: (seeds, points, tasks)}; ``threshold`` is drawn dotted."""
    for t, (ax, task) in enumerate(zip(axes, tasks)):
        for label, values in curves.items():
            seed_band(ax, np.asarray(values)[:, :, t], label)
        if threshold is not None:
            ax.axhline(threshold, color="0.4", linestyle=":", linewidth=1)
        ax.set_yscale("log")
        ax.set_title(f"{title}task {task}" if title else f"task {task}")
        ax.set_xlabel("communication round")
        round_axis(ax)
        ax.legend()
    axes[0].set_ylabel(ylabel)
    return axes


def fmol_local_steps(losses: Callable[[bool, int], np.ndarray], ks: Sequence[int], threshold: float,
                     tasks: Sequence[str] = ("L", "R")) -> matplotlib.figure.Figure:
    """FMOL Fig. 1(b): training loss against rounds for each K, iid (top) and non-iid (bottom),
    one column per task, with Table 2's threshold dotted. ``losses(iid, K)`` gives the
    (seeds, rounds + 1, tasks) losses of one setting."""
    fig, axes = plt.subplots(2, len(tasks), figsize=(13, 8), layout="constrained", sharey=True, squeeze=False)
    for row, iid in enumerate((True, False)):
        task_curves({f"K = {k}": losses(iid, k) for k in ks}, axes[row], tasks, threshold,
                    title=f"{'iid' if iid else 'non-iid'}, ")
    return fig


def final_by_k(finals: dict[str, np.ndarray], ks: Sequence[int], axes: Sequence, tasks: Sequence[str] = ("L", "R"),
               hollow: Sequence[str] = (), ylabel: str = "training loss after the last round"):
    """FMOL Fig. 2(a): for each method, its final value per K (mean ± std over seeds), one panel
    per task, log scale. ``finals``: {label: (Ks, seeds, tasks)}; labels in ``hollow`` get hollow
    markers (the centralised methods)."""
    for t, (ax, task) in enumerate(zip(axes, tasks)):
        for j, (label, values) in enumerate(finals.items()):
            v = np.asarray(values)[:, :, t]
            ax.errorbar(np.arange(len(ks)) + (j - (len(finals) - 1) / 2) * 0.08, v.mean(1), yerr=v.std(1),
                        marker="os"[j // 2 % 2], linestyle="none", capsize=3, markersize=8,
                        markerfacecolor="white" if label in hollow else None, label=label)
        ax.set_xticks(np.arange(len(ks)), [f"K = {k}" for k in ks])
        ax.set_yscale("log")
        ax.set_title(f"task {task}")
        ax.legend()
    axes[0].set_ylabel(ylabel)
    return axes


def grouped_bars(ax, categories: Sequence[str], groups: dict[str, tuple[Sequence[float], Sequence[float]]],
                 paper: dict[str, Sequence[float]] | None = None, colors: Sequence[str] | None = None,
                 width: float = 0.8):
    """Bars of means with ± std error bars: one bar per group within each category (``groups``:
    {group: (means, stds)}, each over ``categories``), and the paper's values as black dashes over
    the bars of the same group when given."""
    x = np.arange(len(categories))
    n = len(groups)
    w = width / max(n, 1)
    for j, (name, (means, stds)) in enumerate(groups.items()):
        offset = (j - (n - 1) / 2) * w
        kw = {"color": colors} if colors is not None and n == 1 else {}
        ax.bar(x + offset, np.asarray(means, float), w, yerr=np.nan_to_num(np.asarray(stds, float)), capsize=3,
               label=None if n == 1 else name, **kw)
        if paper and name in paper:
            ax.scatter(x + offset, paper[name], color="black", marker="_", s=120, zorder=3,
                       label="paper" if j == 0 else None)
    ax.set_xticks(x, categories)
    return ax


def client_curves(histories: Sequence[History], names: Sequence[str], ax=None):
    """Each client's test accuracy (%) against rounds, mean ± std over the runs (seeds)."""
    ax = ax or plt.gca()
    rounds = np.asarray(histories[0].eval_rounds)
    acc = 100 * np.stack([h.acc() for h in histories])          # (run, eval, client)
    for k, name in enumerate(names):
        mu, sd = acc[:, :, k].mean(0), acc[:, :, k].std(0)
        line, = ax.plot(rounds, mu, label=name)
        ax.fill_between(rounds, mu - sd, mu + sd, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("round")
    round_axis(ax)
    return ax


def improved_share(runs: dict[str, Sequence[History]], ax=None, window: int = 1):
    """Share of improved participants per round (%, DQN-Fed eq. 29), mean over runs, as a moving
    average over ``window`` rounds."""
    ax = ax or plt.gca()
    for i, (m, hs) in enumerate(runs.items()):
        share = 100 * np.stack([np.asarray(h.round_improved, float) for h in hs]).mean(0)
        smooth = np.convolve(share, np.ones(window) / window, mode="valid")
        ax.plot(np.arange(len(smooth)) + window, smooth, label=m, **series_style(i))
    ax.set_xlabel("round")
    round_axis(ax)
    ax.set_ylabel("improved participants (%)")
    ax.legend()
    return ax


def convergence(runs: dict[str, Sequence[History]], title: str) -> matplotlib.figure.Figure:
    """Average client test accuracy (mean ± std over seeds) and the share of improved
    participants per round (DQN-Fed Fig. 1 and 3)."""
    columns = min(len(runs), 5)
    fig, axes = plt.subplots(1, 2, figsize=(15, 4.8 + 0.3 * -(-len(runs) // columns)), layout="constrained")
    curves(runs, "mean_acc", ax=axes[0])
    axes[0].set_title("average client test accuracy")
    rounds = max(h.rounds_done for hs in runs.values() for h in hs)
    window = max(1, rounds // 30)
    improved_share(runs, axes[1], window)
    axes[1].set_title(f"participants whose loss did not rise (eq. 29, Fig. 3), {window}-round moving average")
    # one legend for both panels, below them: inside, a dozen entries hide the curves
    for ax in axes:
        ax.get_legend().remove()
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=columns)
    fig.suptitle(title)
    return fig


def step_lengths(runs: dict[str, History], ax=None):
    """The length of the server step ‖θᵗ⁺¹ − θᵗ‖ = ηₜ·‖d‖ per round (from a rule that logs
    ``step_norm2``), with × on the rounds in which some participant got worse."""
    ax = ax or plt.gca()
    for (label, h), style in zip(runs.items(), ("-", "--", ":", "-.")):
        length = np.sqrt(np.asarray(h.info["step_norm2"])) * np.asarray(h.round_lr)
        ax.semilogy(np.arange(1, len(length) + 1), length, style, label=label)
        worse = np.flatnonzero(np.asarray(h.round_improved) < 1)
        ax.plot(worse + 1, length[worse], "x", color="C3", ms=4)
    ax.set_xlabel("round")
    round_axis(ax)
    ax.set_ylabel("length of the server step ‖θᵗ⁺¹ − θᵗ‖")
    ax.legend()
    return ax


# ----------------------------------------------------------------------------- the benchmark (notebook 06)
# Drawn for print: two-column width (6.9 in), text of 7 pt and more; one colour and one marker per
# method in every panel (method_styles); an axis shows only what its metric can take.

PRINT_WIDE = 6.9          # inches: a two-column figure
PRINT_TEXT = 7            # points: the smallest text of a printed figure
_CRITERION_MARKS = {"mean": ("o", "chosen on mean"), "worst10": ("^", "chosen on worst 10 %"),
                    "mean-std": ("s", "chosen on mean − σ")}
_METRIC_NAMES = {"mean": "mean", "std": "σ over clients", "worst10": "worst 10 %", "best10": "best 10 %"}


def method_styles(methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """One (colour, marker) per method, the same in every panel of a figure and across figures:
    the colour-blind palette's ten colours with circles, then the same colours with squares,
    triangles, diamonds, so that no two of up to 40 methods share both. Give the methods in the
    same order everywhere (the notebook's declared list)."""
    import seaborn as sns
    palette = sns.color_palette("colorblind", 10)
    return {m: {"color": palette[i % 10], "marker": "os^D"[min(i // 10, 3)]} for i, m in enumerate(methods)}


def _print_text(ax) -> None:
    ax.tick_params(labelsize=PRINT_TEXT)
    ax.xaxis.label.set_size(PRINT_TEXT + 0.5)
    ax.yaxis.label.set_size(PRINT_TEXT + 0.5)
    ax.title.set_size(PRINT_TEXT + 0.5)


def _inside(lo: float, hi: float, limits: tuple[float, float], pad: float = 0.06) -> tuple[float, float]:
    """[lo, hi] widened by ``pad`` of its width and cut to the metric's ``limits``."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return limits
    width = max(hi - lo, 1e-6)
    return max(limits[0], lo - pad * width), min(limits[1], hi + pad * width)


def forest_plot(table, seeds, reference: str, methods: Sequence[str], styles: Mapping[str, Mapping[str, Any]],
                metrics: Sequence[str] = ("mean", "std", "worst10"), axes=None, fdr: float = 0.05):
    """Seed-paired differences from ``reference``, one panel per metric and one row per method
    (a :func:`fairfl.protocol.summary` ``table`` of one federation, track and criterion): the
    mean difference with its interval, each seed's own difference as a small dot (``seeds``:
    {method: {metric: the per-seed differences}}), filled where the Benjamini–Hochberg q-value
    is ≤ ``fdr`` and hollow otherwise. The x-axis stays inside the range a difference of the
    metric can take."""
    from .protocol import LOWER_IS_BETTER, difference_range
    shown = [m for m in methods if m != reference and m in set(table.method)]
    if axes is None:
        _, axes = plt.subplots(1, len(metrics), sharey=True, figsize=(PRINT_WIDE, 0.22 * len(shown) + 1.0),
                               layout="constrained")
    axes = np.atleast_1d(axes)
    y = {m: len(shown) - 1 - i for i, m in enumerate(shown)}
    for ax, metric in zip(axes, metrics):
        rows = table[table.metric == metric].set_index("method")
        lo_all, hi_all = [0.0], [0.0]
        for m in shown:
            if m not in rows.index or not np.isfinite(rows.loc[m, "difference"]):
                continue
            r, style = rows.loc[m], styles[m]
            found = bool(np.isfinite(r["q"]) and r["q"] <= fdr)
            dots = np.asarray(seeds.get(m, {}).get(metric, []), dtype=np.float64)
            if dots.size:
                ax.scatter(dots, np.full(dots.size, y[m]) + 0.22, s=4, color=style["color"], alpha=0.5, linewidths=0)
                lo_all.append(float(dots.min()))
                hi_all.append(float(dots.max()))
            low, high = r["difference_low"], r["difference_high"]
            ax.plot([low, high], [y[m], y[m]], color=style["color"], linewidth=1.2)
            ax.plot(r["difference"], y[m], linestyle="none", marker=style["marker"], markersize=4.5,
                    color=style["color"], markerfacecolor=style["color"] if found else "white")
            lo_all += [low]
            hi_all += [high]
        ax.axvline(0, color="0.15", linewidth=0.9, zorder=1)
        ax.set_xlim(*_inside(min(lo_all), max(hi_all), difference_range(metric)))
        better = "lower is better" if metric in LOWER_IS_BETTER else "higher is better"
        ax.set_title(f"{_METRIC_NAMES.get(metric, metric)} ({better})")
        ax.set_xlabel(f"difference from {reference} (points)")
        ax.grid(axis="y", visible=False)
        _print_text(ax)
    axes[0].set_yticks([y[m] for m in shown], shown)
    axes[0].set_ylim(-0.7, len(shown) - 0.3)
    key = [matplotlib.lines.Line2D([], [], color="0.3", marker="o", linestyle="-", markersize=4.5, label=text,
                                   markerfacecolor=face) for face, text in
           (("0.3", f"resolved (Benjamini–Hochberg q ≤ {fdr:g})"), ("white", "not resolved"))]
    key.append(matplotlib.lines.Line2D([], [], color="0.3", marker="o", linestyle="none", markersize=2, alpha=0.5,
                                       label="one seed"))
    axes[0].figure.legend(handles=key, loc="outside lower center", ncols=3, fontsize=PRINT_TEXT, frameon=False)
    return axes


def tradeoff_paths(grid, methods: Sequence[str], styles: Mapping[str, Mapping[str, Any]], columns: int = 5,
                   title: str = "", x: str = "mean", y: str = "std"):
    """Each method's whole tuning grid in the accuracy–fairness plane, one small panel per method
    (shared axes): ``grid`` has one row per (method, configuration) with the columns ``method``,
    ``order`` (the path's order), ``x`` and ``y`` (validation scores in %, the choice's view) and
    ``chosen`` (the criteria that chose it, a set); the configurations joined in order, and each
    criterion's choice ringed with its own marker. Axes inside [0, 100] (σ: [0, 50])."""
    from .protocol import METRIC_RANGE
    shown = [m for m in methods if m in set(grid["method"])]
    rows = -(-len(shown) // columns)
    fig, axes = plt.subplots(rows, columns, sharex=True, sharey=True, squeeze=False, layout="constrained",
                             figsize=(PRINT_WIDE, 1.25 * rows + 0.7))
    finite = grid[np.isfinite(grid[x]) & np.isfinite(grid[y])]
    xlim = _inside(finite[x].min(), finite[x].max(), METRIC_RANGE[x]) if len(finite) else METRIC_RANGE[x]
    ylim = _inside(finite[y].min(), finite[y].max(), METRIC_RANGE[y]) if len(finite) else METRIC_RANGE[y]
    for ax, m in zip(axes.flat, shown):
        g = grid[grid.method == m].sort_values("order")
        style = styles[m]
        ax.plot(g[x], g[y], color=style["color"], linewidth=0.8, marker=style["marker"], markersize=3)
        for criterion, (marker, _) in _CRITERION_MARKS.items():
            hit = g[[criterion in c for c in g["chosen"]]]
            ax.plot(hit[x], hit[y], linestyle="none", marker=marker, markersize=8, markerfacecolor="none",
                    markeredgecolor="0.15", markeredgewidth=0.8)
        ax.set_title("\n".join(textwrap.wrap(m, 18)), pad=2)       # a long name in two lines, within its panel
        _print_text(ax)
    for ax in axes.flat[len(shown):]:
        ax.set_axis_off()
    axes[0, 0].set_xlim(*xlim)
    axes[0, 0].set_ylim(*ylim)
    for ax in axes[-1]:
        ax.set_xlabel(f"{_METRIC_NAMES.get(x, x)} (%)")
    for ax in axes[:, 0]:
        ax.set_ylabel(f"{_METRIC_NAMES.get(y, y)} (%)")
    handles = [matplotlib.lines.Line2D([], [], linestyle="none", marker=mk, markersize=7, markerfacecolor="none",
                                       markeredgecolor="0.15", label=text) for mk, text in _CRITERION_MARKS.values()]
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=PRINT_TEXT, frameon=False)
    if title:
        fig.suptitle(title, fontsize=PRINT_TEXT + 1)
    return fig


def effect_heatmap(table, federations: Sequence[str], methods: Sequence[str],
                   metrics: Sequence[str] = ("mean", "std", "worst10"), references: Mapping[str, str] | None = None,
                   fdr: float = 0.05, labels: Mapping[str, str] | None = None):
    """One heat map of effect sizes over methods × metrics × federations: each cell the seed-paired
    difference from the method's track reference (a :func:`fairfl.protocol.summary` table), its
    sign turned so that blue is better for every metric (σ: lower), written in the cell with a
    star where its Benjamini–Hochberg q-value is ≤ ``fdr``; a cell without a comparison (the
    reference itself, a federation that cannot speak for the track) is blank. The colour scale is
    symmetric and capped at the 95th percentile of the effects, so that one exploding method does
    not wash the others out. ``labels`` renames rows (say which reference a personalised method
    is compared with)."""
    from .protocol import LOWER_IS_BETTER
    references, labels = dict(references or {}), dict(labels or {})
    rows = [m for m in methods if m in set(table.method) and m not in references.values()]
    cols = [(f, k) for f in federations for k in metrics]
    value = np.full((len(rows), len(cols)), np.nan)
    star = np.zeros_like(value, dtype=bool)
    for i, m in enumerate(rows):
        for j, (f, k) in enumerate(cols):
            hit = table[(table.method == m) & (table.federation == f) & (table.metric == k)]
            if len(hit) and "difference" in hit and np.isfinite(hit["difference"].iloc[0]):
                sign = -1.0 if k in LOWER_IS_BETTER else 1.0
                value[i, j] = sign * hit["difference"].iloc[0]
                star[i, j] = bool(hit["q"].iloc[0] <= fdr)
    finite = np.abs(value[np.isfinite(value)])
    cap = float(np.percentile(finite, 95)) if finite.size else 1.0
    cap = max(cap, 1.0)
    fig, ax = plt.subplots(figsize=(PRINT_WIDE, 0.2 * len(rows) + 1.6), layout="constrained")
    image = ax.imshow(np.clip(value, -cap, cap), cmap="RdBu", vmin=-cap, vmax=cap, aspect="auto")
    for i in range(len(rows)):
        for j in range(len(cols)):
            if np.isfinite(value[i, j]):
                v = value[i, j]
                text = (f"{v:+.0f}" if abs(v) >= 10 else f"{v:+.1f}") + ("*" if star[i, j] else "")
                ax.text(j, i, text, ha="center", va="center", fontsize=PRINT_TEXT,
                        color="white" if abs(v) > 0.6 * cap else "0.1")
    short = {"std": "σ", "worst10": "worst 10 %", "best10": "best 10 %"}
    ax.set_xticks(range(len(cols)), [short.get(k, k) for _, k in cols], rotation=90)
    ax.set_yticks(range(len(rows)), [labels.get(m, m) for m in rows])
    for j in range(len(metrics), len(cols), len(metrics)):
        ax.axvline(j - 0.5, color="white", linewidth=2)
    top = ax.secondary_xaxis("top")
    top.set_xticks([j * len(metrics) + (len(metrics) - 1) / 2 for j in range(len(federations))], list(federations))
    top.tick_params(length=0, labelsize=PRINT_TEXT)
    ax.grid(False)
    _print_text(ax)
    bar = fig.colorbar(image, ax=ax, shrink=0.8, pad=0.01)
    bar.set_label("better than the reference (points; σ sign turned)", fontsize=PRINT_TEXT)
    bar.ax.tick_params(labelsize=PRINT_TEXT)
    return fig
