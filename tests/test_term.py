"""TERM at the client level (Li et al., ICLR 2021): the properties its paper states, on hand-made
vectors, plus its released code's running-estimate variant and a whole run."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fairfl import ConfigError, ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.federated.algorithms import Context, make_algorithm
from fairfl.federated.algorithms.fedavg import FedAvg
from fairfl.federated.algorithms.term import TERM, tilted_weights
from fairfl.runs.loop import simulate
from fairfl.federated.messages import ClientUpdates


def reports(updates, losses, n=None):
    u = torch.as_tensor(updates, dtype=torch.float64)
    m = u.shape[0]
    return ClientUpdates(np.arange(m), u, torch.as_tensor(n if n is not None else [10] * m),
                         torch.as_tensor(losses, dtype=torch.float64))


def g(m, d, seed=0):
    return torch.randn(m, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("weighting", ["samples", "uniform"])
def test_t_zero_is_fedavg_bit_for_bit(weighting):
    r = reports(g(5, 7), [0.1, 3.0, 0.5, 9.0, 1.0], n=[3, 10, 7, 1, 5])
    a = TERM(t=0.0, weighting=weighting).aggregate(r, TERM().init(torch.zeros(7), 5), Context()).direction
    b = FedAvg(weighting=weighting).aggregate(r, None, Context()).direction
    torch.testing.assert_close(a, b, rtol=1e-15, atol=0)


def test_two_clients_by_hand():
    # uniform prior, F = (0, ln 2), t = 1: p ∝ (1, 2) → (1/3, 2/3)
    p = tilted_weights(torch.tensor([0.0, math.log(2)]), torch.tensor([0.5, 0.5]), 1.0)
    torch.testing.assert_close(p, torch.tensor([1 / 3, 2 / 3], dtype=torch.float64))
    d = TERM(t=1.0, weighting="uniform").aggregate(reports([[3.0, 0.0], [0.0, 3.0]], [0.0, math.log(2)]),
                                                   None, Context()).direction
    torch.testing.assert_close(d, torch.tensor([1.0, 2.0], dtype=torch.float64))


def test_equal_losses_give_the_prior_and_a_shift_of_every_loss_changes_nothing():
    prior = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    torch.testing.assert_close(tilted_weights(torch.full((4,), 2.5), prior, 3.0), prior)
    F = torch.tensor([0.3, 1.2, 0.7, 2.0], dtype=torch.float64)
    torch.testing.assert_close(tilted_weights(F, prior, 2.0), tilted_weights(F + 1e3, prior, 2.0))


def test_large_t_follows_the_worst_client_and_splits_ties():
    prior = torch.full((3,), 1 / 3, dtype=torch.float64)
    torch.testing.assert_close(tilted_weights(torch.tensor([1.0, 2.0, 3.0]), prior, 1e4),
                               torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(tilted_weights(torch.tensor([3.0, 2.0, 3.0]), prior, 1e4),
                               torch.tensor([0.5, 0.0, 0.5], dtype=torch.float64))
    # no overflow where exp(t·F) alone would
    torch.testing.assert_close(tilted_weights(torch.tensor([1e4, 0.0]), torch.tensor([0.5, 0.5]), 5.0),
                               torch.tensor([1.0, 0.0], dtype=torch.float64))


def test_raising_a_clients_loss_raises_its_weight():
    prior = torch.full((3,), 1 / 3, dtype=torch.float64)
    base = tilted_weights(torch.tensor([0.5, 0.9, 0.2]), prior, 2.0)
    up = tilted_weights(torch.tensor([0.5, 1.4, 0.2]), prior, 2.0)
    assert up[1] > base[1] and up[0] < base[0] and up[2] < base[2]


def test_the_direction_is_the_gradient_of_the_tilted_objective():
    """TERM's tilted gradient: with one full-batch GD step per client (gₖ = η∇Fₖ(w)), d/η equals
    ∇ of J_t(w) = (1/t)·log Σₖ πₖ exp(t·Fₖ(w)), computed by autograd on a linear model."""
    torch.manual_seed(0)
    xs = [torch.randn(20, 4, dtype=torch.float64) + k for k in range(3)]
    ys = [torch.randint(0, 3, (20,)) for _ in range(3)]
    w = torch.randn(4 * 3, dtype=torch.float64, requires_grad=True)
    losses = [torch.nn.functional.cross_entropy(x @ w.view(4, 3), y) for x, y in zip(xs, ys)]
    eta, t = 0.1, 2.0
    grads = torch.stack([torch.autograd.grad(L, w, retain_graph=True)[0] for L in losses])
    pi = torch.tensor([20.0, 20.0, 20.0], dtype=torch.float64) / 60
    J = torch.logsumexp(t * torch.stack(losses) + pi.log(), 0) / t
    expected = torch.autograd.grad(J, w)[0]
    r = reports(eta * grads, torch.stack(losses).detach(), n=[20, 20, 20])
    d = TERM(t=t).aggregate(r, None, Context()).direction
    torch.testing.assert_close(d / eta, expected, rtol=1e-12, atol=1e-14)


def test_official_mode_reproduces_the_released_running_estimate():
    """tilting.py: ωₖ = exp(t(Fₖ − max F)) / (R̃·m), R̃ ← ½R̃ + ½·mean, R̃₀ = 0, step (1/m)Σωₖgₖ.
    With fixed losses Σω = 2, 4/3, 8/7, … and at t = 0 the step is (Σω/m) × FedAvg's."""
    m = 10
    r = reports(g(m, 5, seed=3), torch.linspace(0.1, 2.0, m))
    algo = TERM(t=0.0, weighting="uniform", mode="official")
    state = algo.init(torch.zeros(5), m)
    fedavg = FedAvg(weighting="uniform").aggregate(r, None, Context()).direction
    for ratio in (0.2, 4 / 3 / m, 8 / 7 / m):
        agg = algo.aggregate(r, state, Context())
        state = agg.state
        torch.testing.assert_close(agg.direction, ratio * fedavg, rtol=1e-12, atol=1e-15)
    tilted = TERM(t=1.0, mode="official", weighting="uniform")
    s = tilted.init(torch.zeros(5), m)
    sums = []
    for _ in range(3):
        agg = tilted.aggregate(r, s, Context())
        s = agg.state
        sums.append(float(agg.weights.sum()) * m)
    np.testing.assert_allclose(sums, [2, 4 / 3, 8 / 7], rtol=1e-12)


