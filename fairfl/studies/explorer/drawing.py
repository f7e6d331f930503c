"""The explorer's figure: one matplotlib Figure as wide as JupyterLab's notebook column, with fixed
margins (:data:`FIGURE_PX`, :data:`TEXT_SIZES`), redrawn in place — the metric against rounds for
selections A and B (a paper's value dashed where it has one), A − B at the rounds both evaluated,
the clients' final accuracies — and its one-line summary. :class:`Drawing` is the part of
:class:`fairfl.studies.explorer.Explorer` that draws."""
from __future__ import annotations

import io
import textwrap
import time

import numpy as np

from ..plotting import plain_log_ticks, round_axis
from .curves import DISTRIBUTION, acc_percent

# The figure's width in pixels: JupyterLab's notebook column at its default layout (file browser
# open) is wider in a window of 1366 px or more (1,053 px in tests/test_jupyterlab.py's 1500 px
# window), so the figure is shown at its own size, not scaled down
DPI = 100
FIGURE_PX = 880
HEIGHT, BOTTOM = 4.6, 1.15      # inches: the figure's height, and the room under the panels for the legend
# The text sizes the fixed margins are laid out for, whatever style the notebook set (seaborn's
# "notebook" context, plotting.use_style, makes every font a fifth larger)
TEXT_SIZES = {"font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "xtick.labelsize": 8.5,
              "ytick.labelsize": 8.5, "legend.fontsize": 8}


