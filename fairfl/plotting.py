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
                                            and what ``fairfl.figure_checks.problems`` found (the contact
                                            sheet, scripts/contact_sheet.py, shows both)

``fairfl.figure_checks.problems(fig)`` lists what a figure breaks: not a column's width, text under
7 pt, labels over each other or cut off, a legend over a panel, bars not from 0, % outside [0, 100].
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import matplotlib
import matplotlib.lines
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import LogFormatter, MaxNLocator

from .atomic import atomic_write
from .errors import ConfigError
from .figure_checks import MIN_TEXT_PT, ONE_COLUMN, TWO_COLUMNS, problems, width_class
from .history import History
from .paths import figures_root

__all__ = ["ONE_COLUMN", "TWO_COLUMNS", "MIN_TEXT_PT", "INLINE_DPI", "SAVE_DPI", "STYLE", "PALETTE", "use_style",
           "figure", "method_styles", "ordinal_styles", "figure_legend", "suptitle", "percent_axis", "bar_axis",
           "round_axis", "plain_log_ticks", "human", "save_figure"]

# A two-column figure at INLINE_DPI is 897 px wide: JupyterLab's notebook column at its default
# layout (a 1366 px window, file browser open) is about 900 px, so the figure is shown at its own
# size, 7 pt text 12.6 px high. The PNG is drawn at SAVE_DPI, sharp when zoomed or printed.
INLINE_DPI = 130
SAVE_DPI = 300
STYLE = "print-1"           # recorded in every PNG save_figure writes: the contact sheet tells new figures from old

# Okabe & Ito (2008), "Color Universal Design": distinguishable under the common colour-vision
# deficiencies; black is kept for the reference method, yellow (the faintest on white) comes last.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
REFERENCE = {"color": "#000000", "marker": "*"}

# Text sizes at print size (points): nothing under MIN_TEXT_PT
TEXT_RC = {"font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8, "xtick.labelsize": 7, "ytick.labelsize": 7,
           "legend.fontsize": 7, "legend.title_fontsize": 7, "figure.titlesize": 8.5, "figure.labelsize": 8}

NAMES = {"fashion_mnist": "Fashion-MNIST", "mnist": "MNIST", "mnist_5k": "MNIST", "cifar10": "CIFAR-10",
         "adult": "Adult", "shakespeare": "Shakespeare", "multimnist": "MultiMNIST",
         "mlp2": "MLP (2 hidden layers)", "logreg": "logistic regression", "cnn_fmnist": "CNN", "cnn_cifar10": "CNN",
         "cnn_femnist": "CNN", "lstm_shakespeare": "character LSTM", "multi_lenet": "multi-task LeNet"}


def human(name: str) -> str:
    """The name a reader knows for a dataset or model id ("fashion_mnist" → "Fashion-MNIST");
    anything else unchanged."""
    return NAMES.get(name, name)


# ----------------------------------------------------------------------------- style and layout

def use_style() -> None:
    """The print style: seaborn's white grid, the text sizes above, the palette, figures shown at
    INLINE_DPI and saved at SAVE_DPI at exactly their size (no tight bounding box: the file is the
    printed size; constrained layout keeps every label inside)."""
    import seaborn as sns
    sns.set_theme(context="paper", style="whitegrid", palette=list(PALETTE))
    matplotlib.rcParams.update({**TEXT_RC, "figure.dpi": INLINE_DPI, "savefig.dpi": SAVE_DPI,
                                "savefig.bbox": "standard",
                                "lines.linewidth": 1.2, "lines.markersize": 3.5, "axes.linewidth": 0.6,
                                "grid.linewidth": 0.5, "errorbar.capsize": 2, "legend.frameon": False,
                                "patch.linewidth": 0.4, "image.cmap": "viridis"})


def figure(rows: int = 1, cols: int = 1, width: float = TWO_COLUMNS, height: float | None = None, **subplots: Any):
    """A print-sized figure (``width``: ONE_COLUMN or TWO_COLUMNS) with constrained layout and its
    panels, as ``plt.subplots`` gives them (its keywords pass through). ``height`` defaults to
    1.9 in a row of panels plus room for a title and a legend."""
    if width not in (ONE_COLUMN, TWO_COLUMNS):
        raise ConfigError(f"figure(width={width!r}): a figure is one column ({ONE_COLUMN} in) or two "
                          f"({TWO_COLUMNS} in) wide")
    height = height if height is not None else 1.9 * rows + 0.7
    return plt.subplots(rows, cols, figsize=(width, height), layout="constrained", **subplots)


