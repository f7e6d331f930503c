"""The one-protocol machinery (``fairfl.studies.protocol``) on hand-made numbers: the choice reads the
validation splits only; the sign-flip p-values and intervals are the exact ones, stay inside the
metric's range and agree with each other; degenerate seeds (all equal, one, NaN) give what they
should; Holm, Shaffer's refinement (against closed testing by brute force) and Benjamini–Hochberg
on textbook numbers; the exact test's power and detectable difference against a brute-force
enumeration of its sign patterns; how many seeds must agree; three-valued verdicts (non-inferiority
tested as such, "supported, below the margin", a method that did not learn kept out); tuning
designs whose knobs never move together, one shared design, their coverage and the per-knob edge
rule; the constant-predictor check; the CSV files, diverged runs in them, identical methods."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from fairfl.federated import metrics
from fairfl.studies import protocol
from fairfl.base.errors import ConfigError
from fairfl.runs.history import History
from fairfl.studies.protocol import (Axis, Claim, Comparison, ValidationView, bounds, benjamini_hochberg, client_rows,
                                     constant_accuracy, detectable_difference, edge_extensions, holm, judge, local_steps,
                                     location, method_design, p_greater, p_less, paired, pareto_front, read_table, select,
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


def _closed_testing(p, keys, alpha):
    """Closed testing with Bonferroni's local tests, by brute force: H_i is rejected when every
    intersection I ∋ i of nulls that can hold together (at most one per key) has min_I p ≤ α/|I|."""
    m = len(p)
    out = []
    for i in range(m):
        ok = True
        for size in range(1, m + 1):
            for subset in itertools.combinations(range(m), size):
                ks = [keys[j] for j in subset if keys[j] is not None]
                if i not in subset or len(ks) != len(set(ks)):
                    continue
                if min(p[j] for j in subset) > alpha / size:
                    ok = False
        out.append(ok)
    return np.array(out)


def test_shaffer_counts_a_part_once_where_its_two_nulls_cannot_both_be_true():
    """Two superiority parts (keys "a", "b": gain ≤ 0 and gain ≥ margin cannot both hold) and one
    test on its own: the first divisor is 3, not Holm's 5; a part counts until both its tests are
    rejected. Its rejections are closed testing's (Bonferroni) on random families, and never fewer
    than Holm's. Broken variants caught: counting a part once after one of its tests is rejected
    (too many rejections: more than closed testing), counting every test (Holm's)."""
    keys = ["a", "a", "b", "b", None]
    assert protocol.possibly_true(keys).tolist() == [3, 3, 2, 2, 1]
    assert protocol.possibly_true(["a", "b", "a", None, "b"]).tolist() == [3, 3, 3, 2, 1]
    p = [0.012, 0.9, 0.015, 0.8, 0.02]
    adj, level = holm(p, 0.05, exclusive=keys)
    # sorted: 0.012 (÷3 steps: 3·0.012 = 0.036), 0.015 (3·0.015 = 0.045), 0.02 (tests left: a, b, None → 3: 0.06)
    np.testing.assert_allclose(adj[[0, 2, 4]], [0.036, 0.045, 0.06])
    np.testing.assert_allclose(level[[0, 2, 4]], [0.05 / 3, 0.05 / 3, 0.05 / 3])
    holm_adj, _ = holm(p, 0.05)
    assert (holm_adj[[0, 2]] > 0.05).all() and (adj[[0, 2]] <= 0.05).all()     # Holm: 0.06, 0.06
    rng = np.random.default_rng(0)
    for _ in range(60):
        parts = int(rng.integers(1, 4))
        keys = [k for j in range(parts) for k in (j, j)] + [None] * int(rng.integers(0, 3))
        p = np.round(rng.uniform(0, 0.06, len(keys)) ** rng.uniform(1, 3), 4).tolist()
        rejected = holm(p, 0.05, exclusive=keys)[0] <= 0.05
        assert not (rejected & ~_closed_testing(p, keys, 0.05)).any(), (p, keys)
        assert (rejected | ~(holm(p, 0.05)[0] <= 0.05)).all(), (p, keys)


def test_benjamini_hochberg_on_hand_made_p_values():
    q = benjamini_hochberg([0.01, 0.04, 0.03, 0.005, np.nan])
    # m = 4: 0.005·4/1 = 0.02, 0.01·4/2 = 0.02, 0.03·4/3 = 0.04, 0.04·4/4 = 0.04
    np.testing.assert_allclose(q, [0.02, 0.04, 0.04, 0.02, np.nan])
    assert (benjamini_hochberg([0.2, 0.5]) >= [0.2, 0.5]).all()


def _brute_power(effect, n, a, draws, seed):
    """The exact test's power by its definition: normal draws from a generator of its own, each
    draw's p-value by enumerating every sign pattern (``_brute_p_greater``), rejected where p ≤ a."""
    rng = np.random.default_rng(seed)
    return float(np.mean([_brute_p_greater(effect + rng.standard_normal(n), 0.0) <= a + 1e-12
                          for _ in range(draws)]))


def test_the_power_of_the_exact_test_against_its_sign_patterns():
    """Unanimity (r = 0) is exact: Φ(δ/σ)ⁿ, and ten seeds at Holm's α/48 need 2.01 σ for 80 %
    (the t-test formula said 1.63 σ, where this test's power is 59 %). r ≥ 1 is simulated; its power
    at the detectable difference is 80 % by an independent brute-force computation (Monte Carlo
    error of the brute force: ±0.03 at 1,000 draws)."""
    from scipy import stats
    c10 = protocol.power_constant(10, 0.05 / 48)
    assert c10.value == pytest.approx(stats.norm.ppf(0.8 ** 0.1)) == pytest.approx(2.0128, abs=1e-4)
    assert protocol.power_at(1.63, 10, 0.05 / 48) == pytest.approx(0.59, abs=0.01)
    assert _brute_power(1.0, 4, 1 / 16, 2000, 5) == pytest.approx(stats.norm.cdf(1.0) ** 4, abs=0.03)
    for n, a in ((5, 2 / 32), (6, 5 / 64), (7, 0.05)):            # r = 1, 4, 5
        assert protocol.rejections_allowed(n, a) >= 1
        c = protocol.power_constant(n, a)
        assert c.low <= c.value <= c.high and c.high - c.low < 0.05 * c.value and "simulated" in c.method
        assert _brute_power(c.value, n, a, 1000, 11) == pytest.approx(0.8, abs=0.04), (n, a)
        assert _brute_power(0.5 * c.value, n, a, 1000, 12) < 0.7
        assert protocol.power_at(c.value, n, a) == pytest.approx(0.8, abs=0.01)
    d = [1.0, 3.0, 2.0, 4.0, 0.0, 2.0, 3.0, 1.0, 2.0, 2.0]
    assert detectable_difference(d, 0.001) == pytest.approx(np.std(d, ddof=1) * c10.value)
    assert detectable_difference([2.0] * 10, 0.001) == 0.0
    assert detectable_difference(d[:5], 0.001) == math.inf          # 2⁻⁵ > 0.001: nothing is detectable
    assert protocol.power_constant(5, 0.01).value == math.inf


def test_how_many_seeds_must_agree():
    """The best case for k dissenters is p = 2ᵏ/2ⁿ (they are the smallest in magnitude), so a
    rejection at level a needs ⌈log₂(1/a)⌉ agreeing seeds whatever n: 10 at α/28 (10 of 10, 10 of
    12, 10 of 16), 9 at α/24 (2⁻⁹ ≤ 0.05/24)."""
    for n, k in ((10, 0), (12, 2), (16, 6)):
        d = [5.0 + i for i in range(n - k)] + [-0.01 * (j + 1) / k for j in range(k)]
        assert p_greater(d, 0.0) == pytest.approx(protocol.best_case_p(n, k)) == pytest.approx(2.0 ** (k - n))
        assert protocol.fewest_agreeing(n, 0.05 / 28) == 10
    assert protocol.fewest_agreeing(12, 0.05 / 24) == 9 and protocol.fewest_agreeing(8, 0.05 / 28) is None
    # a dissenter larger than an agreeing seed costs more than 2ᵏ/2ⁿ
    assert p_greater([5.0] * 11 + [-6.0], 0.0) > protocol.best_case_p(12, 1)
    t = protocol.agreement_table({"cheap": 16, "dear": 10}, 0.05 / 28).set_index("federation")
    assert t.loc["dear", "agree"] == 10 and t.loc["dear", "interval"] == "the seeds' [min, max]"
    assert t.loc["cheap", "agree"] == 10 and "117th smallest" in t.loc["cheap", "interval"]


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
        {"mean": "max", "std": "min", "worst10": "first", "best10": "first"})
    lower = Claim("σ", (Comparison("Fair", "Ref", "std"),))
    both = Claim("σ and mean", (Comparison("Fair", "Ref", "std"), Comparison("Fair", "Ref", "mean")))
    v = judge([lower, both], frame, ["F"])
    assert (v[v.claim == "σ"].verdict == "supported").all()
    assert v[v.claim == "σ"].difference.iloc[0] == pytest.approx(-4.0)        # printed as the method − the other
    # +0.2 on the mean is real but below the 1-point margin: both of its tests reject, and the part and the
    # claim say so (protocol 6.2 called it "contradicted": "supported" above 0 and "contradicted" below 1 both held)
    parts = v[v.claim == "σ and mean"].set_index("metric")
    assert parts.loc["std", "verdict"] == "supported" and parts.loc["mean", "verdict"] == "supported, below the margin"
    assert set(parts.claim_verdict) == {"supported, below the margin"}
    assert parts.loc["mean", "exclusive"] and parts.loc["mean", "agree"] == 10


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


