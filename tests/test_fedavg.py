"""FedAvg, FedAvg-n, FedProx and FedAvg-FT (fairfl.federated.algorithms.fedavg) on hand-made and adversarial
inputs, and FedAvg-FT's fine-tuning on real data."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fairfl.federated.algorithms import Context, make_algorithm
from fairfl.federated.algorithms.fedavg import FedAvg, FedAvgN, FedProx, normalise_rows
from fairfl.training.client import LocalTraining
from fairfl.base.errors import ConfigError
from fairfl.federated.messages import ClientUpdates


def reports(updates, num_samples=None) -> ClientUpdates:
    u = torch.as_tensor(np.asarray(updates, dtype=np.float32))
    m = u.shape[0]
    n = torch.as_tensor(num_samples if num_samples is not None else [1] * m)
    return ClientUpdates(clients=np.arange(m), updates=u, num_samples=n, loss_before=None, loss_after=None)


# ----------------------------------------------------------------------------- FedAvg

def test_fedavg_weights_by_samples():
    r = reports([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]], [1, 3, 4])
    agg = FedAvg().aggregate(r, None, Context(round=0))
    # p = (1/8, 3/8, 4/8): d = (1/8 + 1, 3/8 + 1)
    torch.testing.assert_close(agg.direction, torch.tensor([1.125, 1.375]))
    torch.testing.assert_close(agg.weights, torch.tensor([0.125, 0.375, 0.5]))
    assert agg.state is None


def test_fedavg_uniform_ignores_sample_counts():
    r = reports([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]], [1, 3, 4])
    agg = FedAvg("uniform").aggregate(r, None, Context(round=0))
    torch.testing.assert_close(agg.direction, torch.tensor([1.0, 1.0]))
    torch.testing.assert_close(agg.weights, torch.full((3,), 1 / 3))


def test_fedavg_single_client_is_its_update():
    r = reports([[0.5, -2.0, 3.0]], [17])
    torch.testing.assert_close(FedAvg().aggregate(r, None, Context(round=0)).direction, torch.tensor([0.5, -2.0, 3.0]))


def test_fedavg_bad_weighting():
    with pytest.raises(ConfigError, match="weighting"):
        FedAvg("by_loss")
    with pytest.raises(ConfigError, match="weighting"):
        FedAvgN("samples_squared")


# ----------------------------------------------------------------------------- FedAvg-n

def test_fedavg_n_normalises_rows_and_ignores_zero_rows():
    r = reports([[3.0, 4.0], [0.0, 0.0], [0.0, 2.0]])
    agg = FedAvgN().aggregate(r, None, Context(round=0))
    # units (0.6, 0.8), (0, 0), (0, 1), uniform weights 1/3
    torch.testing.assert_close(agg.direction, torch.tensor([0.2, 0.6]))
    assert torch.isfinite(agg.direction).all()
    assert agg.info["mean_update_norm"] == pytest.approx((5.0 + 0.0 + 2.0) / 3)


def test_fedavg_n_sample_weighting():
    r = reports([[3.0, 4.0], [0.0, 0.0], [0.0, 2.0]], [1, 1, 2])
    agg = FedAvgN("samples").aggregate(r, None, Context(round=0))
    torch.testing.assert_close(agg.direction, torch.tensor([0.15, 0.7]))


def test_fedavg_n_all_zero_rows_give_zero_direction():
    agg = FedAvgN().aggregate(reports(np.zeros((4, 3))), None, Context())
    assert torch.equal(agg.direction, torch.zeros(3))


def test_fedavg_n_is_scale_free_per_client():
    a = FedAvgN().aggregate(reports([[1.0, 2.0, 2.0], [0.0, -4.0, 3.0]]), None, Context(round=0)).direction
    b = FedAvgN().aggregate(reports([[100.0, 200.0, 200.0], [0.0, -0.04, 0.03]]), None, Context(round=0)).direction
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, torch.tensor([1 / 6, (2 / 3 - 0.8) / 2, (2 / 3 + 0.6) / 2]))


def test_normalise_rows():
    rows, norms = normalise_rows(torch.tensor([[3.0, 4.0], [0.0, 0.0], [-1.0, 0.0]]))
    torch.testing.assert_close(rows, torch.tensor([[0.6, 0.8], [0.0, 0.0], [-1.0, 0.0]]))
    torch.testing.assert_close(norms, torch.tensor([5.0, 0.0, 1.0]))


def test_fedavg_n_huge_update_keeps_its_direction():
    agg = FedAvgN().aggregate(reports([[1e30, 1e30, 1e30, 1e30]]), None, Context(round=0))
    torch.testing.assert_close(agg.direction, torch.full((4,), 0.5))


# ----------------------------------------------------------------------------- properties

SCALES = [0.0, 1e-30, 1e-3, 1.0, 1e3, 1e30]


@st.composite
def update_reports(draw):
    """m x d updates whose rows are zero, tiny, ordinary, huge, or duplicates of earlier rows."""
    m = draw(st.integers(1, 6))
    d = draw(st.integers(1, 8))
    rows = []
    for i in range(m):
        if rows and draw(st.booleans()) and draw(st.booleans()):
            rows.append(rows[draw(st.integers(0, len(rows) - 1))].copy())  # duplicate
            continue
        base = np.array(draw(st.lists(st.floats(-1, 1, allow_nan=False, width=32), min_size=d, max_size=d)))
        rows.append((base * draw(st.sampled_from(SCALES))).astype(np.float32))
    n = draw(st.lists(st.integers(1, 10_000), min_size=m, max_size=m))
    return reports(np.stack(rows), n)


@given(r=update_reports(), weighting=st.sampled_from(["samples", "uniform"]))
def test_fedavg_property_convex_hull(r, weighting):
    agg = FedAvg(weighting).aggregate(r, None, Context(round=0))
    d = agg.direction
    assert d.shape == (r.updates.shape[1],)
    assert torch.isfinite(d).all()
    u = r.updates.double()
    lo, hi = u.min(0).values, u.max(0).values
    tol = 1e-5 * u.abs().max(0).values + 1e-37
    assert (d.double() >= lo - tol).all() and (d.double() <= hi + tol).all()
    w = agg.weights.double()
    assert (w >= 0).all() and abs(float(w.sum()) - 1) < 1e-6


@given(r=update_reports(), weighting=st.sampled_from(["samples", "uniform"]))
def test_fedavg_n_property_norm_at_most_one(r, weighting):
    agg = FedAvgN(weighting).aggregate(r, None, Context(round=0))
    d = agg.direction
    assert d.shape == (r.updates.shape[1],)
    assert torch.isfinite(d).all()
    assert float(d.double().norm()) <= 1 + 1e-5
    if not r.updates.any():
        assert not d.any()


@given(row=st.lists(st.floats(-1, 1, allow_nan=False, width=32), min_size=1, max_size=8),
       scale=st.sampled_from([1e-3, 1.0, 1e3]), copies=st.integers(1, 5))
def test_fedavg_n_property_duplicates_of_one_row_give_its_unit_vector(row, scale, copies):
    """m copies of one row (m = 1 included): the direction is that row, normalised."""
    g = np.asarray(row, dtype=np.float32) * scale
    if np.linalg.norm(g.astype(np.float64)) < 1e-6:
        return
    agg = FedAvgN().aggregate(reports(np.tile(g, (copies, 1))), None, Context())
    unit = torch.from_numpy(g / np.linalg.norm(g))
    torch.testing.assert_close(agg.direction, unit, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- algorithms

def test_algorithms_registry_and_what_their_clients_do():
    avg = make_algorithm("fedavg")
    assert isinstance(avg, FedAvg) and avg.weighting == "samples"
    n = make_algorithm("fedavg_n")
    assert isinstance(n, FedAvgN) and n.weighting == "uniform"
    prox = make_algorithm({"name": "fedprox", "mu": 0.05})
    assert isinstance(prox, FedProx) and prox.mu == 0.05
    ctx = Context(local=LocalTraining(lr=0.3), num_clients=5, num_sampled=2)
    assert prox.configure(ctx, None).local == LocalTraining(lr=0.3, prox_mu=0.05)
    assert avg.configure(ctx, None).local == LocalTraining(lr=0.3)
    assert len(avg.configure(ctx, None).clients) == 2


@pytest.mark.parametrize("spec, match", [
    ("fedsgd", "unknown algorithm 'fedsgd'"),
    ({"name": "fedavg", "weighting": "loss"}, "weighting='loss' is not allowed; it must be one of 'samples', 'uniform'"),
    ({"name": "fedavg", "eps": 0.1}, "fedavg: unknown option"),
    ({"name": "fedprox", "mu": -1.0}, "mu=-1.0 is not allowed"),
    ({"name": "fedavg", "server_lr": float("inf")}, "server_lr=inf is not allowed"),
    ({"name": "fedavg", "decay": True}, "decay=True is not allowed"),
    ({"eps": 0.1}, "mapping with a 'name'"),
])
def test_algorithm_errors(spec, match):
    with pytest.raises(ConfigError, match=match):
        make_algorithm(spec)


def test_equal_settings_serialise_alike():
    # an int where a float is expected is canonicalised: one setting, one cache key
    assert FedAvg(server_lr=1) == FedAvg(server_lr=1.0)
    assert FedAvg(server_lr=1).to_dict() == FedAvg().to_dict()
    assert isinstance(FedAvg(server_lr=1).server_lr, float)


def test_client_updates_replace_does_not_mutate():
    r = reports([[1.0, 2.0]], [3])
    r2 = r.replace(updates=torch.zeros(1, 2))
    assert torch.equal(r.updates, torch.tensor([[1.0, 2.0]]))
    assert torch.equal(r2.updates, torch.zeros(1, 2)) and r2.m == 1 and r2.num_samples.tolist() == [3]


# ----------------------------------------------------------------------------- FedAvg-FT

def _shards(algorithm, rounds=2):
    from fairfl import ExperimentConfig, PartitionSpec
    return ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (0, 1, 2)}, model="logreg",
                            partition=PartitionSpec("shards", num_clients=6, shards_per_client=1),
                            local=LocalTraining(epochs=1, batch_size=100, lr=0.1), rounds=rounds, participation=0.5,
                            eval_every=rounds, track_improved=False, track_validation=True, algorithm=algorithm)


def test_fedavg_ft_trains_as_fedavg_and_scores_each_client_after_fine_tuning(fmnist, tmp_path):
    """Its global model is FedAvg's bit for bit; each client is scored at the global model after
    one epoch of its own local SGD (on the FINETUNE stream), computed here by hand from the
    checkpoint; a second epoch moves the scores. Broken variants caught: scoring the global model,
    fine-tuning only the sampled clients, fine-tuning on the round's training batches."""
    from fairfl.federated.algorithms.fedavg import FedAvgFT
    from fairfl.training.client import ClientRuntime, set_flat_params
    from fairfl.runs.history import load_checkpoint
    from fairfl.runs.loop import federated_data, simulate
    from fairfl.federated.models import build_model
    from fairfl.base.seeding import FINETUNE
    ft = simulate(_shards(FedAvgFT()), checkpoint_dir=tmp_path / "ft", progress=False)
    avg = simulate(_shards(FedAvg()), checkpoint_dir=tmp_path / "avg", progress=False)
    w_ft, w_avg = (load_checkpoint(tmp_path / n, _shards(a)).params for n, a in (("ft", FedAvgFT()), ("avg", FedAvg())))
    assert torch.equal(w_ft, w_avg) and ft.sampled == avg.sampled and ft.round_lr == avg.round_lr
    cfg = _shards(FedAvgFT())
    fed = federated_data(cfg)
    model = build_model("logreg", fed.dataset.input_shape, fed.dataset.num_classes, seed=0)
    clients = ClientRuntime(model, fed.clients, cfg.seed, True)
    clients.validation, clients.round = True, cfg.rounds - 1
    tuned = clients.train_from(list(range(6)), w_avg.unsqueeze(0).repeat(6, 1), cfg.local, purpose=FINETUNE)
    by_hand = clients.evaluate_each(list(tuned))
    assert ft.test_acc[-1] == list(by_hand.test_acc) and ft.val_acc[-1] == list(by_hand.val_acc)
    assert ft.test_acc[-1] != avg.test_acc[-1]
    two = simulate(_shards(FedAvgFT(finetune_epochs=2)), progress=False)
    assert two.test_loss[-1] != ft.test_loss[-1]
    with pytest.raises(ConfigError, match="finetune_epochs"):
        FedAvgFT(finetune_epochs=0)