def method_styles(names: Sequence[str], reference: str | None = None,
                  labelled: bool = False) -> dict[str, dict[str, str]]:
    """{name: {"color", "marker"}}: one colour and one marker per method, in the order given, the
    ``reference`` method in black. Made once per notebook and passed to each of its figures, a
    method looks the same in all of them. More methods than the palette's colours raise: repeated
    colours would make two methods one; draw them as small multiples (``method_panels``). Where a
    figure names every method beside its marks (a forest plot's rows, a panel per method:
    ``labelled=True``), colour is not the only key and past the palette the colours repeat with
    the next marker, no two methods sharing both."""
    names = list(names)
    if len(set(names)) != len(names):
        raise ConfigError(f"method_styles: a name is given twice in {names}")
    if reference is not None and reference not in names:
        raise ConfigError(f"method_styles: the reference {reference!r} is not among {names}")
    others = [n for n in names if n != reference]
    if labelled:
        if len(others) > len(PALETTE) * len(MARKERS):
            raise ConfigError(f"method_styles: {len(others)} methods but {len(PALETTE) * len(MARKERS)} pairs of a "
                              "colour and a marker")
        pairs = iter((PALETTE[i % len(PALETTE)], MARKERS[(i // len(PALETTE) + i) % len(MARKERS)])
                     for i in range(len(others)))
        return {n: dict(REFERENCE) if n == reference else dict(zip(("color", "marker"), next(pairs))) for n in names}
    if len(others) > len(PALETTE):
        raise ConfigError(f"method_styles: {len(others)} methods but {len(PALETTE)} colour-blind-safe colours "
                          f"({', '.join(others)}): draw them as small multiples (plotting.method_panels), "
                          "not with repeated colours")
    colours = iter(zip(PALETTE, MARKERS))
    return {n: dict(REFERENCE) if n == reference else dict(zip(("color", "marker"), next(colours))) for n in names}


def ordinal_styles(values: Sequence[Any], label: Callable[[Any], str] = str, cmap: str = "viridis",
                   span: tuple[float, float] = (0.0, 0.85)) -> dict[str, dict[str, str]]:
    """{label(value): {"color", "marker"}} for the values of an ordered factor (ε, K, a batch size),
    in their order: colours evenly spaced along a sequential colormap (viridis: perceptually
    uniform and colour-blind-safe; its last, light-yellow sixth is left out, faint on white), so
    that the colour reads as the order; a marker each as well, for print in grey."""
    values = list(dict.fromkeys(values))
    colormap = matplotlib.colormaps[cmap]
    n = len(values)
    at = [span[0] + (span[1] - span[0]) * i / (n - 1) if n > 1 else span[0] for i in range(n)]
    return {label(v): {"color": matplotlib.colors.to_hex(colormap(a)), "marker": MARKERS[i % len(MARKERS)]}
            for i, (v, a) in enumerate(zip(values, at))}


def _style(styles: Mapping[str, Mapping[str, str]], label: str) -> dict[str, str]:
    if label not in styles:
        raise ConfigError(f"no style for {label!r}: the styles given name {', '.join(map(repr, styles))}")
    return dict(styles[label])


def _markevery(n: int) -> int:
    """A marker on about ten points of a line: on every point a 300-round curve is a thick smear."""
    return max(1, round(n / 10))


def _text_width_pt(text: str, size: float) -> float:
    """The width of one line of ``text`` at ``size`` points, as Agg draws it."""
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.font_manager import FontProperties
    width, _, _ = RendererAgg(1, 1, 72).get_text_width_height_descent(
        text, FontProperties(size=size), ismath=text.count("$") >= 2)
    return width


def figure_legend(fig, handles: Sequence | None = None, labels: Sequence[str] | None = None, title: str | None = None,
                  ncols: int | None = None, loc: str = "outside lower center"):
    """One legend for the whole figure, outside its panels (below them by default), with as many
    columns as fit the figure's width. Without ``handles``, the entries of every panel, each label
    once, in order; the panels' own legends are removed."""
    if handles is None:
        seen: dict[str, Any] = {}
        from .figure_checks import panels
        for ax in panels(fig):
            for h, lab in zip(*ax.get_legend_handles_labels()):
                if not lab.startswith("_"):
                    seen.setdefault(lab, h)
        handles, labels = list(seen.values()), list(seen)
    elif labels is None:
        labels = [h.get_label() for h in handles]
    from .figure_checks import panels
    for ax in panels(fig):
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    if not handles:
        return None
    if ncols is None:
        size = matplotlib.rcParams["legend.fontsize"]
        size = matplotlib.font_manager.FontProperties(size=size).get_size_in_points()
        rc = matplotlib.rcParams
        entry = max(_text_width_pt(str(lab), size) for lab in labels) \
            + size * (rc["legend.handlelength"] + rc["legend.handletextpad"] + rc["legend.columnspacing"])
        ncols = max(1, min(len(labels), int((_width_in(fig) * 72 - 2 * size) // entry)))
    return fig.legend(handles, labels, loc=loc, ncols=ncols, title=title, frameon=False)


def _width_in(fig) -> float:
    """The width in inches of a figure or subfigure (a subfigure's share of its parent's)."""
    if hasattr(fig, "get_size_inches"):
        return fig.get_size_inches()[0]
    return fig.bbox_relative.width * _width_in(fig._parent)


def _wrap(text: str, width_pt: float, size: float) -> str:
    """``text`` wrapped, its own line breaks kept, so that no line is wider than ``width_pt``."""
    lines = []
    for line in text.splitlines() or [""]:
        words, current = line.split(" "), ""
        for word in words:
            trial = f"{current} {word}" if current else word
            if current and _text_width_pt(trial, size) > width_pt:
                lines.append(current)
                current = word
            else:
                current = trial
        lines.append(current)
    return "\n".join(lines)


def suptitle(fig, text: str):
    """The figure's suptitle, wrapped to its width (a title wider than a column was cut off)."""
    size = matplotlib.font_manager.FontProperties(size=matplotlib.rcParams["figure.titlesize"]).get_size_in_points()
    return fig.suptitle(_wrap(text, _width_in(fig) * 72 - 12, size))


def panel_title(ax, text: str):
    """A panel's title, wrapped to the panel's share of the figure's width (small multiples have
    narrow panels)."""
    root = ax.get_figure(root=True)
    spec = ax.get_subplotspec()
    share = len(spec.colspan) / spec.get_gridspec().ncols if spec is not None else 1.0
    size = matplotlib.font_manager.FontProperties(size=matplotlib.rcParams["axes.titlesize"]).get_size_in_points()
    return ax.set_title(_wrap(text, max(root.get_size_inches()[0] * 72 * share * 0.85, 36), size))


def percent_axis(ax, axis: str = "y") -> None:
    """An axis of a percentage: the range of the data drawn so far (in every panel sharing the
    axis), cut to [0, 100]: matplotlib's margins would show −3 or 104, values a percentage cannot
    take. Called again after more data is drawn, it takes that data in."""
    if axis == "y":
        ax.set_autoscaley_on(True)
        ax.autoscale_view(scalex=False)
        low, high = ax.get_ylim()
    else:
        ax.set_autoscalex_on(True)
        ax.autoscale_view(scaley=False)
        low, high = ax.get_xlim()
    low, high = max(0.0, min(low, 100.0)), min(100.0, max(high, 0.0))
    if high <= low:
        low, high = 0.0, 100.0
    (ax.set_ylim if axis == "y" else ax.set_xlim)(low, high)


def bar_axis(ax, percent: bool = False, axis: str = "y") -> None:
    """The value axis of bars from 0 (a bar's length is its value); to 100 for a percentage."""
    low, high = ax.get_ylim() if axis == "y" else ax.get_xlim()
    (ax.set_ylim if axis == "y" else ax.set_xlim)(0, 100 if percent else max(high, 0))


def round_axis(ax, axis: str = "x") -> None:
    """Integer ticks on an axis of rounds: a run of two rounds otherwise gets 0.5 and 1.5, one of 20
    rounds 2.5 and 7.5. The steps are matplotlib's default locator's (0, 20, 40, not 0, 15, 30)."""
    locator = MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10], integer=True)
    (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(locator)


class PlainLogFormatter(LogFormatter):
    """A log axis's tick labels as decimals (0.3, 2, 10), on the ticks matplotlib labels, with as
    many significant digits as the labels need to differ (2.2975, 2.3, 2.3025 on an axis that
    spans less than a percent, not "2.3" three times)."""

    digits = 3

    def set_locs(self, locs=None):
        super().set_locs(locs)
        low, high = sorted(self.axis.get_view_interval()) if self.axis is not None else (0, np.inf)
        shown = [v for v in (locs if locs is not None else []) if 0 < v and low <= v <= high
                 and LogFormatter.__call__(self, v)]
        self.digits = 3
        while self.digits < 8 and len({f"{v:.{self.digits}g}" for v in shown}) < len(set(shown)):
            self.digits += 1

    def __call__(self, x, pos=None):
        return f"{x:.{self.digits}g}" if super().__call__(x, pos) else ""


def plain_log_ticks(ax, axis: str = "y") -> None:
    """Decimal tick labels on a log axis (0.3, 0.5, 2 rather than 3×10⁻¹, 2×10⁰): a loss that
    spans less than a decade gets labelled minor ticks, which the default writes in scientific
    notation. The choice of which ticks carry a label is matplotlib's, unchanged."""
    a = ax.xaxis if axis == "x" else ax.yaxis
    a.set_major_formatter(PlainLogFormatter(labelOnlyBase=False))
    a.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False))


# ----------------------------------------------------------------------------- saving

def save_figure(fig: matplotlib.figure.Figure, name: str, folder: Path | None = None) -> list[Path]:
    """Write ``<figures>/<name>.png`` (at SAVE_DPI) and ``.pdf``, each atomically, at exactly the
    figure's size; returns the paths. The PNG's text chunks record the style (``fairfl-style``),
    the printed size and what ``fairfl.figure_checks.problems`` found (``fairfl-checks``: "ok" or
    the problems), which scripts/contact_sheet.py shows; a figure with problems is named in one
    printed line."""
    folder = Path(folder or figures_root())
    found = problems(fig)
    width, height = fig.get_size_inches()
    stamp = {"fairfl-style": STYLE, "fairfl-size": f"{width:.2f} x {height:.2f} in ({width_class(fig) or 'no column width'})",
             "fairfl-checks": "ok" if not found else "; ".join(found)}
    if found:
        print(f"figure {name}: not fit for print: " + "; ".join(found))
    paths = []
    for ext in ("png", "pdf"):
        path = folder / f"{name}.{ext}"
        # no creation date in the PDF: re-plotting unchanged results gives an unchanged file
        metadata = stamp if ext == "png" else {"CreationDate": None}
        atomic_write(path, lambda p, ext=ext, md=metadata: fig.savefig(
            p, format=ext, metadata=md, dpi=SAVE_DPI, bbox_inches=fig.bbox_inches))
        paths.append(path)
    return paths


def figure_stamp(path: Path | str) -> dict[str, str]:
    """The ``fairfl-*`` text chunks of a PNG written by ``save_figure`` ({} for one drawn by code
    from before them, or by anything else)."""
    from PIL import Image
    with Image.open(path) as image:
        return {k: str(v) for k, v in getattr(image, "text", {}).items() if k.startswith("fairfl-")}


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
        line, = ax.plot(rounds, mu, label=label, markevery=_markevery(len(rounds)), **_style(styles, label))
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
        ax.plot(rounds, (ys - ref).mean(0), label=label, markevery=_markevery(len(rounds)), **_style(styles, label))
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
        ax.errorbar(pos, [a.mean() for a in v], yerr=[a.std() for a in v], label=label, **_style(styles, label))
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
                      palette={m: _style(styles, m)["color"] for m in final_acc})
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
        kw.setdefault("markevery", _markevery(len(x)))
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
            seed_band(ax, np.asarray(values)[:, :, t], label, **_style(styles, label))
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
            style = _style(styles, label)
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
        line, = ax.plot(rounds, mu, label=name, markevery=_markevery(len(rounds)), **_style(styles, name))
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
        ax.plot(np.arange(len(smooth)) + window, smooth, label=m, markevery=_markevery(len(smooth)), **_style(styles, m))
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
        style = _style(styles, label)
        ax.semilogy(np.arange(1, len(length) + 1), length, color=style["color"], label=label, linewidth=0.9)
        worse = np.flatnonzero(np.asarray(h.round_improved) < 1)
        ax.plot(worse + 1, length[worse], "x", color=style["color"], ms=3, markeredgewidth=0.8,
                label="a participant got worse" if i == 0 else None)
    ax.set_xlabel("round")
    round_axis(ax)
    plain_log_ticks(ax)
    ax.set_ylabel("length of the server step ‖θᵗ⁺¹ − θᵗ‖")
    return ax


# ----------------------------------------------------------------------------- the benchmark (notebook 06)
# Drawn for print: two-column width (6.9 in), text of 7 pt and more; one colour and one marker per
# method in every panel (method_styles); an axis shows only what its metric can take.

_CRITERION_MARKS = {"mean": ("o", "chosen on mean"), "worst10": ("^", "chosen on worst 10 %"),
                    "mean-std": ("s", "chosen on mean − σ")}
_METRIC_NAMES = {"mean": "mean", "std": "σ over clients", "worst10": "worst 10 %", "best10": "best 10 %"}


def _print_text(ax) -> None:
    ax.tick_params(labelsize=MIN_TEXT_PT)
    ax.xaxis.label.set_size(MIN_TEXT_PT + 0.5)
    ax.yaxis.label.set_size(MIN_TEXT_PT + 0.5)
    ax.title.set_size(MIN_TEXT_PT + 0.5)


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
        _, axes = plt.subplots(1, len(metrics), sharey=True, figsize=(TWO_COLUMNS, 0.22 * len(shown) + 1.0),
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
    axes[0].figure.legend(handles=key, loc="outside lower center", ncols=3, fontsize=MIN_TEXT_PT, frameon=False)
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
                             figsize=(TWO_COLUMNS, 1.25 * rows + 0.7))
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
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=MIN_TEXT_PT, frameon=False)
    if title:
        fig.suptitle(title, fontsize=MIN_TEXT_PT + 1)
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
    fig, ax = plt.subplots(figsize=(TWO_COLUMNS, 0.2 * len(rows) + 1.6), layout="constrained")
    image = ax.imshow(np.clip(value, -cap, cap), cmap="RdBu", vmin=-cap, vmax=cap, aspect="auto")
    for i in range(len(rows)):
        for j in range(len(cols)):
            if np.isfinite(value[i, j]):
                v = value[i, j]
                text = (f"{v:+.0f}" if abs(v) >= 10 else f"{v:+.1f}") + ("*" if star[i, j] else "")
                ax.text(j, i, text, ha="center", va="center", fontsize=MIN_TEXT_PT,
                        color="white" if abs(v) > 0.6 * cap else "0.1")
    short = {"std": "σ", "worst10": "worst 10 %", "best10": "best 10 %"}
    ax.set_xticks(range(len(cols)), [short.get(k, k) for _, k in cols], rotation=90)
    ax.set_yticks(range(len(rows)), [labels.get(m, m) for m in rows])
    for j in range(len(metrics), len(cols), len(metrics)):
        ax.axvline(j - 0.5, color="white", linewidth=2)
    top = ax.secondary_xaxis("top")
    top.set_xticks([j * len(metrics) + (len(metrics) - 1) / 2 for j in range(len(federations))], list(federations))
    top.tick_params(length=0, labelsize=MIN_TEXT_PT)
    ax.grid(False)
    _print_text(ax)
    bar = fig.colorbar(image, ax=ax, shrink=0.8, pad=0.01)
    bar.set_label("better than the reference (points; σ sign turned)", fontsize=MIN_TEXT_PT)
    bar.ax.tick_params(labelsize=MIN_TEXT_PT)
    return fig
