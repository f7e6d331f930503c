"""The explorer (fairfl.explore) over a real tiny cache and over a sweep: its factors are found
from the configs, selections cascade, every metric draws, the static output is a figure and a
line of text, and "run it" trains a changed setting through run_many and adds it."""
from __future__ import annotations

import io

import matplotlib
import pytest

import fairfl
from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.studies import plotting
from fairfl.federated.algorithms.fedavg import FedAvg
from fairfl.federated.algorithms.fedmgda import FedMGDAPlus
from fairfl.base.errors import ConfigError
from fairfl.studies.explorer import DISTRIBUTION
from fairfl.studies.notebook import Sweep
from fairfl.runs.sweeps import SerialBackend, run_many

CFG = ExperimentConfig(dataset="adult", model="logreg",
                       partition=PartitionSpec("attribute", num_clients=2, attribute_values=(0, 1), split=None),
                       local=LocalTraining(epochs=1, batch_size=500, lr=0.1), rounds=2, clients_per_round=2,
                       eval_every=1)
CONFIGS = [CFG.replace(algorithm=FedMGDAPlus(eps=e), seed=s) for e in (0.1, 1.0) for s in (0, 1)] + \
          [CFG.replace(algorithm=FedAvg(), seed=0)]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("explore")
    run_many(CONFIGS, backend=SerialBackend(), root=root, progress=False)
    return root


def test_factors_come_from_the_configs_and_every_metric_draws(root, capsys):
    ex = fairfl.explore(root=root, static=True)
    assert ex.factors[:3] == ["dataset", "model", "algorithm"] and "algorithm.eps" in ex.factors
    assert "local.lr" not in ex.factors                       # the same in every run
    assert ex.selection["A"]["algorithm.eps"] != ex.selection["B"]["algorithm.eps"]
    ex.select("B", algorithm="fedavg")
    assert ex.selection["B"]["algorithm.eps"] == "–" and len(ex.selected("B")) == 1 and len(ex.selected("A")) == 2
    for metric in ex.metrics:
        ex.set_metric(metric)
        assert ex.png().startswith(b"\x89PNG")
    with pytest.raises(ConfigError, match="not a factor"):
        ex.select("A", epsilon=0.1)
    ex._ipython_display_()
    assert "explorer (static" in capsys.readouterr().out


def test_run_it_trains_a_changed_setting_and_adds_it(root):
    ex = fairfl.explore(root=root, static=True)
    ex.select("A", algorithm="fedmgda_plus", **{"algorithm.eps": 0.1})
    histories = ex.run_it("algorithm.eps=0.5", seeds=[0])
    assert histories[0] is not None and histories[0].config["algorithm"]["eps"] == 0.5
    assert ex.selection["A"]["algorithm.eps"] == 0.5 and len(ex.selected("A")) == 1
    assert len(fairfl.results(["eps=0.5"], root=root)) == 1
    with pytest.raises(ConfigError):
        ex.run_it("algorithm.eps=7")                          # a bad change is named before training


def test_over_a_sweep_its_factors_are_the_controls(root):
    histories = run_many(CONFIGS[:4], root=root, backend=SerialBackend(), progress=False)
    sweep = Sweep([dict(eps=e, seed=s) for e in (0.1, 1.0) for s in (0, 1)], histories)
    ex = sweep.explore(static=True)
    assert ex.factors == ["eps"] and ex.seeds == [0, 1]
    assert ex.redraw() > 0 and "eps=0.1" in ex.summary and "eps=1" in ex.summary


# ----------------------------------------------------------------------------- what a person sees

def _ipywidgets(widget):
    """Every widget in the box, depth first."""
    yield widget
    for child in getattr(widget, "children", ()):
        yield from _ipywidgets(child)


