"""Is a figure fit for print? Checked as a reader sees it: the figure is drawn by Agg (as it is
saved to PNG) and every text it shows is measured in the renderer's pixels.

The rules are those of CONVENTIONS "Figures": the figure is one column (``ONE_COLUMN``, 3.3 in) or
two (``TWO_COLUMNS``, 6.9 in) wide and at most a page high; no text under ``MIN_TEXT_PT`` (7 pt) at
that size; no text over another text, over another panel or beyond the figure's edge; every
legend outside the data (no legend box over any panel); bar axes from 0; an axis labelled in %
within [0, 100].

    problems(fig)          every rule the figure breaks, in words; [] when it is fit for print
    ink_at_edge(png)       the edges of a saved figure where something is drawn (a text cut by the canvas)

``fairfl.studies.plotting.save_figure`` records the result in the PNG it writes (``scripts/contact_sheet.py``
shows it), and tests/test_plotting.py holds every figure function of ``fairfl.studies.plotting`` to it.
"""
from __future__ import annotations

from matplotlib.transforms import Bbox

ONE_COLUMN = 3.3            # inches: the width of one column of a two-column paper
TWO_COLUMNS = 6.9           # inches: the width of the text of that paper
MAX_HEIGHT = 9.0            # inches: the height of a page of text
MIN_TEXT_PT = 7.0           # the smallest text a printed figure may hold, at its printed size
_WIDTH_TOLERANCE = 0.02     # inches


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


def _figures(fig) -> list:
    """The figure and its subfigures, at any depth."""
    out = [fig]
    for sub in getattr(fig, "subfigs", []):
        out += _figures(sub)
    return out


def panels(fig) -> list:
    """The visible axes of the figure (subfigures' included), each once."""
    seen, out = set(), []
    for f in _figures(fig):
        for ax in f.axes:
            if id(ax) not in seen and ax.get_visible() and ax.axison:
                seen.add(id(ax))
                out.append(ax)
    return out


def _legends(fig) -> list[tuple[object, object]]:
    """(legend, the axes it belongs to or None for a figure legend) of every legend shown."""
    out = [(legend, None) for f in _figures(fig) for legend in f.legends]
    out += [(ax.get_legend(), ax) for ax in panels(fig) if ax.get_legend() is not None]
    return [(legend, owner) for legend, owner in out if legend.get_visible()]


def _renderer(fig, draw: bool):
    """The figure's renderer, the figure drawn first unless ``draw`` is False (drawn already)."""
    return renderer(fig) if draw else fig.canvas.get_renderer()


def shown_text_artists(fig, draw: bool = True) -> list[tuple[object, object]]:
    """(text artist, the axes it belongs to or None) of every non-empty text the figure draws:
    titles, axis labels, tick labels, annotations, legend entries and titles, suptitles. The
    figure is drawn first (tick labels are set at drawing) unless ``draw`` is False."""
    _renderer(fig, draw)
    artists = []
    for f in _figures(fig):
        artists += [(t, None) for t in (f._suptitle, getattr(f, "_supxlabel", None), getattr(f, "_supylabel", None))
                    if t is not None]
        artists += [(t, None) for t in f.texts]
    for ax in panels(fig):
        artists += [(a, ax) for a in (ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label)]
        artists += [(a, ax) for axis in (ax.xaxis, ax.yaxis) for a in tick_labels(axis, draw=False)]
        artists += [(a, ax) for a in ax.texts]
    for legend, owner in _legends(fig):        # a panel's own legend may lie over it, not over another
        artists += [(a, owner) for a in legend.get_texts() + [legend.get_title()]]
    seen: set[int] = set()             # a suptitle is also among its figure's texts
    return [(a, owner) for a, owner in artists if a.get_visible() and a.get_text().strip()
            and not (id(a) in seen or seen.add(id(a)))]


