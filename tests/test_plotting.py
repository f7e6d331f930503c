"""save_figure: both formats, atomically, and byte-identical when re-plotted. What a reader sees:
rounds ticked in whole numbers, a log axis in decimals, accuracy in %, no label over another or
cut off, partition heatmaps readable in a notebook column."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from figure_text import cut_off, over_other_panels, overlapping, shown_size_px, tick_labels  # noqa: E402

from fairfl import plotting  # noqa: E402
from fairfl.history import History  # noqa: E402
from fairfl.plotting import save_figure  # noqa: E402


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
    from fairfl.plotting import accuracy_distribution
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


def _history(rounds: int, acc: float, loss0: float, seed: int = 0) -> History:
    """A run of ``rounds`` rounds evaluated every round: 100 clients' accuracy rising to ``acc``
    (fractions, as a run records them), the training loss falling from ``loss0`` by two thirds."""
    rng = np.random.default_rng(seed)
    steps = np.linspace(0, 1, rounds + 1)
    test_acc = [np.clip(0.1 + (acc - 0.1) * s + 0.05 * rng.standard_normal(100), 0, 1).tolist() for s in steps]
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


def test_thirteen_methods_in_the_convergence_figure_look_different_and_hide_no_curve(style):
    """Notebook 04 plots 13 methods: the colour cycle has ten, so the eleventh looked exactly like
    the first; and a legend of 13 entries inside the panels covered the curves. Every series now
    has its own (colour, line style), and one legend below the panels overlaps neither panel."""
    runs = {f"method {i}": [_history(30, 0.5 + 0.03 * i, 2.0, i)] for i in range(13)}
    fig = plotting.convergence(runs, "thirteen methods")
    for ax in fig.axes:
        styles = [(line.get_color(), line.get_linestyle()) for line in ax.get_lines()]
        assert len(styles) == 13 and len(set(styles)) == 13, styles
        assert ax.get_legend() is None
    assert len(fig.legends) == 1 and len(fig.legends[0].get_texts()) == 13
    assert not over_other_panels(fig), over_other_panels(fig)
    assert not overlapping(fig), overlapping(fig)
    assert not cut_off(fig), cut_off(fig)


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


def test_forest_plot_stays_in_range_shows_the_seeds_and_marks_only_resolved_differences(style):
    """Per federation: every method's paired difference from the reference with its interval and
    its raw seeds; filled exactly where the BH q-value is ≤ 0.05; x inside the range a difference
    of the metric can take; each method in its own (colour, marker); text ≥ 7 pt, none over
    another or cut off."""
    from fairfl import protocol
    scores = _bench_scores()
    table = protocol.summary(scores, REFS)
    fed = BENCH_FEDS[1]
    sub = table[(table.federation == fed) & (table.track == "global")]
    styles = plotting.method_styles(BENCH_METHODS)
    g = scores[scores.federation == fed].set_index("seed")
    seeds = {m: {k: (g[g.method == m][k] - g[g.method == "FedAvg"][k]).dropna().tolist() for k in ("mean", "std", "worst10")}
             for m in BENCH_METHODS}
    axes = plotting.forest_plot(sub, seeds, "FedAvg", BENCH_METHODS, styles)
    fig = axes[0].figure
    assert not overlapping(fig), overlapping(fig)
    assert not cut_off(fig), cut_off(fig)
    assert not _texts_at_least(fig, plotting.PRINT_TEXT), _texts_at_least(fig, plotting.PRINT_TEXT)
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


def test_tradeoff_paths_keep_each_methods_style_and_mark_each_criterion(style):
    import pandas as pd
    styles = plotting.method_styles(BENCH_METHODS)
    rows = [dict(method=m, order=o, mean=60 + 3 * o, std=15.0 - o, chosen={"mean"} if o == 3 else
                 ({"worst10", "mean-std"} if o == 1 else set())) for m in BENCH_METHODS for o in range(4)]
    fig = plotting.tradeoff_paths(pd.DataFrame(rows), BENCH_METHODS, styles, title="FMNIST, 100 shards")
    panels = [ax for ax in fig.axes if ax.axison]
    assert [ax.get_title().replace("\n", " ") for ax in panels] == BENCH_METHODS
    for ax, m in zip(panels, BENCH_METHODS):
        from matplotlib.colors import to_hex
        path = ax.get_lines()[0]
        assert (to_hex(path.get_color()), path.get_marker()) == (to_hex(styles[m]["color"]), styles[m]["marker"])
        ringed = {line.get_marker(): list(line.get_xdata()) for line in ax.get_lines()[1:]}
        assert ringed == {"o": [69.0], "^": [63.0], "s": [63.0]}
    assert 0 <= panels[0].get_xlim()[0] and panels[0].get_xlim()[1] <= 100
    assert 0 <= panels[0].get_ylim()[0] and panels[0].get_ylim()[1] <= 50
    assert not over_other_panels(fig), over_other_panels(fig)      # "DQN-Fed (Thm 4.2 safeguard)" reached its neighbour
    assert not overlapping(fig), overlapping(fig)
    assert not cut_off(fig), cut_off(fig)
    assert not _texts_at_least(fig, plotting.PRINT_TEXT)
    # twenty methods, twenty different (colour, marker) pairs
    assert len({(to_hex(s["color"]), s["marker"]) for s in styles.values()}) == len(BENCH_METHODS)


def test_effect_heatmap_turns_sigma_stars_resolved_cells_and_leaves_references_blank(style):
    from fairfl import protocol
    table = protocol.summary(_bench_scores(), REFS)
    fig = plotting.effect_heatmap(table, BENCH_FEDS, BENCH_METHODS, references=REFS,
                                  labels={"Ditto": "Ditto (vs FedAvg-FT)"})
    ax = fig.axes[0]
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert "FedAvg" not in rows and "FedAvg-FT" not in rows and "Ditto (vs FedAvg-FT)" in rows
    cells = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
    # the personal track has no row on the 3-client federation (its clients hold one class each)
    assert (rows.index("Local-only"), 0) not in cells and (rows.index("Local-only"), 3) in cells
    # σ is better lower: its sign is turned, so a method with a lower σ shows a positive number
    r = table[(table.federation == BENCH_FEDS[1]) & (table.method == "FedMGDA") & (table.metric == "std")].iloc[0]
    text = cells[(rows.index("FedMGDA"), 4)]
    assert float(text.rstrip("*")) == pytest.approx(-r.difference, abs=0.051) and text.endswith("*") == (r.q <= 0.05)
    assert not overlapping(fig), overlapping(fig)
    assert not cut_off(fig), cut_off(fig)
    boxes = [t.get_window_extent(fig.canvas.get_renderer()) for t in ax.texts]
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:]
                if min(a.x1, b.x1) - max(a.x0, b.x0) > 1 and min(a.y1, b.y1) - max(a.y0, b.y0) > 1]
    assert not _texts_at_least(fig, plotting.PRINT_TEXT)
