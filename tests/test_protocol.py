"""The one-protocol machinery (``fairfl.protocol``) on hand-made histories: the choice reads the
validation splits only, paired intervals resolve what they should, the Pareto front is the set of
undominated points."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fairfl.history import History
from fairfl.protocol import ValidationView, compare, paired, pareto_front, select, tidy, validation_score, wide


def run(val, test=None, seed=0):
    """A finished run with the given final per-client validation and test accuracies (fractions)."""
    h = History({"seed": seed}, eval_rounds=[0, 10], test_acc=[[0.1] * len(val), list(test or val)],
                val_acc=[[0.1] * len(val), list(val)])
    return h


def test_the_choice_follows_validation_where_test_disagrees():
    grid = {"FedAvg": {0.1: [run([0.9, 0.8], test=[0.2, 0.2])], 1.0: [run([0.5, 0.5], test=[0.99, 0.99])]}}
    assert select(grid) == {"FedAvg": 0.1}


def test_the_choice_never_reads_the_test_split():
    """Runs with no test scores at all (reading them would raise) are chosen between all the same;
    the view the choice sees has no test scores. Broken variant caught: scoring on final_acc()."""
    blind = History({"seed": 0}, eval_rounds=[10], test_acc=[], val_acc=[[0.7, 0.9]])
    other = History({"seed": 0}, eval_rounds=[10], test_acc=[], val_acc=[[0.6, 0.6]])
    with pytest.raises(IndexError):
        blind.final_acc()
    assert select({"m": {"a": [other], "b": [blind]}}) == {"m": "b"}
    view = ValidationView(blind)
    assert not any(hasattr(view, name) for name in ("test_acc", "final_acc", "acc", "mean_acc", "test_loss"))


def test_criteria_average_over_tuning_seeds_and_differ_where_fairness_matters():
    unfair, fair = [run([1.0, 0.5], seed=s) for s in (0, 1)], [run([0.72, 0.72], seed=s) for s in (0, 1)]
    grid = {"m": {"unfair": unfair, "fair": fair}}
    assert select(grid, "mean") == {"m": "unfair"}                  # 0.75 > 0.72
    assert select(grid, "worst10") == {"m": "fair"}
    assert select(grid, "mean-std") == {"m": "fair"}                # 0.75 − 0.25 < 0.72
    assert validation_score(unfair[0], "worst10") == 0.5
    with pytest.raises(ValueError, match="unknown criterion 'median'"):
        select(grid, "median")


def test_failed_or_non_finite_points_are_never_chosen():
    grid = {"m": {"failed": [None], "nan": [run([np.nan, 0.9])], "ok": [run([0.1, 0.1])]}}
    assert select(grid) == {"m": "ok"}
    with pytest.raises(ValueError, match="m: no grid point has a finished run"):
        select({"m": {"failed": [None]}})
    with pytest.raises(ValueError, match="track_validation=True"):
        select({"m": {"a": [History({"seed": 0}, eval_rounds=[1], test_acc=[[0.5]])]}})


def test_paired_intervals_resolve_a_constant_gain_and_call_noise_a_tie():
    ref = {s: run([0.5 + 0.1 * s, 0.5 + 0.1 * s], seed=s) for s in range(3)}
    gain = {s: run([0.55 + 0.1 * s, 0.55 + 0.1 * s], seed=s) for s in range(3)}    # +5 points on every seed
    noise = {s: run([v, v], seed=s) for s, v in zip(range(3), (0.52, 0.58, 0.67))}   # ±2 around the reference
    table = compare({"FedAvg": ref, "gain": gain, "noise": noise, "one": {0: run([0.9, 0.9])}}, reference="FedAvg")
    row = lambda m, metric: table[(table.method == m) & (table.metric == metric)].iloc[0]
    assert row("gain", "mean").difference == pytest.approx(5.0) and row("gain", "mean").resolved == "better"
    assert row("noise", "mean").resolved == "tie"
    assert row("one", "mean").resolved == "—" and row("one", "mean").paired_seeds == 1
    assert row("gain", "std").resolved == "tie"        # σ = 0 in every run of both: the difference is exactly 0
    assert row("FedAvg", "mean")["mean"] == pytest.approx(60.0) and pd.isna(row("FedAvg", "mean").resolved)
    # σ is better lower: a run with a wider spread of clients is "worse"
    spread = {s: run([0.4 + 0.1 * s, 0.6 + 0.1 * s + 0.01 * s], seed=s) for s in range(3)}
    t2 = compare({"FedAvg": ref, "spread": spread}, reference="FedAvg")
    assert t2[(t2.method == "spread") & (t2.metric == "std")].iloc[0].resolved == "worse"
    with pytest.raises(ValueError, match="reference 'FedProx' is not among"):
        compare({"FedAvg": ref}, reference="FedProx")


def test_pareto_front_on_hand_made_points():
    mean, worst = [80, 82, 78, 82, 70], [60, 55, 65, 55, 50]
    assert pareto_front(mean, worst).tolist() == [True, True, True, True, False]
    std = [5, 9, 3, 9, 10]
    assert pareto_front(mean, std, maximise=(True, False)).tolist() == [True, True, True, True, False]
    assert pareto_front([1], [1]).tolist() == [True]


def test_tidy_names_the_federation_and_the_chosen_point():
    ref = {s: run([0.5, 0.6], seed=s) for s in range(2)}
    out = tidy("adult", compare({"FedAvg": ref}, "FedAvg"), {"FedAvg": "server_lr=1"})
    assert list(out.columns[:4]) == ["federation", "algorithm", "hyper_parameters", "metric"]
    assert set(out.federation) == {"adult"} and set(out.hyper_parameters) == {"server_lr=1"}


def test_paired_compares_against_any_method_and_wide_marks_the_verdicts():
    ref = {s: run([0.5 + 0.1 * s, 0.5 + 0.1 * s], seed=s) for s in range(3)}
    gain = {s: run([0.55 + 0.1 * s, 0.45 + 0.1 * s], seed=s) for s in range(3)}     # same mean, σ +5 points
    runs = {"A": ref, "B": gain}
    table = compare(runs, reference="A")
    row = table[(table.method == "B") & (table.metric == "std")].iloc[0]
    assert paired(runs, "B", "A", "std") == {k: row[k] for k in ("paired_seeds", "difference", "difference_low",
                                                                   "difference_high", "resolved")}
    assert paired(runs, "B", "A", "std")["resolved"] == "worse"            # σ is better lower
    assert paired(runs, "A", "B", "std")["resolved"] == "better"
    assert paired(runs, "B", "A", "mean")["resolved"] == "tie"
    with pytest.raises(ValueError, match="unknown metric 'median'"):
        paired(runs, "B", "A", "median")
    with pytest.raises(ValueError, match="'C' is not among the methods"):
        paired(runs, "C", "A", "mean")
    w = wide(table)
    assert list(w.columns) == ["mean", "std", "worst10", "best10"] and list(w.index) == ["A", "B"]
    assert w.loc["B", "std"] == "5.0 ± 0.0 ▼" and w.loc["B", "mean"].endswith(" =")
    assert w.loc["A", "std"] == "0.0 ± 0.0"                                 # the reference is not marked
    one_seed = wide(compare({"A": {0: ref[0]}, "B": {0: gain[0]}}, reference="A"))
    assert one_seed.loc["B", "mean"] == "50.0"                              # no interval, no verdict


def test_the_accuracy_fairness_plot_draws_the_front_of_the_global_models_only():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from fairfl.plotting import accuracy_vs_fairness

    def runs_of(acc):
        return {s: run([a + 0.01 * s for a in acc], seed=s) for s in range(3)}
    runs = {"FedAvg": runs_of([0.9, 0.6]), "Fair": runs_of([0.72, 0.7]), "Worse": runs_of([0.7, 0.5]),
            "Personal": runs_of([0.99, 0.98])}
    table = compare(runs, reference="FedAvg")
    fig, ax = plt.subplots()
    accuracy_vs_fairness(table, "mean", "worst10", ax=ax, off_front=["Personal"])
    line = [l for l in ax.get_lines() if l.get_label() == "Pareto front"][0]
    # the front without the personalised method: FedAvg (mean 76, worst 61) and Fair (72, 71); Worse (61, 51) is
    # dominated, and Personal (99.5, 99) would dominate them all
    np.testing.assert_allclose(line.get_xdata(), [72.0, 76.0], atol=1e-9)
    np.testing.assert_allclose(line.get_ydata(), [71.0, 61.0], atol=1e-9)
    assert sorted(t.get_text() for t in ax.texts) == ["Fair", "FedAvg"]
    fig.canvas.draw()
    plt.close(fig)
