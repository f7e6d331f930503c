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
``fairfl.studies.paper.reported`` has one for the setting. "run it" trains selection A with the changes
typed beside it (``KEY=VALUE …``, as ``fairfl run --set``), for the chosen seeds, through
``fairfl.runs.sweeps.run_many`` with its progress bar, and adds the runs.

Loaded histories stay in memory (``fairfl.runs.index.load_history``), so that a redraw only computes and
draws (``benchmarks/explore_redraw.py`` measures it over a cache of 120 runs).

Where no live frontend draws widgets — papermill, nbval, a notebook opened outside a Jupyter
server — the explorer shows its figure for the first selection and one line of text instead
(``static=True`` forces it, ``static=False`` forces the widgets; by default the widgets are shown
in kernels that a Jupyter server started for a notebook session, which it marks with
``JPY_SESSION_NAME``).

The modules: :mod:`~fairfl.studies.explorer.runs` (the runs and their factors), :mod:`~fairfl.studies.explorer.curves`
(the metrics against rounds), :mod:`~fairfl.studies.explorer.drawing` (the figure), :mod:`~fairfl.studies.explorer.widgets`
(the controls); here, :class:`Explorer` (its selections, "run it") and :func:`explore`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from fairfl.base.errors import ConfigError
from fairfl.runs.history import History
from .curves import DISTRIBUTION, available_metrics  # noqa: F401
from .drawing import BOTTOM, DPI, FIGURE_PX, HEIGHT, TEXT_SIZES, Drawing  # noqa: F401
from .runs import MISSING, Run, runs_from_cache, runs_from_sweep, value_label
from .widgets import Widgets, static_default

# the factors that name the method compared (over the cache; in a notebook's sweep): B changes one first
METHOD_FACTORS = ("algorithm", "method")


# ----------------------------------------------------------------------------- the explorer

class Explorer(Drawing, Widgets):
    """See the module docstring. ``explorer.widget`` is the whole ipywidgets box (live mode);
    ``explorer.redraw()`` draws the current selections and returns the seconds it took."""

    def __init__(self, runs: list[Run], factors: list[str], static: bool | None = None, backend=None,
                 root: Path | str | None = None, sweep=None):
        if not runs:
            raise ConfigError("nothing to explore: the run cache has no finished run"
                              + (f" under {root}" if root else " (run a notebook, or `python -m fairfl run`)"))
        self.runs, self.factors = runs, factors
        self.static = static_default() if static is None else bool(static)
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
        parts = [f"{f}={value_label(sel[f])}" for f in self.differing()
                 if sel[f] != MISSING and len(self.options(sel, self.factors.index(f))) > 1]
        return f"{which}: {', '.join(parts)}" if parts else which

    def offered_seeds(self) -> list[int]:
        """The seeds that selection A or B has runs for: the ones worth offering."""
        return sorted({r.seed for which in ("A", "B") for r in self._matching(self.selection[which])})

    def describe(self, which: str) -> str:
        sel = self.selection[which]
        parts = [f"{f}={value_label(v)}" for f, v in sel.items()
                 if v != MISSING and len(self.options(sel, self.factors.index(f))) > 1 or f in ("dataset", "algorithm")]
        return ", ".join(parts) or "all runs"

    # -- run it
    def run_it(self, changes: str | Sequence[str] = "", seeds: Sequence[int] | None = None) -> list[History | None]:
        """Train selection A with ``changes`` (``"rounds=50 algorithm.eps=0.3"``, dotted config
        keys as ``fairfl run --set``) for ``seeds`` (default: the chosen ones) through
        :func:`fairfl.runs.sweeps.run_many`, then add the runs and redraw. Cached runs are loaded."""
        from fairfl.runs.config import parse_setting_value, set_dotted
        from fairfl.runs.config import ExperimentConfig
        from fairfl.runs.sweeps import run_many
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
    or over ``sweep`` (a :class:`fairfl.studies.notebook.Sweep`). Display it (the last line of a cell)."""
    if sweep is None:
        runs, factors = runs_from_cache(root)
    else:
        runs, factors = runs_from_sweep(sweep)
    return Explorer(runs, factors, static=static, backend=backend, root=root, sweep=sweep)


__all__ = ["Explorer", "explore", "available_metrics", "runs_from_cache", "runs_from_sweep"]
