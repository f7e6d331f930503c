"""An ipywidgets explorer over finished runs: ``fairfl.explore()`` over the whole run cache,
``fairfl.explore(sweep)`` (or ``sweep.explore()``) over a notebook's sweep.

Two selections, A and B, side by side. Each picks one setting: a value for every factor that
varies among the runs (over the cache: dataset, algorithm and every setting whose value differs
between cached configs, found from the configs; over a sweep: its named factors), the seeds left
free; B starts as A with the first factor that has two values changed, and the seeds offered are
those A and B have. One figure, redrawn in place, as wide as JupyterLab's notebook column: the
chosen metric against rounds for A and B (mean over the chosen seeds, band: ± one std over seeds;
the legend, below, names only what tells A and B apart), A − B, and the distribution of the
clients' final accuracies (accuracies in %, as everywhere); a paper's value where
``fairfl.paper.reported`` has one for the setting. "run it" trains selection A with the changes
typed beside it (``KEY=VALUE …``, as ``fairfl run --set``), for the chosen seeds, through
``fairfl.sweeps.run_many`` with its progress bar, and adds the runs.

Loaded histories stay in memory (``fairfl.index.load_history``), so that a redraw only computes and
draws (``benchmarks/explore_redraw.py`` measures it over a cache of 120 runs).

Where no live frontend draws widgets — papermill, nbval, a notebook opened outside a Jupyter
server — the explorer shows its figure for the first selection and one line of text instead
(``static=True`` forces it, ``static=False`` forces the widgets; by default the widgets are shown
in kernels that a Jupyter server started for a notebook session, which it marks with
``JPY_SESSION_NAME``).
"""
from __future__ import annotations

import io
import json
import os
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from . import metrics
from .errors import ConfigError
from .history import History
from .plotting import plain_log_ticks, round_axis

MISSING = "–"          # the value of a setting a run does not have (an option of another algorithm)
DISTRIBUTION = "per-client accuracy distribution"
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
# settings that never tell runs apart in a way worth a control
_IGNORED = {"checkpoint_every", "seed", "device"}
# the factors that name the method compared (over the cache; in a notebook's sweep): B changes one first
METHOD_FACTORS = ("algorithm", "method")
_INFO_LABELS = {"d_sq": "‖d‖² (Pareto stationarity)", "step_norm2": "‖d‖² of the server step",
                "lambda_max": "largest weight λ", "eta": "server step ηₜ"}


# ----------------------------------------------------------------------------- the runs

@dataclass
class Run:
    factors: dict[str, Any]         # its value of every factor
    seed: int
    config: dict
    load: Callable[[], History | None]


