"""FedMGDA / FedMGDA+ / q-FedAvg / AFL and the attacks, on hand-made vectors: the properties
their papers state or prove."""
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fairfl import ConfigError, ExperimentConfig
from fairfl.federated.algorithms import Context, make_algorithm, sample_clients
from fairfl.federated.algorithms.afl import AFL, project_simplex
from fairfl.federated.algorithms.fedavg import FedAvg, FedAvgN
from fairfl.federated.algorithms.fedmgda import FedMGDA, FedMGDAPlus
from fairfl.federated.algorithms.qffl import QFedAvg
from fairfl.federated.attacks import BiasAttack, ScalingAttack, make_attack
from fairfl.training.client import LocalTraining
from fairfl.federated.messages import ClientUpdates


def reports(updates, losses=None, n=None):
    u = torch.as_tensor(updates, dtype=torch.float32)
    m = u.shape[0]
    return ClientUpdates(np.arange(m), u, torch.as_tensor(n if n is not None else [10] * m),
                         None if losses is None else torch.as_tensor(losses, dtype=torch.float32))


def random_updates(m, d, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, d, generator=g) * scale


# ----------------------------------------------------------------------------- FedMGDA+

@pytest.mark.parametrize("m", [1, 2, 7])
def test_eps_zero_is_fedavg_n_bit_for_bit(m):
    r = reports(random_updates(m, 50, seed=m) * torch.logspace(-3, 3, m).unsqueeze(1))
    d_plus = FedMGDAPlus(eps=0.0).aggregate(r, None, Context(round=0)).direction
    d_n = FedAvgN().aggregate(r, None, Context(round=0)).direction
    assert torch.equal(d_plus, d_n)


def test_eps_zero_without_normalisation_is_uniform_fedavg_bit_for_bit():
    r = reports(random_updates(5, 30), n=[1, 2, 3, 4, 5])
    d = FedMGDAPlus(eps=0.0, normalize=False).aggregate(r, None, Context(round=0)).direction
    assert torch.equal(d, FedAvg("uniform").aggregate(r, None, Context(round=0)).direction)


@pytest.mark.parametrize("eps", [0.01, 0.05, 0.1, 0.5, 1.0])
def test_lambda_stays_in_the_eps_box_around_uniform(eps):
    r = reports(random_updates(6, 20, seed=3))
    lam = FedMGDAPlus(eps=eps).aggregate(r, None, Context(round=0)).weights.double()
    assert abs(lam.sum().item() - 1) < 1e-6
    assert (lam >= -1e-9).all()
    assert (lam - 1 / 6).abs().max().item() <= eps + 1e-6


def test_mgda_direction_is_a_common_descent_direction():
    # MGDA (eps = 1): d = argmin over the hull, so d·ḡᵢ ≥ ‖d‖² for every participant (FedMGDA+ §4)
    r = reports(random_updates(5, 3, seed=1))   # m > d: conflicting gradients
    agg = FedMGDAPlus(eps=1.0).aggregate(r, None, Context(round=0))
    unit = r.updates / r.updates.norm(dim=1, keepdim=True)
    d = agg.direction.double()
    assert (unit.double() @ d >= d.dot(d) - 1e-6).all()


def test_two_opposite_updates_give_zero_direction():
    # Pareto stationary: the hull of {g, −g} holds 0
    r = reports([[1.0, 2.0, 3.0], [-2.0, -4.0, -6.0]])
    assert FedMGDAPlus(eps=1.0).aggregate(r, None, Context(round=0)).direction.norm() < 1e-6


def test_normalisation_makes_fedmgda_plus_immune_to_scaling():
    r = reports(random_updates(4, 25, seed=5))
    scaled = ScalingAttack(client=2, factor=1000.0).apply(r)
    for eps in (0.0, 0.1, 1.0):
        a = FedMGDAPlus(eps=eps).aggregate(r, None, Context(round=0)).direction
        b = FedMGDAPlus(eps=eps).aggregate(scaled, None, Context(round=0)).direction
        assert torch.allclose(a, b, atol=1e-6), eps
    # ... while FedAvg follows the attacker
    a, b = FedAvg().aggregate(r, None, Context(round=0)).direction, FedAvg().aggregate(scaled, None, Context(round=0)).direction
    assert (b - a).norm() > 10 * a.norm()