@given(m=st.integers(1, 6), d=st.integers(1, 5), seed=st.integers(0, 1000),
       t=st.sampled_from([0.0, 0.1, 5.0, 1e3]), scale=st.sampled_from([0.0, 1e-30, 1.0, 1e30]),
       loss_scale=st.sampled_from([0.0, 1.0, 1e4]))
def test_property_finite_and_in_the_hull(m, d, seed, t, scale, loss_scale):
    u = g(m, d, seed) * scale
    if m > 1 and seed % 2:
        u[-1] = u[0]                                           # a duplicate
    losses = torch.rand(m, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * loss_scale
    agg = TERM(t=t).aggregate(reports(u, losses), None, Context())
    assert torch.isfinite(agg.direction).all()
    w = agg.weights
    assert (w >= 0).all() and float(w.sum()) == pytest.approx(1.0)
    lo, hi = u.min(0).values, u.max(0).values
    tol = 1e-12 * u.abs().max() + 1e-300
    assert (agg.direction >= lo - tol).all() and (agg.direction <= hi + tol).all()


def test_options_and_errors():
    assert isinstance(make_algorithm({"name": "term", "t": 2}), TERM)
    with pytest.raises(ConfigError, match="term: t=-1.0 is not allowed"):
        TERM(t=-1.0)
    with pytest.raises(ConfigError, match="mode='tilt' is not allowed"):
        TERM(mode="tilt")
    with pytest.raises(ConfigError, match="finite client losses"):
        TERM(t=1.0).aggregate(reports(g(2, 3), [float("nan"), 1.0]), None, Context())


MLP = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (6, 2, 0), "normalize": "per_feature"},
                       model="mlp2", partition=PartitionSpec("one_class", num_clients=3, classes=(0, 1, 2), split=None),
                       local=LocalTraining(epochs=1, batch_size=None, lr=0.1), rounds=3, participation=1.0,
                       eval_every=1, track_improved=False)


def test_a_t_zero_run_is_a_fedavg_run_and_tilting_moves_it(fmnist):
    a = simulate(MLP.replace(algorithm=TERM(t=0.0)), progress=False)
    b = simulate(MLP.replace(algorithm=FedAvg()), progress=False)
    assert a.test_acc == b.test_acc and a.train_loss == b.train_loss
    c = simulate(MLP.replace(algorithm=TERM(t=5.0)), progress=False)
    assert c.test_acc != a.test_acc
    assert all(w > 1 / 3 for w in c.info["max_weight"])           # it leans on the worst-served client