def shown_texts(fig, draw: bool = True) -> list[tuple[str, Bbox, object]]:
    """(text, its box in display pixels, the axes it belongs to or None) of every non-empty text
    the figure draws."""
    drawn = _renderer(fig, draw)
    return [(a.get_text(), a.get_window_extent(drawn), owner) for a, owner in shown_text_artists(fig, draw=False)]


def cut_off(fig, tolerance: float = 1.0, draw: bool = True) -> list[str]:
    """The texts that reach beyond the figure's edge (partly or wholly not in the picture)."""
    edge = fig.bbox
    return [t for t, b, _ in shown_texts(fig, draw) if b.x0 < edge.x0 - tolerance or b.y0 < edge.y0 - tolerance
            or b.x1 > edge.x1 + tolerance or b.y1 > edge.y1 + tolerance]


def _overlap(a: Bbox, b: Bbox, tolerance: float) -> bool:
    return min(a.x1, b.x1) - max(a.x0, b.x0) > tolerance and min(a.y1, b.y1) - max(a.y0, b.y0) > tolerance


def overlapping(fig, tolerance: float = 1.0, draw: bool = True) -> list[tuple[str, str]]:
    """The pairs of texts drawn over each other (by more than ``tolerance`` pixels both ways)."""
    texts = shown_texts(fig, draw)
    return [(ta, tb) for i, (ta, a, _) in enumerate(texts) for tb, b, _ in texts[i + 1:] if _overlap(a, b, tolerance)]


def over_other_panels(fig, tolerance: float = 1.0, draw: bool = True) -> list[tuple[str, int]]:
    """(text, the index of the panel in ``panels(fig)``) for every label drawn over another panel
    than its own (a y-label reaching into the panel to its left, a figure legend over the curves)."""
    drawn = _renderer(fig, draw)
    shown = panels(fig)
    boxes = [(i, ax.get_window_extent(drawn)) for i, ax in enumerate(shown)]
    return [(t, i) for t, b, owner in shown_texts(fig, draw=False) for i, p in boxes
            if shown[i] is not owner and _overlap(b, p, tolerance)]


def legends_over_panels(fig, tolerance: float = 1.0, draw: bool = True) -> list[str]:
    """The legends (named by their first entry) whose box lies over a panel, its own included:
    a legend inside the axes hides data wherever the data happen to be."""
    drawn = _renderer(fig, draw)
    boxes = [ax.get_window_extent(drawn) for ax in panels(fig)]
    out = []
    for legend, _ in _legends(fig):
        box = legend.get_window_extent(drawn)
        if any(_overlap(box, p, tolerance) for p in boxes):
            texts = [t.get_text() for t in legend.get_texts()]
            out.append(texts[0] if texts else "(empty legend)")
    return out


def smallest_text_pt(fig, draw: bool = True) -> float:
    """The size in points of the smallest text the figure shows (at the figure's own size)."""
    sizes = [a.get_fontsize() for a, _ in shown_text_artists(fig, draw)]
    return min(sizes) if sizes else float("inf")


def small_texts(fig, minimum: float = MIN_TEXT_PT, draw: bool = True) -> list[tuple[str, float]]:
    """(text, its size in points) of every text smaller than ``minimum``."""
    return [(a.get_text(), a.get_fontsize()) for a, _ in shown_text_artists(fig, draw) if a.get_fontsize() < minimum - 1e-9]


def width_class(fig) -> str | None:
    """"one column" or "two columns" when the figure is that wide, else None."""
    width = fig.get_size_inches()[0]
    for name, inches in (("one column", ONE_COLUMN), ("two columns", TWO_COLUMNS)):
        if abs(width - inches) <= _WIDTH_TOLERANCE:
            return name
    return None


