"""Figures of numbers a notebook has already taken out of its runs (arrays and {label: values},
not Histories): the clients' label counts of partitions, a final value against a factor's values,
the distribution of the clients' final accuracies, FMOL's per-task curves and final values per K,
and bars (grouped, and small multiples of them)."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from fairfl.base.errors import ConfigError
from .style import (INLINE_DPI, bar_axis, figure, figure_legend, markevery, method_styles, ordinal_styles,
                    panel_title, percent_axis, plain_log_ticks, round_axis, style_of, suptitle)


# ----------------------------------------------------------------------------- partitions

def partition_heatmap(counts: np.ndarray, ax=None, title: str = "", class_names: Sequence[str] = (),
                      max_clients: int = 50, colorbar: bool = True):
    """Clients × labels heatmap of sample counts (the first ``max_clients`` clients)."""
    import seaborn as sns
    ax = ax or plt.gca()
    shown = counts[:max_clients]
    sns.heatmap(shown, ax=ax, cmap="viridis", cbar=colorbar, cbar_kws={"label": "samples", "pad": 0.02},
                xticklabels=list(class_names) or "auto", yticklabels=max(1, len(shown) // 10))
    ax.set_xlabel("label")
    ax.set_ylabel("client")
    ax.set_title(title)
    return ax


def partitions(counts: dict[str, np.ndarray], class_names: Sequence[str] = (), title: str = "",
               max_clients: int = 30, columns: int = 2) -> matplotlib.figure.Figure:
    """One :func:`partition_heatmap` per partition (``counts``: {title: clients × labels}), in a
    grid of ``columns`` panels a row, two columns wide."""
    rows = -(-len(counts) // columns)
    fig, axes = figure(rows, columns, height=2.45 * rows + 0.35, squeeze=False)
    fig.set_dpi(INLINE_DPI)
    for ax, (name, c) in zip(axes.flat, counts.items()):
        partition_heatmap(c, ax=ax, title=name, class_names=class_names, max_clients=max_clients)
        ax.tick_params(axis="x", labelrotation=90)
        ax.tick_params(axis="y", labelrotation=0)
    for ax in axes.flat[len(counts):]:
        ax.set_axis_off()
    if title:
        suptitle(fig, title)
    return fig


# ----------------------------------------------------------------------------- final values and per-task curves

def final_vs(series: dict[str, dict[Any, Sequence[float]]], ax=None, xlabel: str = "", ylabel: str = "",
             fmt: Callable[[Any], str] = "{:g}".format, styles: Mapping[str, Mapping[str, str]] | None = None):
    """A final value against a factor's values, one line per series: the mean over seeds with
    ± std error bars (ddof 0). ``series``: {label: {factor value: the seeds' values}}. The factor's
    values sit evenly spaced, labelled with ``fmt`` (ε = 0, 0.01, 0.05, 0.1, 0.5, 1 would crowd the
    left end of a linear axis), so that their order is what the eye reads. A label ending in "(%)"
    keeps the axis within [0, 100]."""
    ax = ax or plt.gca()
    styles = styles if styles is not None else method_styles(list(series))
    xs = list(dict.fromkeys(x for by_x in series.values() for x in by_x))
    for label, by_x in series.items():
        pos = [xs.index(x) for x in by_x]
        v = [np.asarray(by_x[x], dtype=np.float64) for x in by_x]
        ax.errorbar(pos, [a.mean() for a in v], yerr=[a.std() for a in v], label=label, **style_of(styles, label))
    ax.set_xticks(range(len(xs)), [fmt(x) for x in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ylabel.endswith("(%)"):
        percent_axis(ax)
    return ax


def accuracy_distribution(final_acc: dict[str, np.ndarray], ax=None,
                          styles: Mapping[str, Mapping[str, str]] | None = None):
    """Distribution of the clients' final test accuracies, one violin + strip per method, in %
    (the axis within [0, 100]), the strip in each method's colour. ``final_acc``: {method:
    accuracies as fractions}, as ``History.final_acc()`` gives them."""
    import pandas as pd
    import seaborn as sns
    ax = ax or plt.gca()
    largest = max((np.nanmax(np.abs(v)) for v in map(np.asarray, final_acc.values()) if v.size), default=0.0)
    if largest > 1:
        raise ConfigError(f"accuracy_distribution takes accuracies as fractions in [0, 1] (History.final_acc()) "
                          f"and shows them in %; got values up to {largest:g}")
    styles = styles if styles is not None else method_styles(list(final_acc))
    df = pd.concat([pd.DataFrame({"method": k, "accuracy": 100 * np.asarray(v, dtype=np.float64).ravel()})
                    for k, v in final_acc.items()])
    sns.violinplot(df, x="method", y="accuracy", ax=ax, inner=None, cut=0, color="0.88", linewidth=0.6)
    # The strip's horizontal jitter is drawn from numpy's global generator: drawn from a fixed seed
    # (and the caller's generator left as it was), the same results give the same figure, byte for byte.
    state = np.random.get_state()
    np.random.seed(0)
    try:
        sns.stripplot(df, x="method", y="accuracy", ax=ax, size=2, alpha=0.7, hue="method", legend=False,
                      palette={m: style_of(styles, m)["color"] for m in final_acc})
    finally:
        np.random.set_state(state)
    ax.set_xlabel("")
    ax.set_ylabel("client test accuracy (%)")
    percent_axis(ax)
    return ax


def seed_band(ax, ys: np.ndarray, label: str, **kw):
    """Mean over seeds (rows of ``ys``, one column per round) with a band from the lowest to the
    highest seed (positive, so it works on a log scale); returns the line. ``kw`` (a style from
    ``method_styles`` or ``ordinal_styles``) goes to the line."""
    x = np.arange(ys.shape[1])
    if "marker" in kw:
        kw.setdefault("markevery", markevery(len(x)))
    line, = ax.plot(x, ys.mean(0), label=label, **kw)
    if len(ys) > 1:
        ax.fill_between(x, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.15, linewidth=0)
    return line


def task_curves(curves: dict[str, np.ndarray], axes: Sequence, tasks: Sequence[str] = ("L", "R"),
                threshold: float | None = None, title: str = "", ylabel: str = "training loss",
                styles: Mapping[str, Mapping[str, str]] | None = None):
    """One panel per task: each curve's mean over seeds with a min–max band, log scale.
    ``curves``: {label: (seeds, points, tasks)}; ``threshold`` is drawn dotted. No legend: the
    figure's (``figure_legend``) names the curves and the threshold."""
    styles = styles if styles is not None else method_styles(list(curves))
    for t, (ax, task) in enumerate(zip(axes, tasks)):
        for label, values in curves.items():
            seed_band(ax, np.asarray(values)[:, :, t], label, **style_of(styles, label))
        if threshold is not None:
            ax.axhline(threshold, color="0.3", linestyle=":", linewidth=1, label=f"loss {threshold:g}")
        ax.set_yscale("log")
        plain_log_ticks(ax)
        ax.set_title(f"{title}task {task}" if title else f"task {task}")
        ax.set_xlabel("communication round")
        round_axis(ax)
    axes[0].set_ylabel(ylabel)
    return axes


def fmol_local_steps(losses: Callable[[bool, int], np.ndarray], ks: Sequence[int], threshold: float,
                     tasks: Sequence[str] = ("L", "R")) -> matplotlib.figure.Figure:
    """FMOL Fig. 1(b): training loss against rounds for each K, iid (top) and non-iid (bottom),
    one column per task, with Table 2's threshold dotted; K in a sequential palette. ``losses(iid,
    K)`` gives the (seeds, rounds + 1, tasks) losses of one setting."""
    fig, axes = figure(2, len(tasks), height=4.3, sharex=True, sharey=True, squeeze=False)
    styles = ordinal_styles(ks, label="K = {}".format)
    for row, iid in enumerate((True, False)):
        task_curves({f"K = {k}": losses(iid, k) for k in ks}, axes[row], tasks, threshold,
                    title=f"{'iid' if iid else 'non-iid'}, ", styles=styles)
    for ax in axes[0]:
        ax.set_xlabel("")
    figure_legend(fig)
    return fig


def final_by_k(finals: dict[str, np.ndarray], ks: Sequence[int], axes: Sequence, tasks: Sequence[str] = ("L", "R"),
               hollow: Sequence[str] = (), ylabel: str = "training loss after the last round",
               styles: Mapping[str, Mapping[str, str]] | None = None):
    """FMOL Fig. 2(a): for each method, its final value per K (mean ± std over seeds), one panel
    per task, log scale. ``finals``: {label: (Ks, seeds, tasks)}; labels in ``hollow`` get hollow
    markers (the centralised methods). No legend: the figure's names the methods."""
    styles = styles if styles is not None else method_styles(list(finals))
    for t, (ax, task) in enumerate(zip(axes, tasks)):
        for j, (label, values) in enumerate(finals.items()):
            v = np.asarray(values)[:, :, t]
            style = style_of(styles, label)
            ax.errorbar(np.arange(len(ks)) + (j - (len(finals) - 1) / 2) * 0.1, v.mean(1), yerr=v.std(1),
                        linestyle="none", markersize=4.5, label=label,
                        markerfacecolor="white" if label in hollow else style["color"], **style)
        ax.set_xticks(np.arange(len(ks)), [f"K = {k}" for k in ks])
        ax.set_yscale("log")
        plain_log_ticks(ax)
        ax.set_title(f"task {task}")
    axes[0].set_ylabel(ylabel)
    return axes


# ----------------------------------------------------------------------------- bars

def grouped_bars(ax, categories: Sequence[str], groups: dict[str, tuple[Sequence[float], Sequence[float]]],
                 paper: dict[str, Sequence[float]] | None = None,
                 colors: Sequence[str] | Mapping[str, str] | None = None, width: float = 0.8,
                 percent: bool = False, horizontal: bool = False):
    """Bars of means with ± std error bars from 0: one bar per group within each category
    (``groups``: {group: (means, stds)}, each over ``categories``), and the paper's values as black
    dashes across the bars of the same group when given. ``colors``: {group: colour}, or one colour
    per category when there is one group. With ``percent`` the axis runs from 0 to 100 and the
    error bars stop at its ends (an accuracy of 99 ± 2 % does not reach 101). ``horizontal``: the
    categories down the y-axis, the first on top (long names read without turning the head)."""
    x = np.arange(len(categories))
    n = len(groups)
    w = width / max(n, 1)
    for j, (name, (means, stds)) in enumerate(groups.items()):
        offset = (j - (n - 1) / 2) * w
        means = np.asarray(means, dtype=np.float64)
        stds = np.nan_to_num(np.asarray(stds, dtype=np.float64))
        low, high = means - stds, means + stds
        if percent:
            low, high = np.clip(low, 0, 100), np.clip(high, 0, 100)
        kw = {}
        if isinstance(colors, Mapping):
            kw["color"] = colors[name]
        elif colors is not None and n == 1:
            kw["color"] = list(colors)
        err = np.stack([means - low, high - means])
        error_kw = {"elinewidth": 0.8, "capsize": 1.5}
        if horizontal:
            ax.barh(x + offset, means, w, xerr=err, label=None if n == 1 else name, error_kw=error_kw, **kw)
        else:
            ax.bar(x + offset, means, w, yerr=err, label=None if n == 1 else name, error_kw=error_kw, **kw)
        if paper and name in paper:
            at = (np.asarray(paper[name], dtype=np.float64), x + offset) if horizontal else \
                (x + offset, np.asarray(paper[name], dtype=np.float64))
            ax.scatter(*at, color="black", marker="|" if horizontal else "_", s=max(20.0, 300 * w ** 2), zorder=3,
                       linewidths=1.2, label="paper" if j == 0 else None)
    if horizontal:
        ax.set_yticks(x, categories)
        ax.set_ylim(len(categories) - 0.5, -0.5)
        ax.grid(False, axis="y")
    else:
        ax.set_xticks(x, categories)
        ax.grid(False, axis="x")
    bar_axis(ax, percent=percent, axis="x" if horizontal else "y")
    return ax


def bar_panels(values: dict[str, dict[str, tuple[float, float]]], colors: Callable[[str, str], str],
               ylabel: str, xlabel: str = "", percent: bool = True, lines: Mapping[str, tuple[float, dict]] = (),
               patches: Mapping[str, str] = (), columns: int = 4, height: float | None = None
               ) -> matplotlib.figure.Figure:
    """Small multiples of bars, two columns wide: one panel per entry of ``values`` ({panel:
    {bar label: (mean, std)}}), bars from 0 (to 100 with ``percent``, error bars stopping there),
    each bar coloured ``colors(panel, bar label)``; ``lines`` ({label: (value, line style)})
    are drawn across every panel (baselines); one legend below, of ``patches`` ({label: colour})
    and the lines."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    rows = -(-len(values) // columns)
    columns = -(-len(values) // rows)
    fig, axes = figure(rows, columns, height=height or 1.9 * rows + 0.9, sharey=True, squeeze=False)
    for ax, (panel, bars) in zip(axes.flat, values.items()):
        labels = list(bars)
        means = [bars[b][0] for b in labels]
        stds = [bars[b][1] for b in labels]
        grouped_bars(ax, labels, {panel: (means, stds)}, colors=[colors(panel, b) for b in labels], percent=percent)
        for value, style in (dict(lines) or {}).values():
            ax.axhline(value, **{"color": "0.2", "linewidth": 0.9, **style})
        panel_title(ax, panel)
        ax.set_xlabel(xlabel)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    for ax in axes.flat[len(values):]:
        ax.set_axis_off()
    handles = [Patch(color=c, label=lab) for lab, c in (dict(patches) or {}).items()]
    handles += [Line2D([], [], **{"color": "0.2", "linewidth": 0.9, **style}, label=lab)
                for lab, (_, style) in (dict(lines) or {}).items()]
    figure_legend(fig, handles=handles)
    return fig
