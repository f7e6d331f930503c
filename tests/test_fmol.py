"""FMOL (FMGDA / FSMGDA, Algorithm 1) and the MultiMNIST builder.

The mathematics on small synthetic multi-task problems in float64: A = I with one client per
objective is FedMGDA; K = 1 full-batch FMGDA is centralised MGD step for step; step 5 averages
each objective over exactly the clients that hold it; the local update is K steps of gradient
descent; the QP's direction is a common descent direction. Then determinism, the NaN guard,
error cases, the cache, and the MultiMNIST builder on the real mnist_5k subset."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fairfl.aggregators import fedmgda
from fairfl.errors import ConfigError, TrainingDivergedError
from fairfl.fmol import (CHECKPOINT, Checkpoint, FMOLConfig, FMOLHistory, FMOLProblem, average_updates, common_direction,
                         format_rounds, rounds_to_threshold, table2_config,
                         fmol_round, local_update, minibatches, objective_gradients, objective_values,
                         run, run_centralised, run_federated, run_many, working_copy)
from fairfl.local import ClientUpdates
from fairfl.minnorm import min_norm_weights
from fairfl.multitask import MultiTaskNet, ParamLayout, init_parameters, multi_lenet


# ----------------------------------------------------------------------------- synthetic problems

def tiny_model(num_tasks: int, seed: int = 0, in_features: int = 6, classes: int = 3) -> MultiTaskNet:
    model = MultiTaskNet(nn.Sequential(nn.Linear(in_features, 5), nn.Tanh()),
                         [nn.Linear(5, classes) for _ in range(num_tasks)]).double()
    init_parameters(model, torch.Generator().manual_seed(seed))
    return model


def tiny_problem(num_clients: int, num_tasks: int, A=None, n: int = 12, seed: int = 0,
                 in_features: int = 6, classes: int = 3) -> FMOLProblem:
    g = torch.Generator().manual_seed(seed)
    clients = []
    for i in range(num_clients):
        # client-specific shift: heterogeneous data, so the objectives conflict
        x = torch.randn(n, in_features, generator=g, dtype=torch.float64) + 0.5 * i
        y = torch.randint(0, classes, (n, num_tasks), generator=g)
        clients.append((x, y))
    return FMOLProblem(clients, A)


def rngs(m: int, seed: int = 0):
    return [np.random.default_rng((seed, i)) for i in range(m)]


def one_round(problem, model, **kw):
    work, layout = working_copy(model), ParamLayout(model)
    theta = layout.flatten(model)
    opts = dict(local_steps=3, batch_size=None, local_lr=0.1, global_lr=0.5, rngs=rngs(problem.num_clients))
    opts.update(kw)
    return theta, layout, fmol_round(problem, work, layout, theta, **opts)


# ----------------------------------------------------------------------------- the mathematics

def test_identity_A_with_one_client_per_objective_is_fedmgda():
    """FMOL §3.2, first bullet: A = I, S = M. Step 5 is then the identity (Δ_s = Δ_{s,s}) and steps
    6–7 are FedMGDA's min-norm direction over the clients' updates (fairfl's FedMGDA aggregator,
    ε = 1 without normalisation, on the pseudo-gradients g_i = w_t − w_i = η_L Δ_{i,i})."""
    M = 3
    problem = tiny_problem(M, M, A=np.eye(M, dtype=int))
    model = tiny_model(M)
    lr_local, lr_global = 0.1, 0.5
    theta, layout, r = one_round(problem, model, local_lr=lr_local, global_lr=lr_global)
    client_rows = torch.stack([r.updates[i, i] for i in range(M)])
    torch.testing.assert_close(r.deltas, client_rows, rtol=0, atol=0)
    pseudo = lr_local * client_rows
    agg = fedmgda().aggregate(ClientUpdates(np.arange(M), pseudo, torch.full((M,), 12)), {}, 0)
    np.testing.assert_allclose(r.lam, agg.weights.numpy(), atol=1e-7)
    torch.testing.assert_close(lr_local * r.direction, agg.direction, rtol=1e-7, atol=1e-12)
    torch.testing.assert_close(r.theta, theta - lr_global * r.direction)
    # and the clients' updates conflict (otherwise this would be a weak test): λ is interior
    assert (r.lam > 0.01).sum() >= 2


@pytest.mark.parametrize("A", [None, [[1, 1], [1, 0], [0, 1], [1, 1]]])
def test_fmgda_with_one_local_step_is_centralised_mgd_step_for_step(A):
    problem = tiny_problem(4, 2, A=A)
    model = tiny_model(2)
    fed = run_federated(problem, model, rounds=6, local_steps=1, local_lr=0.3, global_lr=0.3)
    cen = run_centralised(problem, model, rounds=6, iterations_per_round=1, lr=0.3)
    np.testing.assert_allclose(fed.loss, cen.loss, rtol=1e-12)
    np.testing.assert_allclose(fed.lam, cen.lam, atol=1e-9)
    np.testing.assert_allclose(fed.d_sq, cen.d_sq, rtol=1e-9)
    np.testing.assert_allclose(fed.step_sq, cen.step_sq, rtol=1e-9)
    assert np.all(np.isfinite(fed.d_sq))
    # with K = 1 the direction is built from the full gradients at x_t: ‖d̄_t‖² = ‖d_t‖²
    np.testing.assert_allclose(fed.d_sq, fed.step_sq, rtol=1e-9)
    assert fed.loss[-1].max() < fed.loss[0].max()          # it did move


def test_fmgda_k1_equals_mgd_on_multimnist_lenet(multimnist):
    """The same on the real model and data (float32, channels-last convolutions)."""
    from fairfl.multimnist import federate
    problem = FMOLProblem(federate(multimnist, 3, 16, iid=False, seed=0), tasks=multimnist.tasks)
    model = multi_lenet()
    init_parameters(model, torch.Generator().manual_seed(0))
    fed = run_federated(problem, model, rounds=3, local_steps=1, local_lr=0.1, global_lr=0.1)
    cen = run_centralised(problem, model, rounds=3, iterations_per_round=1, lr=0.1)
    np.testing.assert_allclose(fed.loss, cen.loss, rtol=1e-5)
    np.testing.assert_allclose(fed.lam, cen.lam, atol=1e-4)


def test_step5_averages_each_objective_over_its_holders_only():
    A = np.array([[1, 0], [1, 1], [0, 1]], dtype=bool)
    g = torch.Generator().manual_seed(1)
    updates = torch.randn(3, 2, 7, generator=g, dtype=torch.float64)
    updates[0, 1] = float("nan")       # client 0 does not hold objective 1
    updates[2, 0] = 1e300              # client 2 does not hold objective 0
    deltas = average_updates(updates, A)
    torch.testing.assert_close(deltas[0], (updates[0, 0] + updates[1, 0]) / 2)
    torch.testing.assert_close(deltas[1], (updates[1, 1] + updates[2, 1]) / 2)


def test_a_client_that_does_not_hold_an_objective_does_not_influence_it():
    A = [[1, 1], [1, 0], [0, 1]]
    problem = tiny_problem(3, 2, A=A)
    model = tiny_model(2)
    _, _, base = one_round(problem, model)
    # change what client 1 would say about objective 1 (labels) and client 2 about objective 0
    clients = [(x.clone(), y.clone()) for x, y in zip(problem.x, problem.y)]
    clients[1][1][:, 1] = (clients[1][1][:, 1] + 1) % 3
    clients[2][1][:, 0] = (clients[2][1][:, 0] + 2) % 3
    _, _, other = one_round(FMOLProblem(clients, A), model)
    torch.testing.assert_close(other.deltas, base.deltas, rtol=0, atol=0)
    torch.testing.assert_close(other.theta, base.theta, rtol=0, atol=0)
    assert torch.count_nonzero(base.updates[1, 1]) == 0 and torch.count_nonzero(base.updates[2, 0]) == 0
    # ... whereas the labels of a held objective do change the result
    clients[0][1][:, 1] = (clients[0][1][:, 1] + 1) % 3
    _, _, changed = one_round(FMOLProblem(clients, A), model)
    assert not torch.allclose(changed.deltas[1], base.deltas[1])
    torch.testing.assert_close(changed.deltas[0], base.deltas[0], rtol=0, atol=0)


def test_local_update_is_k_steps_of_gradient_descent():
    """Δ_{s,i} = Σ_{k<K} ∇f_{s,i}(x^{t,k}) = (x_t − x^{t,K}) / η_L, moving only trunk and head s."""
    problem = tiny_problem(1, 2)
    model = tiny_model(2)
    layout, work = ParamLayout(model), working_copy(model)
    theta = layout.flatten(model)
    K, lr, task = 4, 0.2, 1
    delta, loss0, grad0 = local_update(work, layout, theta, problem.x[0], problem.y[0], task, [None] * K, lr)
    # reference: plain autograd on a fresh copy
    ref = tiny_model(2)
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    grads = []
    for _ in range(K):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ref(problem.x[0], task), problem.y[0][:, task])
        loss.backward()
        grads.append(torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                                for p in ref.parameters()]))
        opt.step()
    torch.testing.assert_close(delta, torch.stack(grads).sum(0))
    torch.testing.assert_close(delta, (theta - layout.flatten(ref)) / lr)
    torch.testing.assert_close(grad0, grads[0])
    assert torch.count_nonzero(delta[layout.heads[0]]) == 0 and torch.count_nonzero(delta[layout.heads[1]]) > 0
    g_exact = objective_gradients(problem, work, layout, theta)[task]
    torch.testing.assert_close(grad0, g_exact)
    assert loss0 == pytest.approx(objective_values(problem, work, layout, theta)[task])


def test_the_direction_is_a_common_descent_direction():
    """MGDA's optimality condition: Δ_s · d ≥ ‖d‖² for every s (Désidéri 2012), so the step does
    not increase any objective to first order."""
    problem = tiny_problem(3, 3)
    _, _, r = one_round(problem, tiny_model(3), local_steps=1)
    d = r.direction
    for s in range(3):
        assert float(r.deltas[s] @ d) >= float(d @ d) * (1 - 1e-7)
    assert r.step_sq == pytest.approx(float(d @ d), rel=1e-9)


def test_qp_over_shared_parameters_only():
    problem = tiny_problem(2, 2)
    model = tiny_model(2)
    layout = ParamLayout(model)
    _, _, r = one_round(problem, model)
    d_all, lam_all, _ = common_direction(r.deltas)
    d_sh, lam_sh, sq_sh = common_direction(r.deltas, layout.shared)
    v = r.deltas[:, layout.shared]
    np.testing.assert_allclose(lam_sh, min_norm_weights((v @ v.T).numpy()), atol=1e-9)
    torch.testing.assert_close(d_sh, torch.from_numpy(lam_sh) @ r.deltas)   # heads still move by λ_s Δ_s
    assert sq_sh == pytest.approx(float((torch.from_numpy(lam_sh) @ v).pow(2).sum()), rel=1e-9)
    assert not np.allclose(lam_sh, lam_all, atol=1e-3)                      # the choice matters here


def test_minibatches():
    rng = np.random.default_rng(0)
    batches = minibatches(50, 8, 5, rng)
    assert len(batches) == 5
    for b in batches:
        assert len(b) == 8 and len(set(b.tolist())) == 8 and b.min() >= 0 and b.max() < 50
    assert any(not np.array_equal(batches[0], b) for b in batches[1:])
    assert minibatches(50, None, 3, rng) == [None] * 3 and minibatches(50, 50, 2, rng) == [None] * 2


# ----------------------------------------------------------------------------- runs

def test_runs_are_deterministic_and_depend_on_the_seed():
    problem = tiny_problem(3, 2, n=20)
    model = tiny_model(2)
    kw = dict(rounds=3, local_steps=4, batch_size=5, local_lr=0.1, global_lr=0.1)
    a = run_federated(problem, model, seed=7, **kw)
    b = run_federated(problem, model, seed=7, **kw)
    c = run_federated(problem, model, seed=8, **kw)
    for field in ("loss", "lam", "d_sq", "step_sq"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert not np.array_equal(a.loss, c.loss)
    assert np.isfinite(a.d_sq).all()       # tracked with an extra full pass for minibatch runs
    s1 = run_centralised(problem, model, rounds=2, iterations_per_round=3, batch_size=5, seed=7)
    s2 = run_centralised(problem, model, rounds=2, iterations_per_round=3, batch_size=5, seed=7)
    np.testing.assert_array_equal(s1.loss, s2.loss)


class CrashAfter(Checkpoint):
    """Saves like a Checkpoint and records the rounds it saw; with ``crash_at``, then stops the
    run the way a killed process would."""

    def __init__(self, folder, key, every, crash_at=None):
        super().__init__(folder, key, every)
        self.crash_at, self.seen = crash_at, []

    def after_round(self, done, rounds, *args):
        super().after_round(done, rounds, *args)
        self.seen.append(done)
        if done == self.crash_at:
            raise KeyboardInterrupt


@pytest.mark.parametrize("loop", ["federated", "centralised"])
def test_an_interrupted_run_resumes_to_the_uninterrupted_result(loop, tmp_path):
    problem, model = tiny_problem(3, 2, n=20), tiny_model(2)
    if loop == "federated":
        go = lambda **kw: run_federated(problem, model, rounds=7, local_steps=3, batch_size=5, seed=3, **kw)  # noqa: E731
    else:
        go = lambda **kw: run_centralised(problem, model, rounds=7, iterations_per_round=3, batch_size=5, seed=3, **kw)  # noqa: E731
    whole = go()
    with pytest.raises(KeyboardInterrupt):
        go(checkpoint=CrashAfter(tmp_path, "run-a", every=2, crash_at=5))
    assert (tmp_path / CHECKPOINT).is_file()                     # saved after round 4, not 5
    again = CrashAfter(tmp_path, "run-a", every=2)
    resumed = go(checkpoint=again)
    assert again.seen == [5, 6, 7]                               # it went on from round 4
    for field in ("loss", "lam", "d_sq", "step_sq"):
        np.testing.assert_array_equal(getattr(resumed, field), getattr(whole, field))
    # a checkpoint of another config is ignored: that run starts from round 0
    other = CrashAfter(tmp_path, "run-b", every=2)
    np.testing.assert_array_equal(go(checkpoint=other).loss, whole.loss)
    assert other.seen == list(range(1, 8))


def test_checkpoint_rejects_a_bad_interval(tmp_path):
    with pytest.raises(ConfigError, match="checkpoint every"):
        Checkpoint(tmp_path, "k", every=0)


def test_divergence_raises_a_named_error():
    problem = tiny_problem(2, 2)
    linear = MultiTaskNet(nn.Linear(6, 5), [nn.Linear(5, 3) for _ in range(2)]).double()   # nothing saturates
    init_parameters(linear, torch.Generator().manual_seed(0))
    with pytest.raises(TrainingDivergedError, match="NaN/Inf"):
        run_federated(problem, linear, rounds=3, local_steps=3, local_lr=1e200, global_lr=1e200)
    bad = ParamLayout(linear).flatten(linear)
    bad[0] = float("inf")
    with pytest.raises(TrainingDivergedError, match="initial model"):
        run_federated(problem, linear, rounds=1, local_steps=1, theta0=bad)


def test_rounds_to_threshold():
    h = FMOLHistory(np.array([[1.0, 2.0], [0.5, 0.9], [0.05, 0.8]]), np.zeros((2, 2)), np.zeros(2),
                    np.zeros(2), ("L", "R"))
    np.testing.assert_array_equal(h.rounds_to(0.5), [1.0, np.inf])
    np.testing.assert_array_equal(h.rounds_to(0.9), [1.0, 1.0])


def test_table2_rounds_over_seeds_and_their_table_entries():
    def history(l_curve, r_curve):
        loss = np.stack([l_curve, r_curve], axis=1)
        return FMOLHistory(loss, np.zeros((len(loss) - 1, 2)), np.zeros(len(loss) - 1), np.zeros(len(loss) - 1), ("L", "R"))
    seeds = [history([1.0, 0.009, 0.001], [1.0, 0.5, 0.2]), history([1.0, 0.5, 0.01], [1.0, 0.5, 0.3])]
    r = rounds_to_threshold(seeds)                                  # 10⁻² of Table 2; reached at ≤, not <
    np.testing.assert_array_equal(r, [[1, np.inf], [2, np.inf]])
    assert format_rounds(r[:, 0], 2) == "1.5 ± 0.5"
    assert format_rounds(r[:, 1], 2) == "> 2"
    assert format_rounds(np.array([3.0, np.inf, np.inf]), 9) == "3.0 (1/3 seeds; others > 9)"
    assert format_rounds(np.array([4.0]), 9) == "4"


def test_table2_config_is_the_papers_fmgda_setting():
    c = table2_config(20, iid=False, seed=3)
    assert (c.method, c.batch_size, c.num_clients, c.samples_per_client, c.rounds) == ("federated", None, 10, 256, 100)
    assert (c.local_steps, c.local_lr, c.global_lr, c.iid, c.seed, c.partition_seed) == (20, 0.1, 0.1, False, 3, 3)
    assert c.key() != table2_config(20, iid=True, seed=3).key() != table2_config(10, iid=True, seed=3).key()


@pytest.mark.parametrize("A, match", [([[1, 0], [1, 0]], "held by no client"), ([[1, 2], [1, 1]], "binary"),
                                      ([[1, 1, 1], [1, 1, 1]], "shape")])
def test_problem_rejects_bad_indicator_matrices(A, match):
    with pytest.raises(ConfigError, match=match):
        tiny_problem(2, 2, A=A)


def test_problem_rejects_bad_data():
    x = torch.randn(4, 3, dtype=torch.float64)
    with pytest.raises(ConfigError, match="disagree"):
        FMOLProblem([(x, torch.zeros(4, 2, dtype=torch.long)), (x, torch.zeros(4, 3, dtype=torch.long))])
    with pytest.raises(ConfigError, match="shape"):
        FMOLProblem([(x, torch.zeros(5, 2, dtype=torch.long))])
    with pytest.raises(ConfigError, match="finite"):
        FMOLProblem([(x * float("nan"), torch.zeros(4, 2, dtype=torch.long))])
    with pytest.raises(ConfigError, match="non-negative"):
        FMOLProblem([(x, -torch.ones(4, 2, dtype=torch.long))])


@pytest.mark.parametrize("kw, match", [(dict(rounds=0), "rounds"), (dict(local_steps=0), "local_steps"),
                                       (dict(batch_size=0), "batch_size"), (dict(local_lr=-1.0), "local_lr"),
                                       (dict(global_lr=float("nan")), "global_lr"), (dict(qp_params="heads"), "qp_params"),
                                       (dict(solver="gurobi"), "solver")])
def test_run_rejects_bad_parameters(kw, match):
    opts = dict(rounds=1, local_steps=1)
    opts.update(kw)
    with pytest.raises(ConfigError, match=match):
        run_federated(tiny_problem(2, 2), tiny_model(2), **opts)


def test_run_rejects_a_model_with_the_wrong_number_of_heads():
    with pytest.raises(ConfigError, match="heads"):
        run_federated(tiny_problem(2, 2), tiny_model(3), rounds=1, local_steps=1)


@pytest.mark.parametrize("kw, match", [(dict(method="fedavg"), "method"), (dict(batch_size=256), "full batch"),
                                       (dict(dataset="cifar"), "dataset"), (dict(num_clients=0), "num_clients")])
def test_config_validation(kw, match):
    with pytest.raises(ConfigError, match=match):
        FMOLConfig(**kw).validate()


def test_cached_run_and_run_many(fairfl_env):
    cfg = FMOLConfig(source="mnist_5k", num_clients=2, samples_per_client=8, local_steps=2, batch_size=4, rounds=2)
    h = run(cfg)
    assert h.loss.shape == (3, 2) and h.lam.shape == (2, 2) and np.isfinite(h.loss).all()
    np.testing.assert_allclose(h.lam.sum(axis=1), 1.0)
    again = run(cfg)                                        # from the cache: same numbers
    np.testing.assert_array_equal(again.loss, h.loss)
    from fairfl.fmol import run_dir
    assert not (run_dir(cfg) / CHECKPOINT).exists()          # the finished history replaced it
    assert again.config == cfg.to_dict() and again.tasks == ("L", "R")
    both = run_many([cfg, cfg.replace(method="centralised")], progress=False)
    np.testing.assert_array_equal(both[0].loss, h.loss)
    assert both[1].config["method"] == "centralised" and np.isfinite(both[1].loss).all()
    assert both[1].loss[0].tolist() == h.loss[0].tolist()   # same initial point for every method


# ----------------------------------------------------------------------------- MultiMNIST

@pytest.fixture(scope="module")
def multimnist(fairfl_env):
    from fairfl.multimnist import load_multimnist
    return load_multimnist(source="mnist_5k", seed=0)


def test_multimnist_from_mnist_5k(multimnist):
    from fairfl.datasets import load_dataset
    from fairfl.multimnist import pair_indices
    ds = multimnist
    assert ds.x_train.shape == (4000, 1, 28, 28) and ds.x_test.shape == (1000, 1, 28, 28)
    assert ds.y_train.shape == (4000, 2) and ds.y_train.dtype == torch.int64 and ds.tasks == ("L", "R")
    assert int(ds.y_train.min()) == 0 and int(ds.y_train.max()) == 9
    assert abs(float(ds.x_train.mean())) < 1e-4 and abs(float(ds.x_train.std()) - 1) < 1e-4
    base = load_dataset("mnist_5k", normalize="none")
    partner = pair_indices(4000, np.random.default_rng(0))          # the pairs of seed 0's train split
    assert torch.equal(ds.y_train[:, 0], base.y_train)
    assert torch.equal(ds.y_train[:, 1], base.y_train[torch.from_numpy(partner)])
    assert sorted(partner.tolist()) == list(range(4000)) and not (partner == np.arange(4000)).any()
    # both tasks' labels are balanced-ish: every class of R appears as often as in the base
    assert torch.bincount(ds.y_train[:, 1]).tolist() == [400] * 10


def test_compose_places_left_top_left_and_right_bottom_right():
    from fairfl.multimnist import compose
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


def test_noniid_partition_gives_at_most_two_task_L_labels(multimnist):
    from fairfl.multimnist import federate, label_counts, partition
    parts = partition(multimnist.y_train, 10, 256, iid=False, rng=np.random.default_rng(3))
    flat = np.concatenate(parts)
    assert len(parts) == 10 and all(len(p) == 256 for p in parts) and len(np.unique(flat)) == 2560
    for p in parts:
        assert len(np.unique(multimnist.y_train[p, 0].numpy())) <= 2
    counts = label_counts(federate(multimnist, 10, 256, iid=False, seed=3), 0, 10)
    assert ((counts > 0).sum(axis=1) <= 2).all() and counts.sum() == 2560
    # the other task is not restricted (its labels come with the pairs)
    counts_r = label_counts(federate(multimnist, 10, 256, iid=False, seed=3), 1, 10)
    assert ((counts_r > 0).sum(axis=1) > 2).all()
    # restricting task R instead
    parts_r = partition(multimnist.y_train, 10, 256, iid=False, rng=np.random.default_rng(3), label_task=1)
    assert all(len(np.unique(multimnist.y_train[p, 1].numpy())) <= 2 for p in parts_r)


def test_iid_partition_and_seeding(multimnist):
    from fairfl.multimnist import partition
    a = partition(multimnist.y_train, 10, 256, iid=True, rng=np.random.default_rng(0))
    b = partition(multimnist.y_train, 10, 256, iid=True, rng=np.random.default_rng(0))
    c = partition(multimnist.y_train, 10, 256, iid=True, rng=np.random.default_rng(1))
    assert all(np.array_equal(p, q) for p, q in zip(a, b)) and not np.array_equal(a[0], c[0])
    assert len(np.unique(np.concatenate(a))) == 2560
    assert all(len(np.unique(multimnist.y_train[p, 0].numpy())) >= 8 for p in a)


def test_partition_errors(multimnist):
    from fairfl.multimnist import load_multimnist, partition
    rng = np.random.default_rng(0)
    with pytest.raises(ConfigError, match="only 4000"):
        partition(multimnist.y_train, 20, 256, iid=True, rng=rng)
    # 16 clients x 250 fit in 4000 samples, but a class dealt 4 of the 32 shards needs 500 of its 400
    with pytest.raises(ConfigError, match="class"):
        partition(multimnist.y_train, 16, 250, iid=False, rng=rng)
    with pytest.raises(ConfigError, match="label_task"):
        partition(multimnist.y_train, 2, 8, iid=False, rng=rng, label_task=2)
    with pytest.raises(ConfigError, match="source"):
        load_multimnist(source="emnist")
