"""FedFV (Wang et al. 2021, Algorithms 1–3) on hand-made vectors: the projection order, α's
rounding, what a projection guarantees, the external-conflict history, and degenerate inputs."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fairfl import ConfigError
from fairfl.federated.algorithms import Context, make_algorithm
from fairfl.federated.algorithms.fedavg import FedAvg
from fairfl.federated.algorithms.fedfv import FedFV, kept_count, project_conflicts, projection_order
from fairfl.federated.messages import ClientUpdates


def reports(updates, losses, clients=None):
    u = torch.as_tensor(updates, dtype=torch.float32)
    m = u.shape[0]
    return ClientUpdates(np.arange(m) if clients is None else np.asarray(clients), u,
                         torch.full((m,), 10), torch.as_tensor(losses, dtype=torch.float32))


def conflicting_updates(m, d, seed):
    """Updates that share a weak common direction and conflict pairwise often."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, d, generator=g, dtype=torch.float64) + 0.3


# ----------------------------------------------------------------------------- α and the order

@pytest.mark.parametrize("m, alpha, kept", [
    (3, 0.0, 0), (3, 0.1, 1), (3, 1 / 3, 1), (3, 2 / 3, 2), (3, 1.0, 3),
    (10, 0.0, 0), (10, 0.1, 1), (10, 1 / 3, 4), (10, 2 / 3, 7), (10, 1.0, 10),
])
def test_kept_count_rounding(m, alpha, kept):
    assert kept_count(m, alpha) == kept


def test_orders():
    losses = torch.tensor([0.3, 0.1, 0.9, 0.5])
    assert projection_order(losses, "loss") == [1, 0, 3, 2]
    assert projection_order(losses, "reverse") == [2, 3, 0, 1]
    a = projection_order(losses, "random", np.random.default_rng([0, 5, 0xFF]))
    b = projection_order(losses, "random", np.random.default_rng([0, 5, 0xFF]))
    assert a == b and sorted(a) == [0, 1, 2, 3]


def test_random_order_is_deterministic_per_seed_and_round_and_changes_across_rounds():
    g = conflicting_updates(8, 5, seed=1).float()
    r = reports(g, torch.arange(8.0))
    agg = FedFV(order="random")
    d0 = agg.aggregate(r, agg.init(torch.zeros(5), 8), Context(seed=3)).direction
    assert torch.equal(d0, agg.aggregate(r, agg.init(torch.zeros(5), 8), Context(seed=3)).direction)
    others = [agg.aggregate(r, agg.init(torch.zeros(5), 8), Context(round=t, seed=3)).direction for t in range(1, 6)]
    assert any(not torch.allclose(d0, o) for o in others)
    # the order is the loop's stream of (seed, round, purpose): another seed, another order
    assert any(not torch.allclose(d0, agg.aggregate(r, agg.init(torch.zeros(5), 8), Context(seed=s)).direction)
               for s in range(4, 9))


# ----------------------------------------------------------------------------- internal conflicts

def test_two_conflicting_gradients_by_hand():
    # g1 = (1, 0) with the lower loss, g2 = (−1, 1): g1·g2 = −1 < 0.
    # g1 → g1 − (−1/2) g2 = (0.5, 0.5);  g2 → g2 − (−1/1) g1 = (0, 1);  mean (0.25, 0.75),
    # rescaled to ‖mean of originals‖ = ‖(0, 0.5)‖ = 0.5.
    r = reports([[1.0, 0.0], [-1.0, 1.0]], [0.1, 0.9])
    d = FedFV().aggregate(r, None, Context(round=0)).direction.double()
    expected = torch.tensor([0.25, 0.75], dtype=torch.float64)
    expected = expected / expected.norm() * 0.5
    assert torch.allclose(d, expected, atol=1e-7)


@pytest.mark.parametrize("seed", range(5))
def test_no_projected_gradient_conflicts_with_the_last_target(seed):
    g = conflicting_updates(6, 4, seed)
    order = list(np.random.default_rng(seed).permutation(6))
    pc, count = project_conflicts(g, order, keep=set())
    assert count > 0
    last = order[-1]
    for i in range(6):
        if i != last:
            assert pc[i] @ g[last] >= -1e-9


def test_kept_clients_are_the_highest_loss_ones_and_stay_unprojected():
    g = torch.tensor([[1.0, 0.0], [-1.0, 0.2], [0.0, 1.0]], dtype=torch.float64)
    losses = torch.tensor([0.5, 0.9, 0.1])          # client 1 has the highest loss
    order = projection_order(losses, "loss")
    keep = set(order[3 - kept_count(3, 1 / 3):])
    assert keep == {1}
    pc, _ = project_conflicts(g, order, keep)
    assert torch.equal(pc[1], g[1])
    assert not torch.equal(pc[0], g[0])              # client 0 conflicts with client 1: projected