def test_shaffer_resolves_nine_of_ten_where_holm_over_the_same_family_cannot():
    """Nine of ten seeds ahead by 2 points, one behind by 0.5: p = 2/1024 = 0.00195. On 25 federations
    one superiority part each makes 50 tests: Holm's first step is α/50 = 0.001, so nothing; Shaffer
    counts each part once (its nulls gain ≤ 0 and gain ≥ 1 cannot both hold): α/25 = 0.002, and
    every part is supported (its contradicted null stays in, so the divisor stays 25)."""
    nine = [b + (2.0 if i else -0.5) for i, b in enumerate(BASE)]
    one = Claim("nine", (Comparison("Nine", "Ref", "mean"),))
    feds = [f"F{i}" for i in range(25)]
    frame = pd.concat([scores_of({"Ref": BASE, "Nine": nine}, federation=f) for f in feds])
    shaffer = judge([one], frame, feds)
    holm_only = judge([one], frame, feds, shaffer=False)
    assert set(shaffer.verdict) == {"supported"} and set(holm_only.verdict) == {"inconclusive"}
    assert shaffer.strictest_level.iloc[0] == pytest.approx(0.05 / 25)
    assert holm_only.strictest_level.iloc[0] == pytest.approx(0.05 / 50)
    assert (shaffer.agree == 9).all() and shaffer.p_supported.iloc[0] == pytest.approx(2 / 1024)
    # a non-inferiority part's two nulls meet at −margin: it counts twice
    ni = Claim("ni", (Comparison("Nine", "Ref", "mean", "non-inferiority"),))
    assert not ni.parts[0].exclusive and one.parts[0].exclusive
    assert judge([ni], frame, feds[:2]).strictest_level.iloc[0] == pytest.approx(0.05 / 4)


