"""save_figure: both formats, atomically, byte-identical when re-plotted, stamped with the style and
the print checks. What a reader sees: every figure function's figure fit for print (a column's
width, text ≥ 7 pt, nothing over anything or cut off, legends outside the data, bars from 0, %
within [0, 100]), the checks themselves catching each broken form, rounds ticked in whole numbers,
a log axis in decimals, one colour and marker per method, small multiples past the palette."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from figure_text import (cut_off, over_other_panels, overlapping, problems, shown_size_px, smallest_text_pt,  # noqa: E402
                         tick_labels, width_class)

from fairfl.studies import plotting  # noqa: E402
from fairfl.base.errors import ConfigError  # noqa: E402
from fairfl.runs.history import History  # noqa: E402
from fairfl.studies.plotting import save_figure  # noqa: E402


def _plot(folder):
    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [2, 0, 1])
    paths = save_figure(fig, "curve", folder)
    plt.close(fig)
    return paths


def test_writes_png_and_pdf_and_no_temporary_files(tmp_path):
    paths = _plot(tmp_path)
    assert sorted(p.name for p in paths) == ["curve.pdf", "curve.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curve.pdf", "curve.png"]
    assert {p.suffix: p.read_bytes()[:4] for p in paths} == {".png": b"\x89PNG", ".pdf": b"%PDF"}


def test_replotting_the_same_figure_gives_the_same_pdf(tmp_path, monkeypatch):
    # two plots at different times (matplotlib dates PDFs by SOURCE_DATE_EPOCH when set)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    first = next(p for p in _plot(tmp_path) if p.suffix == ".pdf").read_bytes()
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1800000000")
    again = next(p for p in _plot(tmp_path) if p.suffix == ".pdf").read_bytes()
    assert again == first


def test_accuracy_distribution_is_the_same_figure_for_the_same_results(tmp_path):
    """The strip's jitter comes from numpy's global generator: whatever its state, the same
    accuracies give the same PNG, and the caller's generator is left where it was."""
    from fairfl.studies.plotting import accuracy_distribution
    acc = {"FedAvg": np.linspace(0.40, 0.90, 100), "FedAvg-n": np.linspace(0.35, 0.95, 100)}
    pngs = []
    for i, seed in enumerate((1, 2)):
        np.random.seed(seed)
        fig, ax = plt.subplots()
        accuracy_distribution(acc, ax=ax)
        after = np.random.random()
        np.random.seed(seed)
        assert after == np.random.random()                 # the caller's generator did not move
        pngs.append(next(p for p in save_figure(fig, f"dist{i}", tmp_path) if p.suffix == ".png").read_bytes())
        plt.close(fig)
    assert pngs[0] == pngs[1]


# ----------------------------------------------------------------------------- what a reader sees

