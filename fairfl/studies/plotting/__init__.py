"""Figures drawn for print, one style for every notebook, and ``save_figure``.

A figure is made at the size it will have in a paper (CONVENTIONS "Figures"): one column
(``ONE_COLUMN``, 3.3 in) or two (``TWO_COLUMNS``, 6.9 in) wide, no text under 7 pt at that size.
The screen gets the same figure at a higher dpi: ``INLINE_DPI`` in a notebook (a two-column figure
is then as wide as JupyterLab's notebook column, about 900 px, and shown unscaled) and ``SAVE_DPI``
in the PNG. The pieces any notebook or script uses to draw a figure of its own in this style:

    use_style()                             text sizes, grid, palette (a notebook's ``start`` calls it)
    fig, axes = figure(2, 3, height=4.4)    a print-sized figure with constrained layout; the other
                                            keywords are plt.subplots' (sharex, sharey, squeeze, ...)
    STYLES = method_styles(["FedAvg", "q-FFL", ...], reference="FedAvg")
                                            one colour + marker per method (Okabe & Ito's colour-blind-
                                            safe palette, the reference in black), made once and passed
                                            to every figure of a notebook (``styles=STYLES``); more
                                            methods than colours raise: draw small multiples instead
                                            (``method_panels``, as ``convergence`` does)
    ordinal_styles([0, 0.01, 0.1, 1], label="ε = {:g}".format)
                                            a sequential palette keyed to an ordered factor (ε, K, b)
    figure_legend(fig)                      one legend for the figure, below its panels (outside the
                                            data), the panels' own legends removed
    suptitle(fig, text)                     the figure's title, wrapped to its width
    percent_axis(ax), bar_axis(ax)          accuracy in %, within [0, 100]; bars from 0
    round_axis(ax), plain_log_ticks(ax)     whole-number rounds; decimals on a log axis
    human("fashion_mnist")                  "Fashion-MNIST": names for titles, not ids
    save_figure(fig, name)                  PNG (SAVE_DPI) + PDF, atomically; the PNG records this style
                                            and what ``fairfl.base.figure_checks.problems`` found (the contact
                                            sheet, scripts/contact_sheet.py, shows both)

``fairfl.base.figure_checks.problems(fig)`` lists what a figure breaks: not a column's width, text under
7 pt, labels over each other or cut off, a legend over a panel, bars not from 0, % outside [0, 100].

The figures, by module: the style and ``save_figure`` above (:mod:`fairfl.studies.plotting.style`); here,
the figures of runs (their Histories) against rounds — curves with bands over seeds, differences
from a reference, each client's accuracy, the improved share, small multiples and heat maps of
many methods (``convergence``), the server's step lengths; figures of numbers already taken out
of the runs — partitions, finals against a factor, accuracy distributions, FMOL's task curves,
bars (:mod:`fairfl.studies.plotting.summaries`); the benchmark's forest plot, trade-off paths and effect
heat map (:mod:`fairfl.studies.plotting.benchmark`). Every name is importable from ``fairfl.studies.plotting``.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from fairfl.base.errors import ConfigError
from fairfl.base.figure_checks import MIN_TEXT_PT, ONE_COLUMN, TWO_COLUMNS  # noqa: F401
from fairfl.runs.history import History
from .benchmark import effect_heatmap, forest_plot, tradeoff_paths  # noqa: F401
from .style import (INLINE_DPI, MARKERS, NAMES, NON_VERDICT_MARKERS, PALETTE, REFERENCE, SAVE_DPI, STYLE, TEXT_RC,  # noqa: F401
                    PlainLogFormatter, bar_axis, figure, figure_legend, figure_stamp, human, markevery,
                    method_styles, ordinal_styles, panel_title, percent_axis, plain_log_ticks, round_axis,
                    save_figure, style_of, suptitle, use_style)
from .summaries import (accuracy_distribution, bar_panels, final_by_k, final_vs, fmol_local_steps,  # noqa: F401
                        grouped_bars, partition_heatmap, partitions, seed_band, task_curves)

__all__ = ["ONE_COLUMN", "TWO_COLUMNS", "MIN_TEXT_PT", "INLINE_DPI", "SAVE_DPI", "STYLE", "PALETTE", "use_style",
           "figure", "method_styles", "ordinal_styles", "figure_legend", "suptitle", "percent_axis", "bar_axis",
           "round_axis", "plain_log_ticks", "human", "save_figure"]


# ----------------------------------------------------------------------------- curves over rounds

def _metric(runs: Sequence[History], metric: str) -> np.ndarray:
    """(seeds, evaluations) of a per-evaluation metric: the mean client accuracy in %, or the
    averaged training loss."""
    if metric == "mean_acc":
        return np.stack([100 * r.mean_acc() for r in runs])
    if metric == "train_loss":
        return np.stack([np.asarray(r.train_loss, dtype=np.float64) for r in runs])
    raise ConfigError(f"metric={metric!r}: one of 'mean_acc', 'train_loss'")


LABELS = {"mean_acc": "average user test accuracy (%)", "train_loss": "averaged training loss"}


def curves(histories: dict[str, Sequence[History]], metric: str = "mean_acc", ax=None, logy: bool = False,
           band: str = "std", styles: Mapping[str, Mapping[str, str]] | None = None, legend: bool = False):
    """Mean over seeds ± a band (std or min–max) of a per-evaluation metric against rounds, one
    line per entry of ``histories`` ({label: the seeds' runs}) in ``styles``' colour and marker
    (default: ``method_styles`` of the labels). ``metric``: "mean_acc" (average user test
    accuracy, in %, its axis within [0, 100]) or "train_loss". No legend unless asked: a figure
    gets one, ``figure_legend``."""
    ax = ax or plt.gca()
    styles = styles if styles is not None else method_styles(list(histories))
    for label, runs in histories.items():
        rounds = np.asarray(runs[0].eval_rounds)
        ys = _metric(runs, metric)
        mu = ys.mean(0)
        lo, hi = ((mu - ys.std(0), mu + ys.std(0)) if band == "std" else (ys.min(0), ys.max(0)))
        if metric == "mean_acc":           # a band past 100 % would show accuracies no run can have
            lo, hi = np.clip(lo, 0, 100), np.clip(hi, 0, 100)
        line, = ax.plot(rounds, mu, label=label, markevery=markevery(len(rounds)), **style_of(styles, label))
        if len(runs) > 1:
            ax.fill_between(rounds, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("round")
    round_axis(ax)
    ax.set_ylabel(LABELS[metric])
    if logy:
        ax.set_yscale("log")
        plain_log_ticks(ax)
    if metric == "mean_acc":
        percent_axis(ax)
    if legend:
        ax.legend()
    return ax


def curve_differences(histories: dict[str, Sequence[History]], reference: str, metric: str = "train_loss", ax=None,
                      styles: Mapping[str, Mapping[str, str]] | None = None):
    """Each entry's metric minus the ``reference`` entry's, seed by seed (the i-th run of each
    entry is the same seed: ``Sweep.groups`` keeps the seeds' order), mean over seeds, against
    rounds. Curves that coincide on their own scale (notebook 01's ε) separate here; the
    reference is the line at 0."""
    ax = ax or plt.gca()
    styles = styles if styles is not None else method_styles(list(histories))
    if reference not in histories:
        raise ConfigError(f"curve_differences: the reference {reference!r} is not among {list(histories)}")
    ref = _metric(histories[reference], metric)
    for label, runs in histories.items():
        ys = _metric(runs, metric)
        if ys.shape != ref.shape:
            raise ConfigError(f"curve_differences: {label!r} has {ys.shape[0]} runs of {ys.shape[1]} evaluations, "
                              f"the reference {ref.shape[0]} of {ref.shape[1]}: differences need the same seeds")
        rounds = np.asarray(runs[0].eval_rounds)
        ax.plot(rounds, (ys - ref).mean(0), label=label, markevery=markevery(len(rounds)), **style_of(styles, label))
    ax.set_xlabel("round")
    round_axis(ax)
    ax.set_ylabel(f"{LABELS[metric].replace(' (%)', '')} − {reference}'s" + (" (points)" if metric == "mean_acc" else ""))
    return ax


def accuracy_and_loss(histories: dict[str, Sequence[History]], title: str = "",
                      styles: Mapping[str, Mapping[str, str]] | None = None) -> matplotlib.figure.Figure:
    """Three panels against rounds, mean ± std over seeds: the average user test accuracy, the
    averaged training loss, and that loss on a log scale; one legend below them."""
    fig, axes = figure(1, 3, height=2.6)
    curves(histories, "mean_acc", ax=axes[0], styles=styles)
    curves(histories, "train_loss", ax=axes[1], styles=styles)
    curves(histories, "train_loss", ax=axes[2], logy=True, styles=styles)
    axes[0].set_title("average user test accuracy")
    axes[1].set_title("training loss")
    axes[2].set_title("training loss (log scale)")
    figure_legend(fig)
    if title:
        suptitle(fig, title)
    return fig


def curves_and_differences(rows: dict[str, dict[str, Sequence[History]]], reference: str,
                           styles: Mapping[str, Mapping[str, str]], legend_title: str | None = None
                           ) -> matplotlib.figure.Figure:
    """Notebook 01's figure, two columns wide: for each row ({row name: {label: the seeds'
    runs}}, e.g. iid and non-iid), the average user accuracy (%) and the averaged training loss
    (log) against rounds, mean ± std over seeds, and that loss minus the ``reference`` entry's,
    seed by seed: where the curves lie on top of each other, the differences tell them apart. One
    legend (titled ``legend_title``) for the figure."""
    fig, axes = figure(len(rows), 3, height=1.85 * len(rows) + 0.9, sharex=True, squeeze=False)
    for r, (name, histories) in enumerate(rows.items()):
        curves(histories, "mean_acc", ax=axes[r, 0], styles=styles)
        curves(histories, "train_loss", ax=axes[r, 1], logy=True, styles=styles)
        curve_differences(histories, reference, "train_loss", ax=axes[r, 2], styles=styles)
        axes[r, 0].set_ylabel("accuracy (%)")
        axes[r, 1].set_ylabel("training loss")
        axes[r, 2].set_ylabel("loss difference")
        axes[r, 0].set_title(f"{name}: average user accuracy")
        axes[r, 1].set_title(f"{name}: training loss (log)")
        axes[r, 2].set_title(f"{name}: loss − {reference.split(' (')[0]}'s")
        if r < len(rows) - 1:
            for ax in axes[r]:
                ax.set_xlabel("")
    figure_legend(fig, title=legend_title)
    return fig


# ----------------------------------------------------------------------------- clients and methods

def client_curves(histories: Sequence[History], names: Sequence[str], ax=None,
                  styles: Mapping[str, Mapping[str, str]] | None = None):
    """Each client's test accuracy (%) against rounds, mean ± std over the runs (seeds), the axis
    within [0, 100]."""
    ax = ax or plt.gca()
    styles = styles if styles is not None else method_styles(list(names))
    rounds = np.asarray(histories[0].eval_rounds)
    acc = 100 * np.stack([h.acc() for h in histories])          # (run, eval, client)
    for k, name in enumerate(names):
        mu, sd = acc[:, :, k].mean(0), acc[:, :, k].std(0)
        line, = ax.plot(rounds, mu, label=name, markevery=markevery(len(rounds)), **style_of(styles, name))
        ax.fill_between(rounds, np.clip(mu - sd, 0, 100), np.clip(mu + sd, 0, 100), color=line.get_color(),
                        alpha=0.2, linewidth=0)
    ax.set_xlabel("round")
    round_axis(ax)
    percent_axis(ax)
    return ax


def _improved(hs: Sequence[History], window: int) -> np.ndarray:
    """The share of improved participants per round (%, DQN-Fed eq. 29), mean over runs, as a
    moving average over ``window`` rounds (its value at round t covers rounds t − window + 1 … t)."""
    share = 100 * np.stack([np.asarray(h.round_improved, float) for h in hs]).mean(0)
    return np.convolve(share, np.ones(window) / window, mode="valid")


def improved_share(runs: dict[str, Sequence[History]], ax=None, window: int = 1,
                   styles: Mapping[str, Mapping[str, str]] | None = None):
    """Share of improved participants per round (%, DQN-Fed eq. 29), mean over runs, as a moving
    average over ``window`` rounds, one line per method."""
    ax = ax or plt.gca()
    styles = styles if styles is not None else method_styles(list(runs))
    for m, hs in runs.items():
        smooth = _improved(hs, window)
        ax.plot(np.arange(len(smooth)) + window, smooth, label=m, markevery=markevery(len(smooth)), **style_of(styles, m))
    ax.set_xlabel("round")
    round_axis(ax)
    ax.set_ylabel("improved participants (%)")
    percent_axis(ax)
    return ax


def method_panels(runs: dict[str, Sequence[History]], axes: Sequence, metric: str = "mean_acc",
                  reference: str | None = None, color: str = PALETTE[0]):
    """Small multiples: one panel per method (``axes``, in the order of ``runs``), its mean ± std
    over seeds in ``color``, and the ``reference`` method's mean as a dashed dark-grey line in every
    other panel, so that each method is read against the same baseline. The way to show more
    methods than the palette has colours (CONVENTIONS: small multiples, not repeated colours)."""
    axes = list(axes)
    if reference is not None and reference not in runs:
        raise ConfigError(f"method_panels: the reference {reference!r} is not among {list(runs)}")
    if len(axes) < len(runs):
        raise ConfigError(f"method_panels: {len(runs)} methods but {len(axes)} panels")
    for ax, (m, hs) in zip(axes, runs.items()):
        rounds = np.asarray(hs[0].eval_rounds)
        if reference is not None and m != reference:
            ref = _metric(runs[reference], metric).mean(0)
            ax.plot(np.asarray(runs[reference][0].eval_rounds), ref, color="0.3", linestyle="--", linewidth=0.9,
                    label=f"{reference} (reference), mean over seeds")
        ys = _metric(hs, metric)
        mu, sd = ys.mean(0), ys.std(0)
        lo, hi = (np.clip(mu - sd, 0, 100), np.clip(mu + sd, 0, 100)) if metric == "mean_acc" else (mu - sd, mu + sd)
        shade = REFERENCE["color"] if m == reference else color
        ax.plot(rounds, mu, color=shade, label="the panel's method, mean over seeds")
        if len(hs) > 1:
            ax.fill_between(rounds, lo, hi, color=shade, alpha=0.2, linewidth=0, label="± std over seeds")
        panel_title(ax, m + (" (reference)" if m == reference else ""))
        round_axis(ax)
    if metric == "mean_acc":         # once all are drawn: shared axes take the last limits set
        for ax in axes[:len(runs)]:
            percent_axis(ax)
    for ax in axes[len(runs):]:
        ax.set_axis_off()
    return axes


def improved_heatmap(runs: dict[str, Sequence[History]], ax, window: int = 1, colorbar: bool = True):
    """The share of improved participants (%, DQN-Fed eq. 29; mean over runs, moving average over
    ``window`` rounds) as a heat map: one row per method, rounds across, 0–100 % on one colour
    scale. Fourteen such series drawn as lines cross each other in every round."""
    names = list(runs)
    shares = [_improved(hs, window) for hs in runs.values()]
    width = max(len(s) for s in shares)
    grid = np.full((len(names), width), np.nan)
    for i, s in enumerate(shares):
        grid[i, :len(s)] = s
    image = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=100, interpolation="nearest",
                      extent=(window - 0.5, window - 0.5 + width, len(names) - 0.5, -0.5))
    ax.set_yticks(range(len(names)), names)
    ax.grid(False)
    ax.set_xlabel("round")
    round_axis(ax)
    if colorbar:
        bar = ax.get_figure().colorbar(image, ax=ax, pad=0.01, aspect=15)
        bar.set_label("improved participants (%)")
    return image


def convergence(runs: dict[str, Sequence[History]], title: str = "", reference: str | None = "FedAvg",
                columns: int = 5) -> matplotlib.figure.Figure:
    """DQN-Fed Fig. 1 and 3 for any number of methods, two columns wide: above, small multiples of
    the average client test accuracy (mean ± std over seeds), one panel per method with the
    ``reference`` method dashed in each (``method_panels``); below, the share of improved
    participants per round (eq. 29, a moving average over a thirtieth of the rounds) as a heat map,
    one row per method (``improved_heatmap``). Thirteen methods drawn as lines in two panels
    tangled into one band of colour."""
    reference = reference if reference in runs else None
    rows = -(-len(runs) // columns)
    columns = -(-len(runs) // rows)          # as few empty panels as the rows allow: 12 methods in 3 × 4, not 5 + 5 + 2
    fig = plt.figure(figsize=(TWO_COLUMNS, 1.25 * rows + 0.16 * len(runs) + 1.6), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.25 * rows + 0.5, 0.16 * len(runs) + 0.8])
    axes = top.subplots(rows, columns, sharex=True, sharey=True, squeeze=False)
    method_panels(runs, axes.flat, "mean_acc", reference)
    for ax in axes[:, 0]:
        ax.set_ylabel("accuracy (%)")
    for c in range(columns):          # the round axis under the lowest panel of each column
        shown = [ax for ax in axes[:, c] if ax.axison]
        shown[-1].set_xlabel("round")
        shown[-1].xaxis.set_tick_params(labelbottom=True)
    figure_legend(top)
    top.suptitle("average client test accuracy", fontsize=matplotlib.rcParams["axes.titlesize"])
    ax = bottom.subplots()
    rounds = max(h.rounds_done for hs in runs.values() for h in hs)
    window = max(1, rounds // 30)
    improved_heatmap(runs, ax, window)
    ax.set_title(f"participants whose loss did not rise (eq. 29, Fig. 3), {window}-round moving average")
    if title:
        suptitle(fig, title)
    return fig


def step_lengths(runs: dict[str, History], ax=None, styles: Mapping[str, Mapping[str, str]] | None = None):
    """The length of the server step ‖θᵗ⁺¹ − θᵗ‖ = ηₜ·‖d‖ per round (from a rule that logs
    ``step_norm2``), with × on the rounds in which some participant got worse."""
    ax = ax or plt.gca()
    styles = styles if styles is not None else method_styles(list(runs))
    for i, (label, h) in enumerate(runs.items()):
        length = np.sqrt(np.asarray(h.info["step_norm2"])) * np.asarray(h.round_lr)
        style = style_of(styles, label)
        ax.semilogy(np.arange(1, len(length) + 1), length, color=style["color"], label=label, linewidth=0.9)
        worse = np.flatnonzero(np.asarray(h.round_improved) < 1)
        ax.plot(worse + 1, length[worse], "x", color=style["color"], ms=3, markeredgewidth=0.8,
                label="a participant got worse" if i == 0 else None)
    ax.set_xlabel("round")
    round_axis(ax)
    plain_log_ticks(ax)
    ax.set_ylabel("length of the server step ‖θᵗ⁺¹ − θᵗ‖")
    return ax
