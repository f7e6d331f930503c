"""The algorithms as Flower strategies are the same algorithms: a few rounds through Flower's
Simulation Runtime (its Ray backend, a local Ray instance with 2 CPUs, one node per client) give
the global model of fairfl's own loop on the same clients, seeds and sampling, and the same
evaluation (Ditto: every client's personal model, kept on its node; FMGDA: each objective's
training loss averaged over the clients that hold it).

One simulation serves every experiment (the ServerApp runs them one after the other on the same
six nodes, FMGDA's MultiMNIST experiment included: a node loads each experiment's data for its
client): starting Ray and its workers is most of the cost. It runs as a researcher runs it, from a
script, and its output, read from the pipes, is checked for the noise fairfl keeps out of it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.federated.algorithms.fmgda import FMGDA
from fairfl.runs.history import load_checkpoint
from fairfl.runs.loop import simulate

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
    "dqnfed_safeguarded": {"name": "dqnfed", "step": "eq17_safeguarded"},   # sends dqn_curvature, dqn_scale
    "afl": {"name": "afl", "lr_lambda": 0.5},
    "term": {"name": "term", "t": 2.0},
    "ditto": {"name": "ditto", "lam": 0.5},
    # DQN-Fed's baselines: FedHEAL keeps its masks on the clients, FedLF reads the layout (its clients
    # train at the round's decayed rate, sent with the plan, or, as its code does, send their
    # full-batch gradients at the global model), FedNew sends each client its dual (ρ large enough for
    # this MLP's conjugate-gradient reading), FedNL learns each client's diagonal Hessian on the client
    # (μ as notebook 04's, on a Hessian subsample)
    "fedheal": "fedheal",
    "fedlf": {"name": "fedlf", "lr_decay": 0.5},
    "fedlf_gradient": {"name": "fedlf", "message": "gradient", "server_lr": 0.1},
    "fednew": {"name": "fednew", "rho": 100.0},
    "fednl": {"name": "fednl", "mu": 10.0, "hessian_batch": 20},
}
CONFIGS = {name: BASE.replace(algorithm=spec) for name, spec in ALGORITHMS.items()}
# FMOL on two-task MultiMNIST over the same six nodes: two local full-batch steps per objective,
# the QP over the shared trunk, and a partial indicator matrix A (clients 1, 4 hold only
# objective 0, clients 2, 5 only objective 1), so that every message carries (S, d) updates,
# masks and the shared-coordinate mask, and the per-objective training loss averages over
# holders only (any 3 of these clients hold both objectives, so every sample is valid).
HELD = ((0, 1), (0,), (1,), (0, 1), (0,), (1,))
CONFIGS["fmgda"] = BASE.replace(
    dataset="multimnist", dataset_options={"source": "mnist_5k", "seed": 0}, model="multi_lenet",
    partition=PartitionSpec("label_limited", num_clients=6, shards_per_client=2, samples_per_client=20, seed=0),
    local=LocalTraining(steps=2, batch_size=None, lr=0.1),
    algorithm=FMGDA(server_lr=0.1, qp_params="shared", held=HELD))

# The loop trains a round's clients fused into one stacked computation, a node trains its client
# alone; with one intra-op thread and MKL's strict reproducibility they agree to the bit on this
# machine (measured), but another CPU may pick other float32 kernels for another stack size.
# 1e-6 of the parameters' scale is far below what one changed SGD step moves (>1e-4 here).
ATOL = 1e-6


# Every experiment in one simulation, as a researcher runs it from a script: its results saved for the
# tests, its output read from the pipes and the nodes' own logs from Ray's folder.
SIMULATION = """
import sys
import torch
sys.path.insert(0, sys.argv[1])
from test_flower import CONFIGS
from fairfl.runs.flower import run_simulation
runs = run_simulation(*CONFIGS.values(), num_cpus=2)
torch.save({name: (run.params, run.history) for name, run in zip(CONFIGS, runs)}, sys.argv[2])
print("rounds done:", sorted({run.history.rounds_done for run in runs}))
"""


@pytest.fixture(scope="module")
def flower_simulation(fmnist, one_ray_at_a_time, tmp_path_factory):
    """The simulation's runs by name, its output (stdout and stderr) and its nodes' logs."""
    pytest.importorskip("ray")
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray"))     # short: Ray's socket paths must fit in 107 bytes
    saved = tmp_path_factory.mktemp("flower") / "runs.pt"
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "RAY_COLOR_PREFIX", "FLWR_LOG_LEVEL")}
    try:
        r = subprocess.run([sys.executable, "-c", SIMULATION, str(Path(__file__).parent), str(saved)],
                           capture_output=True, text=True, timeout=900, env={**env, "RAY_TMPDIR": str(ray_tmp)})
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        nodes = [p for p in ray_tmp.glob("ray/session_*/logs/worker-*") if p.is_file()]
        assert nodes, sorted(str(p) for p in ray_tmp.rglob("*"))[:20]
        said = "".join(p.read_text(errors="replace") for p in nodes)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    runs = {name: SimpleNamespace(params=params, history=history)
            for name, (params, history) in torch.load(saved, weights_only=False).items()}
    return runs, r.stdout, out, said


@pytest.fixture(scope="module")
def flower_runs(flower_simulation):
    return flower_simulation[0]


@pytest.fixture(scope="module")
def loop_runs(fmnist, tmp_path_factory):
    out = {}
    for name, cfg in CONFIGS.items():
        d = tmp_path_factory.mktemp(f"loop_{name}")
        history = simulate(cfg, checkpoint_dir=d, progress=False)
        out[name] = (history, load_checkpoint(d, cfg).params)
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
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
    # the nodes' evaluation of the model the rule shows (AFL: its averaged iterate; Ditto: each
    # client's personal model), per client (and objective), summarised by the algorithm's evaluate
    assert run.history.eval_rounds == [3] and history.eval_rounds[-1] == 3
    np.testing.assert_allclose(run.history.test_acc[-1], history.test_acc[-1], atol=1e-9)
    np.testing.assert_allclose(run.history.test_loss[-1], history.test_loss[-1], rtol=1e-5)
    np.testing.assert_allclose(run.history.train_loss[-1], history.train_loss[-1], rtol=1e-5)


def test_the_rules_are_not_fedavg_in_disguise(loop_runs):
    """Each rule moved the model differently, and did what distinguishes it."""
    params = {name: p for name, (_, p) in loop_runs.items() if name not in ("fmgda", "ditto")}
    for name in params:
        if name != "fedavg":
            assert not torch.allclose(params[name], params["fedavg"], atol=1e-5), name
    fedfv = loop_runs["fedfv"][0].info
    assert sum(fedfv["internal_projections"]) + sum(fedfv["external_projections"]) > 0
    assert max(loop_runs["fedmgda_plus"][0].info["lambda_max"]) > 1 / 3 + 1e-3
    q = loop_runs["qfedavg"][0].info["sum_h"]
    assert len(q) == 3 and all(np.isfinite(q))
    safeguard = loop_runs["dqnfed_safeguarded"][0].info
    assert all(c > 0 for c in safeguard["curvature"][1:])       # from round 1 the clients have BFGS pairs
    assert min(safeguard["safeguard"]) < 1                      # and the clients' extras cut a step
    # Ditto's global model is FedAvg's (Ditto's server is FedAvg's), its evaluation is not: every
    # client is evaluated at its own personal model, sampled ones have moved away from the global one
    ditto, fedavg = loop_runs["ditto"][0], loop_runs["fedavg"][0]
    torch.testing.assert_close(loop_runs["ditto"][1], loop_runs["fedavg"][1], rtol=0, atol=0)
    trained = sorted({k for ks in ditto.sampled for k in ks})
    assert len(trained) < 6                                           # some clients keep w⁰
    assert all(abs(ditto.test_loss[-1][k] - fedavg.test_loss[-1][k]) > 1e-4 for k in trained)


def test_fmgda_training_loss_is_averaged_over_each_objectives_holders(loop_runs):
    """FMOL eq. (2) with the partial A of the Flower run: f_s averages over the clients holding s,
    which here differs from the average over all clients (so the Flower run's equal training
    loss above is the holders' average, not the all-clients one)."""
    from fairfl.training.client import ClientRuntime
    from fairfl.federated.data import load_dataset
    from fairfl.runs.loop import federated_data
    from fairfl.federated.models import build_model
    cfg = CONFIGS["fmgda"]
    history, params = loop_runs["fmgda"]
    ds = load_dataset(cfg.dataset, **dict(cfg.dataset_options))
    model = build_model(cfg.model, ds.input_shape, ds.num_classes, seed=cfg.seed, tasks=ds.num_tasks)
    per_client = np.asarray(ClientRuntime(model, federated_data(cfg).clients, cfg.seed).evaluate(params)
                            .client_train_loss, dtype=np.float64)                  # (client, objective)
    holders = [[k for k, row in enumerate(HELD) if s in row] for s in range(2)]
    np.testing.assert_allclose(history.train_loss[-1], [per_client[h, s].mean() for s, h in enumerate(holders)],
                               rtol=1e-6)
    assert not np.allclose(history.train_loss[-1], per_client.mean(axis=0), rtol=1e-3)


def test_a_node_without_its_client_id_is_refused():
    from types import SimpleNamespace

    from fairfl.base.errors import ConfigError
    from fairfl.runs.flower import client_id
    with pytest.raises(ConfigError, match="partition-id"):
        client_id(SimpleNamespace(node_config={}))
    assert client_id(SimpleNamespace(node_config={"partition-id": 4})) == 4


def test_a_gpu_config_is_refused_before_the_simulation_starts():
    # Flower's Ray backend hides the GPUs from nodes that ask for none: one clear error instead of
    # a torch error in every node. Without a GPU, "cuda" is refused as a device this machine lacks.
    from fairfl.base.errors import ConfigError
    from fairfl.runs.flower import run_simulation
    reason = "the Flower simulation trains on the CPU" if torch.cuda.is_available() else "has no CUDA device"
    with pytest.raises(ConfigError, match=f"device='cuda', but .*{reason}"):
        run_simulation(BASE, BASE.replace(device="cuda"))


def test_an_algorithm_that_makes_its_personal_models_at_evaluation_is_refused():
    """FedAvg-FT fine-tunes at evaluation; a node scores a personalised algorithm at the model it
    keeps (Ditto's), so it would have scored the global model as if it were personal."""
    from fairfl.federated.algorithms.fedavg import FedAvgFT
    from fairfl.base.errors import ConfigError
    from fairfl.runs.flower import run_simulation
    with pytest.raises(ConfigError, match="fedavg_ft makes each client's model when it is evaluated"):
        run_simulation(BASE, BASE.replace(algorithm=FedAvgFT()))


def test_report_round_trip_keeps_every_field():
    """What a node sends is what the rule reads: updates (also per objective), losses, masks and
    extras come back with their values (scalars as float64)."""
    from fairfl.runs.flower import decode_reports, encode_report
    from fairfl.federated.messages import ClientUpdates
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


@pytest.mark.slow
def test_a_simulation_shows_flowers_log_without_the_noise(flower_simulation):
    """No deprecation notice of the run_simulation fairfl calls on purpose, no Ray FutureWarning,
    no ANSI colour codes in a pipe, no "Manually terminating ClientAppActor": neither in the
    script's output nor in the nodes' own output, which Ray forwards to the driver for as long as
    it runs."""
    _, stdout, out, nodes = flower_simulation
    assert "rounds done: [3]" in stdout and "[ROUND 3/3]" in out, out       # Flower's log of the rounds is kept
    for noise in ("deprecated", "DEPRECATED", "FutureWarning", "Manually terminating", "\x1b["):
        assert noise not in out, (noise, out)
    assert "Manually terminating" not in nodes and "\x1b[" not in nodes, nodes