def test_zero_update_does_not_produce_nan():
    r = reports([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    for eps in (0.0, 0.5, 1.0):
        d = FedMGDAPlus(eps=eps).aggregate(r, None, Context(round=0)).direction
        assert torch.isfinite(d).all()
    # with eps = 1 MGDA puts all weight on the zero vector: the direction is 0
    assert FedMGDAPlus(eps=1.0).aggregate(r, None, Context(round=0)).direction.norm() < 1e-6


@given(st.integers(1, 6), st.integers(1, 8), st.sampled_from([0.0, 0.05, 1.0]),
       st.sampled_from([1e-30, 1e-6, 1.0, 1e6, 1e30]), st.integers(0, 2**16))
def test_fedmgda_plus_degenerate_inputs(m, d, eps, scale, seed):
    g = random_updates(m, d, seed) * scale
    if m > 1:
        g[0] = 0.0                     # a zero update
        g[-1] = g[min(1, m - 1)]       # a duplicate
    agg = FedMGDAPlus(eps=eps).aggregate(reports(g), None, Context(round=0))
    assert torch.isfinite(agg.direction).all()
    assert agg.direction.norm() <= 1 + 1e-5   # a convex combination of unit (or zero) vectors


def test_eps_outside_unit_interval_is_a_config_error():
    for eps in (-0.1, 1.5, float("nan"), True, "0.1"):
        with pytest.raises(ConfigError, match=r"fedmgda_plus: eps=.* is not allowed; it must be a finite number in \[0, 1\]"):
            make_algorithm({"name": "fedmgda_plus", "eps": eps})


def test_fedmgda_is_unnormalised_mgda():
    r = reports(random_updates(4, 20, seed=3) * torch.tensor([[1.0], [5.0], [0.2], [3.0]]))
    a = FedMGDA().aggregate(r, None, Context()).direction
    b = FedMGDAPlus(eps=1.0, normalize=False).aggregate(r, None, Context()).direction
    assert torch.equal(a, b)


# ----------------------------------------------------------------------------- q-FedAvg

def test_qfedavg_two_clients_by_hand():
    # q = 2, L = 10; client 1: g = (1, 0), F = 1; client 2: g = (0, 2), F = 2
    # Δw = L g = (10, 0), (0, 20); ‖Δw‖² = 100, 400
    # Δ = F^q Δw = (10, 0), (0, 80); h = q F^{q-1} ‖Δw‖² + L F^q = 2·1·100 + 10·1 = 210, 2·2·400 + 10·4 = 1640
    # d = ΣΔ / Σh = (10, 80) / 1850
    r = reports([[1.0, 0.0], [0.0, 2.0]], losses=[1.0, 2.0])
    d = QFedAvg(q=2, L=10).aggregate(r, None, Context(round=0)).direction
    assert torch.allclose(d, torch.tensor([10 / 1850, 80 / 1850]), rtol=1e-6)


def test_qfedavg_with_q_zero_is_the_uniform_average():
    r = reports(random_updates(4, 10), losses=[0.3, 1.0, 2.0, 5.0])
    d = QFedAvg(q=0, L=100).aggregate(r, None, Context(round=0)).direction
    assert torch.allclose(d, r.updates.mean(0), atol=1e-7)


def test_qfedavg_weights_grow_with_the_reported_loss():
    r = reports([[1.0, 0.0], [0.0, 1.0]], losses=[1.0, 1.0])
    biased = BiasAttack(client=1, bias=3.0).apply(r)
    d0 = QFedAvg(q=5, L=100).aggregate(r, None, Context(round=0)).direction
    d1 = QFedAvg(q=5, L=100).aggregate(biased, None, Context(round=0)).direction
    assert d1[1] / d1[0] > 100 * d0[1] / d0[0]


def test_qfedavg_L_defaults_to_inverse_local_lr():
    r = reports([[1.0, 0.0], [0.0, 2.0]], losses=[1.0, 2.0])
    default = QFedAvg(q=2).aggregate(r, None, Context(local=LocalTraining(lr=0.05))).direction
    assert torch.equal(default, QFedAvg(q=2, L=20.0).aggregate(r, None, Context()).direction)


# ----------------------------------------------------------------------------- AFL

@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=20))
def test_simplex_projection_is_on_the_simplex(values):
    x = project_simplex(torch.tensor(values, dtype=torch.float64))
    assert abs(x.sum().item() - 1) < 1e-12
    assert (x >= 0).all()


