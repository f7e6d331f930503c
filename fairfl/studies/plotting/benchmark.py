"""The figures of the one-protocol benchmark (notebook 06), from :mod:`fairfl.studies.protocol`'s tables:
a forest plot of seed-paired differences from the reference, each method's tuning grid as a path
in the accuracy–fairness plane, and a heat map of the effects over methods × metrics × federations."""
from __future__ import annotations

import textwrap
from typing import Any, Mapping, Sequence

import matplotlib
import matplotlib.lines
import matplotlib.pyplot as plt
import numpy as np

from fairfl.base.figure_checks import MIN_TEXT_PT, TWO_COLUMNS

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


def _robust_limits(centres, spans, dots, limits, fence: float = 3.0, pad: float = 0.06) -> tuple[float, float]:
    """The x-range of one forest panel: 0, every method's mean difference, and every seed's
    difference (pooled over the methods) inside Tukey's far-out fences, [Q1 − 3·IQR, Q3 + 3·IQR]
    (one extreme seed does not set the axis for every method); interval ends inside that range
    count too. Widened by ``pad`` and cut to the metric's ``limits``."""
    dots = np.asarray([d for d in dots if np.isfinite(d)], dtype=np.float64)
    lo, hi = [0.0] + [c for c in centres if np.isfinite(c)], [0.0] + [c for c in centres if np.isfinite(c)]
    if dots.size:
        q1, q3 = np.quantile(dots, [0.25, 0.75])
        low_fence, high_fence = q1 - fence * (q3 - q1), q3 + fence * (q3 - q1)
        kept = dots[(dots >= low_fence) & (dots <= high_fence)]
        lo.append(float(kept.min()))
        hi.append(float(kept.max()))
        lo += [v for v in spans if np.isfinite(v) and low_fence <= v]
        hi += [v for v in spans if np.isfinite(v) and v <= high_fence]
    return _inside(min(lo), max(hi), limits, pad)


def forest_plot(table, seeds, reference: str, methods: Sequence[str], styles: Mapping[str, Mapping[str, Any]],
                metrics: Sequence[str] = ("mean", "std", "worst10"), axes=None, fdr: float = 0.05,
                clients: int | None = None, labels: Mapping[str, str] | None = None):
    """Seed-paired differences from ``reference``, one panel per metric and one row per method
    (a :func:`fairfl.studies.protocol.summary` ``table`` of one federation, track and criterion): the
    mean difference with its interval, each seed's own difference as a small dot (``seeds``:
    {method: {metric: the per-seed differences}}), filled where the Benjamini–Hochberg q-value
    is ≤ ``fdr`` and hollow otherwise. The x-axis covers 0, every mean difference and every seed
    inside Tukey's far-out fences (pooled over the methods), inside the range a difference of the
    metric can take: so that one extreme seed does not squeeze every other method into a line, a
    seed or an interval end beyond it is drawn at the edge as a caret (‹ ›) in its method's colour. ``clients``
    names the worst-10 % panel "worst client" where a federation has fewer than 20; ``labels``
    renames rows (a row compared with another reference than ``reference`` says so)."""
    from ..protocol import LOWER_IS_BETTER, difference_range, metric_label
    shown = [m for m in methods if m != reference and m in set(table.method)]
    if axes is None:
        _, axes = plt.subplots(1, len(metrics), sharey=True, figsize=(TWO_COLUMNS, 0.22 * len(shown) + 1.5),
                               layout="constrained")
    axes = np.atleast_1d(axes)
    y = {m: len(shown) - 1 - i for i, m in enumerate(shown)}
    for ax, metric in zip(axes, metrics):
        rows = table[table.metric == metric].set_index("method")
        drawn = [m for m in shown if m in rows.index and np.isfinite(rows.loc[m, "difference"])]
        dots_of = {m: np.asarray(seeds.get(m, {}).get(metric, []), dtype=np.float64) for m in drawn}
        left, right = _robust_limits([rows.loc[m, "difference"] for m in drawn],
                                     [v for m in drawn for v in (rows.loc[m, "difference_low"],
                                                                 rows.loc[m, "difference_high"])],
                                     [d for m in drawn for d in dots_of[m]], difference_range(metric))
        clip = lambda v: min(max(v, left), right)
        for m in drawn:
            r, style = rows.loc[m], styles[m]
            found = bool(np.isfinite(r["q"]) and r["q"] <= fdr)
            dots = dots_of[m]
            inside = dots[(dots >= left) & (dots <= right)]
            if inside.size:
                ax.scatter(inside, np.full(inside.size, y[m]) + 0.22, s=4, color=style["color"], alpha=0.5,
                           linewidths=0)
            for side, outside, mark in ((left, dots[dots < left], "<"), (right, dots[dots > right], ">")):
                if outside.size:       # the extreme seeds, at the edge
                    ax.plot([side], [y[m] + 0.22], linestyle="none", marker=mark, markersize=3.5,
                            color=style["color"], clip_on=False)
            low, high = r["difference_low"], r["difference_high"]
            ax.plot([clip(low), clip(high)], [y[m], y[m]], color=style["color"], linewidth=1.2)
            ax.plot(clip(r["difference"]), y[m], linestyle="none", marker=style["marker"], markersize=4.5,
                    color=style["color"], markerfacecolor=style["color"] if found else "white")
        ax.axvline(0, color="0.15", linewidth=0.9, zorder=1)
        ax.set_xlim(left, right)
        better = "lower is better" if metric in LOWER_IS_BETTER else "higher is better"
        ax.set_title(f"{metric_label(metric, clients) if metric != 'std' else 'σ over clients'}\n({better})")
        ax.set_xlabel(f"difference from {reference} (points)")
        ax.grid(axis="y", visible=False)
        _print_text(ax)
    axes[0].set_yticks([y[m] for m in shown], [dict(labels or {}).get(m, m) for m in shown])
    axes[0].set_ylim(-0.7, len(shown) - 0.3)
    key = [matplotlib.lines.Line2D([], [], color="0.3", marker="o", linestyle="-", markersize=4.5, label=text,
                                   markerfacecolor=face) for face, text in
           (("0.3", f"resolved (Benjamini–Hochberg q ≤ {fdr:g})"), ("white", "not resolved"))]
    key.append(matplotlib.lines.Line2D([], [], color="0.3", marker="o", linestyle="none", markersize=2, alpha=0.5,
                                       label="one seed"))
    key.append(matplotlib.lines.Line2D([], [], color="0.3", marker=">", linestyle="none", markersize=3.5,
                                       label="seeds beyond the axis"))
    axes[0].figure.legend(handles=key, loc="outside lower center", ncols=4, fontsize=MIN_TEXT_PT, frameon=False)
    return axes


