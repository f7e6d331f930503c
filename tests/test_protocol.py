"""The one-protocol machinery (``fairfl.protocol``) on hand-made numbers: the choice reads the
validation splits only; the sign-flip p-values and intervals are the exact ones, stay inside the
metric's range and agree with each other; degenerate seeds (all equal, one, NaN) give what they
should; Holm, Benjamini–Hochberg and the detectable difference on textbook numbers; three-valued
verdicts (non-inferiority tested as such); equal tuning budgets and the grid-edge rule; the
constant-predictor check; the CSV files."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from fairfl import metrics, protocol
from fairfl.errors import ConfigError
from fairfl.history import History
from fairfl.protocol import (Axis, Claim, Comparison, ValidationView, bounds, benjamini_hochberg, client_rows,
                             constant_accuracy, detectable_difference, extension, holm, judge, latin_design,
                             local_steps, location, p_greater, p_less, paired, pareto_front, read_table, select,
                             speaks, summary, validation_score, wide, write_table)


def run(val, test=None, seed=0):
    """A finished run with the given final per-client validation and test accuracies (fractions)."""
    return History({"seed": seed}, eval_rounds=[0, 10], test_acc=[[0.1] * len(val), list(test or val)],
                   test_loss=[[2.0] * len(val), [1.0] * len(val)],
                   val_acc=[[0.1] * len(val), list(val)], val_loss=[[2.0] * len(val), [1.5] * len(val)])


# ----------------------------------------------------------------------------- the choice

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
    with pytest.raises(ConfigError, match="unknown criterion 'median'"):
        select(grid, "median")


def test_failed_or_non_finite_points_are_never_chosen():
    grid = {"m": {"failed": [None], "nan": [run([np.nan, 0.9])], "ok": [run([0.1, 0.1])]}}
    assert select(grid) == {"m": "ok"}
    with pytest.raises(ConfigError, match="m: no grid point has a finished run"):
        select({"m": {"failed": [None]}})
    with pytest.raises(ValueError, match="track_validation=True"):
        select({"m": {"a": [History({"seed": 0}, eval_rounds=[1], test_acc=[[0.5]])]}})


# ----------------------------------------------------------------------------- sign-flip tests and intervals

def _brute_p_greater(d, c):
    """P(Σ s_i (d_i − c) ≥ Σ (d_i − c)) over all 2ⁿ sign vectors: the definition."""
    x = np.asarray(d, dtype=float) - c
    hits = sum(np.dot(s, x) >= x.sum() - 1e-12 for s in itertools.product((1, -1), repeat=len(x)))
    return hits / 2 ** len(x)


@pytest.mark.parametrize("d", [[1.5, -0.5, 2.0, 3.25, 0.75], [0.3, 0.3, -0.1, 0.9], [4.0, -2.0, 1.0, 1.0, 0.5, -0.25]])
def test_p_values_are_the_sign_flip_tests_by_enumeration(d):
    """Broken variants caught: counting subsets with < instead of ≤ (ties), forgetting the identity
    pattern (p = 0 where it should be 2⁻ⁿ), the two sides swapped."""
    for c in (-3.0, -0.5, 0.0, 0.3, 1.0, 1.5, 5.0):
        assert p_greater(d, c) == pytest.approx(_brute_p_greater(d, c))
        assert p_less(d, c) == pytest.approx(_brute_p_greater([-v for v in d], -c))


def test_bounds_reject_exactly_where_the_p_values_do():
    """H0: location ≤ c is rejected at level a (p ≤ a) exactly when c < the lower bound, and
    H0: location ≥ c exactly when c > the upper one — the property that lets a verdict be read
    off the interval."""
    rng = np.random.default_rng(3)
    for n in (4, 7, 10):
        d = np.round(rng.normal(1.0, 2.0, n), 2)
        for a in (1 / 2 ** n, 0.01, 0.025, 0.05, 0.2):
            lo, hi = bounds(d, a, (-100, 100))
            for c in np.linspace(d.min() - 1, d.max() + 1, 61):
                if lo > -100:
                    assert (p_greater(d, c) <= a) == (c < lo), (n, a, c)
                if hi < 100:
                    assert (p_less(d, c) <= a) == (c > hi), (n, a, c)


def test_intervals_stay_inside_the_metric_where_student_t_leaves_it():
    """Ten seeds of a worst-client accuracy near 100 %: Student's t reaches above 100 (the
    impossible intervals of the last notebook 06), the sign-flip interval ends at the largest seed."""
    acc = [100, 100, 99.5, 100, 97.0, 100, 100, 98.0, 100, 100]
    _, _, t_high = metrics.seed_interval(acc)
    assert t_high > 100
    mean, lo, hi = location(acc, 0.95, protocol.METRIC_RANGE["worst10"])
    assert 97.0 <= lo <= mean <= hi <= 100.0
    sigma = [0.4, 0.0, 0.1, 0.0, 2.5, 0.0, 0.3, 0.0, 0.0, 0.2]
    assert metrics.seed_interval(sigma)[1] < 0 <= location(sigma, 0.95, protocol.METRIC_RANGE["std"])[1]


def test_degenerate_seeds_all_equal_one_seed_and_nan():
    assert location([70.0] * 10, 0.95, (0, 100)) == (70.0, 70.0, 70.0)          # no spread: a point
    assert p_greater([0.0] * 10, 0.0) == 1.0 and p_less([0.0] * 10, 1.0) == 1 / 2 ** 10
    # one seed: no interval at any usual level (the metric's whole range), never a rejection
    assert location([80.0], 0.95, (0, 100)) == (80.0, 0.0, 100.0)
    assert p_greater([5.0], 0.0) == 0.5
    assert detectable_difference([5.0], 0.05) == math.inf
    # three seeds cannot resolve anything at 2.5 % a side, however consistent (2⁻³ = 12.5 %)
    assert location([1.0, 2.0, 3.0], 0.95, (-100, 100))[1:] == (-100, 100)
    # NaN (a diverged seed) is dropped and counted by paired; a location ignores it
    d, dropped = paired({0: 80.0, 1: np.nan, 2: 75.0, 3: 70.0}, {0: 78.0, 1: 77.0, 2: np.nan, 3: 71.0, 9: 50.0})
    assert d.tolist() == [2.0, -1.0] and dropped == 2
    assert location([np.nan, 60.0, 62.0], 0.5)[0] == 61.0
    assert all(math.isnan(v) for v in location([np.nan, np.nan]))
    with pytest.raises(ConfigError, match="level"):
        location([1.0, 2.0], 1.5)


def test_holm_on_hand_made_p_values_and_its_levels_agree_with_the_adjusted_p():
    p = [0.01, 0.04, 0.03, np.nan, 0.005]
    adjusted, level = holm(p, 0.05)
    # sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 → max-accumulated 0.06
    np.testing.assert_allclose(adjusted, [0.03, 0.06, 0.06, np.nan, 0.02])
    # Holm rejects ranks 1, 2 (0.005 ≤ 0.05/4, 0.01 ≤ 0.05/3) and keeps rank 3: ranks ≥ 3 are held to 0.05/2
    np.testing.assert_allclose(level, [0.05 / 3, 0.05 / 2, 0.05 / 2, np.nan, 0.05 / 4])
    for pv, adj, lev in zip(p, adjusted, level):
        if np.isfinite(pv):
            assert (adj <= 0.05) == (pv <= lev)
    assert np.isnan(holm([np.nan])[0]).all()


def test_benjamini_hochberg_on_hand_made_p_values():
    q = benjamini_hochberg([0.01, 0.04, 0.03, 0.005, np.nan])
    # m = 4: 0.005·4/1 = 0.02, 0.01·4/2 = 0.02, 0.03·4/3 = 0.04, 0.04·4/4 = 0.04
    np.testing.assert_allclose(q, [0.02, 0.04, 0.04, 0.02, np.nan])
    assert (benjamini_hochberg([0.2, 0.5]) >= [0.2, 0.5]).all()


def test_the_detectable_difference_of_a_design():
    from scipy import stats
    d = [1.0, 3.0, 2.0, 4.0, 0.0, 2.0, 3.0, 1.0, 2.0, 2.0]
    expected = (stats.t.ppf(1 - 0.001, 9) + stats.t.ppf(0.8, 9)) * np.std(d, ddof=1) / np.sqrt(10)
    assert detectable_difference(d, 0.001) == pytest.approx(expected)
    assert detectable_difference([2.0] * 10, 0.001) == 0.0
    assert detectable_difference(d[:5], 0.001) == math.inf          # 2⁻⁵ > 0.001: nothing is detectable


# ----------------------------------------------------------------------------- tables and verdicts

def scores_of(values: dict[str, list[float]], federation="F", track="global", criterion="mean", metric="mean",
              others=None):
    rows = []
    for method, vs in values.items():
        for seed, v in enumerate(vs):
            row = dict(federation=federation, track=track, criterion=criterion, method=method, seed=seed)
            row.update({m: v if m == metric else (others or {}).get(m, 50.0) for m in protocol.REPORTED})
            rows.append(row)
    return pd.DataFrame(rows)


BASE = [70.0, 72.0, 68.0, 71.0, 69.0, 73.0, 70.5, 71.5, 69.5, 70.0]


def test_verdicts_are_three_valued_against_the_margin():
    """Ten seeds. Broken variants caught: a non-inferiority claim passed as "better or tie"
    (−40 with a huge spread was accepted), "not reproduced" where the seeds could not tell, a
    superiority claim called contradicted by a tie the design could not resolve."""
    noisy = [b - 40 + (60 if i % 2 else -60) * 0.9 for i, b in enumerate(BASE)]
    scores = scores_of({"Ref": BASE, "Gain": [b + 3 for b in BASE], "Same": BASE, "Slightly": [b - 0.3 for b in BASE],
                        "Loss": [b - 5 for b in BASE], "Noisy": noisy,
                        "Tie": [b + (2.0 if i % 2 else -2.0) for i, b in enumerate(BASE)]})
    claims = [Claim("gain", (Comparison("Gain", "Ref", "mean"),)),
              Claim("same", (Comparison("Same", "Ref", "mean"),)),
              Claim("tie", (Comparison("Tie", "Ref", "mean", margin=1.0),)),
              Claim("slightly", (Comparison("Slightly", "Ref", "mean", "non-inferiority", 1.0),)),
              Claim("loss", (Comparison("Loss", "Ref", "mean", "non-inferiority", 1.0),)),
              Claim("noisy", (Comparison("Noisy", "Ref", "mean", "non-inferiority", 1.0),))]
    v = judge(claims, scores, ["F"]).set_index("claim")
    assert v.loc["gain", "verdict"] == "supported"
    assert v.loc["same", "verdict"] == "contradicted"          # no gain at all: a gain of 1 point is ruled out
    assert v.loc["tie", "verdict"] == "inconclusive"           # ±2 around 0: neither a gain nor its absence shown
    assert v.loc["slightly", "verdict"] == "supported"         # worse by 0.3 on every seed: within the margin
    assert v.loc["loss", "verdict"] == "contradicted"          # worse by 5 on every seed
    assert v.loc["noisy", "verdict"] == "inconclusive"         # the old "not lower" accepted this
    # each adjusted interval is read the same way as its verdict
    assert v.loc["gain", "adjusted_low"] > 0 and v.loc["loss", "adjusted_high"] < -1
    assert v.loc["slightly", "adjusted_low"] > -1
    assert (v.claim_verdict == v.verdict).all() and (v.paired_seeds == 10).all()
    assert np.isfinite(v.loc["gain", "detectable"]) and v.loc["same", "detectable"] == 0.0


def test_sigma_is_better_lower_and_parts_combine():
    sigma_ref = [10.0, 11.0, 9.5, 10.5, 12.0, 9.0, 10.0, 11.5, 10.0, 10.5]
    frame = pd.concat([scores_of({"Ref": BASE, "Fair": [b + 0.2 for b in BASE]}),
                       scores_of({"Ref": sigma_ref, "Fair": [s - 4 for s in sigma_ref]}, metric="std")])
    frame = frame.groupby(["federation", "track", "criterion", "method", "seed"], as_index=False).agg(
        {"mean": "min", "std": "min", "worst10": "first", "best10": "first"})
    lower = Claim("σ", (Comparison("Fair", "Ref", "std"),))
    both = Claim("σ and mean", (Comparison("Fair", "Ref", "std"), Comparison("Fair", "Ref", "mean")))
    v = judge([lower, both], frame, ["F"])
    assert (v[v.claim == "σ"].verdict == "supported").all()
    assert v[v.claim == "σ"].difference.iloc[0] == pytest.approx(-4.0)        # printed as the method − the other
    # +0.2 on the mean is real but below the 1-point margin: that part is contradicted, and so is the claim
    parts = v[v.claim == "σ and mean"].set_index("metric")
    assert parts.loc["std", "verdict"] == "supported" and parts.loc["mean", "verdict"] == "contradicted"
    assert set(parts.claim_verdict) == {"contradicted"}


def test_holm_makes_a_family_more_demanding_and_mute_federations_are_not_judged():
    """Nine of ten seeds ahead: one claim alone is supported (p = 2/1024); among sixty tests it
    is not. A federation whose models do not beat the constant predictor gets no verdict."""
    nine = [b + (2.0 if i else -0.5) for i, b in enumerate(BASE)]
    one = Claim("nine", (Comparison("Nine", "Ref", "mean"),))
    frame = pd.concat([scores_of({"Ref": BASE, "Nine": nine}, federation=f) for f in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:30]])
    alone = judge([one], frame, ["A"])
    assert alone.verdict.iloc[0] == "supported"
    many = judge([one], frame, list("ABCDEFGHIJKLMNOPQRSTUVWXYZ")[:30])
    assert set(many.verdict) == {"inconclusive"} and many.p_supported.iloc[0] == pytest.approx(2 / 1024)
    mute = judge([one], frame, ["A", "B"], speaking={("B", "global"): False}).set_index("federation")
    assert mute.loc["B", "verdict"] == "not judged" and "constant predictor" in mute.loc["B", "reason"]
    assert mute.loc["A", "verdict"] == "supported"
    with pytest.raises(ConfigError, match="positive number of points"):
        Comparison("A", "B", "mean", margin=0)
    with pytest.raises(ConfigError, match="unknown metric"):
        Comparison("A", "B", "median")


def test_the_exploratory_table_marks_by_false_discovery_rate_and_counts_divergences():
    frame = scores_of({"Ref": BASE, "Gain": [b + 3 for b in BASE], "Tie": [b + (1 if i % 2 else -1) for i, b in enumerate(BASE)],
                       "Lost": [np.nan] * 3 + [b + 3 for b in BASE[3:]]})
    t = summary(frame, {"global": "Ref"})
    mean = t[t.metric == "mean"].set_index("method")
    assert mean.loc["Gain", "mark"] == "▲" and mean.loc["Tie", "mark"] == "=" and mean.loc["Ref", "mark"] == ""
    assert mean.loc["Lost", "diverged"] == 3 and mean.loc["Lost", "paired_seeds"] == 7
    assert mean.loc["Gain", "q"] >= mean.loc["Gain", "p"]
    assert ((t["low"] >= 0) & (t["high"] <= 100)).all()
    w = wide(t[t.metric.isin(["mean", "std"])])
    assert w.loc["Gain", "mean"].endswith("▲") and w.loc["Lost", "diverged"] == "3 of 10"
    m, lo, hi = location(BASE, 0.95, (0, 100))
    assert w.loc["Ref", "mean"] == f"{m:.1f} [{lo:.1f}, {hi:.1f}]" and 68 < lo < m < hi < 73
    with pytest.raises(ConfigError, match="no reference"):
        summary(frame, {"personal": "Ref"})


# ----------------------------------------------------------------------------- grids, budgets, edges

AXES = [Axis("q", (0.1, 1.0, 5.0), below=0.01, above=10.0), Axis("server_lr", (0.5, 1.0, 2.0), 0.25, 4.0),
        Axis("local.lr", (0.05, 0.1, 0.2), 0.025, 0.4)]


def test_every_method_gets_the_same_number_of_configurations_each_value_tried():
    for k in (3, 5):
        design = latin_design(AXES, k, seed=7)
        assert len(design) == k and len({tuple(p.items()) for p in design}) == k
        for a in AXES:
            counts = [sum(p[a.name] == v for p in design) for v in a.values]
            assert max(counts) - min(counts) <= 1 and min(counts) >= k // 3      # every value, as evenly as possible
    assert latin_design(AXES, 3, seed=7) == latin_design(AXES, 3, seed=7)       # declared: one seed, one design
    assert latin_design(AXES[:1], 5, seed=0) == [{"q": 0.1}, {"q": 1.0}, {"q": 5.0}]   # a smaller grid: all of it
    assert latin_design([], 3, seed=0) == [{}]
    # a configuration the method refuses is replaced by an allowed one: the budget stays k
    drawn = latin_design(AXES, 3, seed=7)
    refused = drawn[1]
    design = latin_design(AXES, 3, seed=7, allowed=lambda p: p != refused)
    assert len(design) == 3 and refused not in design and design[0] == drawn[0] and design[1] == drawn[2]
    assert latin_design(AXES[:1], 3, seed=0, allowed=lambda p: p["q"] < 5) == [{"q": 0.1}, {"q": 1.0}]
    with pytest.raises(ConfigError, match="distinct and increasing"):
        Axis("q", (1.0, 0.1))


def test_a_winning_edge_is_extended_once_by_the_declared_step():
    assert extension(AXES, {"q": 5.0, "server_lr": 1.0, "local.lr": 0.05}) == {"q": 10.0, "server_lr": 1.0,
                                                                                 "local.lr": 0.025}
    assert extension(AXES, {"q": 1.0, "server_lr": 1.0, "local.lr": 0.1}) is None      # inside the grid
    bounded = [Axis("alpha", (0.1, 1 / 3, 2 / 3), below=0.0, above=None)]
    assert extension(bounded, {"alpha": 2 / 3}) is None                               # α's own bound
    assert protocol.point_label({"q": 10.0, "server_lr": 1.0}, {"server_lr": "η"}) == "q=10, η=1"


# ----------------------------------------------------------------------------- federations that can speak

def test_the_best_constant_predictor():
    labels = [np.array([0, 0, 1, 2]), np.array([1, 1, 1, 0]), np.array([2, 2])]
    # one class for all: class 1 scores 1/4, 3/4, 0 -> 1/3; class 2: 1/4, 0, 1 -> 5/12; class 0: 1/2, 1/4, 0
    assert constant_accuracy(labels) == pytest.approx(100 * 5 / 12)
    assert constant_accuracy(labels, personal=True) == pytest.approx(100 * (0.5 + 0.75 + 1) / 3)
    one_class = [np.full(10, c) for c in (0, 2, 6)]
    assert constant_accuracy(one_class, personal=True) == 100.0         # no personal model can beat it
    assert speaks(24.7, 16.9) and not speaks(12.5, 12.5) and not speaks(float("nan"), 10.0)
    with pytest.raises(ConfigError, match="no client has any label"):
        constant_accuracy([np.array([])])


# ----------------------------------------------------------------------------- files and per-run rows

def test_tables_carry_their_schema_and_protocol(tmp_path):
    frame = pd.DataFrame({"method": ["FedAvg", "FedFV"], "mean": [80.123456789, np.nan]})
    for name in ("t.csv", "t.csv.gz"):
        path = write_table(frame, tmp_path / name, "summary", "6.2")
        back = read_table(path)
        assert back.attrs == {"kind": "summary", "schema": protocol.SCHEMAS["summary"], "protocol": "6.2"}
        assert back["method"].tolist() == ["FedAvg", "FedFV"] and back["mean"].iloc[0] == pytest.approx(80.1235)
        assert np.isnan(back["mean"].iloc[1])
    first = (tmp_path / "t.csv.gz").read_bytes()
    write_table(frame, tmp_path / "t.csv.gz", "summary", "6.2")
    assert (tmp_path / "t.csv.gz").read_bytes() == first               # no time stamp in the gzip header
    (tmp_path / "plain.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="not a fairfl table"):
        read_table(tmp_path / "plain.csv")
    (tmp_path / "new.csv").write_text("# fairfl table=summary schema=99 protocol=7\na\n1\n")
    with pytest.raises(ConfigError, match="schema 99"):
        read_table(tmp_path / "new.csv")
    with pytest.raises(ConfigError, match="unknown table kind"):
        write_table(frame, tmp_path / "x.csv", "other", "1")


def test_client_rows_and_local_steps():
    h = run([0.5, 0.75], test=[0.25, 1.0])
    rows = client_rows(h)
    assert rows.split.tolist() == ["val", "val", "test", "test"] and rows.accuracy.tolist() == [50, 75, 25, 100]
    assert rows.loss.tolist() == [1.5, 1.5, 1.0, 1.0]
    # two rounds: clients {0, 1} then {1}; client 0 holds 95 rows, client 1 holds 10; batches of 10
    assert local_steps([[0, 1], [1]], [95, 10], epochs=2, batch_size=10) == 2 * 10 + 2 * 1 + 2 * 1
    assert local_steps([[0, 1], [1]], [95, 10], epochs=1, batch_size=None) == 3
    assert local_steps([[0, 1]], [95, 10], epochs=1, batch_size=10, steps=5) == 10
    assert protocol.reported(None)["mean"] != protocol.reported(None)["mean"]        # NaN for a diverged run


def test_pareto_front_on_hand_made_points():
    mean, worst = [80, 82, 78, 82, 70], [60, 55, 65, 55, 50]
    assert pareto_front(mean, worst).tolist() == [True, True, True, True, False]
    std = [5, 9, 3, 9, 10]
    assert pareto_front(mean, std, maximise=(True, False)).tolist() == [True, True, True, True, False]
    assert pareto_front([1], [1]).tolist() == [True]