def test_simplex_projection_by_hand_and_idempotent():
    assert torch.allclose(project_simplex(torch.tensor([0.5, 0.5, 2.0])), torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))
    assert torch.allclose(project_simplex(torch.tensor([1.0, 1.0])), torch.tensor([0.5, 0.5], dtype=torch.float64))
    p = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    assert torch.allclose(project_simplex(p), p)


def test_simplex_projection_is_the_closest_point():
    # against a brute-force check: no feasible point on a fine grid is closer
    v = torch.tensor([0.9, -0.3, 0.6], dtype=torch.float64)
    x = project_simplex(v)
    best = min(((a, b, 1 - a - b) for a in np.linspace(0, 1, 201) for b in np.linspace(0, 1, 201) if a + b <= 1),
               key=lambda p: float(((torch.tensor(p) - v) ** 2).sum()))
    assert float(((x - v) ** 2).sum()) <= float(((torch.tensor(best) - v) ** 2).sum()) + 1e-12


def test_afl_lambda_weights_the_update_and_moves_to_the_worse_client():
    afl = AFL(lr_lambda=0.5)
    state = afl.init(torch.zeros(2), num_clients=2)
    r = reports([[1.0, 0.0], [0.0, 1.0]], losses=[0.1, 0.9])
    agg = afl.aggregate(r, state, Context())
    assert torch.allclose(agg.direction, torch.tensor([0.5, 0.5]))   # λ₀ uniform
    lam = agg.state.lam
    assert lam[1] > lam[0] and abs(lam.sum().item() - 1) < 1e-12
    agg2 = afl.aggregate(r, agg.state, Context(round=1))
    assert torch.allclose(agg2.direction, lam.float())                # the new λ weights the update


def test_afl_reports_the_averaged_iterate():
    afl = AFL(lr_lambda=0.1)
    state = afl.init(torch.zeros(1), num_clients=1)
    r = reports([[1.0]], losses=[1.0])
    w = torch.tensor([10.0])
    for t in range(4):   # w_t = 10, 9, 8, 7; each round steps by the update 1
        state = afl.aggregate(r, state, Context(round=t, params=w)).state
        w = w - 1.0
    # after 4 rounds: average of w_1..w_4 = (9 + 8 + 7 + 6) / 4
    assert afl.eval_params(state, w).item() == pytest.approx(7.5)


# ----------------------------------------------------------------------------- attacks

def test_bias_attack_changes_only_the_reported_losses():
    r = reports(random_updates(3, 4), losses=[0.5, 0.6, 0.7], n=[10, 100, 1000])
    mean = BiasAttack(client=1, bias=2.0).apply(r)
    total = BiasAttack(client=2, bias=2.0, target="total").apply(r)
    assert torch.equal(mean.updates, r.updates) and torch.equal(total.updates, r.updates)
    assert torch.allclose(mean.loss_before, torch.tensor([0.5, 2.6, 0.7]))
    assert torch.allclose(total.loss_before, torch.tensor([0.5, 0.6, 0.702]))
    assert torch.equal(r.loss_before, torch.tensor([0.5, 0.6, 0.7]))   # the honest reports are untouched


@pytest.mark.parametrize("bias", [0.0, 1.0, 1e4])
def test_bias_leaves_fedavg_and_fedmgda_plus_unchanged_bit_for_bit(bias):
    r = reports(random_updates(3, 8), losses=[0.5, 0.6, 0.7])
    biased = BiasAttack(client=0, bias=bias).apply(r)
    for agg in (FedAvg(), FedAvgN(), FedMGDAPlus(eps=0.1), FedMGDAPlus(eps=1.0)):
        assert torch.equal(agg.aggregate(r, None, Context(round=0)).direction, agg.aggregate(biased, None, Context(round=0)).direction)