def tradeoff_paths(grid, methods: Sequence[str], styles: Mapping[str, Mapping[str, Any]], columns: int = 4,
                   title: str = "", x: str = "mean", y: str = "std", knobs: Mapping[str, str] | None = None):
    """Each method's whole tuning grid in the accuracy–fairness plane, one small panel per method
    (shared axes): ``grid`` has one row per (method, configuration) with the columns ``method``,
    ``along`` (the value of the knob its path is ordered along), ``tag`` (the configuration's
    values, written beside its point), ``x`` and ``y`` (validation scores in %, the choice's view),
    ``chosen`` (the criteria that chose it, a set) and ``diverged`` (bool). The configurations are
    joined in the order of ``along`` (not of the design, which zig-zags), each labelled with its
    tag, and each criterion's choice ringed with its own marker; a configuration that diverged has
    no scores and is written under the panel's title, marked ×. ``knobs`` ({method: "q · lr×"})
    names, in each panel's title, the knobs the tags list. Axes inside [0, 100] (σ: [0, 50])."""
    from ..protocol import METRIC_RANGE
    knobs = dict(knobs or {})
    shown = [m for m in methods if m in set(grid["method"])]
    rows = -(-len(shown) // columns)
    fig, axes = plt.subplots(rows, columns, sharex=True, sharey=True, squeeze=False, layout="constrained",
                             figsize=(TWO_COLUMNS, 1.55 * rows + 0.7))
    finite = grid[np.isfinite(grid[x]) & np.isfinite(grid[y])]
    xlim = _inside(finite[x].min(), finite[x].max(), METRIC_RANGE[x], 0.12) if len(finite) else METRIC_RANGE[x]
    ylim = _inside(finite[y].min(), finite[y].max(), METRIC_RANGE[y], 0.12) if len(finite) else METRIC_RANGE[y]
    diverged_col = grid["diverged"] if "diverged" in grid else np.zeros(len(grid), dtype=bool)
    labels: list = []
    for ax, m in zip(axes.flat, shown):
        g = grid[grid.method == m]
        gone = g[diverged_col[g.index].astype(bool) | ~(np.isfinite(g[x]) & np.isfinite(g[y]))]
        g = g.drop(gone.index).sort_values("along" if "along" in g else "order", kind="stable")
        style = styles[m]
        ax.plot(g[x], g[y], color=style["color"], linewidth=0.8, marker=style["marker"], markersize=3)
        for criterion, (marker, _) in _CRITERION_MARKS.items():
            hit = g[[criterion in c for c in g["chosen"]]]
            ax.plot(hit[x], hit[y], linestyle="none", marker=marker, markersize=8, markerfacecolor="none",
                    markeredgecolor="0.15", markeredgewidth=0.8)
        if "tag" in g:
            labels += [ax.annotate(str(r.tag), (getattr(r, x), getattr(r, y)), xytext=(3, 2), textcoords="offset points",
                                   fontsize=MIN_TEXT_PT, color="0.25") for r in g.itertuples()]
        head = "\n".join(textwrap.wrap(m, 22))
        if m in knobs:
            head += f"\n({knobs[m]})"
        if len(gone):
            head += "\n× " + ", ".join(str(t) for t in (gone["tag"] if "tag" in gone else gone.index)) + " diverged"
        ax.set_title(head, pad=2)
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
    _spread_labels(fig, labels)
    return fig


def _spread_labels(fig, labels) -> None:
    """Place each point's label where it is read: inside its panel, over no label placed before it.
    Points that print at one place (within :data:`_SAME_PLACE` pt: configurations that scored alike)
    share one label, a tag per line. Each label takes the nearest free place on rings of growing
    distance around its point, tied to it by a thin line beyond the first ring; where none is free,
    the place it overlaps least. (Beside the point only, eight places, notebook 06's panels printed
    up to five tags over each other.)"""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    pt = fig.dpi / 72
    labels = _merge_same_place(labels, _SAME_PLACE * pt)
    placed = [t.get_window_extent(renderer) for ax in fig.axes for t in (*ax.get_xticklabels(), *ax.get_yticklabels(),
                                                                         ax.title) if t.get_visible() and t.get_text()]
    placed = [(b.x0, b.y0, b.x1, b.y1) for b in placed]
    panels = [ax.get_window_extent(renderer) for ax in fig.axes if ax.axison]
    whole = fig.bbox
    for label in labels:
        label.set_in_layout(False)          # a label placed later must not move the panels
        px, py = label.axes.transData.transform(label.xy)
        box = label.get_window_extent(renderer)
        w, h = box.width, box.height
        own = label.axes.get_window_extent(renderer)
        others = [(b.x0, b.y0, b.x1, b.y1) for b in panels if b.bounds != own.bounds]
        best = None                         # (outside its panel, overlap, ring, dx, dy, box, ha, va)
        for r in _RINGS:
            for angle in range(0, 360, 30):
                dx, dy = r * np.cos(np.radians(angle)), r * np.sin(np.radians(angle))
                ha = "left" if dx > 0.3 * r else "right" if dx < -0.3 * r else "center"
                va = "bottom" if dy > 0.3 * r else "top" if dy < -0.3 * r else "center"
                x0 = px + dx * pt - {"left": 0, "right": w, "center": w / 2}[ha]
                y0 = py + dy * pt - {"bottom": 0, "top": h, "center": h / 2}[va]
                cand = (x0, y0, x0 + w, y0 + h)
                outside = not (own.x0 <= cand[0] and cand[2] <= own.x1 and own.y0 <= cand[1] and cand[3] <= own.y1)
                # a label may reach into the margin beside its panel, never into another panel or off the figure
                if outside and (not (whole.x0 <= cand[0] and cand[2] <= whole.x1 and whole.y0 <= cand[1]
                                     and cand[3] <= whole.y1) or any(_area(cand, b) > 0 for b in others)):
                    continue
                key = (outside, sum(_area(cand, b) for b in placed), r)
                if best is None or key < best[:3]:
                    best = (*key, dx, dy, cand, ha, va)
            if best is not None and best[:2] == (False, 0):
                break
        if best is None:                    # nowhere: beside the point, as drawn
            placed.append((box.x0, box.y0, box.x1, box.y1))
            continue
        *_, r, dx, dy, cand, ha, va = best
        label.set_position((dx, dy))
        label.set_horizontalalignment(ha)
        label.set_verticalalignment(va)
        if r > _RINGS[0]:
            tie = label.axes.annotate("", label.xy, xytext=(dx, dy), textcoords="offset points", annotation_clip=False,
                                      arrowprops=dict(arrowstyle="-", linewidth=0.4, color="0.55", shrinkA=0, shrinkB=1.5))
            tie.set_in_layout(False)        # nor the lines: the layout drawn again would move the labels' panels
        placed.append(cand)
    # the panels stay where the labels were placed: drawn again (saving), the layout engine would move them
    # a little, the points with them, and labels a few points from their neighbours would meet
    fig.set_layout_engine("none")


def _area(a, b) -> float:
    """The area two boxes (x0, y0, x1, y1) share."""
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


_SAME_PLACE = 2.5                        # pt: points closer than this print as one
_RINGS = (3.5, 9.0, 15.0, 22.0, 30.0, 40.0)     # pt: the distances tried, nearest first


def _merge_same_place(labels, near: float) -> list:
    """One label for the points of a panel that print within ``near`` pixels of each other: the first
    one's, its text the tags one per line (duplicates once); the others removed."""
    kept: list = []
    for label in labels:
        at = label.axes.transData.transform(label.xy)
        for other in kept:
            if other.axes is label.axes and np.hypot(*(other.axes.transData.transform(other.xy) - at)) <= near:
                lines = other.get_text().split("\n")
                if label.get_text() not in lines:
                    other.set_text("\n".join(lines + [label.get_text()]))
                label.remove()
                break
        else:
            kept.append(label)
    return kept


def effect_heatmap(table, federations: Sequence[str], methods: Sequence[str],
                   metrics: Sequence[str] = ("mean", "std", "worst10"), references: Mapping[str, str] | None = None,
                   fdr: float = 0.05, labels: Mapping[str, str] | None = None,
                   clients: Mapping[str, int] | None = None):
    """One heat map of effect sizes over methods × metrics × federations: each cell the seed-paired
    difference from the method's track reference (a :func:`fairfl.studies.protocol.summary` table), its
    sign turned so that blue is better for every metric (σ: lower), written in the cell with a
    star where its Benjamini–Hochberg q-value is ≤ ``fdr``; a cell without a comparison (the
    reference itself, a federation that cannot speak for the track) is blank. The colour scale is
    symmetric and capped at the 95th percentile of the effects, so that one exploding method does
    not wash the others out. ``labels`` renames rows (say which reference a personalised method
    is compared with); ``clients`` ({federation: its number of clients}) names a worst-10 % column
    "worst client" where a federation has fewer than 20. A row compares a method with its own
    reference where the table names one (``reference``: an averaged iterate with an averaged
    iterate)."""
    from ..protocol import LOWER_IS_BETTER, metric_label
    clients = dict(clients or {})
    references, labels = dict(references or {}), dict(labels or {})
    refs = set(references.values()) | (set(table["method"][table["reference"] == table["method"]])
                                       if "reference" in table else set())
    rows = [m for m in methods if m in set(table.method) and m not in refs]
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
    # a row compared with another reference says so on a second line, and the colour bar goes below: the
    # cells get the figure's width (a one-line "AFL (averaged iterate) (vs FedAvg (averaged iterate))" and a
    # bar at the side left 12 columns so little that neighbouring cells' numbers ran into each other)
    names = [label.replace(" (vs ", "\nvs ")[:-1] if " (vs " in label and label.endswith(")") else label
             for label in (labels.get(m, m) for m in rows)]
    fig, ax = plt.subplots(figsize=(TWO_COLUMNS, 0.24 * len(rows) + 2.2), layout="constrained")
    image = ax.imshow(np.clip(value, -cap, cap), cmap="RdBu", vmin=-cap, vmax=cap, aspect="auto")
    for i in range(len(rows)):
        for j in range(len(cols)):
            if np.isfinite(value[i, j]):
                v = value[i, j]
                text = (f"{v:+.0f}" if abs(v) >= 10 else f"{v:+.1f}") + ("*" if star[i, j] else "")
                ax.text(j, i, text, ha="center", va="center", fontsize=MIN_TEXT_PT,
                        color="white" if abs(v) > 0.6 * cap else "0.1")
    ax.set_xticks(range(len(cols)), [metric_label(k, clients.get(f)) for f, k in cols], rotation=90)
    ax.set_yticks(range(len(rows)), names)
    for j in range(len(metrics), len(cols), len(metrics)):
        ax.axvline(j - 0.5, color="white", linewidth=2)
    top = ax.secondary_xaxis("top")
    top.set_xticks([j * len(metrics) + (len(metrics) - 1) / 2 for j in range(len(federations))],
                   [f.replace(", ", ",\n") for f in federations])
    top.tick_params(length=0, labelsize=MIN_TEXT_PT)
    ax.grid(False)
    _print_text(ax)
    bar = fig.colorbar(image, ax=ax, location="bottom", shrink=0.6, pad=0.02, aspect=40)
    bar.set_label("better than the reference (points; σ sign turned)", fontsize=MIN_TEXT_PT)
    bar.ax.tick_params(labelsize=MIN_TEXT_PT)
    return fig