class Drawing:
    """The drawing methods of :class:`fairfl.studies.explorer.Explorer` (its selections, metric, seeds and
    axes are the explorer's)."""

    # -- drawing
    def _curves(self, which: str):
        """(x, seeds × points) of the metric for selection ``which`` (None when it has no run)."""
        fn = self.metrics[self.metric]
        pairs = [fn(h, self.fraction) for _, h in self.selected(which)]
        if not pairs:
            return None
        n = min(len(x) for x, _ in pairs)
        return pairs[0][0][:n], np.stack([y[:n] for _, y in pairs])

    def redraw(self) -> float:
        """Draw the current selections into the one figure (and the widget's image); seconds taken."""
        import matplotlib
        t0 = time.perf_counter()
        with matplotlib.rc_context(TEXT_SIZES):
            png = self._draw()
        if self.widget is not None:
            self._image.value = png
            self._text.value = self.summary
        self.last_redraw = time.perf_counter() - t0
        return self.last_redraw

    def _draw(self) -> bytes:
        ax_curve, ax_diff, ax_dist = self.axes
        for ax in self.axes:
            ax.clear()
        data, lines = {}, []
        for which, color in (("A", "C0"), ("B", "C1")):
            c = self._curves(which)
            data[which] = c
            if c is None:
                continue
            x, ys = c
            if not ys.size:            # a metric this selection's runs do not record
                continue
            mu = np.nanmean(ys, axis=0)
            label = f"{self.legend_label(which)} ({len(ys)} seed{'s' * (len(ys) != 1)})"
            ax_curve.plot(x, mu, color=color, label=label)
            if len(ys) > 1:
                sd = np.nanstd(ys, axis=0)
                ax_curve.fill_between(x, mu - sd, mu + sd, color=color, alpha=0.2, linewidth=0)
            # what the value is: the metric at the last round drawn (for the distribution, its median client)
            what = "median client, mean over seeds" if self.metric == DISTRIBUTION else "mean over seeds"
            lines.append(f"{which}: {self.describe(which)}, {len(ys)} seed(s), {what} at round {x[-1]:g}: {mu[-1]:.4g}")
            paper = self._paper(which)
            if paper is not None:
                source, value = paper
                ax_curve.axhline(value, color=color, linestyle="--", linewidth=1, label=f"{which}: paper ({source})")
                lines[-1] += f" (paper {value:g}, {source})"
        ax_curve.set_xlabel("round")
        name = self.metric.replace("x %", f"{100 * self.fraction:g} %")
        if self.metric == DISTRIBUTION:
            self._client_bands(ax_curve)
            ax_curve.set_ylabel("client test accuracy (%)")
            ax_curve.set_title("median client, band: 10–90 % of the clients")
        else:
            ax_curve.set_ylabel(name)
            ax_curve.set_title(name)
        if self.logy:
            ax_curve.set_yscale("log")
            plain_log_ticks(ax_curve)
        # below the panels, from the figure's left edge, where it covers neither the curves nor an
        # axis label; labels too long for two columns get one, wrapped to the figure's width
        if ax_curve.has_data():
            handles, labels = ax_curve.get_legend_handles_labels()
            wide = max(map(len, labels)) > 60
            labels = [textwrap.fill(t, 120, subsequent_indent="  ") for t in labels] if wide else labels
            ax_curve.legend(handles, labels, loc="upper left", bbox_to_anchor=(0.01, (BOTTOM - 0.48) / HEIGHT),
                            bbox_transform=self.figure.transFigure, ncols=1 if wide else 2,
                            frameon=False, borderaxespad=0, columnspacing=1.5, handlelength=1.5)
        if data["A"] is not None and data["B"] is not None and data["A"][1].size and data["B"][1].size:
            (xa, ya), (xb, yb) = data["A"], data["B"]
            # at the rounds both evaluated: runs of different horizons or evaluation steps (30 rounds beside 100)
            # would otherwise compare A's end with B interpolated to a round B never evaluated
            common, ia, ib = np.intersect1d(xa, xb, return_indices=True)
            diff = np.nanmean(ya, 0)[ia] - np.nanmean(yb, 0)[ib]
            ax_diff.plot(common, diff, color="C2", marker="o" if len(common) < 3 else None)
            ax_diff.axhline(0, color="0.5", linewidth=0.8)
            if len(common):
                at = "the end" if common[-1] == xa[-1] == xb[-1] else f"round {common[-1]:g}, the last both evaluated"
                lines.append(f"A − B at {at}: {diff[-1]:+.4g}")
        ax_diff.set_title("A − B (means over seeds)")
        ax_diff.set_xlabel("round")
        for ax in (ax_curve, ax_diff):
            round_axis(ax)
        self._distribution(ax_dist)
        self.summary = "; ".join(lines) if lines else "no run matches the selections"
        return self.png()

    def png(self) -> bytes:
        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=DPI, bbox_inches=None)
        return buf.getvalue()

    def _client_bands(self, ax) -> None:
        for which, color in (("A", "C0"), ("B", "C1")):
            sel = self.selected(which)
            if not sel:
                continue
            n = min(len(h.eval_rounds) for _, h in sel)
            acc = np.concatenate([acc_percent(h)[:n] for _, h in sel], axis=1)       # clients of every seed
            x = np.asarray(sel[0][1].eval_rounds[:n], float)
            lo, hi = np.nanpercentile(acc, 10, axis=1), np.nanpercentile(acc, 90, axis=1)
            ax.fill_between(x, lo, hi, color=color, alpha=0.12, linewidth=0)

    def _distribution(self, ax) -> None:
        values, names = [], []
        for which in ("A", "B"):
            finals = [acc_percent(h)[-1] for _, h in self.selected(which)]
            if finals:
                v = np.concatenate(finals)
                values.append(v[np.isfinite(v)])
                names.append(which)
        shown = [(n, v) for n, v in zip(names, values) if v.size]
        if shown:
            pos = np.arange(1, len(shown) + 1)
            if all(v.size > 1 for _, v in shown):
                parts = ax.violinplot([v for _, v in shown], pos, showextrema=False)
                for body, color in zip(parts["bodies"], ("C0", "C1")):
                    body.set_facecolor(color)
                    body.set_alpha(0.3)
            rng = np.random.default_rng(0)          # jitter only: the same picture at every redraw
            for p, (n, v), color in zip(pos, shown, ("C0", "C1")):
                ax.scatter(p + rng.uniform(-0.08, 0.08, v.size), v, s=6, color=color, alpha=0.6)
            ax.set_xticks(pos, [n for n, _ in shown])
        ax.set_title("final client test accuracy (%)")

    def _paper(self, which: str) -> tuple[str, float] | None:
        from ..paper import reported
        sel = self.selected(which)
        if not sel:
            return None
        found = reported(sel[0][0].config)
        if found is None:
            return None
        source, values, fraction = found
        key = {"mean accuracy (%)": "mean", "std of client accuracy (points)": "std"}.get(self.metric)
        if key is None and self.metric.startswith(("worst", "best")) and fraction is not None \
                and abs(fraction - self.fraction) < 1e-9:
            key = self.metric.split()[0]
        if key is None or key not in values:
            return None
        return source, values[key]