def bars_not_from_zero(fig) -> list[str]:
    """The panels (named by their title or y-label) with bars whose value axis does not start at 0:
    a bar's length is its value, and an axis cut at 50 % doubles what the eye reads."""
    from matplotlib.container import BarContainer
    out = []
    for ax in panels(fig):
        bars = [c for c in ax.containers if isinstance(c, BarContainer) and len(c.patches)]
        if not bars:
            continue
        horizontal = any(getattr(c, "orientation", "vertical") == "horizontal" for c in bars)
        low, high = ax.get_xlim() if horizontal else ax.get_ylim()
        if abs(min(low, high)) > 1e-9 * max(1.0, abs(high)):
            out.append(ax.get_title() or (ax.get_xlabel() if horizontal else ax.get_ylabel()) or "a panel")
    return out


def percent_outside(fig) -> list[str]:
    """The axes labelled in % ("… (%)") whose shown range leaves [0, 100]: a percentage cannot be
    −3 or 104, and an axis that shows it suggests it could."""
    out = []
    for ax in panels(fig):
        for axis, limits in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            label = axis.label.get_text()
            low, high = sorted(limits)
            if "(%)" in label and (low < -1e-9 or high > 100 + 1e-9):
                out.append(f"{label} shows {low:.3g} to {high:.3g}")
    return out


def problems(fig) -> list[str]:
    """Every rule of the module's docstring that the figure breaks, in words; [] when it is fit
    for print."""
    out = []
    width, height = fig.get_size_inches()
    if width_class(fig) is None:
        out.append(f"{width:.2f} in wide: not one column ({ONE_COLUMN} in) nor two ({TWO_COLUMNS} in)")
    if height > MAX_HEIGHT + _WIDTH_TOLERANCE:
        out.append(f"{height:.2f} in high: more than a page ({MAX_HEIGHT} in)")
    renderer(fig)                      # drawn once: the checks below read that drawing
    small = small_texts(fig, draw=False)
    if small:
        out.append(f"{len(small)} text(s) under {MIN_TEXT_PT:g} pt, e.g. {small[0][0]!r} at {small[0][1]:g} pt")
    for name, found in (("over each other", overlapping(fig, draw=False)),
                        ("over another panel", over_other_panels(fig, draw=False)),
                        ("cut off at the edge", cut_off(fig, draw=False)),
                        ("legend over a panel", legends_over_panels(fig, draw=False)),
                        ("bars not from 0", bars_not_from_zero(fig)), ("% outside [0, 100]", percent_outside(fig))):
        if found:
            out.append(f"{name}: {found[0]!r}" + (f" and {len(found) - 1} more" if len(found) > 1 else ""))
    return out


def ink_at_edge(png, margin: int = 2, threshold: int = 200) -> list[str]:
    """The edges ("top", "bottom", "left", "right") of a saved figure (a PNG file's path, or a PIL
    image) where anything is drawn in the outermost ``margin`` pixels: a title, a label or a tick
    label cut by the canvas shows its glyphs there, however the figure's texts measured when it was
    drawn. Read from the file a reader sees, so it also catches what a drawing at another dpi than
    the saved one moved, and figures drawn by any code."""
    import numpy as np
    from PIL import Image
    image = png if isinstance(png, Image.Image) else Image.open(png)
    gray = np.asarray(image.convert("L"))
    strips = {"top": gray[:margin], "bottom": gray[-margin:], "left": gray[:, :margin], "right": gray[:, -margin:]}
    return [edge for edge, strip in strips.items() if (strip < threshold).any()]


def shown_size_px(fig, column_px: float) -> float:
    """The height in screen pixels of the smallest font the figure uses, as JupyterLab shows it:
    at its own size up to a notebook column of ``column_px`` pixels, scaled down to the column's
    width beyond it."""
    drawn = renderer(fig)
    points = smallest_text_pt(fig, draw=False)
    if points == float("inf"):
        from matplotlib.font_manager import FontProperties
        points = FontProperties().get_size_in_points()
    scale = min(1.0, column_px / fig.bbox.width)
    return drawn.points_to_pixels(points) * scale
