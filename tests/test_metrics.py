"""Fairness metrics on hand-computed cases."""
from __future__ import annotations

import math

import numpy as np
import pytest

from fairfl.federated import metrics

ACC = [0.9, 0.5, 0.7, 0.3, 0.6, 0.8, 0.4, 1.0, 0.2, 0.1]   # sorted: .1 .2 .3 .4 .5 .6 .7 .8 .9 1.


def test_mean_and_population_std():
    assert metrics.mean([1, 2, 3, 4]) == pytest.approx(2.5)
    # ddof = 0: sqrt(((1.5)^2 + (0.5)^2 + (0.5)^2 + (1.5)^2) / 4) = sqrt(1.25)
    assert metrics.std([1, 2, 3, 4]) == pytest.approx(math.sqrt(1.25))
    assert metrics.std([1, 2, 3, 4]) != pytest.approx(np.std([1, 2, 3, 4], ddof=1))
    assert metrics.std([5.0]) == 0.0


def test_worst_and_best_fractions():
    assert metrics.worst(ACC, 0.1) == pytest.approx(0.1)          # 1 client
    assert metrics.best(ACC, 0.1) == pytest.approx(1.0)
    assert metrics.worst(ACC, 0.2) == pytest.approx(0.15)         # mean(.1, .2)
    assert metrics.best(ACC, 0.3) == pytest.approx(0.9)           # mean(.8, .9, 1.)
    assert metrics.worst(ACC, 0.25) == pytest.approx(0.15)        # floor(2.5) = 2
    assert metrics.worst(ACC, 1.0) == pytest.approx(0.55)         # everybody


def test_worst_best_take_at_least_one_client():
    a = [0.3, 0.9, 0.6]
    assert metrics.worst(a, 0.1) == pytest.approx(0.3)   # floor(0.3) = 0 -> 1
    assert metrics.best(a, 0.1) == pytest.approx(0.9)


def test_floor_is_robust_to_float_products():
    # 0.3 * 10 = 3.0000000000000004 and 0.7 * 10 = 7.000000000000001: floor must give 3 and 7
    assert metrics.worst(ACC, 0.3) == pytest.approx(0.2)   # mean(.1, .2, .3)
    assert metrics.worst(ACC, 0.7) == pytest.approx(0.4)   # mean(.1 ... .7)
    # 0.29 * 100 = 28.999999999999996 in floating point, but ⌊0.29·100⌋ = 29 clients
    v = np.arange(100, dtype=float)
    assert metrics.worst(v, 0.29) == pytest.approx(np.mean(np.arange(29)))
    assert metrics.best(v, 0.29) == pytest.approx(np.mean(np.arange(71, 100)))


def test_percentile_linear_interpolation():
    a = [0.0, 10.0, 20.0, 30.0, 40.0]
    assert metrics.percentile(a, 50) == pytest.approx(20.0)
    assert metrics.percentile(a, 5) == pytest.approx(2.0)      # 0.05 * 4 = 0.2 of the way 0 -> 10
    assert metrics.percentile(a, 95) == pytest.approx(38.0)


def test_angle_to_uniform():
    assert metrics.angle_to_uniform([0.7, 0.7, 0.7]) == pytest.approx(0.0, abs=1e-6)
    assert metrics.angle_to_uniform([1.0, 0.0]) == pytest.approx(45.0)
    # [1, 0, 0]: cos = 1 / sqrt(3)
    assert metrics.angle_to_uniform([1.0, 0.0, 0.0]) == pytest.approx(math.degrees(math.acos(1 / math.sqrt(3))))
    # [1, -1] is orthogonal to [1, 1]
    assert metrics.angle_to_uniform([1.0, -1.0]) == pytest.approx(90.0)
    assert metrics.angle_to_uniform([0.0, 0.0]) == 0.0
    # scale-free
    assert metrics.angle_to_uniform([3.0, 1.0]) == pytest.approx(metrics.angle_to_uniform([0.3, 0.1]))


