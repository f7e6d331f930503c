"""Ditto (Li et al., ICML 2021): the global model is FedAvg's whatever λ, the personal update
is SGD on Fₖ(v) + (λ/2)‖v − wᵗ‖² anchored at the round-start global model, λ pulls the personal
models towards the global one, unsampled clients keep theirs, evaluation is personal (a client never
sampled is scored at a model trained for FedAvg-FT's budget, never at the untrained w⁰), and a
checkpointed run resumes exactly with its clients' state."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fairfl import ConfigError, ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.federated.algorithms.ditto import Ditto
from fairfl.federated.algorithms.fedavg import FedAvg, FedAvgFT
from fairfl.training.client import flat_params, set_flat_params, train_instances
from fairfl.runs.history import load_checkpoint
from fairfl.runs.loop import simulate
from fairfl.federated.models import build_model
from fairfl.base.seeding import Stream

SHARDS = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (0, 1, 2)}, model="mlp2",
                          partition=PartitionSpec("shards", num_clients=6, shards_per_client=1),
                          local=LocalTraining(epochs=1, batch_size=200, lr=0.1), rounds=3, participation=0.5,
                          eval_every=1, checkpoint_every=1, track_improved=True)


def global_model(cfg, folder):
    simulate(cfg, checkpoint_dir=folder, progress=False)
    return load_checkpoint(folder, cfg)


@pytest.mark.parametrize("lam", [0.0, 1.0, 5.0])
def test_the_global_model_is_fedavgs_bit_for_bit(fmnist, tmp_path, lam):
    d = global_model(SHARDS.replace(algorithm=Ditto(lam=lam)), tmp_path / "ditto")
    f = global_model(SHARDS.replace(algorithm=FedAvg()), tmp_path / "fedavg")
    assert torch.equal(d.params, f.params)
    assert d.history.sampled == f.history.sampled and d.history.round_improved == f.history.round_improved


def test_personal_step_is_anchored_at_the_round_start_global_model():
    """Two full-batch steps from v with centre w: v ← v − η(∇F(v) + λ(v − w)), w fixed, by hand."""
    torch.manual_seed(0)
    model = build_model("logreg", (4,), 3, seed=0)
    x, y = torch.randn(30, 4), torch.randint(0, 3, (30,))
    v0, w = flat_params(model) + 0.3, flat_params(model) - 0.2
    eta, lam = 0.1, 2.0
    out = train_instances(model, v0.unsqueeze(0), [x], [y], [Stream(0, 0, 0)],
                          LocalTraining(steps=2, batch_size=None, lr=eta, prox_mu=lam), prox_centre=w).params[0]
    v = v0.clone()
    for _ in range(2):
        set_flat_params(model, v)
        loss = F.cross_entropy(model(x), y)
        grad = torch.cat([p.reshape(-1) for p in torch.autograd.grad(loss, list(model.parameters()))])
        v = v - eta * (grad + lam * (v - w))
    torch.testing.assert_close(out, v, rtol=1e-5, atol=1e-6)


def personal(cfg, folder):
    simulate(cfg, checkpoint_dir=folder, progress=False)
    run = load_checkpoint(folder, cfg)
    return run, {k: s.personal for k, s in run.clients.items()}


def test_lambda_pulls_the_personal_models_towards_the_global_one(fmnist, tmp_path):
    one_round = SHARDS.replace(rounds=1, participation=1.0)
    w0 = flat_params(build_model("mlp2", (1, 28, 28), 3, seed=0))
    distances = []
    for lam in (0.0, 1.0, 5.0, 9.9):                        # η·λ < 2
        _, models = personal(one_round.replace(algorithm=Ditto(lam=lam)), tmp_path / f"l{lam}")
        distances.append(np.mean([float((v - w0).norm()) for v in models.values()]))
    assert all(a > b for a, b in zip(distances, distances[1:])), distances


def test_lambda_zero_personal_model_equals_the_clients_own_local_training(fmnist, tmp_path):
    from fairfl.training.client import train_clients
    from fairfl.runs.loop import federated_data
    cfg = SHARDS.replace(rounds=1, participation=1.0, algorithm=Ditto(lam=0.0))
    _, models = personal(cfg, tmp_path)
    fed = federated_data(cfg)
    model = build_model("mlp2", (1, 28, 28), 3, seed=0)
    w0 = flat_params(model)
    torch.manual_seed(0)
    local = train_clients(model, w0, fed.clients, list(range(6)), cfg.local, 0, 0, loss_before=False, loss_after=False)
    for k in range(6):
        torch.testing.assert_close(models[k], w0 - local.updates[k], rtol=0, atol=1e-6)


def test_unsampled_clients_keep_their_personal_model(fmnist, tmp_path):
    cfg = SHARDS.replace(rounds=2, participation=0.34, algorithm=Ditto(lam=0.5))      # 2 of 6 per round
    run, models = personal(cfg, tmp_path)
    sampled = {k for r in run.history.sampled for k in r}
    assert set(models) == sampled and len(sampled) < 6
    first = {k: v.clone() for k, v in models.items()}
    cfg3 = cfg.replace(rounds=3)
    run3, models3 = personal(cfg3, tmp_path / "three")
    untouched = set(first) - set(run3.history.sampled[2])
    assert untouched and all(torch.equal(models3[k], first[k]) for k in untouched)


def test_a_client_never_sampled_is_scored_as_fedavg_ft_scores_it(fmnist, tmp_path):
    """λ > 0: a client never sampled has no personal model yet; it is scored at the global model
    fine-tuned for one epoch, exactly as FedAvg-FT scores every client (Ditto's global model is
    FedAvg's bit for bit, the same fine-tuning stream): the two runs agree on that client, and
    neither is the untrained w⁰'s score. Broken variant caught: scoring it at w⁰ (the official
    code), which is what the sampled-client check below would then also show."""
    cfg = SHARDS.replace(rounds=1, participation=0.34)                   # 2 of 6 clients in the one round
    ditto = simulate(cfg.replace(algorithm=Ditto(lam=0.5)), progress=False)
    ft = simulate(cfg.replace(algorithm=FedAvgFT()), progress=False)
    never = sorted(set(range(6)) - {k for r in ditto.sampled for k in r})
    assert len(never) == 4 and ditto.sampled == ft.sampled
    for k in never:
        assert ditto.test_acc[-1][k] == ft.test_acc[-1][k]
        assert ditto.test_loss[-1][k] == pytest.approx(ft.test_loss[-1][k], rel=1e-6)
    # the initial evaluation (round 0, nobody sampled yet) fine-tunes every client from w⁰ = the global model
    assert ditto.test_acc[0] == ft.test_acc[0]
    untrained = simulate(cfg.replace(algorithm=FedAvg(), rounds=1), progress=False).test_loss[0]   # w⁰'s losses
    assert all(abs(ditto.test_loss[0][k] - untrained[k]) > 1e-3 for k in range(6))


def test_local_only_trains_a_never_sampled_clients_own_initial_model(fmnist, tmp_path):
    """λ = 0 (Local-only): a client never sampled is scored at its own w⁰ trained for one epoch on
    its own data (the fine-tuning stream, no proximal term) — by hand — not at the global model."""
    from dataclasses import replace

    from fairfl.training.client import evaluate_model
    from fairfl.runs.loop import federated_data
    from fairfl.base.seeding import FINETUNE
    cfg = SHARDS.replace(rounds=1, participation=0.34, algorithm=Ditto(lam=0.0))
    run, _ = personal(cfg, tmp_path)
    h = run.history
    never = sorted(set(range(6)) - {k for r in h.sampled for k in r})
    assert never
    fed = federated_data(cfg)
    model = build_model("mlp2", (1, 28, 28), 3, seed=0)
    w0 = flat_params(model)
    local = replace(cfg.local, epochs=1, prox_mu=0.0)
    for k in never:
        c = fed.clients[k]
        v = train_instances(model, w0.unsqueeze(0), [c.x_train], [c.y_train], [Stream(cfg.seed, 0, k, FINETUNE)],
                            local).params[0]
        assert not torch.equal(v, w0) and not torch.equal(v, run.params)
        set_flat_params(model, v)
        ev = evaluate_model(model, [c])
        assert h.test_acc[-1][k] == pytest.approx(float(ev.test_acc[0]), abs=1e-9)
        assert h.test_loss[-1][k] == pytest.approx(float(ev.test_loss[0]), rel=1e-5)


def test_evaluation_is_personal(fmnist):
    one_class = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (6, 2, 0), "normalize": "per_feature"},
                                 model="mlp2", partition=PartitionSpec("one_class", num_clients=3, classes=(0, 1, 2), split=None),
                                 local=LocalTraining(epochs=1, batch_size=None, lr=0.1), rounds=3, participation=1.0,
                                 eval_every=3, track_improved=False)
    personal_acc = simulate(one_class.replace(algorithm=Ditto(lam=0.0)), progress=False).final_acc()
    global_acc = simulate(one_class.replace(algorithm=FedAvg()), progress=False).final_acc()
    # a client that holds one class is served perfectly by its own model, not by the global one
    assert (personal_acc == 1.0).all() and global_acc.mean() < 0.99


def test_checkpointed_run_resumes_exactly_with_the_clients_state(fmnist, tmp_path):
    cfg = SHARDS.replace(rounds=4, algorithm=Ditto(lam=0.5), checkpoint_every=2)
    whole = simulate(cfg, progress=False)
    simulate(cfg, checkpoint_dir=tmp_path, progress=False, stop_after=2)
    assert load_checkpoint(tmp_path, cfg).clients                     # personal models in the checkpoint
    resumed = simulate(cfg, checkpoint_dir=tmp_path, progress=False)
    assert resumed.test_acc == whole.test_acc and resumed.train_loss == whole.train_loss


def test_unstable_lambda_is_refused_before_any_data():
    with pytest.raises(ConfigError, match=r"ditto: lam=25.0 with the local lr 0.1 gives η·λ = 2.5 ≥ 2"):
        SHARDS.replace(algorithm=Ditto(lam=25.0)).validate()
    with pytest.raises(ConfigError, match="lam=-1.0 is not allowed"):
        Ditto(lam=-1.0)
