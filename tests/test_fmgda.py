"""FMOL (FMGDA / FSMGDA, Algorithm 1) on the one round loop, and the MultiMNIST builder.

The rule on hand-made vectors: step 5 averages each objective over exactly its holders; the
min-norm direction is a common descent direction; A = I with one client per objective is
FedMGDA; the QP over the shared parameters. The clients' per-objective training on small
synthetic float64 problems: K steps of gradient descent per held objective, moving only the
trunk and that head, one minibatch stream per client. Then runs on real MultiMNIST (mnist_5k):
K = 1 FMGDA is centralised MGD (the pooled client) step for step, a partial indicator matrix,
determinism, resume, the NaN guard and the configuration errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fairfl import ConfigError, ExperimentConfig, LocalTraining, PartitionSpec, TrainingDivergedError
from fairfl.federated.algorithms import Context
from fairfl.federated.algorithms.fedmgda import FedMGDA
from fairfl.federated.algorithms.fmgda import FMGDA, average_updates
from fairfl.training.client import train_objectives
from fairfl.runs.history import load_checkpoint
from fairfl.runs.loop import simulate
from fairfl.federated.messages import ClientUpdates
from fairfl.federated.minnorm import min_norm_weights
from fairfl.federated.models import MultiTaskNet, objective_indices, shared_mask
from fairfl.federated.partition import Client


# ----------------------------------------------------------------------------- the server rule

def message(updates, held=None, shared=None, first=None):
    u = torch.as_tensor(updates, dtype=torch.float64)
    m = u.shape[0]
    extras = {} if first is None else {"first_gradients": torch.as_tensor(first, dtype=torch.float64)}
    return ClientUpdates(np.arange(m), u, torch.full((m,), 10), extras=extras,
                         held=None if held is None else torch.as_tensor(held, dtype=torch.bool), shared=shared)


def test_step5_averages_each_objective_over_its_holders_only():
    held = torch.tensor([[1, 0], [1, 1], [0, 1]], dtype=torch.bool)
    g = torch.Generator().manual_seed(1)
    updates = torch.randn(3, 2, 7, generator=g, dtype=torch.float64)
    updates[0, 1] = float("nan")       # client 0 does not hold objective 1
    updates[2, 0] = 1e300              # client 2 does not hold objective 0
    deltas = average_updates(updates, held)
    torch.testing.assert_close(deltas[0], (updates[0, 0] + updates[1, 0]) / 2)
    torch.testing.assert_close(deltas[1], (updates[1, 1] + updates[2, 1]) / 2)
    with pytest.raises(ConfigError, match="objective 1 is held by no client"):
        average_updates(updates, torch.tensor([[1, 0], [1, 0], [1, 0]], dtype=torch.bool))


def test_identity_A_with_one_client_per_objective_is_fedmgda():
    """FMOL §3.2, first bullet: A = I, S = M. Step 5 is the identity (Δ_s = Δ_{s,s}) and steps
    6–7 are FedMGDA's min-norm direction over the clients' updates."""
    M, d = 3, 9
    rows = torch.randn(M, d, generator=torch.Generator().manual_seed(4), dtype=torch.float64) + 0.2
    updates = torch.zeros(M, M, d, dtype=torch.float64)
    for i in range(M):
        updates[i, i] = rows[i]
    agg = FMGDA().aggregate(message(updates, held=torch.eye(M)), None, Context())
    ref = FedMGDA().aggregate(ClientUpdates(np.arange(M), rows, torch.full((M,), 10)), None, Context())
    torch.testing.assert_close(agg.direction, ref.direction, rtol=0, atol=0)
    np.testing.assert_allclose(agg.info["lambda"], ref.weights.numpy(), atol=0)
    assert (np.asarray(agg.info["lambda"]) > 0.01).sum() >= 2        # the clients conflict: λ is interior


def test_the_direction_is_a_common_descent_direction():
    """MGDA's optimality condition: Δ_s · d ≥ ‖d‖² for every s (Désidéri 2012), so the step does
    not increase any objective to first order; ‖d‖² is logged as step_sq."""
    g = torch.randn(4, 3, 12, generator=torch.Generator().manual_seed(2), dtype=torch.float64) + 0.1
    agg = FMGDA().aggregate(message(g), None, Context())
    deltas = g.mean(0)
    d = agg.direction
    for s in range(3):
        assert float(deltas[s] @ d) >= float(d @ d) * (1 - 1e-7)
    assert agg.info["step_sq"] == pytest.approx(float(d @ d), rel=1e-9)
    assert sum(agg.info["lambda"]) == pytest.approx(1.0)


def test_qp_over_shared_parameters_only():
    g = torch.randn(2, 2, 10, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    shared = torch.tensor([True] * 6 + [False] * 4)
    g[:, 0, 8:] = 0.0                  # head 0 = coordinates 6–7, head 1 = 8–9
    g[:, 1, 6:8] = 0.0
    g[:, 0, 6:8] *= 30                 # a large head update: it matters whether heads enter the QP
    deltas = g.mean(0)
    every = FMGDA().aggregate(message(g, shared=shared), None, Context())
    trunk = FMGDA(qp_params="shared").aggregate(message(g, shared=shared), None, Context())
    v = deltas[:, shared]
    lam = min_norm_weights((v @ v.T).numpy())
    np.testing.assert_allclose(trunk.info["lambda"], lam, atol=1e-12)
    torch.testing.assert_close(trunk.direction, torch.from_numpy(lam) @ deltas)     # heads move by λ_s Δ_s
    assert trunk.info["step_sq"] == pytest.approx(float((torch.from_numpy(lam) @ v).pow(2).sum()), rel=1e-9)
    assert not np.allclose(trunk.info["lambda"], every.info["lambda"], atol=1e-3)   # the choice matters here


def test_stationarity_is_lambda_applied_to_the_full_gradients():
    g = torch.randn(3, 2, 5, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    full = torch.randn(3, 2, 5, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    agg = FMGDA().aggregate(message(g, first=full), None, Context())
    lam = torch.tensor(agg.info["lambda"], dtype=torch.float64)
    assert agg.info["d_sq"] == pytest.approx(float((lam @ full.mean(0)).pow(2).sum()), rel=1e-12)
    assert "d_sq" not in FMGDA().aggregate(message(g), None, Context()).info


# ----------------------------------------------------------------------------- the clients, synthetic

def tiny_model(tasks: int, seed: int = 0, features: int = 6, classes: int = 3) -> MultiTaskNet:
    torch.manual_seed(seed)
    return MultiTaskNet(nn.Sequential(nn.Linear(features, 5), nn.Tanh()),
                        [nn.Sequential(nn.Linear(5, classes)) for _ in range(tasks)]).double()


def tiny_clients(m: int, tasks: int, n: int = 12, seed: int = 0, features: int = 6, classes: int = 3):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(m):
        x = torch.randn(n, features, generator=g, dtype=torch.float64) + 0.5 * i   # heterogeneous
        y = torch.randint(0, classes, (n, tasks), generator=g)
        out.append(Client(x, y, x[:0], y[:0], x[:0], y[:0]))
    return out


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("batched", [True, False])
def test_local_update_is_k_steps_of_gradient_descent_on_the_held_objective(batched):
    """Δ_{s,i} = Σ_{k<K} ∇f_{s,i}(x^{t,k}), moving only the trunk and head s; loss_before is
    f_{s,i}(x_t); the first gradient is ∇f_{s,i}(x_t)."""
    model, data = tiny_model(2), tiny_clients(1, 2)
    theta = flat(model)
    K, lr, task = 4, 0.2, 1
    out = train_objectives(model, theta, data, [0], torch.tensor([[True, True]]), LocalTraining(steps=K, batch_size=None, lr=lr),
                           seed=0, round_=0, batched=batched, first_gradients=True)
    ref = tiny_model(2)
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    grads, first_loss = [], None
    for k in range(K):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ref(data[0].x_train, task), data[0].y_train[:, task])
        first_loss = float(loss.detach()) if k == 0 else first_loss
        loss.backward()
        grads.append(torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                                for p in ref.parameters()]))
        opt.step()
    torch.testing.assert_close(out.updates[0, task], torch.stack(grads).sum(0))
    torch.testing.assert_close(out.extras["first_gradients"][0, task], grads[0])
    assert float(out.loss_before[0, task]) == pytest.approx(first_loss)
    head0 = objective_indices(model, 0)[~shared_mask(model)[objective_indices(model, 0)]]
    assert torch.count_nonzero(out.updates[0, task][head0]) == 0
    assert torch.count_nonzero(out.updates[0, task][objective_indices(model, task)]) > 0
    assert torch.equal(flat(model), theta)                       # the template model is untouched


def test_batched_and_reference_paths_agree_and_objectives_share_the_minibatches():
    model, data = tiny_model(2), tiny_clients(3, 2, n=20)
    theta = flat(model)
    held = torch.ones(3, 2, dtype=torch.bool)
    cfg = LocalTraining(steps=3, batch_size=5, lr=0.1)
    a = train_objectives(model, theta, data, [0, 1, 2], held, cfg, seed=4, round_=2, batched=True)
    b = train_objectives(model, theta, data, [0, 1, 2], held, cfg, seed=4, round_=2, batched=False)
    torch.testing.assert_close(a.updates, b.updates, rtol=1e-10, atol=1e-12)
    # two objectives with the same labels and the same head see the same ξ: identical trunk updates
    same = [Client(c.x_train, torch.stack([c.y_train[:, 0]] * 2, 1), c.x_val, c.y_val, c.x_test, c.y_test) for c in data]
    twin = tiny_model(2)
    twin.heads[1].load_state_dict(twin.heads[0].state_dict())
    tied = train_objectives(twin, flat(twin), same, [0, 1, 2], held, cfg, seed=4, round_=2)
    trunk = shared_mask(model)
    torch.testing.assert_close(tied.updates[:, 0, trunk], tied.updates[:, 1, trunk], rtol=0, atol=0)
    other_round = train_objectives(model, theta, data, [0, 1, 2], held, cfg, seed=4, round_=3)
    assert not torch.allclose(other_round.updates, a.updates)


def test_a_client_that_does_not_hold_an_objective_does_not_train_or_report_it():
    model, data = tiny_model(2), tiny_clients(3, 2)
    held = torch.tensor([[1, 1], [1, 0], [0, 1]], dtype=torch.bool)
    out = train_objectives(model, flat(model), data, [0, 1, 2], held, LocalTraining(steps=2, batch_size=None, lr=0.1),
                           seed=0, round_=0)
    assert torch.count_nonzero(out.updates[1, 1]) == 0 and torch.count_nonzero(out.updates[2, 0]) == 0
    assert torch.isnan(out.loss_before[1, 1]) and torch.isnan(out.loss_before[2, 0])
    # changing the labels of an objective a client does not hold changes nothing
    swapped = [c if i != 1 else Client(c.x_train, torch.stack([c.y_train[:, 0], (c.y_train[:, 1] + 1) % 3], 1),
                                       c.x_val, c.y_val, c.x_test, c.y_test) for i, c in enumerate(data)]
    again = train_objectives(model, flat(model), swapped, [0, 1, 2], held, LocalTraining(steps=2, batch_size=None, lr=0.1),
                             seed=0, round_=0)
    assert torch.equal(again.updates, out.updates)


# ----------------------------------------------------------------------------- runs on real MultiMNIST

def fmol(**changes) -> ExperimentConfig:
    base = ExperimentConfig(
        dataset="multimnist", dataset_options={"source": "mnist_5k", "seed": 0}, model="multi_lenet",
        partition=PartitionSpec("label_limited", num_clients=3, samples_per_client=20, shards_per_client=2),
        local=LocalTraining(steps=1, batch_size=None, lr=0.1), algorithm=FMGDA(server_lr=0.1), rounds=3,
        participation=1.0, eval_every=1, track_improved=False, checkpoint_every=2)
    return base.replace(**changes)


def test_fmgda_with_one_local_step_is_centralised_mgd_step_for_step():
    """K = 1, full batch: FMGDA over 3 equal clients and MGD on their pooled data take the same
    steps (FMOL §4.1: FMGDA degenerates to MGD), to float32 rounding."""
    fed = simulate(fmol(), progress=False)
    cen = simulate(fmol(partition=fmol().partition.__class__(**{**fmol().partition.__dict__, "pooled": True})),
                   progress=False)
    np.testing.assert_allclose(fed.train_losses(), cen.train_losses(), rtol=2e-5)
    np.testing.assert_allclose(fed.info_array("lambda"), cen.info_array("lambda"), atol=2e-3)
    # with K = 1 the direction is made of the full gradients at x_t: ‖d̄_t‖² = ‖d_t‖²
    np.testing.assert_allclose(fed.info_array("d_sq"), fed.info_array("step_sq"), rtol=1e-5)
    assert fed.train_losses()[-1].max() < fed.train_losses()[0].max()        # it moved
    assert fed.acc().shape == (4, 3, 2) and cen.acc().shape == (4, 1, 2)    # per client and objective


def test_fsmgda_minibatch_runs_are_deterministic_resume_exactly_and_track_stationarity(tmp_path):
    cfg = fmol(local=LocalTraining(steps=3, batch_size=5, lr=0.1), algorithm=FMGDA(server_lr=0.1), rounds=4)
    a = simulate(cfg, progress=False)
    b = simulate(cfg, checkpoint_dir=tmp_path, progress=False, stop_after=2)
    assert load_checkpoint(tmp_path, cfg).round == 2
    b = simulate(cfg, checkpoint_dir=tmp_path, progress=False)
    assert a.train_loss == b.train_loss and a.info == b.info and a.test_acc == b.test_acc
    assert np.isfinite(a.info_array("d_sq")).all()            # an extra full pass for minibatch runs
    c = simulate(cfg.replace(seed=1), progress=False)
    assert c.train_loss != a.train_loss


def test_a_partial_indicator_matrix_averages_over_the_holders():
    held = ((0, 1), (0,), (1,))
    h = simulate(fmol(algorithm=FMGDA(held=held), rounds=2), progress=False)
    assert np.isfinite(h.train_losses()).all() and h.train_losses().shape == (3, 2)
    full = simulate(fmol(rounds=2), progress=False)
    assert h.train_loss[1] != full.train_loss[1]


def test_divergence_raises_a_named_error():
    with pytest.raises(TrainingDivergedError, match="NaN/Inf"):
        simulate(fmol(local=LocalTraining(steps=2, batch_size=None, lr=1e30), algorithm=FMGDA(server_lr=1e30)),
                 progress=False)


@pytest.mark.parametrize("changes, match", [
    (dict(model="cnn_fmnist"), "fmgda trains one head per objective: use a multi-task model"),
    (dict(algorithm=FMGDA(held=((0, 1), (0,)))), "held has 2 rows for 3 clients"),
    (dict(attacks=({"kind": "bias", "client": 0, "bias": 1.0},)), "attacks rewrite single-objective reports"),
])
def test_config_errors_before_any_data(changes, match):
    with pytest.raises(ConfigError, match=match):
        fmol(**changes).validate()


@pytest.mark.parametrize("options, match", [({"qp_params": "heads"}, "qp_params='heads' is not allowed"),
                                            ({"server_lr": float("nan")}, "server_lr=nan is not allowed"),
                                            ({"solver": "gurobi"}, "solver='gurobi'"),
                                            ({"held": ((0, 0),)}, "distinct objective indices")])
def test_bad_options_are_named(options, match):
    with pytest.raises(ConfigError, match=match):
        FMGDA(**options)


def test_a_single_task_model_refuses_several_tasks():
    from fairfl.federated.models import build_model
    with pytest.raises(ConfigError, match="has one output head, the data has 2 tasks"):
        build_model("cnn_fmnist", (1, 28, 28), 10, tasks=2)


# ----------------------------------------------------------------------------- MultiMNIST

@pytest.fixture(scope="module")
def multimnist(fairfl_env):
    from fairfl.federated.data import load_dataset
    return load_dataset("multimnist", source="mnist_5k", seed=0)


def test_multimnist_from_mnist_5k(multimnist):
    from fairfl.federated.data import load_dataset
    from fairfl.federated.data.multimnist import pair_indices
    ds = multimnist
    assert ds.x_train.shape == (4000, 1, 28, 28) and ds.x_test.shape == (1000, 1, 28, 28)
    assert ds.y_train.shape == (4000, 2) and ds.y_train.dtype == torch.int64 and ds.tasks == ("L", "R")
    assert ds.num_tasks == 2
    assert int(ds.y_train.min()) == 0 and int(ds.y_train.max()) == 9
    assert abs(float(ds.x_train.mean())) < 1e-4 and abs(float(ds.x_train.std()) - 1) < 1e-4
    base = load_dataset("mnist_5k", normalize="none")
    partner = pair_indices(4000, np.random.default_rng(0))          # the pairs of seed 0's train split
    assert torch.equal(ds.y_train[:, 0], base.y_train)
    assert torch.equal(ds.y_train[:, 1], base.y_train[torch.from_numpy(partner)])
    assert sorted(partner.tolist()) == list(range(4000)) and not (partner == np.arange(4000)).any()
    assert torch.bincount(ds.y_train[:, 1]).tolist() == [400] * 10


def test_compose_places_left_top_left_and_right_bottom_right():
    from fairfl.federated.data.multimnist import compose
    left, right = torch.zeros(1, 1, 28, 28), torch.zeros(1, 1, 28, 28)
    left[..., :6, :6] = 1.0        # a blob in the top-left corner of the left image
    right[..., -6:, -6:] = 1.0     # and in the bottom-right corner of the right one
    out = compose(left, right, canvas=36, size=36)
    assert out.shape == (1, 1, 36, 36)
    assert out[0, 0, :6, :6].min() == 1.0 and out[0, 0, -6:, -6:].min() == 1.0
    assert out[0, 0, 10:26, 10:26].max() == 0.0
    small = compose(left, right)
    assert small.shape == (1, 1, 28, 28) and 0 <= float(small.min()) and float(small.max()) <= 1
    assert small[0, 0, :3, :3].mean() > 0.5 and small[0, 0, -3:, -3:].mean() > 0.5
    with pytest.raises(ConfigError, match="canvas"):
        compose(left, right, canvas=20)


def test_label_limited_partition_gives_at_most_two_task_L_labels(multimnist):
    from fairfl.federated.partition import federate, label_limited
    parts = label_limited(multimnist.y_train[:, 0].numpy(), 10, 256, 2, np.random.default_rng(3))
    flat_ids = np.concatenate(parts)
    assert len(parts) == 10 and all(len(p) == 256 for p in parts) and len(np.unique(flat_ids)) == 2560
    for p in parts:
        assert len(np.unique(multimnist.y_train[p, 0].numpy())) <= 2
    spec = PartitionSpec("label_limited", num_clients=10, samples_per_client=256, shards_per_client=2, seed=3,
                         split=(1.0, 0.0, 0.0))
    fed = federate(multimnist, spec)
    counts = fed.label_counts(task=0)
    assert ((counts > 0).sum(axis=1) <= 2).all() and counts.sum() == 2560
    assert ((fed.label_counts(task=1) > 0).sum(axis=1) > 2).all()   # task R comes with the pairs, unrestricted
    by_r = federate(multimnist, PartitionSpec(**{**spec.__dict__, "label_column": 1}))
    assert ((by_r.label_counts(task=1) > 0).sum(axis=1) <= 2).all()
    pooled = federate(multimnist, PartitionSpec(**{**spec.__dict__, "pooled": True}))
    assert pooled.num_clients == 1 and pooled.clients[0].num_train == 2560


def test_iid_subset_partition_and_seeding(multimnist):
    from fairfl.federated.partition import iid
    y = multimnist.y_train[:, 0].numpy()
    a = iid(len(y), 10, np.random.default_rng(0), samples_per_client=256)
    b = iid(len(y), 10, np.random.default_rng(0), samples_per_client=256)
    c = iid(len(y), 10, np.random.default_rng(1), samples_per_client=256)
    assert all(np.array_equal(p, q) for p, q in zip(a, b)) and not np.array_equal(a[0], c[0])
    assert len(np.unique(np.concatenate(a))) == 2560
    assert all(len(np.unique(y[p])) >= 8 for p in a)


def test_partition_errors(multimnist):
    from fairfl.federated.data import load_dataset
    from fairfl.federated.partition import federate, iid, label_limited
    rng = np.random.default_rng(0)
    y = multimnist.y_train[:, 0].numpy()
    with pytest.raises(ConfigError, match="only 4000"):
        iid(len(y), 20, rng, samples_per_client=256)
    # 16 clients x 250 fit in 4000 samples, but a class dealt 4 of the 32 shards needs 500 of its 400
    with pytest.raises(ConfigError, match="class"):
        label_limited(y, 16, 250, 2, rng)
    with pytest.raises(ConfigError, match="label_column=2"):
        federate(multimnist, PartitionSpec("label_limited", num_clients=2, samples_per_client=8, label_column=2))
    with pytest.raises(ConfigError, match="needs samples_per_client"):
        PartitionSpec("label_limited", num_clients=2).validate()
    with pytest.raises(ConfigError, match="source"):
        load_dataset("multimnist", source="emnist")