def test_kl_to_uniform():
    assert metrics.kl_to_uniform([0.25, 0.25, 0.25, 0.25]) == pytest.approx(0.0, abs=1e-12)
    assert metrics.kl_to_uniform([2.0, 2.0]) == pytest.approx(0.0, abs=1e-12)
    assert metrics.kl_to_uniform([1.0, 0.0, 0.0, 0.0]) == pytest.approx(math.log(4))
    assert metrics.kl_to_uniform([0.0, 5.0, 0.0]) == pytest.approx(math.log(3))
    # [3, 1]: p = (3/4, 1/4): 3/4 log(3/2) + 1/4 log(1/2)
    assert metrics.kl_to_uniform([3.0, 1.0]) == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5))
    assert metrics.kl_to_uniform([0.0, 0.0]) == 0.0
    with pytest.raises(ValueError, match="non-negative"):
        metrics.kl_to_uniform([0.5, -0.1])


def test_improved_share_counts_ties_as_improved():
    before = [1.0, 1.0, 1.0, 1.0]
    after = [0.5, 1.0, 1.5, 1.0]
    assert metrics.improved_share(before, after) == pytest.approx(0.75)
    assert metrics.improved_share([2.0], [2.0]) == 1.0
    assert metrics.improved_share([2.0], [2.0 + 1e-12]) == 0.0
    with pytest.raises(ValueError, match="differ in length"):
        metrics.improved_share([1.0, 2.0], [1.0])


@pytest.mark.parametrize("fn", [metrics.mean, metrics.std, lambda a: metrics.worst(a, 0.1),
                                lambda a: metrics.best(a, 0.1), lambda a: metrics.percentile(a, 5),
                                metrics.angle_to_uniform, metrics.kl_to_uniform])
def test_empty_input_raises(fn):
    with pytest.raises(ValueError, match="empty"):
        fn([])


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5])
def test_bad_fraction_raises(fraction):
    with pytest.raises(ValueError, match="fraction"):
        metrics.worst(ACC, fraction)
    with pytest.raises(ValueError, match="fraction"):
        metrics.best(ACC, fraction)


def test_summary_row():
    s = metrics.summary(ACC, 0.1)
    assert s["mean"] == pytest.approx(0.55)
    assert s["worst10%"] == pytest.approx(0.1) and s["best10%"] == pytest.approx(1.0)
    assert s["p5"] == pytest.approx(np.percentile(ACC, 5))
    assert set(s) == {"mean", "std", "worst10%", "best10%", "p5", "p95", "angle", "kl"}


def test_summary_key_names_the_fraction_used():
    s = metrics.summary(np.arange(100.0), 0.29)
    assert "worst29%" in s and "best29%" in s


def test_rounds_to_reach():
    rounds, acc = [0, 5, 10, 15], [0.1, 0.5, 0.7, 0.65]
    assert metrics.rounds_to_reach(rounds, acc, 0.6) == 10
    assert metrics.rounds_to_reach(rounds, acc, 0.1) == 0
    assert math.isnan(metrics.rounds_to_reach(rounds, acc, 0.9))
    assert metrics.rounds_to_reach(rounds, [1.0, 0.5, 0.009, 0.02], 1e-2, above=False) == 10
    with pytest.raises(ValueError):
        metrics.rounds_to_reach([0, 1], [0.5], 0.4)


def test_seed_interval_by_hand():
    # values 1, 2, 3: mean 2, sample std 1, t(0.975; 2 dof) = 4.302653 -> half-width 4.302653 / sqrt(3) = 2.484138
    m, lo, hi = metrics.seed_interval([1.0, 2.0, 3.0])
    assert m == 2.0
    assert lo == pytest.approx(2 - 2.484138, abs=1e-6) and hi == pytest.approx(2 + 2.484138, abs=1e-6)
    # a 90 % interval is narrower; identical values whose mean is exact have a zero-width interval
    assert metrics.seed_interval([1.0, 2.0, 3.0], level=0.9)[2] < hi
    assert metrics.seed_interval([0.5, 0.5, 0.5, 0.5]) == (0.5, 0.5, 0.5)


def test_seed_interval_degenerate_inputs():
    m, lo, hi = metrics.seed_interval([0.25])
    assert m == 0.25 and math.isnan(lo) and math.isnan(hi)
    with pytest.raises(ValueError, match="empty"):
        metrics.seed_interval([])
    with pytest.raises(ValueError, match="level"):
        metrics.seed_interval([1.0, 2.0], level=1.0)
    with pytest.raises(ValueError, match="non-finite"):
        metrics.seed_interval([1.0, math.inf])