def _label(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def runs_from_cache(root: Path | str | None = None) -> tuple[list[Run], list[str]]:
    """The finished runs of the cache, and the settings that vary among them (dataset, model and
    algorithm first, then the algorithm's options, then the rest by name)."""
    from .index import load_history, scan
    entries = [e for e in scan(root) if e.finished and e.config]
    keys = sorted({k for e in entries for k in e.settings} - _IGNORED)
    varying = [k for k in keys if len({repr(e.settings.get(k, MISSING)) for e in entries}) > 1]
    first = ["dataset", "model", "algorithm"]
    order = [k for k in first if k in varying or k in keys] + \
        sorted((k for k in varying if k not in first), key=lambda k: (not k.startswith("algorithm."), k))
    runs = [Run({k: e.settings.get(k, MISSING) for k in order}, int(e.settings.get("seed", 0)), e.config,
                (lambda e=e: load_history(e))) for e in entries]
    return runs, order


def runs_from_sweep(sweep) -> tuple[list[Run], list[str]]:
    """The runs of a notebook's :class:`fairfl.notebook.Sweep` (failed ones left out), its
    factors except the seed."""
    factors = [f for f in sweep.factors if f != "seed"]
    runs = []
    for point, history in sweep:
        if history is None:
            continue
        seed = point.get("seed", history.config.get("seed", 0))
        runs.append(Run({f: point.get(f, MISSING) for f in factors}, int(seed), history.config,
                        (lambda h=history: h)))
    return runs, factors


# ----------------------------------------------------------------------------- metrics

def _acc(h: History) -> np.ndarray:
    """(evaluations, clients) accuracy in %; a multi-objective run's objectives averaged per client."""
    a = h.acc()
    return 100 * (a.mean(axis=2) if a.ndim == 3 else a)


def _per_eval(fn: Callable[[np.ndarray], float]) -> Callable[[History, float], tuple[np.ndarray, np.ndarray]]:
    def curve(h: History, fraction: float) -> tuple[np.ndarray, np.ndarray]:
        acc = _acc(h)
        return np.asarray(h.eval_rounds, float), np.array([fn(row[np.isfinite(row)], fraction) if np.isfinite(row).any()
                                                           else np.nan for row in acc])
    return curve


def _loss(h: History, fraction: float):
    loss = h.train_losses()
    return np.asarray(h.eval_rounds, float), loss.mean(axis=1) if loss.ndim == 2 else loss


def _per_round(get: Callable[[History], Sequence[float]], scale: float = 1.0):
    def curve(h: History, fraction: float):
        y = scale * np.asarray(get(h), dtype=np.float64)
        y = y.reshape(len(y), -1).mean(axis=1) if y.ndim > 1 else y
        return np.arange(1, len(y) + 1, dtype=float), y
    return curve


def available_metrics(histories: Sequence[History]) -> dict[str, Callable]:
    """The curves these histories can give: accuracy statistics per evaluation, the training
    loss, and per round what each history recorded (improved share, server step, the rule's log)."""
    out: dict[str, Callable] = {
        "mean accuracy (%)": _per_eval(lambda a, f: float(a.mean())),
        "std of client accuracy (points)": _per_eval(lambda a, f: metrics.std(a)),
        "worst x % of clients (%)": _per_eval(lambda a, f: metrics.worst(a, f)),
        "best x % of clients (%)": _per_eval(lambda a, f: metrics.best(a, f)),
        DISTRIBUTION: _per_eval(lambda a, f: float(np.median(a))),
        "averaged training loss": _loss,
    }
    if any(np.isfinite(np.asarray(h.round_improved, float)).any() for h in histories):
        out["improved share (%)"] = _per_round(lambda h: h.round_improved, 100.0)
    if any(len(set(h.round_lr)) > 1 for h in histories):
        out["server learning rate ηₜ"] = _per_round(lambda h: h.round_lr)
    # of what the rules log each round, the quantities the papers discuss, by name: the menu listed every
    # internal key (about 25 over notebook 06's runs: `kept`, `internal_projections`, ...)
    info = sorted({k for h in histories for k in h.info if k in _INFO_LABELS})
    for k in info:
        out[_INFO_LABELS[k]] = _per_round(lambda h, k=k: h.info.get(k, []))
    return out


# ----------------------------------------------------------------------------- the explorer

def _static_default() -> bool:
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


class Explorer:
    """See the module docstring. ``explorer.widget`` is the whole ipywidgets box (live mode);
    ``explorer.redraw()`` draws the current selections and returns the seconds it took."""

    def __init__(self, runs: list[Run], factors: list[str], static: bool | None = None, backend=None,
                 root: Path | str | None = None, sweep=None):
        if not runs:
            raise ConfigError("nothing to explore: the run cache has no finished run"
                              + (f" under {root}" if root else " (run a notebook, or `python -m fairfl run`)"))
        self.runs, self.factors = runs, factors
        self.static = _static_default() if static is None else bool(static)
        self.backend, self.root, self.from_sweep = backend, root, sweep is not None
        self.added: list[Run] = []
        histories = [h for h in (r.load() for r in runs) if h is not None]     # loaded once, kept
        self.metrics = available_metrics(histories)
        self.seeds = sorted({r.seed for r in runs})
        self.selection = {"A": self._first(), "B": self._first(second=True)}
        self.metric, self.fraction, self.chosen_seeds, self.logy = "mean accuracy (%)", 0.1, list(self.seeds), False
        import matplotlib
        from matplotlib.figure import Figure           # not pyplot: no second copy shown by the inline backend
        # As wide as JupyterLab's notebook column, in pixels at the PNG's dpi: shown at its own size,
        # its text is the size it was set in (a wider figure was scaled down, its text with it).
        # The metric on the left over both rows, A − B and the final accuracies on the right.
        # Fixed margins: a layout engine measures every label at each draw and doubled the redraw time.
        self.figure = Figure(figsize=(FIGURE_PX / DPI, HEIGHT), dpi=DPI)
        grid = self.figure.add_gridspec(2, 2, width_ratios=[1.55, 1], left=0.085, right=0.985,
                                        bottom=BOTTOM / HEIGHT, top=1 - 0.32 / HEIGHT, wspace=0.3, hspace=0.62)
        with matplotlib.rc_context(TEXT_SIZES):
            self.axes = [self.figure.add_subplot(grid[:, 0]), self.figure.add_subplot(grid[0, 1]),
                         self.figure.add_subplot(grid[1, 1])]
        self.summary = ""
        self.widget = None                       # set before the controls exist: _build syncs them
        if not self.static:
            self.widget = self._build()

    # -- selections
    def _matching(self, sel: dict[str, Any], upto: int | None = None) -> list[Run]:
        names = self.factors[:upto] if upto is not None else self.factors
        return [r for r in self.runs if all(r.factors.get(f) == sel.get(f) for f in names if f in sel)]

    def _cascade(self, sel: dict[str, Any]) -> dict[str, Any]:
        """Each factor's value kept where runs with the earlier choices have it, else their first."""
        out: dict[str, Any] = {}
        for i, f in enumerate(self.factors):
            values = self.options(out, i)
            out[f] = sel.get(f) if sel.get(f) in values else (values[0] if values else MISSING)
        return out

    def options(self, sel: dict[str, Any], i: int) -> list[Any]:
        """The values factor ``i`` takes among the runs that match the choices before it."""
        return list(dict.fromkeys(r.factors[self.factors[i]] for r in self._matching(sel, i)))

    def _first(self, second: bool = False) -> dict[str, Any]:
        sel = self._cascade({})
        # B: A with another algorithm (a factor "algorithm" or "method") on the same data, else with the
        # first factor that has two values changed; not the last (often an option that changes nothing
        # in the run: A − B = 0), nor the data (notebook 06's default compared FedAvg on two federations)
        if second:
            order = sorted(range(len(self.factors)), key=lambda i: self.factors[i] not in METHOD_FACTORS)
            for i in order:
                values = self.options(sel, i)
                if len(values) > 1:
                    return self._cascade({**sel, self.factors[i]: values[1]})
        return sel

    def select(self, which: str = "A", **factors: Any) -> None:
        """Set selection A or B (``explorer.select("B", eps=0.1)``) and redraw."""
        unknown = set(factors) - set(self.factors)
        if unknown:
            raise ConfigError(f"explore: {', '.join(sorted(unknown))} is not a factor; factors: {', '.join(self.factors)}")
        self.selection[which] = self._cascade({**self.selection[which], **factors})
        self._sync_controls()
        self.redraw()

    def set_metric(self, metric: str, fraction: float | None = None) -> None:
        if metric not in self.metrics:
            raise ConfigError(f"explore: no metric {metric!r}; these runs give: {', '.join(self.metrics)}")
        self.metric = metric
        if fraction is not None:
            self.fraction = fraction
        self._sync_controls()
        self.redraw()

    def selected(self, which: str) -> list[tuple[Run, History]]:
        chosen = set(self.chosen_seeds)
        out = []
        for r in self._matching(self.selection[which]):
            if r.seed in chosen:
                h = r.load()
                if h is not None:
                    out.append((r, h))
        return out

    def differing(self) -> list[str]:
        """The factors whose values differ between selections A and B."""
        a, b = self.selection["A"], self.selection["B"]
        return [f for f in self.factors if a.get(f) != b.get(f)]

    def legend_label(self, which: str) -> str:
        """``which`` with only the factors that tell A and B apart (the rest is in the summary line):
        of those, the ones this selection has (not another algorithm's options) and could have
        chosen otherwise (not the one model of a dataset, nor an option its algorithm's runs share)."""
        sel = self.selection[which]
        parts = [f"{f}={_label(sel[f])}" for f in self.differing()
                 if sel[f] != MISSING and len(self.options(sel, self.factors.index(f))) > 1]
        return f"{which}: {', '.join(parts)}" if parts else which

    def offered_seeds(self) -> list[int]:
        """The seeds that selection A or B has runs for: the ones worth offering."""
        return sorted({r.seed for which in ("A", "B") for r in self._matching(self.selection[which])})

    def describe(self, which: str) -> str:
        sel = self.selection[which]
        parts = [f"{f}={_label(v)}" for f, v in sel.items()
                 if v != MISSING and len(self.options(sel, self.factors.index(f))) > 1 or f in ("dataset", "algorithm")]
        return ", ".join(parts) or "all runs"

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
            acc = np.concatenate([_acc(h)[:n] for _, h in sel], axis=1)       # clients of every seed
            x = np.asarray(sel[0][1].eval_rounds[:n], float)
            lo, hi = np.nanpercentile(acc, 10, axis=1), np.nanpercentile(acc, 90, axis=1)
            ax.fill_between(x, lo, hi, color=color, alpha=0.12, linewidth=0)

    def _distribution(self, ax) -> None:
        values, names = [], []
        for which in ("A", "B"):
            finals = [_acc(h)[-1] for _, h in self.selected(which)]
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
        from .paper import reported
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
                    d.options = [(_label(v), v) for v in values]
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

    # -- run it
    def run_it(self, changes: str | Sequence[str] = "", seeds: Sequence[int] | None = None) -> list[History | None]:
        """Train selection A with ``changes`` (``"rounds=50 algorithm.eps=0.3"``, dotted config
        keys as ``fairfl run --set``) for ``seeds`` (default: the chosen ones) through
        :func:`fairfl.sweeps.run_many`, then add the runs and redraw. Cached runs are loaded."""
        from .config import parse_setting_value, set_dotted
        from .config import ExperimentConfig
        from .sweeps import run_many
        items = changes.split() if isinstance(changes, str) else list(changes)
        template = next((r.config for r in self._matching(self.selection["A"])), None)
        if template is None:
            raise ConfigError("explore: selection A has no run to start from")
        base = json.loads(json.dumps(template))
        for item in items:
            if "=" not in item:
                raise ConfigError(f"explore: a change is KEY=VALUE (e.g. rounds=50, algorithm.eps=0.3), got {item!r}")
            k, v = item.split("=", 1)
            set_dotted(base, k, parse_setting_value(v))
        seeds = list(seeds if seeds is not None else self.chosen_seeds) or [int(base.get("seed", 0))]
        configs = [ExperimentConfig.from_dict({**base, "seed": s}) for s in seeds]   # a bad change is named now
        out = self._progress if self.widget is not None else None
        if out is not None:
            out.clear_output()
            with out:
                print(f"training selection A with {' '.join(items) or 'no change'} for seeds {seeds} …")
                histories = run_many(configs, backend=self.backend, root=self.root, keep_diverged=True)
        else:
            histories = run_many(configs, backend=self.backend, root=self.root, keep_diverged=True)
        self._add(configs, histories, " ".join(items))
        return histories

    def _add(self, configs, histories, change: str) -> None:
        if self.from_sweep:
            if "variant" not in self.factors:
                self.factors.append("variant")
                for r in self.runs:
                    r.factors["variant"] = "as in the notebook"
            for c, h in zip(configs, histories):
                if h is not None:
                    self.runs.append(Run({**self.selection["A"], "variant": change or "as in the notebook"},
                                         c.seed, c.to_dict(), (lambda h=h: h)))
        else:
            self.runs, self.factors = runs_from_cache(self.root)
        self.seeds = sorted({r.seed for r in self.runs} | set(self.seeds))
        histories_all = [h for h in (r.load() for r in self.runs) if h is not None]
        self.metrics = available_metrics(histories_all)
        new = {"variant": change or "as in the notebook"} if self.from_sweep else \
            next(({k: v for k, v in r.factors.items()} for r in self.runs
                  if r.config == {**configs[0].to_dict()}), {})
        self.selection["A"] = self._cascade({**self.selection["A"], **new})
        self.selection["B"] = self._cascade(self.selection["B"])
        if self.widget is not None:              # the same box, its controls made again for the new factors
            self.widget.children = self._build().children
        self.redraw()

    # -- display
    def _ipython_display_(self) -> None:
        from IPython.display import Image, display
        self.redraw()
        if self.static:
            display(Image(data=self.png(), format="png"))
            print(f"explorer (static: no live widget frontend) — {self.summary}")
        else:
            display(self.widget)


def explore(sweep=None, *, root: Path | str | None = None, static: bool | None = None, backend=None) -> Explorer:
    """An explorer over the run cache (``root``: the results folder, default ``$FAIRFL_RESULTS``),
    or over ``sweep`` (a :class:`fairfl.notebook.Sweep`). Display it (the last line of a cell)."""
    if sweep is None:
        runs, factors = runs_from_cache(root)
    else:
        runs, factors = runs_from_sweep(sweep)
    return Explorer(runs, factors, static=static, backend=backend, root=root, sweep=sweep)


__all__ = ["Explorer", "explore", "available_metrics", "runs_from_cache", "runs_from_sweep"]