def test_alpha_one_tau_zero_is_uniform_fedavg_bit_for_bit():
    g = conflicting_updates(7, 30, seed=2).float()
    r = reports(g, torch.rand(7))
    assert torch.equal(FedFV(alpha=1.0).aggregate(r, None, Context(round=0)).direction,
                       FedAvg("uniform").aggregate(r, None, Context(round=0)).direction)


def test_theorem1_later_targets_conflict_less_with_the_average():
    # Theorem 1: the later a gradient is a projection target, the smaller the bound on its
    # conflict with the projected average. Over many random rounds the share of rounds in which
    # the average conflicts with the gradient at position k must not grow with k, and the
    # last target is served best.
    m, trials = 5, 400
    conflicts = np.zeros(m)
    for s in range(trials):
        g = torch.randn(m, 6, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
        order = list(range(m))
        pc, _ = project_conflicts(g, order, set())
        avg = pc.mean(0)
        conflicts += [(avg @ g[k] < 0).item() for k in order]
    share = conflicts / trials
    assert all(share[k + 1] <= share[k] + 0.02 for k in range(m - 1)), share
    assert share[-1] < share[0] / 2, share


# ----------------------------------------------------------------------------- degenerate inputs

def test_zero_gradient_neither_projects_nor_is_projected_into_nan():
    r = reports([[0.0, 0.0], [1.0, 0.0], [-1.0, 0.5]], [0.2, 0.1, 0.3])
    d = FedFV().aggregate(r, None, Context(round=0)).direction
    assert torch.isfinite(d).all()


def test_parallel_gradients_are_left_alone():
    g = torch.tensor([[1.0, 2.0], [2.0, 4.0], [0.5, 1.0]])
    r = reports(g, [0.3, 0.2, 0.1])
    agg = FedFV().aggregate(r, None, Context(round=0))
    assert agg.info["internal_projections"] == 0
    assert torch.equal(agg.direction, g.mean(0))


def test_antiparallel_gradients_cancel_to_a_zero_step_not_nan():
    r = reports([[1.0, -2.0], [-1.0, 2.0]], [0.1, 0.2])
    agg = FedFV().aggregate(r, None, Context(round=0))
    assert torch.equal(agg.direction, torch.zeros(2))


def test_all_zero_updates():
    r = reports(torch.zeros(3, 4), [0.1, 0.2, 0.3])
    assert torch.equal(FedFV(tau=1).aggregate(r, FedFV(tau=1).init(torch.zeros(4), 3), Context(round=5)).direction, torch.zeros(4))


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 6), d=st.integers(1, 5), seed=st.integers(0, 10_000),
       alpha=st.sampled_from([0.0, 0.1, 1 / 3, 2 / 3, 1.0]), scale=st.sampled_from([1e-20, 1.0, 1e15]))
def test_direction_is_finite_and_as_long_as_the_mean(m, d, seed, alpha, scale):
    g = torch.randn(m, d, generator=torch.Generator().manual_seed(seed)) * scale
    r = reports(g, torch.rand(m, generator=torch.Generator().manual_seed(seed)))
    out = FedFV(alpha=alpha).aggregate(r, None, Context(round=0)).direction.double()
    assert torch.isfinite(out).all()
    mean_norm = g.double().mean(0).norm()
    assert out.norm() == pytest.approx(mean_norm.item(), rel=1e-5) or out.norm() == 0


# ----------------------------------------------------------------------------- external conflicts

def test_history_bookkeeping_with_partial_participation():
    agg = FedFV(tau=2)
    state = agg.init(torch.zeros(2), 6)
    for t, clients in enumerate([[0, 1], [1, 2], [3]]):
        g = torch.full((len(clients), 2), float(t + 1))
        state = agg.aggregate(reports(g, torch.rand(len(clients)), clients), state, Context(round=t)).state
        if t == 1:   # client 1's round-0 entry replaced by its round-1 update
            assert dict(zip(state.clients.tolist(), state.rounds.tolist())) == {0: 0, 1: 1, 2: 1}
    # after round 2 the window of round 3 is rounds 1–2: client 0 (round 0) is gone
    assert dict(zip(state.clients.tolist(), state.rounds.tolist())) == {1: 1, 2: 1, 3: 2}
    assert torch.equal(state.updates[state.clients == 3], torch.full((1, 2), 3.0))


def test_external_projection_removes_the_conflict_with_an_absent_client():
    agg = FedFV(tau=1)
    state = agg.init(torch.zeros(2), 5)
    absent = torch.tensor([[-1.0, 0.3]])
    state = agg.aggregate(reports(absent, [0.5], clients=[4]), state, Context()).state
    r = reports([[1.0, 0.0], [1.0, 0.2]], [0.1, 0.2], clients=[0, 1])   # both conflict with client 4
    out = agg.aggregate(r, state, Context(round=1))
    assert out.info["external_projections"] == 1
    assert out.direction.double() @ absent[0].double() == pytest.approx(0.0, abs=1e-6)
    # before τ rounds have passed nothing is projected
    assert FedFV(tau=3).aggregate(r, state, Context(round=1)).info["external_projections"] == 0