def test_b_differs_from_a_in_the_first_factor_that_has_two_values(root):
    """Over the cache the first factor with two values is the algorithm: B is the other algorithm,
    not A's algorithm with another option (A − B = 0 where that option changes nothing)."""
    ex = fairfl.explore(root=root, static=True)
    first = next(f for i, f in enumerate(ex.factors) if len(ex.options(ex.selection["A"], i)) > 1)
    assert first == "algorithm"
    assert ex.selection["A"]["algorithm"] != ex.selection["B"]["algorithm"]
    assert ex.differing()[0] == "algorithm"


@pytest.mark.parametrize("notebook_style", [False, True], ids=["matplotlib-style", "notebook-style"])
def test_legend_names_what_tells_a_from_b_below_the_panels_and_no_text_is_cut_off(root, notebook_style):
    """The legend names only the factors that differ between A and B, sits outside every panel,
    and, for every metric, no title, axis label, tick or legend text is cut off at the figure's
    edge or drawn over another one or over a panel, and rounds are ticked in whole numbers; in
    matplotlib's style and in the one a notebook's session sets (plotting.use_style: larger fonts)."""
    with matplotlib.rc_context():
        if notebook_style:
            plotting.use_style()
        _check_legend_and_text(root, all_metrics=notebook_style)


def _check_legend_and_text(root, all_metrics: bool) -> None:
    from figure_text import cut_off, over_other_panels, overlapping, renderer, tick_labels
    ex = fairfl.explore(root=root, static=True)
    ex.select("A", algorithm="fedmgda_plus", **{"algorithm.eps": 0.1})
    ex.select("B", algorithm="fedmgda_plus", **{"algorithm.eps": 1.0})
    ex.redraw()
    labels = [t.get_text() for t in ex.axes[0].get_legend().get_texts()]
    assert labels == ["A: algorithm.eps=0.1 (2 seeds)", "B: algorithm.eps=1 (2 seeds)"]
    ex.select("B", algorithm="fedavg")
    labels = [t.get_text() for t in ex.axes[0].get_legend().get_texts()]
    assert labels == ["A: algorithm=fedmgda_plus, algorithm.eps=0.1 (2 seeds)", "B: algorithm=fedavg (1 seed)"]
    shown = list(ex.metrics) if all_metrics else ["mean accuracy (%)"]
    for metric, logy in [(m, False) for m in shown] + [("averaged training loss", True), (DISTRIBUTION, True)]:
        ex.logy = logy
        ex.set_metric(metric, fraction=0.1)
        assert not cut_off(ex.figure), (metric, cut_off(ex.figure))
        assert not overlapping(ex.figure), (metric, overlapping(ex.figure))
        assert not over_other_panels(ex.figure), (metric, over_other_panels(ex.figure))
        legend = ex.axes[0].get_legend().get_window_extent(renderer(ex.figure))
        assert not [ax for ax in ex.axes if legend.overlaps(ax.get_window_extent())], "the legend covers a panel"
        # two rounds: whole-number ticks (not 0.5, 1.5) on both axes of rounds
        for ax in ex.axes[:2]:
            ticks = [t.get_text() for t in tick_labels(ax.xaxis, draw=False)]
            assert len(ticks) >= 2 and all(t.isdigit() for t in ticks), (metric, ticks)


def test_the_figure_and_the_widget_fit_a_notebook_column(root):
    """JupyterLab's notebook column is about 900 px wide at its default layout (a 1366 px window,
    file browser open): the figure is no wider, so it is shown at its own size, and the boxes of
    controls wrap instead of running off to the right (tests/test_jupyterlab.py measures it in a
    browser)."""
    from PIL import Image
    ex = fairfl.explore(root=root, static=False)
    ex.redraw()
    width, _ = Image.open(io.BytesIO(ex.png())).size
    assert width <= 900, width
    assert ex.widget.layout.width == "100%"
    rows = [b for b in _ipywidgets(ex.widget) if type(b).__name__ == "HBox"]
    assert rows and all(b.layout.flex_flow == "row wrap" for b in rows)


