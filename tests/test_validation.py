"""Validation scores (``track_validation``): every evaluation can also score each client's
validation split, so that a tuning protocol selects on data it never reports (the test split).
On real Fashion-MNIST: the scores are those of the final model on the clients' validation data,
the training and the test scores are untouched, a group run gives a lone run's scores, a resumed
run keeps them, and a config that cannot give them is refused before any data is read."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fairfl import ConfigError, ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.training.client import evaluate_model, set_flat_params
from fairfl.runs.history import load_checkpoint
from fairfl.runs.loop import federated_data, simulate, simulate_group
from fairfl.federated.models import build_model

CFG = ExperimentConfig(
    dataset="fashion_mnist",
    partition=PartitionSpec("shards", num_clients=6, shards_per_client=2, seed=0),
    model="mlp2", model_options={"hidden": (16,)}, rounds=3, participation=0.5, eval_every=2,
    local=LocalTraining(batch_size=50), checkpoint_every=1, track_validation=True)


def test_the_validation_scores_are_the_final_models_on_the_validation_splits(fmnist, tmp_path):
    h = simulate(CFG, checkpoint_dir=tmp_path, progress=False)
    assert h.eval_rounds == [0, 2, 3]
    val = h.validation_acc()
    assert val.shape == (3, 6) and np.isfinite(val).all()
    run = load_checkpoint(tmp_path, CFG)
    fed = federated_data(CFG)
    model = build_model(CFG.model, fed.dataset.input_shape, fed.dataset.num_classes, seed=CFG.seed, hidden=(16,))
    set_flat_params(model, run.params)
    ev = evaluate_model(model, fed.clients, validation=True)
    np.testing.assert_allclose(h.val_acc[-1], ev.val_acc, rtol=0, atol=1e-6)
    np.testing.assert_allclose(h.val_loss[-1], ev.val_loss, rtol=1e-5)
    # the validation and test splits are different data: the scores are not a copy of the test scores
    assert h.val_acc[-1] != h.test_acc[-1]
    np.testing.assert_allclose(h.test_acc[-1], ev.test_acc, rtol=0, atol=1e-6)


def test_scoring_validation_changes_nothing_else(fmnist):
    """The same training, test scores and losses bit for bit; the flag's default leaves the cache key
    of every earlier config as it was."""
    on = simulate(CFG, progress=False)
    off = simulate(CFG.replace(track_validation=False), progress=False)
    assert (on.test_acc, on.test_loss, on.train_loss, on.round_lr) == (off.test_acc, off.test_loss, off.train_loss,
                                                                      off.round_lr)
    assert off.val_acc == [] and "track_validation" not in CFG.replace(track_validation=False).to_dict()
    assert CFG.key() != CFG.replace(track_validation=False).key()
    with pytest.raises(ValueError, match="track_validation=True"):
        off.validation_acc()


def test_a_group_run_and_a_resumed_run_give_a_lone_runs_validation_scores(fmnist, tmp_path):
    alone = simulate(CFG, progress=False)
    grouped = simulate_group([CFG, CFG.replace(seed=1)], progress=False)[0]
    assert grouped.val_acc == alone.val_acc and grouped.val_loss == alone.val_loss
    simulate(CFG, checkpoint_dir=tmp_path, stop_after=2, progress=False)
    resumed = simulate(CFG, checkpoint_dir=tmp_path, progress=False)
    assert resumed.val_acc == alone.val_acc and resumed.val_loss == alone.val_loss


def test_a_personalised_algorithm_is_validated_at_its_personal_models(fmnist):
    h = simulate(CFG.replace(algorithm={"name": "ditto", "lam": 1.0}), progress=False)
    assert np.asarray(h.val_acc).shape == (3, 6)
    assert h.val_acc[-1] != simulate(CFG, progress=False).val_acc[-1]


def test_a_config_without_validation_data_is_refused_before_any_data_is_read():
    with pytest.raises(ConfigError, match=r"track_validation=True, but partition: split=None gives the clients no "
                                          r"validation data"):
        CFG.replace(partition=PartitionSpec("one_class", num_clients=3, classes=(0, 1, 2), split=None)).validate()
    with pytest.raises(ConfigError, match="no validation data"):
        CFG.replace(partition=PartitionSpec("shards", num_clients=6, shards_per_client=2,
                                            split=(0.9, 0.0, 0.1))).validate()


def test_val_fraction_holds_training_rows_out_and_keeps_the_standard_test_file(fmnist):
    """The papers' settings that test on the standard test file (q-FFL's three clients, Adult's
    domains) get a validation split from their training rows; the test data and every earlier
    partition stay as they were."""
    from fairfl.federated.partition import federate
    plain = PartitionSpec("one_class", num_clients=3, classes=(0, 1, 2), split=None)
    held = PartitionSpec("one_class", num_clients=3, classes=(0, 1, 2), split=None, val_fraction=0.1)
    a, b = federate(fmnist, plain), federate(fmnist, held)
    for ca, cb, ia, ib in zip(a.clients, b.clients, a.train_indices, b.train_indices):
        assert len(ca.y_val) == 0 and len(cb.y_val) == round(0.1 * ca.num_train)
        assert torch.equal(ca.x_test, cb.x_test) and torch.equal(ca.y_test, cb.y_test)
        # train and validation rows are disjoint and together the client's whole training share
        val_rows = np.setdiff1d(ia, ib)
        assert len(np.intersect1d(ib, val_rows)) == 0 and len(ib) + len(val_rows) == len(ia)
        assert torch.equal(torch.sort(cb.x_val.flatten(1), dim=0).values,
                           torch.sort(fmnist.x_train[torch.from_numpy(val_rows)].flatten(1), dim=0).values)
    assert all(torch.equal(x.x_val, y.x_val) for x, y in zip(b.clients, federate(fmnist, held).clients))
    cfg = ExperimentConfig(dataset="fashion_mnist", partition=plain)
    assert "val_fraction" not in cfg.to_dict()["partition"]
    assert cfg.replace(partition=held, track_validation=True).validate().key() != cfg.key()
    with pytest.raises(ConfigError, match="val_fraction=0.1 applies to split=None"):
        PartitionSpec("shards", num_clients=6, val_fraction=0.1)
    with pytest.raises(ConfigError, match="val_fraction"):
        PartitionSpec("one_class", num_clients=3, classes=(0, 1, 2), split=None, val_fraction=1.0)


def test_a_multi_objective_run_refuses_validation_scores(tmp_path):
    from fairfl.studies.paper import fmol_config
    cfg = fmol_config(K=1).replace(rounds=1, eval_every=1, track_validation=True)
    with pytest.raises(ConfigError, match="track_validation scores single-task models"):
        simulate(cfg, progress=False)
