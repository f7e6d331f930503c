"""The explorer's ipywidgets: a column of drop-downs per selection, the metric, the x % slider, the
seeds, the log scale, and "run it" with the changes typed beside it, kept in step with the
explorer's state (:class:`Widgets`, the part of :class:`fairfl.studies.explorer.Explorer` that builds
them); :func:`static_default`: whether a live widget frontend is there to show them."""
from __future__ import annotations

import os
from typing import Sequence

from .drawing import FIGURE_PX
from .runs import value_label


def static_default() -> bool:
    """No live widget frontend: not in an IPython kernel, or in one no Jupyter server session started
    (papermill, nbval and nbclient start kernels without JPY_SESSION_NAME)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return True
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return True
    return not os.environ.get("JPY_SESSION_NAME")


class Widgets:
    """The widget methods of :class:`fairfl.studies.explorer.Explorer`."""

    # -- widgets
    def _build(self):
        import ipywidgets as w
        # Everything fits the notebook's column: boxes as wide as it and wrapping, controls that
        # shrink, the image at its own width or the column's when that is narrower (no
        # horizontal scrollbar, no panel cut off at the right).
        fit = {"width": "100%", "max_width": "100%", "flex_flow": "row wrap"}
        self._image = w.Image(format="png", layout=w.Layout(width="100%", max_width=f"{FIGURE_PX}px", height="auto"))
        self._text = w.HTML(layout=w.Layout(max_width="100%"))
        self._controls: dict[str, list] = {}
        columns = []
        for which in ("A", "B"):
            drops = []
            for i, f in enumerate(self.factors):
                d = w.Dropdown(description=f, style={"description_width": "initial"},
                               layout=w.Layout(width="auto", max_width="100%"))
                d.observe(lambda change, which=which, f=f: self._on_factor(which, f, change), names="value")
                drops.append(d)
            self._controls[which] = drops
            columns.append(w.VBox([w.HTML(f"<b>selection {which}</b>"), *drops],
                                  layout=w.Layout(border="1px solid #ddd", padding="4px", margin="2px",
                                                  flex="1 1 240px", min_width="0", max_width="100%")))
        self._metric = w.Dropdown(options=list(self.metrics), value=self.metric, description="metric",
                                  layout=w.Layout(width="auto", max_width="100%"))
        self._fraction = w.IntSlider(value=round(100 * self.fraction), min=1, max=50, description="x %",
                                     layout=w.Layout(max_width="100%"))
        offered = self.offered_seeds()
        self._seeds = w.SelectMultiple(options=offered, value=tuple(s for s in offered if s in self.chosen_seeds),
                                       description="seeds", rows=min(4, max(2, len(self.seeds))),
                                       layout=w.Layout(max_width="100%"))
        self._logy = w.Checkbox(value=False, description="log scale", layout=w.Layout(max_width="100%"))
        self._metric.observe(lambda c: self._set(metric=c["new"]), names="value")
        self._fraction.observe(lambda c: self._set(fraction=c["new"] / 100), names="value")
        self._seeds.observe(lambda c: self._choose_seeds(c["new"]), names="value")
        self._logy.observe(lambda c: self._set(logy=c["new"]), names="value")
        self._changes = w.Text(placeholder="changes to A, e.g. rounds=50 algorithm.eps=0.3", description="run A with",
                               layout=w.Layout(flex="1 1 300px", min_width="0", max_width="420px"))
        self._run = w.Button(description="run it", button_style="primary", tooltip="train selection A with the "
                             "changes, for the chosen seeds, through fairfl.run_many; cached runs are loaded")
        self._run.on_click(lambda _: self.run_it(self._changes.value))
        self._progress = w.Output()
        self._syncing = False
        self._sync_controls()
        shared = w.VBox([self._metric, self._fraction, self._seeds, self._logy],
                        layout=w.Layout(flex="1 1 240px", min_width="0", max_width="100%", margin="2px"))
        box = w.VBox([w.HBox([*columns, shared], layout=w.Layout(**fit)),
                      w.HBox([self._changes, self._run], layout=w.Layout(**fit)), self._progress,
                      self._text, self._image], layout=w.Layout(width="100%", max_width="100%"))
        box.add_class("fairfl-explorer")
        return box

    def _set(self, **changes) -> None:
        if self._syncing:
            return
        for k, v in changes.items():
            setattr(self, k, v)
        self._show_fraction()
        self.redraw()

    def _show_fraction(self) -> None:
        """The x % slider only for the metrics that read it."""
        self._fraction.layout.display = None if "x %" in self.metric else "none"

    def _choose_seeds(self, value: Sequence[int]) -> None:
        """The seeds ticked among those offered; a seed not offered now keeps its earlier state."""
        if self._syncing:
            return
        offered = set(self._seeds.options)
        self.chosen_seeds = sorted({s for s in self.chosen_seeds if s not in offered} | set(value))
        self.redraw()

    def _on_factor(self, which: str, factor: str, change) -> None:
        if self._syncing or change["new"] is None:
            return
        self.selection[which] = self._cascade({**self.selection[which], factor: change["new"]})
        self._sync_controls()
        self.redraw()

    def _sync_controls(self) -> None:
        if not hasattr(self, "_controls"):      # static: no controls
            return
        self._syncing = True
        try:
            for which, drops in self._controls.items():
                sel = self.selection[which]
                for i, (f, d) in enumerate(zip(self.factors, drops)):
                    values = self.options(sel, i)
                    d.options = [(value_label(v), v) for v in values]
                    d.value = sel[f]
                    d.layout.display = None if len(values) > 1 or f in ("dataset", "algorithm") else "none"
            self._metric.value = self.metric
            self._fraction.value = round(100 * self.fraction)
            self._show_fraction()
            offered = self.offered_seeds()
            self._seeds.options = offered
            self._seeds.value = tuple(s for s in offered if s in self.chosen_seeds)
        finally:
            self._syncing = False