def test_the_x_slider_shows_only_for_the_metrics_that_read_it(root):
    """Whether the metric is picked in its dropdown (as a click does) or by set_metric."""
    ex = fairfl.explore(root=root, static=False)
    controls = {getattr(c, "description", None): c for c in _ipywidgets(ex.widget)}
    slider, dropdown = controls["x %"], controls["metric"]
    for metric in ex.metrics:
        dropdown.value = metric
        assert ex.metric == metric
        assert (slider.layout.display != "none") == metric.startswith(("worst x %", "best x %")), metric
    for metric, shown in (("worst x % of clients (%)", True), ("averaged training loss", False)):
        ex.set_metric(metric)
        assert (slider.layout.display != "none") == shown, metric


def test_the_seeds_offered_are_those_of_the_selections(root):
    """FedAvg has seed 0 only: with FedAvg on both sides, seed 1 is not offered; back to FedMGDA+
    for A, it is, and still ticked."""
    ex = fairfl.explore(root=root, static=False)
    seeds = next(c for c in _ipywidgets(ex.widget) if getattr(c, "description", None) == "seeds")
    ex.select("A", algorithm="fedavg")
    ex.select("B", algorithm="fedavg")
    assert seeds.options == (0,) and seeds.value == (0,)
    ex.select("A", algorithm="fedmgda_plus")
    assert seeds.options == (0, 1) and seeds.value == (0, 1)
    seeds.value = (1,)                                  # as a click does: the figure follows
    assert ex.chosen_seeds == [1] and len(ex.selected("A")) == 1 and ex.selected("B") == []


def test_a_minus_b_compares_runs_of_different_horizons_at_a_round_both_evaluated(root):
    """A trained 3 rounds, B 4 evaluated every 2 (notebook 06 puts federations of 30 and 100 rounds side
    by side): A − B is taken at round 2, the last both evaluated, and says so, instead of A's end against
    B interpolated to round 3, which B never evaluated. Broken variant caught: interpolating B at A's rounds."""
    short, long_ = run_many([CFG.replace(seed=0, rounds=3), CFG.replace(seed=0, rounds=4, eval_every=2)], root=root,
                            backend=SerialBackend(), progress=False)
    ex = Sweep([dict(rounds=3, seed=0), dict(rounds=4, seed=0)], [short, long_]).explore(static=True)
    ex.select("A", rounds=3)
    ex.select("B", rounds=4)
    ex.redraw()
    expected = 100 * (short.mean_acc()[2] - long_.mean_acc()[1])                # both at round 2
    assert f"A − B at round 2, the last both evaluated: {expected:+.4g}" in ex.summary
    ex.select("A", rounds=4)
    ex.redraw()
    assert "A − B at the end: +0" in ex.summary


def test_b_compares_another_method_on_the_same_data_and_the_text_says_what_its_numbers_are(root):
    """A notebook's sweep keyed by federation, then method (notebook 06): B is another method on A's
    federation (it was FedAvg on another federation); the summary names the round and, for the
    distribution, that the value is its median client (it read "last 78.2"); the metric menu offers
    the quantities the rules log by name only (it listed every internal key)."""
    histories = run_many(CONFIGS[:4], root=root, backend=SerialBackend(), progress=False)
    points = [dict(fed=f, method=m, seed=0) for f in ("FMNIST, 3 clients", "Adult") for m in ("FedAvg", "FedMGDA+")]
    ex = Sweep(points, histories).explore(static=True)
    assert ex.factors == ["fed", "method"]
    assert ex.selection["A"]["fed"] == ex.selection["B"]["fed"] and ex.differing() == ["method"]
    ex.set_metric(DISTRIBUTION)
    assert "median client, mean over seeds at round 2:" in ex.summary and "last" not in ex.summary, ex.summary
    ex.set_metric("mean accuracy (%)")
    assert "mean over seeds at round 2:" in ex.summary, ex.summary
    every = fairfl.explore(root=root, static=True)
    logged = {k for r in every.runs for k in r.load().info}
    assert logged - {"d_sq", "step_norm2", "lambda_max", "eta"}, "these runs log no internal key to leave out"
    assert not [m for m in every.metrics if "(per round)" in m or m in logged], list(every.metrics)