def reports64(updates, clients):
    u = torch.tensor(updates, dtype=torch.float64)
    return ClientUpdates(np.asarray(clients), u, torch.full((len(u),), 10), torch.arange(len(u), dtype=torch.float64))


def run_rounds(agg, rounds):
    """Feed (clients, updates) per round through the rule; the last round's Aggregate."""
    state = agg.init(torch.zeros(len(rounds[0][1][0]), dtype=torch.float64), 10)
    for t, (clients, updates) in enumerate(rounds):
        out = agg.aggregate(reports64(updates, clients), state, Context(round=t))
        state = out.state
    return out


def test_a_client_sampled_again_is_not_its_own_external_conflict():
    # Alg. 1 line 4 updates GH before Alg. 3: client 0's round-0 update [−1, 0.2] is replaced by
    # its round-1 update, so only client 1 ([0.5, 0.5], no conflict) is external in round 1 and
    # the result is the plain mean. (Projecting against client 0's old update gave [0.18, 0.88].)
    out = run_rounds(FedFV(tau=1), [([0, 1], [[-1.0, 0.2], [0.5, 0.5]]),
                                    ([0, 2], [[1.0, 0.0], [0.8, 0.1]])])
    assert out.info["external_projections"] == 0
    assert torch.allclose(out.direction, torch.tensor([0.9, 0.05], dtype=torch.float64), atol=1e-15)


def test_external_conflicts_over_two_rounds_computed_by_hand():
    # τ = 2, round 2 samples clients 1 and 3; the mean is d = [1, 0.1] (no internal conflict).
    # GH after line 4: client 0 @ round 0 [−1, 0.2], client 2 @ round 1 [0, −1]; client 1's
    # round-0 entry [−0.5, 0.5] (which conflicts with d) was replaced by its round-2 update.
    # Alg. 3, oldest round first:
    #   round 0: d·[−1, 0.2] = −0.98 < 0 → d ← d + (0.98 / 1.04)·[−1, 0.2] = [0.0576923…, 0.2884615…]
    #   round 1: d·[0, −1] = −0.2884615… < 0 → d ← d − 0.2884615…·[0, 1] = [0.0576923…, 0]
    # Alg. 1 line 10: rescaled to ‖d₀‖ = √1.01 → [√1.01, 0].
    out = run_rounds(FedFV(tau=2), [([0, 1], [[-1.0, 0.2], [-0.5, 0.5]]),
                                    ([2], [[0.0, -1.0]]),
                                    ([1, 3], [[1.0, 0.0], [1.0, 0.2]])])
    assert out.info["external_projections"] == 2
    assert torch.allclose(out.direction, torch.tensor([math.sqrt(1.01), 0.0], dtype=torch.float64), atol=1e-12)
    assert out.state.updates.dtype == torch.float64          # the history keeps the updates' dtype


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_inexact_cancellation_is_no_step(dtype):
    # g₁ = −3.7·g₀: each projects the other away; in exact arithmetic the mean of the projections
    # is 0, in floats ~1e-16 of its length, which rescaling must not stretch to a full step
    g0 = torch.tensor([0.3, -1.7, 0.9], dtype=dtype)
    r = ClientUpdates(np.arange(2), torch.stack([g0, -3.7 * g0]), torch.full((2,), 10), torch.tensor([0.1, 0.2]))
    out = FedFV(alpha=0.0).aggregate(r, None, Context(round=0))
    assert out.info["internal_projections"] == 2
    assert torch.equal(out.direction, torch.zeros(3, dtype=dtype))


def test_tau_zero_keeps_no_history():
    agg = FedFV(tau=0)
    state = agg.init(torch.zeros(3), 4)
    out = agg.aggregate(reports(torch.ones(2, 3), [0.1, 0.2]), state, Context())
    assert len(out.state.clients) == 0


# ----------------------------------------------------------------------------- errors

@pytest.mark.parametrize("opts, word", [({"alpha": 1.5}, "alpha"), ({"alpha": -0.1}, "alpha"),
                                        ({"tau": -1}, "tau"), ({"tau": 1.5}, "tau"), ({"order": "sideways"}, "order")])
def test_bad_options_are_named(opts, word):
    with pytest.raises(ConfigError, match=f"fedfv: {word}="):
        make_algorithm({"name": "fedfv", **opts})


def test_missing_losses_is_an_error():
    r = ClientUpdates(np.arange(2), torch.ones(2, 3), torch.full((2,), 5))
    with pytest.raises(ValueError, match="loss_before"):
        FedFV().aggregate(r, None, Context(round=0))


def test_registered_and_requires_losses():
    algo = make_algorithm({"name": "fedfv", "alpha": 1 / 3, "tau": 0})
    assert isinstance(algo, FedFV) and "loss_before" in algo.requires
    assert math.isclose(algo.alpha, 1 / 3)
    assert algo.configure(Context(num_clients=3, num_sampled=3), None).loss_before
