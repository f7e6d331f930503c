"""Where a drawn figure's text lands, for the tests that no label is cut off at the figure's
edge or drawn over another one: every title, axis label, legend entry and tick label the
figure shows, with its box in pixels from the renderer."""
from __future__ import annotations

from matplotlib.transforms import Bbox


def renderer(fig):
    """The figure drawn by Agg (as it is saved to PNG), and that renderer. A figure made without
    pyplot (the explorer's) gets an Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    if not hasattr(fig.canvas, "get_renderer"):
        FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def tick_labels(axis, draw: bool = True) -> list:
    """The tick labels an axis draws: ticks inside the view, with a non-empty label (labels are
    set at drawing: the figure is drawn first, unless ``draw`` is False)."""
    if draw:
        renderer(axis.figure)
    low, high = sorted(axis.get_view_interval())
    margin = 1e-9 * max(abs(low), abs(high), 1.0)
    return [label for tick in axis.get_major_ticks() + axis.get_minor_ticks()
            if low - margin <= tick.get_loc() <= high + margin          # ticks outside the view are not drawn
            for label in (tick.label1, tick.label2) if label.get_visible() and label.get_text().strip()]


def shown_texts(fig) -> list[tuple[str, Bbox, object]]:
    """(text, its box in display pixels, the axes it belongs to or None) of every non-empty text
    the figure draws."""
    renderer_ = renderer(fig)
    artists = [(fig._suptitle, None)] if fig._suptitle is not None else []
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison:
            continue
        artists += [(a, ax) for a in (ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label)]
        artists += [(a, ax) for axis in (ax.xaxis, ax.yaxis) for a in tick_labels(axis, draw=False)]
        legend = ax.get_legend()
        if legend is not None:                  # a panel's own legend may lie over it, not over another
            artists += [(a, ax) for a in legend.get_texts()]
    for legend in fig.legends:
        artists += [(a, None) for a in legend.get_texts()]
    return [(a.get_text(), a.get_window_extent(renderer_), owner) for a, owner in artists
            if a.get_visible() and a.get_text().strip()]


def cut_off(fig, tolerance: float = 1.0) -> list[str]:
    """The texts that reach beyond the figure's edge (partly or wholly not in the picture)."""
    edge = fig.bbox
    return [t for t, b, _ in shown_texts(fig) if b.x0 < edge.x0 - tolerance or b.y0 < edge.y0 - tolerance
            or b.x1 > edge.x1 + tolerance or b.y1 > edge.y1 + tolerance]


def _overlap(a: Bbox, b: Bbox, tolerance: float) -> bool:
    return min(a.x1, b.x1) - max(a.x0, b.x0) > tolerance and min(a.y1, b.y1) - max(a.y0, b.y0) > tolerance


def overlapping(fig, tolerance: float = 1.0) -> list[tuple[str, str]]:
    """The pairs of texts drawn over each other (by more than ``tolerance`` pixels both ways)."""
    texts = shown_texts(fig)
    return [(ta, tb) for i, (ta, a, _) in enumerate(texts) for tb, b, _ in texts[i + 1:] if _overlap(a, b, tolerance)]


def over_other_panels(fig, tolerance: float = 1.0) -> list[tuple[str, int]]:
    """(text, the index of the panel in ``fig.axes``) for every label drawn over another panel
    than its own (a y-label reaching into the panel to its left, a legend over the curves)."""
    drawn = renderer(fig)
    panels = [(i, ax.get_window_extent(drawn)) for i, ax in enumerate(fig.axes) if ax.get_visible() and ax.axison]
    return [(t, i) for t, b, owner in shown_texts(fig) for i, p in panels
            if fig.axes[i] is not owner and _overlap(b, p, tolerance)]


def shown_size_px(fig, column_px: float) -> float:
    """The height in screen pixels of the smallest font the figure uses, as JupyterLab shows it:
    at its own size up to a notebook column of ``column_px`` pixels, scaled down to the column's
    width beyond it."""
    from matplotlib.font_manager import FontProperties
    renderer_ = renderer(fig)
    sizes = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            sizes += [t.get_fontsize() for t in tick_labels(axis, draw=False)]
        sizes += [t.get_fontsize() for t in (ax.title, ax.xaxis.label, ax.yaxis.label) if t.get_text().strip()]
    points = min(sizes) if sizes else FontProperties().get_size_in_points()
    scale = min(1.0, column_px / fig.bbox.width)
    return renderer_.points_to_pixels(points) * scale
