"""The print style every figure of fairfl is drawn in, and ``save_figure``: the sizes (one column,
two columns), text sizes, the colour-blind-safe palette and one colour + marker per method, the
figure-wide legend, wrapped titles, the axes of percentages, bars, rounds and log scales, and the
PNG + PDF files with their stamp. What each piece is for: :mod:`fairfl.studies.plotting`'s docstring."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import LogFormatter, MaxNLocator

from fairfl.base.atomic import atomic_write
from fairfl.base.errors import ConfigError
from fairfl.base.figure_checks import ONE_COLUMN, TWO_COLUMNS, problems, width_class
from fairfl.base.paths import figures_root

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
# markers for figures that also print the verdict glyphs ▲ / ▼ (notebook 06): no triangles
NON_VERDICT_MARKERS = ("o", "s", "D", "P", "X", "p", "h")
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
                  labelled: bool = False, markers: Sequence[str] = MARKERS) -> dict[str, dict[str, str]]:
    """{name: {"color", "marker"}}: one colour and one marker per method, in the order given, the
    ``reference`` method in black. Made once per notebook and passed to each of its figures, a
    method looks the same in all of them. More methods than the palette's colours raise: repeated
    colours would make two methods one; draw them as small multiples (``method_panels``). Where a
    figure names every method beside its marks (a forest plot's rows, a panel per method:
    ``labelled=True``), colour is not the only key and past the palette the colours repeat with
    the next marker, no two methods sharing both. ``markers``: the markers to use
    (:data:`NON_VERDICT_MARKERS` where a figure's tables print ▲ / ▼ as verdicts)."""
    marks = tuple(markers)
    names = list(names)
    if len(set(names)) != len(names):
        raise ConfigError(f"method_styles: a name is given twice in {names}")
    if reference is not None and reference not in names:
        raise ConfigError(f"method_styles: the reference {reference!r} is not among {names}")
    others = [n for n in names if n != reference]
    if labelled:
        if len(others) > len(PALETTE) * len(marks):
            raise ConfigError(f"method_styles: {len(others)} methods but {len(PALETTE) * len(marks)} pairs of a "
                              "colour and a marker")
        pairs = iter((PALETTE[i % len(PALETTE)], marks[(i // len(PALETTE) + i) % len(marks)])
                     for i in range(len(others)))
        return {n: dict(REFERENCE) if n == reference else dict(zip(("color", "marker"), next(pairs))) for n in names}
    if len(others) > len(PALETTE):
        raise ConfigError(f"method_styles: {len(others)} methods but {len(PALETTE)} colour-blind-safe colours "
                          f"({', '.join(others)}): draw them as small multiples (plotting.method_panels), "
                          "not with repeated colours")
    colours = iter(zip(PALETTE, marks))
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


def style_of(styles: Mapping[str, Mapping[str, str]], label: str) -> dict[str, str]:
    if label not in styles:
        raise ConfigError(f"no style for {label!r}: the styles given name {', '.join(map(repr, styles))}")
    return dict(styles[label])


def markevery(n: int) -> int:
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
        from fairfl.base.figure_checks import panels
        for ax in panels(fig):
            for h, lab in zip(*ax.get_legend_handles_labels()):
                if not lab.startswith("_"):
                    seen.setdefault(lab, h)
        handles, labels = list(seen.values()), list(seen)
    elif labels is None:
        labels = [h.get_label() for h in handles]
    from fairfl.base.figure_checks import panels
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

def save_figure(fig: matplotlib.figure.Figure, name: str, folder: Path | None = None,
                provenance: dict[str, str] | None = None) -> list[Path]:
    """Write ``<figures>/<name>.png`` (at SAVE_DPI) and ``.pdf``, each atomically, at exactly the
    figure's size; returns the paths. The PNG's text chunks record the style (``fairfl-style``),
    the printed size and what ``fairfl.base.figure_checks.problems`` found (``fairfl-checks``: "ok" or
    the problems), which scripts/contact_sheet.py shows, and ``provenance`` (a notebook's figures:
    ``fairfl-profile`` and ``fairfl-machine``, the profile and the machine the figure's runs were
    computed with); a figure with problems is named in one printed line."""
    folder = Path(folder or figures_root())
    found = problems(fig)
    # and as the file shows it: ink in the outermost pixels is a text cut by the canvas
    import io
    from fairfl.base.figure_checks import ink_at_edge
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=SAVE_DPI, bbox_inches=fig.bbox_inches)
    buffer.seek(0)
    edges = ink_at_edge(buffer)
    if edges:
        found.append(f"drawn at the canvas edge ({', '.join(edges)}): a text cut off")
    width, height = fig.get_size_inches()
    stamp = {"fairfl-style": STYLE, "fairfl-size": f"{width:.2f} x {height:.2f} in ({width_class(fig) or 'no column width'})",
             "fairfl-checks": "ok" if not found else "; ".join(found), **(provenance or {})}
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