# JupyterLab's notebook column at its default layout (a 1366 px window, file browser open), in
# pixels; tests/test_jupyterlab.py measures the explorer's fit in it
COLUMN_PX = 900
FMNIST = ["T-shirt", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


@pytest.fixture
def style():
    """The notebooks' style (plotting.use_style), undone afterwards."""
    with matplotlib.rc_context():
        plotting.use_style()
        yield
    plt.close("all")


def _history(rounds: int, acc: float, loss0: float, seed: int = 0, clients: int = 100) -> History:
    """A run of ``rounds`` rounds evaluated every round: the clients' accuracy rising to ``acc``
    (fractions, as a run records them), the training loss falling from ``loss0`` by two thirds."""
    rng = np.random.default_rng(seed)
    steps = np.linspace(0, 1, rounds + 1)
    test_acc = [np.clip(0.1 + (acc - 0.1) * s + 0.05 * rng.standard_normal(clients), 0, 1).tolist() for s in steps]
    return History(config={}, eval_rounds=list(range(rounds + 1)), test_acc=test_acc,
                   train_loss=(loss0 * (1 - 2 / 3 * steps)).tolist(), round_lr=[1.0] * rounds,
                   round_improved=[0.5] * rounds)


def _short_runs(rounds: int = 2) -> dict[str, list[History]]:
    return {"FedAvg": [_history(rounds, 0.8, 2.3, s) for s in (0, 1)],
            "FedAvg-n": [_history(rounds, 0.7, 2.1, s) for s in (2, 3)]}


def test_round_axes_have_whole_number_ticks_on_short_runs(style):
    """Two rounds: ticks 0, 1, 2, not 0.5 and 1.5."""
    runs = _short_runs(2)
    fig, axes = plt.subplots(1, 3)
    plotting.curves(runs, "mean_acc", ax=axes[0])
    plotting.curves(runs, "train_loss", ax=axes[1], logy=True)
    plotting.improved_share(runs, ax=axes[2])
    for ax in axes:
        ticks = [t.get_text() for t in tick_labels(ax.xaxis)]
        assert len(ticks) >= 2 and all(t.isdigit() for t in ticks), ticks


def test_tour_curves_panels_neither_collide_nor_write_powers_of_ten(style):
    """notebooks/00_tour's curves (plotting.accuracy_and_loss): no text over another text or over
    a neighbouring panel (the log panel's y-label reached into the middle one, its title into the
    suptitle), nothing cut off, and the log panel's ticks are decimals (0.8, 2), not 2×10⁰."""
    fig = plotting.accuracy_and_loss(_short_runs(2), "Fashion-MNIST, label shards, CNN (FedMGDA+ Table 3), "
                                                     "p = 0.05, mean ± std over 2 seed(s)")
    assert not overlapping(fig), overlapping(fig)
    assert not over_other_panels(fig), over_other_panels(fig)
    assert not cut_off(fig), cut_off(fig)
    log_ticks = [t.get_text() for t in tick_labels(fig.axes[2].yaxis)]
    assert len(log_ticks) >= 2, log_ticks
    for t in log_ticks:
        float(t.replace("−", "-"))            # "0.8", "2": a plain number (not "$\\mathdefault{2\\times10^{0}}$")


def test_accuracy_is_in_percent_in_curves_and_violins(style):
    runs = _short_runs(2)
    fig, (a, b) = plt.subplots(1, 2)
    plotting.curves(runs, "mean_acc", ax=a)
    assert a.get_ylabel().endswith("(%)")
    expected = 100 * np.mean([h.mean_acc() for h in runs["FedAvg"]], axis=0)
    np.testing.assert_allclose(a.get_lines()[0].get_ydata(), expected)
    final = {name: np.concatenate([h.final_acc() for h in hs]) for name, hs in runs.items()}
    plotting.accuracy_distribution(final, ax=b)
    assert b.get_ylabel().endswith("(%)") and 50 < b.get_ylim()[1] <= 110
    with pytest.raises(ValueError, match="fractions"):
        plotting.accuracy_distribution({k: 100 * v for k, v in final.items()})


def test_partition_heatmaps_are_readable_in_a_notebook_column(style):
    """Four client × label heatmaps with Fashion-MNIST's class names: their smallest text is at
    least 9 screen pixels high when JupyterLab fits the figure into its column (in one row of
    20 inches it was scaled to 7), and no label is cut off or drawn over another."""
    rng = np.random.default_rng(0)
    counts = {f"{name}: 100 clients": rng.integers(0, 120, size=(100, 10)) for name in
              ("iid", "label shards (5 per client)", "Dirichlet(β = 0.3)")}
    counts["one class per client (FedFV): 3 clients"] = np.eye(3, 10, dtype=int) * 6000
    fig = plotting.partitions(counts, class_names=FMNIST, max_clients=30,
                              title="Fashion-MNIST: training samples per client and label (first 30 clients)")
    assert shown_size_px(fig, COLUMN_PX) >= 9, shown_size_px(fig, COLUMN_PX)
    assert not overlapping(fig), overlapping(fig)
    assert not over_other_panels(fig), over_other_panels(fig)
    assert not cut_off(fig), cut_off(fig)


def test_thirteen_methods_become_small_multiples_and_a_heat_map(style):
    """Notebook 04's 13 methods: drawn as lines in one panel they tangled into one band (14 jagged
    lines of improved participants over each other). Now one panel per method, its curve in one
    colour with the reference (FedAvg) dashed behind it, and the improved share as a heat map with
    one row per method; one legend, below, fit for print."""
    runs = _flat_runs(13, rounds=60)
    fig = plotting.convergence(runs, "thirteen methods")
    _fit_for_print(fig)
    panels = [ax for ax in fig.axes if ax.get_title()]
    titles = [ax.get_title().replace("\n", " ") for ax in panels]
    assert titles[:13] == ["FedAvg (reference)"] + [f"method {i}" for i in range(1, 13)], titles
    for ax in panels[1:13]:            # every method's panel holds it and the reference, nothing else
        labels = [line.get_label() for line in ax.get_lines()]
        assert labels == ["FedAvg (reference), mean over seeds", "the panel's method, mean over seeds"], labels
    heat = [ax for ax in fig.axes if ax.images]
    assert len(heat) == 1 and heat[0].images[0].get_array().shape[0] == 13
    assert [t.get_text() for t in heat[0].get_yticklabels()] == list(runs)
    assert len([lg for sub in [fig, *fig.subfigs] for lg in sub.legends]) == 1
    assert all(ax.get_legend() is None for ax in fig.axes)


# ----------------------------------------------------------------------------- fit for print

def _fit_for_print(fig):
    """Every rule of fairfl.base.figure_checks: a column's width, text ≥ 7 pt, nothing over anything,
    nothing cut off, legends off the panels, bars from 0, % within [0, 100]."""
    found = problems(fig)
    assert not found, found


def _flat_runs(n: int, rounds: int = 30, clients: int = 3, seeds: int = 2, reference: str = "FedAvg"):
    names = [reference] + [f"method {i}" for i in range(1, n)]
    return {name: [_history(rounds, 0.5 + 0.03 * i, 2.0, 10 * i + s, clients=clients) for s in range(seeds)]
            for i, name in enumerate(names)}


def _bars_fig():
    fig, ax = plotting.figure(height=2.6)
    methods = ["FedAvg", "FedProx (μ=0.01)", "q-FedAvg (q=0.5)", "q-FedAvg (q=2)", "FedMGDA+", "FedAvg-n", "MGDA-Prox"]
    plotting.grouped_bars(ax, methods, {"no attack": (np.linspace(65, 75, 7), np.full(7, 1.0)),
                                        "scaled ×10": (np.linspace(35, 99.5, 7), np.full(7, 2.0))},
                          colors={"no attack": plotting.PALETTE[0], "scaled ×10": plotting.PALETTE[1]}, percent=True)
    ax.tick_params(axis="x", labelrotation=20)
    ax.set_ylabel("average user test accuracy (%)")
    plotting.figure_legend(fig)
    return fig


def _table3_fig():
    """Notebook 03's Table 3: 12 methods × 3 clients' bars across, the paper's dashes, two models."""
    methods = ["FedAvg", "AFL (η_λ=0.01)", "AFL (η_λ=0.1)", "AFL (η_λ=0.5)", "q-FedAvg (q=5)", "q-FedAvg (q=15)",
               "FedMGDA+ (ε=0.05)", "FedMGDA+ (ε=0.1)", "FedMGDA+ (ε=1)", "FedFV (α=0)", "FedFV (α=1/3)", "FedFV (α=2/3)"]
    clients = plotting.method_styles(["shirt", "pullover", "T-shirt"])
    rng = np.random.default_rng(0)
    fig, axes = plotting.figure(1, 2, height=0.3 * len(methods) + 1.0, squeeze=False, sharey=True)
    for ax, model in zip(axes[0], ("mlp2", "logreg")):
        plotting.grouped_bars(ax, methods, {c: (rng.uniform(36, 96, 12), rng.uniform(0, 9, 12)) for c in clients},
                              paper={c: rng.uniform(44, 99, 12) for c in clients},
                              colors={c: s["color"] for c, s in clients.items()}, percent=True, horizontal=True)
        ax.set_xlabel("test accuracy on the client's class (%)")
        ax.set_title(plotting.human(model))
    plotting.figure_legend(fig)
    plotting.suptitle(fig, "FedFV Table 3: bars ours (mean ± std over 3 seeds), dashes the paper's")
    return fig


def _fmol_losses(ks, seeds: int = 3, rounds: int = 20):
    rng = np.random.default_rng(1)
    return lambda iid, k: np.exp(-np.linspace(0, 0.2 * k, rounds + 1))[None, :, None] * 2.3 \
        * rng.uniform(0.9, 1.1, size=(seeds, 1, 2))


def _bias_fig():
    ac = {"no attack": plotting.PALETTE[0], "attacked": plotting.PALETTE[1]}
    panels = {"AFL": {"0": (79.9, 0.5), "0.01": (79.5, 0.8), "0.1": (76.8, 1.8), "1": (68.1, 1.0)},
              "q-FedAvg (q=5)": {"0": (83.1, 0.1), "1000": (57.5, 1.6), "5000": (51.9, 3.4), "10000": (51.9, 3.4)},
              "FedMGDA+": {"0": (77.9, 0.8), "1": (77.9, 0.8), "10000": (77.9, 0.8)},
              "FedAvg": {"0": (83.1, 0.1), "1": (83.1, 0.1), "10000": (83.1, 0.1)}}
    fig = plotting.bar_panels(panels, lambda m, b: ac["no attack" if float(b) == 0 else "attacked"],
                              ylabel="uniform test accuracy (%)", xlabel="bias",
                              patches={"no attack (bias 0)": ac["no attack"], "the PhD client adds the bias": ac["attacked"]},
                              lines={"trained on PhD rows only (51.85 %)": (51.85, {"linestyle": "--"}),
                                     "… on the official code's rows (off by one: 82.01 %)": (82.01, {"linestyle": ":"})})
    plotting.suptitle(fig, "Bias attack by the PhD client on Adult (FedMGDA+ Fig. 2 left), 60 rounds, mean ± std over 3 seeds")
    return fig


def _eps_fig():
    eps = [0.0, 0.01, 0.05, 0.1, 0.5, 1.0]
    label = lambda e: f"ε = {e:g}" + (" (FedAvg)" if e == 0 else " (FedMGDA)" if e == 1 else "")
    styles = plotting.ordinal_styles(eps, label=label)
    rows = {s: {label(e): [_history(200, 0.78 + 0.001 * i, 2.3, 10 * i + k) for k in range(5)] for i, e in enumerate(eps)}
            for s in ("iid", "non-iid")}
    fig = plotting.curves_and_differences(rows, reference=label(0.0), styles=styles)
    plotting.suptitle(fig, "FedMGDA+ ε-interpolation on Fashion-MNIST: mean over 5 seeds, band ± std (paper Fig. 5/6); "
                           "right: minus ε = 0's loss, seed by seed")
    return fig


def _final_vs_fig():
    fig, axes = plotting.figure(2, 2, height=3.9, sharex=True)
    for row, setting in enumerate(("iid", "non-iid")):
        for col, (unit, centre) in enumerate((("training loss", 0.55), ("accuracy (%)", 78.0))):
            plotting.final_vs({setting: {e: centre + 0.01 * np.arange(5) * (1 + i) for i, e in
                                         enumerate((0, 0.01, 0.05, 0.1, 0.5, 1))}}, ax=axes[row, col],
                              xlabel="ε" if row else "", ylabel=unit, styles={setting: {"color": "0.2", "marker": "o"}})
            axes[row, col].set_title(f"{setting}: final {unit.split(' (')[0]}")
    plotting.suptitle(fig, "FedMGDA+ on Fashion-MNIST: the end of every run against ε (mean ± std over 5 seeds)")
    return fig


def _ordering_fig():
    clients = ["shirt", "pullover", "T-shirt"]
    styles = plotting.method_styles(clients)
    fig, axes = plotting.figure(2, 3, height=4.5, squeeze=False, sharex=True, sharey=True)
    for r, model in enumerate(("mlp2", "logreg")):
        for c, order in enumerate(("loss", "random", "reverse")):
            plotting.client_curves([_history(200, 0.9, 2.0, s, clients=3) for s in range(3)], clients, axes[r, c],
                                   styles=styles)
            plotting.panel_title(axes[r, c], f"{plotting.human(model)}, {order} order: final std 12.21")
            axes[r, c].set_ylabel("client test accuracy (%)" if c == 0 else "")
            if r == 0:
                axes[r, c].set_xlabel("")
    plotting.figure_legend(fig)
    plotting.suptitle(fig, "FedFV (α = 0): each client's test accuracy by projection order (mean ± std over 3 seeds; "
                           "FedFV Table 4)")
    return fig


def _step_fig():
    fig, axes = plotting.figure(1, 2, height=2.8)
    axes[0].bar(["Q1", "Q2", "Q3", "Q4"], [100.0, 99.9, 77.3, 24.9], color=plotting.PALETTE[0])
    plotting.bar_axis(axes[0], percent=True)
    axes[0].set_xlabel("quartile of ηₜ / minₖ d̃ₖ, all rounds and seeds")
    axes[0].set_ylabel("improved participants (%)")
    plotting.panel_title(axes[0], "DQN-Fed, eq. (17): where participants get worse (Theorem 4.2 needs ηₜ / minₖ d̃ₖ ≤ 2/L)")
    rng = np.random.default_rng(0)
    runs = {}
    for name in ("DQN-Fed (seed 0)", "DQN-Fed, Alg. 1 reading (seed 0)"):
        h = _history(300, 0.8, 2.0)
        h.info["step_norm2"] = rng.uniform(0.1, 10, 300).tolist()
        h.round_improved = rng.choice([1 / 3, 2 / 3, 1.0], 300).tolist()
        runs[name] = h
    plotting.step_lengths(runs, axes[1], styles=plotting.method_styles(list(runs)))
    plotting.panel_title(axes[1], "length of the server step; × rounds in which some participant got worse")
    plotting.figure_legend(fig)
    return fig


def _fig1a_fig():
    batches = [4, 16, 32, 64]
    label = lambda b: f"b = {b}" + (" (FMGDA)" if b == 64 else " (FSMGDA)")
    fig, axes = plotting.figure(1, 2, height=2.6, sharey=True)
    losses = _fmol_losses(batches)
    plotting.task_curves({label(b): losses(False, b / 8) for b in batches}, axes,
                         styles=plotting.ordinal_styles(batches, label=label, cmap="plasma"))
    plotting.figure_legend(fig)
    plotting.suptitle(fig, "FMOL Fig. 1(a): batch sizes, non-iid, K = 10, M = 10 × n = 64 (mean over 3 seeds, band: min–max)")
    return fig


def _fig1b_fig():
    fig = plotting.fmol_local_steps(_fmol_losses([1, 5, 10, 20]), [1, 5, 10, 20], 1e-2)
    plotting.suptitle(fig, "FMOL Fig. 1(b): FMGDA with K local steps (dotted: the 10⁻² of Table 2; mean over 3 seeds, "
                           "band: min–max)")
    return fig


def _final_by_k_fig():
    methods = ["FMGDA", "MGD", "FSMGDA (b = 16)", "SMGD (b = 16)"]
    rng = np.random.default_rng(2)
    fig, axes = plotting.figure(1, 2, height=2.6, sharey=True)
    plotting.final_by_k({m: rng.uniform(0.05, 2.5, size=(4, 3, 2)) for m in methods}, [1, 5, 10, 20], axes,
                        hollow=["MGD", "SMGD (b = 16)"], ylabel="training loss after 20 rounds",
                        styles=plotting.method_styles(methods))
    plotting.figure_legend(fig)
    plotting.suptitle(fig, "FMOL Fig. 2(a): federated (filled) vs centralised (hollow, same K·T iterations and total "
                           "batch), non-iid (mean ± std over 3 seeds)")
    return fig


def _multimnist_fig():
    rng = np.random.default_rng(3)
    fig = plt.figure(figsize=(plotting.TWO_COLUMNS, 2.4), layout="constrained")
    grid = fig.add_gridspec(2, 8)
    for k in range(8):
        ax = fig.add_subplot(grid[k // 4, k % 4])
        ax.imshow(rng.uniform(size=(28, 28)), cmap="gray_r")
        ax.set_title(f"L={k}, R={9 - k}", fontsize=7)
        ax.axis("off")
    for t, name in enumerate(("L", "R")):
        plotting.partition_heatmap(rng.integers(0, 60, size=(10, 10)), ax=fig.add_subplot(grid[:, 4 + 2 * t: 6 + 2 * t]),
                                   title=f"task {name}: labels per client")
    plotting.suptitle(fig, "MultiMNIST: example pairs (task L: left digit, R: right digit) and the non-iid partition of "
                           "M = 10 clients (seed 0)")
    return fig


def _improved_fig():
    fig, ax = plotting.figure(width=plotting.ONE_COLUMN, height=2.4)
    plotting.improved_share(_flat_runs(3, rounds=60), ax=ax, window=5)
    plotting.figure_legend(fig)
    return fig


def _distribution_fig():
    runs = _short_runs(2)
    fig, ax = plotting.figure(width=plotting.ONE_COLUMN, height=2.6)
    plotting.accuracy_distribution({n: np.concatenate([h.final_acc() for h in hs]) for n, hs in runs.items()}, ax=ax,
                                   styles=plotting.method_styles(list(runs), reference="FedAvg"))
    ax.set_title("client test accuracy after 2 rounds (all seeds)")
    return fig


def _partitions_fig():
    rng = np.random.default_rng(0)
    counts = {f"{name}: 100 clients": rng.integers(0, 120, size=(100, 10)) for name in
              ("iid", "label shards (5 per client)", "Dirichlet(β = 0.3)")}
    counts["one class per client (FedFV): 3 clients"] = np.eye(3, 10, dtype=int) * 6000
    return plotting.partitions(counts, class_names=FMNIST, max_clients=30,
                               title="Fashion-MNIST: training samples per client and label (first 30 clients)")


# Each figure function of fairfl.studies.plotting, drawn as its notebook draws it, at the notebook's size and with its
# longest labels (notebook 06's three: on 20 methods and four federations of made-up seeds)
FIGURES = {
    "accuracy_and_loss": lambda: plotting.accuracy_and_loss(
        _short_runs(2), "Fashion-MNIST, label shards, CNN (FedMGDA+ Table 3), p = 0.05; mean ± std over 2 seed(s)"),
    "partitions": _partitions_fig,
    "accuracy_distribution": _distribution_fig,
    "curves_and_differences": _eps_fig,
    "final_vs": _final_vs_fig,
    "bar_panels": _bias_fig,
    "grouped_bars": _bars_fig,
    "grouped_bars_with_paper": _table3_fig,
    "client_curves": _ordering_fig,
    "convergence": lambda: plotting.convergence(_flat_runs(13, rounds=300), "Fashion-MNIST (DQN-Fed Appendix G.1), "
                                                "3 clients, MLP: mean ± std over 3 seeds (FedNL, FedNew: 1; Ditto: each "
                                                "client's personal model)"),
    "step_lengths": _step_fig,
    "task_curves": _fig1a_fig,
    "fmol_local_steps": _fig1b_fig,
    "final_by_k": _final_by_k_fig,
    "partition_heatmap": _multimnist_fig,
    "improved_share": _improved_fig,
    "forest_plot": lambda: _bench_forest()[0][0].figure,
    "tradeoff_paths": lambda: _bench_tradeoff()[0],
    "effect_heatmap": lambda: _bench_heatmap()[0],
}
# what FIGURES covers besides the names above: functions drawn inside another's figure
INSIDE = {"curves": "accuracy_and_loss", "curve_differences": "curves_and_differences", "seed_band": "task_curves",
          "method_panels": "convergence", "improved_heatmap": "convergence"}
NOT_FIGURES = {"use_style", "figure", "method_styles", "ordinal_styles", "figure_legend", "suptitle", "panel_title",
               "percent_axis", "bar_axis", "round_axis", "plain_log_ticks", "human", "save_figure", "figure_stamp",
               "style_of", "markevery"}


def test_every_figure_function_is_checked():
    """A figure function added to fairfl.studies.plotting (any of its modules) without an entry in FIGURES fails here."""
    import importlib
    import inspect
    import pkgutil
    modules = [plotting] + [importlib.import_module(f"{plotting.__name__}.{m.name}")
                            for m in pkgutil.iter_modules(plotting.__path__)]
    public = {n for mod in modules for n, f in vars(mod).items() if inspect.isfunction(f) and f.__module__ == mod.__name__
              and not n.startswith("_")}
    covered = {n.replace("_with_paper", "") for n in FIGURES} | set(INSIDE)
    assert public - NOT_FIGURES - covered == set()


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_figure_is_fit_for_print(style, name):
    """Drawn at its notebook's print size: one or two columns wide, no text under 7 pt, nothing
    over anything or cut off, legends outside the panels, bars from 0, % within [0, 100]."""
    fig = FIGURES[name]()
    assert width_class(fig) is not None, fig.get_size_inches()
    assert smallest_text_pt(fig) >= 7
    _fit_for_print(fig)


# ----------------------------------------------------------------------------- the checks catch what the issue saw

def test_the_checks_catch_each_form_the_committed_figures_had(style):
    """Each rule fails on the form a committed figure had before the print style (so that the tests
    above can fail): a 17-inch figure (01), a legend inside the panel over the bars and a bar axis
    cut at 50 % (02), 5-pt text, % shown past 100, two labels on top of each other."""
    fig, ax = plt.subplots(figsize=(17, 8))
    ax.bar(["AFL", "q-FedAvg"], [79.9, 51.9], label="ours")
    ax.set_ylim(50, 85)
    ax.legend(loc="lower right")
    ax.set_ylabel("uniform test accuracy (%)")
    found = " | ".join(problems(fig))
    assert "17.00 in wide" in found and "bars not from 0" in found and "legend over a panel" in found, found

    fig, ax = plotting.figure(width=plotting.ONE_COLUMN, height=2.0)
    ax.plot([0, 1], [0, 100])
    ax.set_ylim(-3, 104)
    ax.set_ylabel("accuracy (%)")
    ax.set_title("tiny", fontsize=5)
    ax.text(0.5, 50, "one label")
    ax.text(0.5, 50, "one label too")
    found = " | ".join(problems(fig))
    assert "under 7 pt" in found and "% outside [0, 100]" in found and "over each other" in found, found
    assert not problems(_bars_fig())          # and a figure in the print style passes

    # notebook 02's scaling-attack title on one line in a one-column figure: it runs off both edges
    fig, ax = plotting.figure(width=plotting.ONE_COLUMN, height=2.0)
    ax.bar(["no attack", "attacked"], [80, 60])
    ax.set_title("Scaling attack on Fashion-MNIST, p = 0.2, 30 rounds, mean ± std over 3 seed(s) "
                 "(FedMGDA+ Fig. 2 right uses CIFAR-10)")
    found = " | ".join(problems(fig))
    assert "cut off at the edge: 'Scaling attack" in found, found


def test_method_styles_one_colour_and_marker_each_and_small_multiples_past_the_palette():
    styles = plotting.method_styles(["DQN-Fed", "FedAvg", "q-FFL"], reference="FedAvg")
    assert styles["FedAvg"] == {"color": "#000000", "marker": "*"}
    assert len({s["color"] for s in styles.values()}) == 3 and len({s["marker"] for s in styles.values()}) == 3
    first = plotting.method_styles(["a", "b", "c"])
    assert plotting.method_styles(["a", "b"]) == {k: first[k] for k in ("a", "b")}     # the same in every figure
    seven = plotting.method_styles([f"m{i}" for i in range(7)] + ["FedAvg"], reference="FedAvg")
    assert len({s["color"] for s in seven.values()}) == 8
    with pytest.raises(ConfigError, match="small multiples"):
        plotting.method_styles([f"m{i}" for i in range(8)])
    with pytest.raises(ConfigError, match="twice"):
        plotting.method_styles(["a", "a"])
    with pytest.raises(ConfigError, match="reference"):
        plotting.method_styles(["a"], reference="FedAvg")
    with pytest.raises(ConfigError, match="no style for 'c'"):
        plotting.curves({"c": [_history(2, 0.8, 2.3)]}, styles=plotting.method_styles(["a"]))


def test_ordinal_styles_follow_the_order_of_the_factor():
    """ε = 0 … 1 (notebook 01) along viridis: the colours darkest first and each lighter than the
    last, so that the order of ε is the order of lightness."""
    from matplotlib.colors import to_rgb
    eps = [0.0, 0.01, 0.05, 0.1, 0.5, 1.0]
    styles = plotting.ordinal_styles(eps, label="ε = {:g}".format)
    assert list(styles) == [f"ε = {e:g}" for e in eps]
    lightness = [np.dot(to_rgb(s["color"]), [0.299, 0.587, 0.114]) for s in styles.values()]
    assert all(b > a for a, b in zip(lightness, lightness[1:])), lightness
    assert len({s["marker"] for s in styles.values()}) == len(eps)


def test_percent_axis_takes_in_every_shared_panel_and_stays_within_0_and_100(style):
    """Panels that share the accuracy axis: the limits set after the first panel would have cut the
    second's curve at the first's top (60 %); and a band past 100 is not shown past 100."""
    fig, axes = plotting.figure(1, 2, sharey=True)
    for ax, top in zip(axes, (0.6, 0.99)):
        plotting.client_curves([_history(10, top, 2.0, s, clients=3) for s in range(3)], ["a", "b", "c"], ax)
    low, high = axes[0].get_ylim()
    assert high >= max(line.get_ydata().max() for ax in axes for line in ax.get_lines())
    assert 0 <= low and high <= 100


def test_curve_differences_are_seed_paired_and_the_reference_is_zero(style):
    ref = [_history(5, 0.8, 2.0, s) for s in (0, 1)]
    other = [_history(5, 0.8, 2.2, s) for s in (0, 1)]
    fig, ax = plt.subplots()
    plotting.curve_differences({"ref": ref, "other": other}, "ref", ax=ax)
    lines = {line.get_label(): line.get_ydata() for line in ax.get_lines()}
    np.testing.assert_array_equal(lines["ref"], 0.0)
    expected = np.mean([np.subtract(o.train_loss, r.train_loss) for o, r in zip(other, ref)], axis=0)
    np.testing.assert_allclose(lines["other"], expected)
    with pytest.raises(ConfigError, match="same seeds"):
        plotting.curve_differences({"ref": ref, "other": other[:1]}, "ref", ax=ax)


def test_one_figure_legend_replaces_the_panels_legends_and_fits(style):
    """Six panels each with its own legend of the same six entries (notebook 01): one legend,
    each entry once, below the panels, in as many columns as fit, nothing cut off."""
    labels = [f"ε = {e:g}" + (" (FedAvg)" if e == 0 else "") for e in (0, 0.01, 0.05, 0.1, 0.5, 1)]
    fig, axes = plotting.figure(2, 3, height=4.0)
    for ax in axes.flat:
        for i, lab in enumerate(labels):
            ax.plot([0, 1], [i, i + 1], label=lab)
        ax.legend()
    plotting.figure_legend(fig)
    assert all(ax.get_legend() is None for ax in axes.flat)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == labels
    _fit_for_print(fig)


def test_save_figure_stamps_the_png_with_the_style_and_the_checks(tmp_path, style, capsys):
    good = _bars_fig()
    plotting.save_figure(good, "good", tmp_path)
    stamp = plotting.figure_stamp(tmp_path / "good.png")
    assert stamp == {"fairfl-style": plotting.STYLE, "fairfl-size": "6.90 x 2.60 in (two columns)",
                     "fairfl-checks": "ok"}
    from PIL import Image
    with Image.open(tmp_path / "good.png") as image:
        assert image.size == (round(6.9 * plotting.SAVE_DPI), round(2.6 * plotting.SAVE_DPI))   # the printed size
    bad, ax = plt.subplots(figsize=(15, 4))
    ax.plot([0, 1], [0, 1], label="x")
    ax.legend()
    plotting.save_figure(bad, "bad", tmp_path)
    assert "15.00 in wide" in plotting.figure_stamp(tmp_path / "bad.png")["fairfl-checks"]
    assert "figure bad: not fit for print" in capsys.readouterr().out
    plain = tmp_path / "plain.png"
    bad.savefig(plain)
    assert plotting.figure_stamp(plain) == {}


def test_contact_sheet_labels_each_figure_by_what_drew_it(tmp_path, style):
    """scripts/contact_sheet.py reads the stamps: a figure saved by save_figure is "new code",
    one saved by anything else "old code"; the sheet holds a tile for each."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "contact_sheet", Path(__file__).resolve().parent.parent / "scripts" / "contact_sheet.py")
    sheet = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sheet)
    plotting.save_figure(_bars_fig(), "a_new", tmp_path)
    old, ax = plt.subplots(figsize=(12, 4))
    ax.bar(["x"], [60])
    ax.set_ylim(50, 70)
    old.savefig(tmp_path / "b_old.png", dpi=50)
    image, labels = sheet.sheet(sorted(tmp_path.glob("*.png")), columns=2, tile=200)
    assert [(name, kind) for name, kind, _ in labels] == [("a_new.png", "new"), ("b_old.png", "old")]
    assert labels[0][2] == "new code (print-1), 6.90 x 2.60 in (two columns), checks ok"
    assert image.size[0] == 2 * (200 + 12) + 12


# ----------------------------------------------------------------------------- the benchmark's figures (notebook 06)

BENCH_METHODS = ["FedAvg", "FedAvg-n", "FedProx", "FedMGDA", "FedMGDA+", "MGDA-Prox", "q-FedAvg", "AFL",
                 "AFL (averaged iterate)", "FedFV", "TERM", "FedLF", "FedNL", "FedNew", "DQN-Fed",
                 "DQN-Fed (Thm 4.2 safeguard)", "FedHEAL", "FedAvg-FT", "Local-only", "Ditto"]
BENCH_PERSONAL = {"FedAvg-FT", "Local-only", "Ditto"}
BENCH_FEDS = ["FMNIST, 3 clients", "FMNIST, 100 shards", "FMNIST, Dirichlet", "Adult"]


def _bench_scores(n=10):
    """Ten seeds of every method on four federations (no personal track on the first), one
    method far better than the others and one that diverges on some seeds; accuracies near 100 %
    for one method, so that an interval could only leave the range by a bug."""
    import pandas as pd
    rng = np.random.default_rng(0)
    rows = []
    for f in BENCH_FEDS:
        for i, m in enumerate(BENCH_METHODS):
            if m in BENCH_PERSONAL and f == BENCH_FEDS[0]:
                continue
            base = 99.0 if m == "Ditto" else 70 + 3 * np.sin(i)
            for s in range(n):
                mean = float(np.clip(base + rng.normal(0, 2), 0, 100))
                rows.append(dict(federation=f, track="personal" if m in BENCH_PERSONAL else "global", criterion="mean",
                                 method=m, seed=s, mean=np.nan if m == "DQN-Fed" and s % 3 == 0 else mean,
                                 std=abs(10 + 2 * np.cos(i) + rng.normal(0, 1)),
                                 worst10=float(np.clip(mean - 20 + rng.normal(0, 3), 0, 100)), best10=min(100.0, mean + 15)))
    return pd.DataFrame(rows)


REFS = {"global": "FedAvg", "personal": "FedAvg-FT"}


def _texts_at_least(fig, points):
    """Every text the figure draws (ticks, labels, titles, legends, annotations) is at least ``points`` large."""
    import matplotlib.text
    return [t.get_text() for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text().strip()
            and t.get_fontsize() < points - 1e-9]


def _marker_styles(ax):
    """{(colour, marker)} of the drawn markers of a panel's lines."""
    from matplotlib.colors import to_hex
    return {(to_hex(line.get_color()), line.get_marker()) for line in ax.get_lines() if line.get_marker() not in (None, "None", "")}


def _bench_forest():
    from fairfl.studies import protocol
    scores = _bench_scores()
    table = protocol.summary(scores, REFS)
    fed = BENCH_FEDS[1]
    sub = table[(table.federation == fed) & (table.track == "global")]
    styles = plotting.method_styles(BENCH_METHODS, labelled=True)
    g = scores[scores.federation == fed].set_index("seed")
    seeds = {m: {k: (g[g.method == m][k] - g[g.method == "FedAvg"][k]).dropna().tolist() for k in ("mean", "std", "worst10")}
             for m in BENCH_METHODS}
    return plotting.forest_plot(sub, seeds, "FedAvg", BENCH_METHODS, styles), sub, styles


def test_a_forest_of_two_rows_under_the_notebooks_title_keeps_its_rows_apart(style):
    """Notebook 06's personal track has two rows (Local-only, Ditto) and the notebook titles each forest
    figure: in 1.44 in of height the two row labels were drawn over each other (its three committed
    personal forests said so in their stamps)."""
    from fairfl.studies import protocol
    scores = _bench_scores()
    fed, methods = BENCH_FEDS[1], ["FedAvg-FT", "Local-only", "Ditto"]
    table = protocol.summary(scores, REFS)
    sub = table[(table.federation == fed) & (table.track == "personal")]
    g = scores[scores.federation == fed].set_index("seed")
    seeds = {m: {k: (g[g.method == m][k] - g[g.method == "FedAvg-FT"][k]).dropna().tolist()
                 for k in ("mean", "std", "worst10")} for m in methods}
    axes = plotting.forest_plot(sub, seeds, "FedAvg-FT", methods, plotting.method_styles(BENCH_METHODS, labelled=True))
    fig = axes[0].figure
    fig.suptitle(f"{fed}, personal models: paired differences over 10 seeds")
    assert [t.get_text() for t in axes[0].get_yticklabels()] == ["Local-only", "Ditto"]
    assert not overlapping(fig), overlapping(fig)
    assert not cut_off(fig), cut_off(fig)


def test_forest_plot_stays_in_range_shows_the_seeds_and_marks_only_resolved_differences(style):
    """Per federation: every method's paired difference from the reference with its interval and
    its raw seeds; filled exactly where the BH q-value is ≤ 0.05; x inside the range a difference
    of the metric can take; each method in its own (colour, marker); text ≥ 7 pt, none over
    another or cut off."""
    from fairfl.studies import protocol
    axes, sub, styles = _bench_forest()
    fig = axes[0].figure
    assert not overlapping(fig), overlapping(fig)
    assert not cut_off(fig), cut_off(fig)
    assert not _texts_at_least(fig, plotting.MIN_TEXT_PT), _texts_at_least(fig, plotting.MIN_TEXT_PT)
    for ax, metric in zip(axes, ("mean", "std", "worst10")):
        lo, hi = ax.get_xlim()
        assert protocol.difference_range(metric)[0] <= lo < hi <= protocol.difference_range(metric)[1]
        rows = sub[sub.metric == metric].set_index("method")
        for line in ax.get_lines():
            if line.get_marker() in ("o", "s") and len(line.get_xdata()) == 1:
                y = int(round(line.get_ydata()[0]))
                method = [m for m in BENCH_METHODS if m not in ("FedAvg",) and m in rows.index][::-1][y]
                filled = line.get_markerfacecolor() != "white"
                assert filled == bool(rows.loc[method, "q"] <= 0.05), method
                assert (line.get_marker(), line.get_color()) == (styles[method]["marker"], styles[method]["color"])
    shown = [t.get_text() for t in axes[0].get_yticklabels()]
    assert shown == [m for m in BENCH_METHODS if m in set(sub.method) and m != "FedAvg"]


def test_one_extreme_seed_does_not_set_the_forest_axis_and_is_marked_at_its_edge(style):
    """One method with one seed 40 points away: the axis stays on the central seeds (most methods
    readable), that seed is drawn at the edge as a caret in its method's colour."""
    from matplotlib.colors import to_hex

    from fairfl.studies import protocol
    scores = _bench_scores()
    fed = BENCH_FEDS[1]
    wild = (scores.federation == fed) & (scores.method == "FedMGDA") & (scores.seed == 0)
    scores.loc[wild, "mean"] -= 40
    table = protocol.summary(scores, REFS)
    sub = table[(table.federation == fed) & (table.track == "global")]
    styles = plotting.method_styles(BENCH_METHODS, labelled=True, markers=plotting.NON_VERDICT_MARKERS)
    g = scores[scores.federation == fed].set_index("seed")
    seeds = {m: {k: (g[g.method == m][k] - g[g.method == "FedAvg"][k]).dropna().tolist() for k in ("mean", "std", "worst10")}
             for m in BENCH_METHODS}
    axes = plotting.forest_plot(sub, seeds, "FedAvg", BENCH_METHODS, styles)
    lo, hi = axes[0].get_xlim()
    assert lo > min(seeds["FedMGDA"]["mean"]) + 20 and hi - lo < 30
    edge = [line for line in axes[0].get_lines() if line.get_marker() == "<"]
    assert len(edge) == 1 and to_hex(edge[0].get_color()) == to_hex(styles["FedMGDA"]["color"])
    assert edge[0].get_xdata()[0] == lo
    fig = axes[0].figure
    assert not overlapping(fig) and not cut_off(fig)


def _bench_tradeoff():
    import pandas as pd
    styles = plotting.method_styles(BENCH_METHODS, labelled=True, markers=plotting.NON_VERDICT_MARKERS)
    # the design's order (o) zig-zags along the knob; the path follows the knob (along); one diverged point
    order = [2, 0, 3, 1]
    rows = [dict(method=m, order=o, along=float(order[o]), tag=f"{order[o]}·1", mean=60 + 3 * order[o],
                 std=15.0 - order[o], diverged=False, chosen={"mean"} if order[o] == 3 else
                 ({"worst10", "mean-std"} if order[o] == 1 else set())) for m in BENCH_METHODS for o in range(4)]
    rows.append(dict(method=BENCH_METHODS[0], order=4, along=9.0, tag="9·1", mean=np.nan, std=np.nan, diverged=True,
                     chosen=set()))
    return plotting.tradeoff_paths(pd.DataFrame(rows), BENCH_METHODS, styles, title="FMNIST, 100 shards",
                                   knobs={m: "q · lr×" for m in BENCH_METHODS}), styles


def test_tradeoff_paths_follow_a_knob_label_each_point_and_show_what_diverged(style):
    """Each method's path joins its configurations along the knob (not in the design's order), each
    point labelled with its configuration, each criterion's choice ringed; a diverged configuration
    is named (×) under the panel's title; the method markers are not the verdict glyphs ▲ / ▼."""
    fig, styles = _bench_tradeoff()
    panels = [ax for ax in fig.axes if ax.axison]
    assert [ax.get_title().split("\n(")[0].replace("\n", " ") for ax in panels] == BENCH_METHODS
    assert "× 9·1 diverged" in panels[0].get_title() and "diverged" not in panels[1].get_title()
    for ax, m in zip(panels, BENCH_METHODS):
        from matplotlib.colors import to_hex
        path = ax.get_lines()[0]
        assert (to_hex(path.get_color()), path.get_marker()) == (to_hex(styles[m]["color"]), styles[m]["marker"])
        assert list(path.get_xdata()) == [60.0, 63.0, 66.0, 69.0]                     # ordered along the knob
        ringed = {line.get_marker(): list(line.get_xdata()) for line in ax.get_lines()[1:]}
        assert ringed == {"o": [69.0], "^": [63.0], "s": [63.0]}
        assert sorted(t.get_text() for t in ax.texts) == ["0·1", "1·1", "2·1", "3·1"]
    assert 0 <= panels[0].get_xlim()[0] and panels[0].get_xlim()[1] <= 100
    assert 0 <= panels[0].get_ylim()[0] and panels[0].get_ylim()[1] <= 50
    assert not over_other_panels(fig), over_other_panels(fig)      # "DQN-Fed (Thm 4.2 safeguard)" reached its neighbour
    assert not overlapping(fig), overlapping(fig)
    assert not cut_off(fig), cut_off(fig)
    assert not _texts_at_least(fig, plotting.MIN_TEXT_PT)
    # twenty methods, twenty different (colour, marker) pairs, none a triangle
    assert len({(to_hex(s["color"]), s["marker"]) for s in styles.values()}) == len(BENCH_METHODS)
    assert not {s["marker"] for s in styles.values()} & {"^", "v", "<", ">"}


def test_tradeoff_paths_label_a_cluster_of_configurations_each_readable(style):
    """Notebook 06's panels hold configurations that scored alike: up to five three-knob tags within
    a point of each other near a panel's edge printed over each other (17 pairs in its 100-shard
    figure), and some over the next panel. Points at one place share a label, a tag per line; the
    others find a free place around their point, tied to it by a line, inside the figure and off
    the other panels."""
    import pandas as pd
    styles = plotting.method_styles(BENCH_METHODS, labelled=True, markers=plotting.NON_VERDICT_MARKERS)
    rows = []
    for m in BENCH_METHODS:
        # a cluster by the right edge, two of its points at one place, and two points apart
        spots = [(78.4, 14.3), (78.4, 14.3), (77.7, 17.3), (77.6, 19.0), (78.1, 15.1), (60.0, 24.0), (98.0, 9.0)]
        for o, (mean, std) in enumerate(spots):
            rows.append(dict(method=m, order=o, along=float(o), tag=f"0.{o + 1}·0.25·0.5", mean=mean, std=std,
                             diverged=False, chosen={"mean"} if o == 2 else set()))
    fig = plotting.tradeoff_paths(pd.DataFrame(rows), BENCH_METHODS, styles, title="FMNIST, 100 shards",
                                  knobs={m: "μ · η · lr×" for m in BENCH_METHODS})
    import io
    fig.savefig(io.BytesIO(), dpi=150)      # drawn again, as saving does: the panels must not move under the labels
    assert not overlapping(fig), overlapping(fig)[:5]
    assert not over_other_panels(fig), over_other_panels(fig)[:5]
    assert not cut_off(fig), cut_off(fig)[:5]
    for ax in [ax for ax in fig.axes if ax.axison]:
        shown = [t.get_text() for t in ax.texts if t.get_text()]
        assert "0.1·0.25·0.5\n0.2·0.25·0.5" in shown                     # one place, one label
        assert sorted(line for t in shown for line in t.split("\n")) == [f"0.{o + 1}·0.25·0.5" for o in range(7)]


def _bench_heatmap():
    from fairfl.studies import protocol
    table = protocol.summary(_bench_scores(), REFS)
    # the notebook's labels and clients: its longest row label and its federations' own worst-client columns (with
    # a one-line "AFL (averaged iterate) (vs FedAvg (averaged iterate))" and the colour bar at the side, neighbouring
    # cells' numbers ran into each other in notebook 06's figure, 24 pairs)
    return plotting.effect_heatmap(table, BENCH_FEDS, BENCH_METHODS, references=REFS,
                                   labels={"Ditto": "Ditto (vs FedAvg-FT)", "Local-only": "Local-only (vs FedAvg-FT)",
                                           "AFL (averaged iterate)": "AFL (averaged iterate) (vs FedAvg (averaged iterate))"},
                                   clients=dict(zip(BENCH_FEDS, (3, 100, 100, 2)))), table


def test_effect_heatmap_turns_sigma_stars_resolved_cells_and_leaves_references_blank(style):
    fig, table = _bench_heatmap()
    ax = fig.axes[0]
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert "FedAvg" not in rows and "FedAvg-FT" not in rows and "Ditto\nvs FedAvg-FT" in rows
    assert "AFL (averaged iterate)\nvs FedAvg (averaged iterate)" in rows      # the reference on a line of its own
    cells = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
    # the personal track has no row on the 3-client federation (its clients hold one class each)
    assert (rows.index("Local-only\nvs FedAvg-FT"), 0) not in cells and (rows.index("Local-only\nvs FedAvg-FT"), 3) in cells
    # σ is better lower: its sign is turned, so a method with a lower σ shows a positive number
    r = table[(table.federation == BENCH_FEDS[1]) & (table.method == "FedMGDA") & (table.metric == "std")].iloc[0]
    text = cells[(rows.index("FedMGDA"), 4)]
    assert float(text.rstrip("*")) == pytest.approx(-r.difference, abs=0.051) and text.endswith("*") == (r.q <= 0.05)
    assert not overlapping(fig), overlapping(fig)
    assert not cut_off(fig), cut_off(fig)
    boxes = [t.get_window_extent(fig.canvas.get_renderer()) for t in ax.texts]
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:]
                if min(a.x1, b.x1) - max(a.x0, b.x0) > 1 and min(a.y1, b.y1) - max(a.y0, b.y0) > 1]
    assert not _texts_at_least(fig, plotting.MIN_TEXT_PT)


def test_a_text_cut_by_the_canvas_is_found_in_the_saved_file_and_no_committed_figure_has_one(tmp_path):
    """The check the drawn texts' boxes can miss, read from the file a reader sees: ink in the
    outermost pixels of the saved PNG (a title pushed beyond the top by a layout computed at another
    dpi, or drawn by any code). A title placed above the canvas is found there, and said in the PNG's
    stamp; a figure in the print style is clean; and so is every figure committed in figures/."""
    from pathlib import Path
    from fairfl.base.figure_checks import ink_at_edge
    from fairfl.studies.plotting import figure_stamp, save_figure
    fig, ax = plotting.figure(width=plotting.ONE_COLUMN, height=2.0)
    ax.plot([0, 1], [0, 1])
    fig.text(0.5, 1.0, "a title half above the canvas", ha="center", va="center")
    (png, _) = save_figure(fig, "cut", tmp_path)
    assert ink_at_edge(png) == ["top"]
    assert "drawn at the canvas edge (top)" in figure_stamp(png)["fairfl-checks"]
    fig, ax = plotting.figure(width=plotting.ONE_COLUMN, height=2.0)
    ax.plot([0, 1], [0, 1])
    ax.set_title("a title in place")
    (png, _) = save_figure(fig, "fine", tmp_path)
    assert ink_at_edge(png) == [] and figure_stamp(png)["fairfl-checks"] == "ok"
    committed = sorted((Path(__file__).resolve().parent.parent / "figures").glob("*.png"))
    assert committed
    assert {p.name: ink_at_edge(p) for p in committed if ink_at_edge(p)} == {}