def test_a_method_that_did_not_learn_is_kept_out_of_a_claims_verdict():
    frame = scores_of({"Ref": BASE, "Gain": [b + 3 for b in BASE]})
    claim = Claim("gain", (Comparison("Gain", "Ref", "mean"),))
    v = judge([claim], frame, ["F"], learned={("F", "Gain"): False})
    assert v.verdict.iloc[0] == "not judged" and "Gain did not learn" in v.reason.iloc[0]
    assert judge([claim], frame, ["F"], learned={("F", "Other"): False}).verdict.iloc[0] == "supported"
    t = summary(frame, {"global": "Ref"}, learned={("F", "Gain"): False})
    assert not t[t.method == "Gain"].learned.any() and wide(t[t.metric == "mean"]).loc["Gain", "learned"] == \
        "did not learn"


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


# ----------------------------------------------------------------------------- designs, budgets, edges

SERVER = Axis("server_lr", (0.5, 1.0, 2.0), 0.25, 4.0)
LOCAL = Axis("lr×", (0.5, 1.0, 2.0), 0.25, 4.0)


def _knobs(k):
    """Notebook 06's methods as knob shapes (its quick grid, K = 3, or paper grid, K = 5): the shared
    knobs η and lr× with up to one own knob (FedHEAL's β declared, not tuned), own knob + lr×, own
    knob + η, lr× alone."""
    grid = lambda name: Axis(name, tuple(float(10 ** (i - k // 2)) for i in range(k)))
    server = Axis("server_lr", tuple(0.25 * 2 ** i for i in range(k)))
    local = Axis("lr×", tuple(0.25 * 2 ** i for i in range(k)))
    return {"FedAvg": [server, local], "FedProx": [grid("mu"), server, local], "FedMGDA+": [grid("eps"), server, local],
            "FedHEAL": [grid("tau"), server, local], "Ditto": [grid("lam"), server, local],
            "q-FedAvg": [grid("q"), local], "TERM": [grid("t"), local], "FedNL": [grid("mu"), server],
            "DQN-Fed": [local], "Local-only": [local]}


@pytest.mark.parametrize("k", [3, 5])
def test_no_design_moves_two_knobs_together_and_the_shared_knobs_have_one_design(k):
    """Every method's K configurations: every value of every knob once (Latin), no two knobs with
    |Spearman ρ| = 1 (protocol 6.2's seed 606 gave every two-knob method the diagonal at K = 3), the
    largest |ρ| the best possible (0.5 at K = 3), and the same (η, lr×) points for every method that
    has them — a method with only one of them takes that column. Broken variants caught: one
    generator seeded alike for every axis (the diagonal), a design drawn per method (shared knobs
    differ)."""
    designs = {m: method_design(axes, k) for m, axes in _knobs(k).items()}
    protocol.check_designs(designs)
    shared = protocol.shared_design(k)
    for m, d in designs.items():
        assert len(d.points) == k and d.refused == 0, m
        for a in d.axes:
            assert sorted(p[a.name] for p in d.points) == list(a.values), (m, a.name)      # every value once
        for a, b in itertools.combinations(d.axes, 2):
            assert abs(protocol.spearman(d.columns[a.name], d.columns[b.name])) < 1, (m, a.name, b.name)
        for name, column in zip(protocol.SHARED, shared):
            if name in d.columns:
                assert d.columns[name] == column, (m, name)
        assert d.largest_rho <= (0.5 if k == 3 else 0.3) + 1e-9, (m, d.largest_rho)
    pairs = {(p["server_lr"], p["lr×"]) for p in designs["FedAvg"].points}
    assert all({(p["server_lr"], p["lr×"]) for p in designs[m].points} == pairs
               for m in ("FedProx", "FedMGDA+", "FedHEAL", "Ditto"))
    assert [p["lr×"] for p in designs["q-FedAvg"].points] == [p["lr×"] for p in designs["FedAvg"].points]
    cov = protocol.coverage(designs["FedProx"])
    assert cov["mu"] == f"{k}/{k}" and cov["server_lr × lr×"] == f"{k}/{k * k}" and cov["mu × lr×"] == f"{k}/{k * k}"


def test_a_confounded_design_is_refused_and_the_choice_is_declared_not_drawn():
    """Four knobs at K = 3 cannot avoid |ρ| = 1 (only (0 1 2) and its reorderings exist): the design
    says so and :func:`check_designs` refuses it, naming the knobs; a method whose shared column
    differs from the others' is refused too. The criterion's ties go to the lexicographic first:
    the same design every time, no seed."""
    four = [Axis("tau", (0.1, 0.3, 0.5)), Axis("beta", (0.2, 0.4, 0.6)), SERVER, LOCAL]
    d = method_design(four, 3)
    assert d.largest_rho == 1.0
    with pytest.raises(ConfigError, match="FedHEAL: its design moves .* together"):
        protocol.check_designs({"FedHEAL": d})
    other = method_design([SERVER, LOCAL], 3, shared={"server_lr": (0, 1, 2), "lr×": (1, 2, 0)})
    with pytest.raises(ConfigError, match="one design"):
        protocol.check_designs({"FedAvg": method_design([SERVER, LOCAL], 3), "Other": other})
    assert protocol.shared_design(3) == ((0, 1, 2), (0, 2, 1))
    assert method_design([SERVER, LOCAL], 3).points == ({"server_lr": 0.5, "lr×": 0.5}, {"server_lr": 1.0, "lr×": 2.0},
                                                        {"server_lr": 2.0, "lr×": 1.0})
    assert method_design([], 3).points == ({},) and len(method_design([LOCAL], 1).points) == 1


def test_a_refused_configuration_changes_the_methods_own_column_not_the_shared_design():
    """Ditto refuses η·λ ≥ 2 on a federation: its own column (λ) is the best one whose every
    configuration passes, the shared (η, lr×) points are kept; where no own column passes, the
    refused configurations are dropped and counted (the budget is then below K, said)."""
    lam = Axis("lam", (0.1, 0.5, 2.0))
    plain = method_design([lam, SERVER, LOCAL], 3)
    refuse = lambda p: not (p["lam"] == 2.0 and p["lr×"] == 2.0)
    d = method_design([lam, SERVER, LOCAL], 3, allowed=refuse)
    assert all(refuse(p) for p in d.points) and len(d.points) == 3 and d.refused == 0
    assert d.columns["server_lr"] == plain.columns["server_lr"] and d.columns["lr×"] == plain.columns["lr×"]
    assert d.largest_rho <= 0.5 + 1e-9
    never = method_design([lam, SERVER, LOCAL], 3, allowed=lambda p: p["lr×"] != 2.0)
    assert never.refused == 1 and len(never.points) == 2


def test_a_winning_edge_is_extended_knob_by_knob():
    """Each knob on an edge alone, one declared step outward, the others kept (protocol 6.2 moved
    them all together); none inside the grid or at a knob's own bound."""
    axes = [Axis("q", (0.1, 1.0, 5.0), below=0.01, above=10.0), SERVER, LOCAL]
    assert edge_extensions(axes, {"q": 5.0, "server_lr": 1.0, "lr×": 0.5}) == [
        {"q": 10.0, "server_lr": 1.0, "lr×": 0.5}, {"q": 5.0, "server_lr": 1.0, "lr×": 0.25}]
    assert edge_extensions(axes, {"q": 1.0, "server_lr": 1.0, "lr×": 1.0}) == []
    bounded = [Axis("alpha", (0.1, 1 / 3, 2 / 3), below=0.0, above=None)]
    assert edge_extensions(bounded, {"alpha": 2 / 3}) == []                              # α's own bound
    assert protocol.point_label({"q": 10.0, "server_lr": 1.0}, {"server_lr": "η"}) == "q=10, η=1"
    with pytest.raises(ConfigError, match="distinct and increasing"):
        Axis("q", (1.0, 0.1))


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
    assert read_table(tmp_path / "new.csv", schema=99).attrs["schema"] == 99       # an earlier version, asked for
    with pytest.raises(ConfigError, match="asked for schema 1"):
        read_table(tmp_path / "t.csv", schema=1)
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


def test_diverged_runs_keep_their_rows_and_the_numbers_come_back_from_the_rows():
    """A diverged run is in the long file (NaN, ``diverged`` True), and every reported number of a
    run is recomputed from its clients' rows (what a reader of the file, and the next protocol's
    pilot, does); a client never sampled is counted."""
    h = run([0.5, 0.75, 1.0], test=[0.25, 1.0, 0.5])
    h.sampled = [[0, 2], [2]]
    assert protocol.never_sampled(h, 3) == 1 and protocol.never_sampled(h, 5) == 3
    gone = client_rows(None, clients=3)
    assert len(gone) == 6 and gone.diverged.all() and gone.accuracy.isna().all()
    assert not client_rows(h).diverged.any()
    with pytest.raises(ConfigError, match="number of clients"):
        client_rows(None)
    rows = pd.concat([client_rows(h).assign(federation="F", method="A", scored="global", phase="reporting",
                                            point="p", seed=0),
                      gone.assign(federation="F", method="A", scored="global", phase="reporting", point="p", seed=1)])
    back = protocol.run_scores(rows).set_index("seed")
    expected = protocol.reported(h)
    for name in protocol.REPORTED:
        assert back.loc[0, name] == pytest.approx(expected[name]) and np.isnan(back.loc[1, name])
    assert protocol.metric_label("worst10", 3) == "worst client" and protocol.metric_label("worst10", 50) == "worst 10 %"
    assert protocol.metric_label("worst10", 19) == "worst client" and protocol.metric_label("best10", 20) == "best 10 %"


def test_identical_methods_are_found_and_reported_once():
    same = {0: np.array([0.5, 0.7]), 1: np.array([0.6, 0.6])}
    runs = {"FedAvg": same, "FedProx": {s: v.copy() for s, v in same.items()},
            "FedMGDA": {0: np.array([0.5, 0.7]), 1: np.array([0.6, 0.61])}, "Gone": {0: None, 1: same[1]}}
    assert protocol.identical_runs(runs) == {"FedProx": "FedAvg"}
    assert protocol.identical_runs({"A": {0: None}, "B": {0: None}}) == {}


def test_pareto_front_on_hand_made_points():
    mean, worst = [80, 82, 78, 82, 70], [60, 55, 65, 55, 50]
    assert pareto_front(mean, worst).tolist() == [True, True, True, True, False]
    std = [5, 9, 3, 9, 10]
    assert pareto_front(mean, std, maximise=(True, False)).tolist() == [True, True, True, True, False]
    assert pareto_front([1], [1]).tolist() == [True]