def test_an_absent_attacker_changes_nothing():
    r = reports(random_updates(2, 3), losses=[1.0, 1.0])
    assert BiasAttack(client=7, bias=5.0).apply(r) is r
    assert ScalingAttack(client=7, factor=5.0).apply(r) is r


def test_make_attack_errors():
    with pytest.raises(ConfigError, match="attack kind"):
        make_attack({"kind": "poison", "client": 0})
    with pytest.raises(ConfigError, match="factor=-1.0 is not allowed"):
        make_attack({"kind": "scaling", "client": 0, "factor": -1})
    with pytest.raises(ConfigError, match="unknown option.s. strength"):
        make_attack({"kind": "bias", "client": 0, "bias": 1, "strength": 2})


# ----------------------------------------------------------------------------- sampling and config

def test_forced_and_eligible_sampling():
    for t in range(20):
        s = sample_clients(0, t, 10, 3, eligible=(2, 4, 6, 8), forced=(4,))
        assert 4 in s and set(s) <= {2, 4, 6, 8} and len(set(s)) == 3
    assert list(sample_clients(0, 0, 10, 1, eligible=(3,))) == [3]


@pytest.mark.parametrize("changes, match", [
    (dict(attacks=({"kind": "bias", "client": 99, "bias": 1.0},)), "attack client 99"),
    (dict(eligible_clients=()), "eligible_clients must be non-empty"),
    (dict(eligible_clients=(0, 5)), "eligible_clients must be non-empty client ids"),
    (dict(clients_per_round=2, eligible_clients=(0,)), "more than the 1 clients"),
    (dict(clients_per_round=1, attacks=({"kind": "bias", "client": 0, "bias": 1.0},
                                         {"kind": "bias", "client": 1, "bias": 1.0})), "2 attackers"),
    (dict(algorithm={"name": "fedmgda_plus", "eps": 2.0}), "eps=2.0 is not allowed"),
])
def test_config_rejects_bad_attack_and_sampling_settings(changes, match):
    from fairfl import PartitionSpec
    base = ExperimentConfig(partition=PartitionSpec("iid", num_clients=3))
    with pytest.raises(ConfigError, match=match):
        base.replace(**changes).validate()


# ----------------------------------------------------------------------------- end to end, real data

def _adult(**changes):
    from fairfl import LocalTraining, PartitionSpec
    base = ExperimentConfig(
        dataset="adult", model="logreg",
        partition=PartitionSpec("attribute", num_clients=2, attribute_values=(0, 1), split=None),
        local=LocalTraining(epochs=1, batch_size=500, lr=0.1), rounds=3, clients_per_round=2, eval_every=1)
    return base.replace(**changes)


def test_bias_attack_leaves_whole_fedmgda_plus_runs_unchanged_bit_for_bit():
    from fairfl.runs.loop import simulate
    honest = simulate(_adult(algorithm=FedMGDAPlus(eps=0.1)), progress=False)
    attacked = simulate(_adult(algorithm=FedMGDAPlus(eps=0.1),
                               attacks=({"kind": "bias", "client": 1, "bias": 1e4},)), progress=False)
    assert honest.test_acc == attacked.test_acc and honest.train_loss == attacked.train_loss
    # ... whereas AFL, which reads the reported losses, changes
    afl = simulate(_adult(algorithm=AFL(lr_lambda=0.5)), progress=False)
    afl_attacked = simulate(_adult(algorithm=AFL(lr_lambda=0.5),
                                   attacks=({"kind": "bias", "client": 1, "bias": 1.0},)), progress=False)
    assert afl.train_loss != afl_attacked.train_loss


def test_eps_zero_run_equals_fedavg_n_run_bit_for_bit():
    from fairfl.runs.loop import simulate
    a = simulate(_adult(algorithm=FedMGDAPlus(eps=0.0, decay=0.5)), progress=False)
    b = simulate(_adult(algorithm=FedAvgN(decay=0.5)), progress=False)
    assert a.test_acc == b.test_acc and a.train_loss == b.train_loss


def test_phd_only_baseline_trains_only_the_eligible_client():
    from fairfl.runs.loop import simulate
    h = simulate(_adult(algorithm="fedavg", eligible_clients=(1,), clients_per_round=1), progress=False)
    assert h.sampled == [[1], [1], [1]]
