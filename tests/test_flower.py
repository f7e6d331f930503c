"""The algorithms as Flower strategies are the same algorithms: a few rounds through Flower's
Simulation Runtime (its Ray backend, a local Ray instance with 2 CPUs, one node per client) give
the global model of fairfl's own loop on the same clients, seeds and sampling.

One simulation serves every experiment (the ServerApp runs them one after the other on the same
six nodes): starting Ray and its workers is most of the cost.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.loop import load_checkpoint, simulate

# Three-class Fashion-MNIST split in label shards over 6 clients, 3 sampled per round: the
# clients' updates conflict, so FedFV projects, MGDA's λ moves off uniform and q-FedAvg's
# weights differ from FedAvg's (checked below, so that the equalities are not FedAvg's five times).
BASE = ExperimentConfig(
    dataset="fashion_mnist", dataset_options={"classes": (6, 2, 0)},
    partition=PartitionSpec("label_limited", num_clients=6, shards_per_client=2, samples_per_client=60, seed=0),
    model="mlp2", rounds=3, participation=0.5, eval_every=3, local=LocalTraining(batch_size=20, lr=0.05),
    track_improved=False, seed=3)

ALGORITHMS = {
    "fedavg": "fedavg",
    "fedmgda_plus": {"name": "fedmgda_plus", "eps": 0.5},
    "fedfv": {"name": "fedfv", "alpha": 0.2, "tau": 1},
    "qfedavg": {"name": "qfedavg", "q": 2.0},
    "dqnfed": {"name": "dqnfed", "step": "algorithm1", "server_lr": 0.5},
    "afl": {"name": "afl", "lr_lambda": 0.5},
    "term": {"name": "term", "t": 2.0},
}
CONFIGS = {name: BASE.replace(algorithm=spec) for name, spec in ALGORITHMS.items()}

# The loop trains a round's clients fused into one stacked computation, a node trains its client
# alone; with one intra-op thread and MKL's strict reproducibility they agree to the bit on this
# machine (measured), but another CPU may pick other float32 kernels for another stack size.
# 1e-6 of the parameters' scale is far below what one changed SGD step moves (>1e-4 here).
ATOL = 1e-6


@pytest.fixture(scope="module")
def flower_runs(fmnist):
    ray = pytest.importorskip("ray")
    from fairfl.flower import run_simulation
    try:
        runs = run_simulation(*CONFIGS.values(), num_cpus=2)
    finally:
        if ray.is_initialized():
            ray.shutdown()
    return dict(zip(CONFIGS, runs))


@pytest.fixture(scope="module")
def loop_runs(fmnist, tmp_path_factory):
    out = {}
    for name, cfg in CONFIGS.items():
        d = tmp_path_factory.mktemp(f"loop_{name}")
        history = simulate(cfg, checkpoint_dir=d, progress=False)
        out[name] = (history, load_checkpoint(d, cfg).params)
    return out


@pytest.mark.parametrize("name", ["fedavg", "fedmgda_plus", "fedfv", "qfedavg", "dqnfed", "afl", "term"])
def test_flower_strategy_gives_the_loops_global_model(name, flower_runs, loop_runs):
    history, params = loop_runs[name]
    run = flower_runs[name]
    assert run.history.sampled == history.sampled                      # the same clients, round by round
    scale = float(params.abs().max())
    torch.testing.assert_close(run.params, params, rtol=0, atol=ATOL * scale)
    assert set(run.history.info) == set(history.info)
    for key, values in history.info.items():                            # the rule saw the same reports
        np.testing.assert_allclose(run.history.info[key], values, rtol=1e-5, atol=1e-9, err_msg=key)
    assert run.history.round_lr == history.round_lr
    # the nodes' evaluation of the model the rule shows (AFL: its averaged iterate)
    assert run.history.eval_rounds == [3] and history.eval_rounds[-1] == 3
    np.testing.assert_allclose(run.history.test_acc[-1], history.test_acc[-1], atol=1e-9)
    np.testing.assert_allclose(run.history.test_loss[-1], history.test_loss[-1], rtol=1e-5)
    np.testing.assert_allclose(run.history.train_loss[-1], history.train_loss[-1], rtol=1e-5)


def test_the_rules_are_not_fedavg_in_disguise(loop_runs):
    """Each rule moved the model differently, and did what distinguishes it."""
    params = {name: p for name, (_, p) in loop_runs.items()}
    for name in params:
        if name != "fedavg":
            assert not torch.allclose(params[name], params["fedavg"], atol=1e-5), name
    fedfv = loop_runs["fedfv"][0].info
    assert sum(fedfv["internal_projections"]) + sum(fedfv["external_projections"]) > 0
    assert max(loop_runs["fedmgda_plus"][0].info["lambda_max"]) > 1 / 3 + 1e-3
    q = loop_runs["qfedavg"][0].info["sum_h"]
    assert len(q) == 3 and all(np.isfinite(q))


def test_a_node_without_its_client_id_is_refused():
    from types import SimpleNamespace

    from fairfl.errors import ConfigError
    from fairfl.flower import client_id
    with pytest.raises(ConfigError, match="partition-id"):
        client_id(SimpleNamespace(node_config={}))
    assert client_id(SimpleNamespace(node_config={"partition-id": 4})) == 4


def test_report_round_trip_keeps_every_field():
    """What a node sends is what the rule reads: updates (also per objective), losses, masks and
    extras come back with their values (scalars as float64)."""
    from fairfl.flower import decode_reports, encode_report
    from fairfl.messages import ClientUpdates
    rng = torch.Generator().manual_seed(0)
    rows = []
    for k in (4, 1):
        rows.append(ClientUpdates(np.asarray([k]), torch.randn(1, 2, 5, generator=rng), torch.tensor([7 + k]),
                                  torch.tensor([[0.5, float("nan")]]), None,
                                  {"dqn_d": torch.tensor([0.25 * k], dtype=torch.float64),
                                   "first_gradients": torch.randn(1, 2, 5, generator=rng)},
                                  torch.tensor([[True, False]]), torch.tensor([True, True, False, False, True])))
    back = decode_reports([encode_report(r) for r in rows], [1, 4])
    assert back.clients.tolist() == [1, 4] and back.num_samples.tolist() == [8, 11]
    torch.testing.assert_close(back.updates, torch.cat([rows[1].updates, rows[0].updates]))
    torch.testing.assert_close(back.loss_before, torch.cat([rows[1].loss_before, rows[0].loss_before]), equal_nan=True)
    assert back.loss_after is None
    torch.testing.assert_close(back.extras["dqn_d"], torch.tensor([0.25, 1.0], dtype=torch.float64))
    torch.testing.assert_close(back.extras["first_gradients"], torch.cat([rows[1].extras["first_gradients"],
                                                                        rows[0].extras["first_gradients"]]))
    assert back.held.tolist() == [[True, False], [True, False]] and back.shared.tolist() == rows[0].shared.tolist()
