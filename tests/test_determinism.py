"""One config gives one result, however it is run (issue: results must not depend on how they
were run): in this process with one or two torch threads, in a worker process of the pool, and
resumed from a checkpoint written under another thread count — bit-identical histories. The
models: the Table 3 CNN, whose convolutions' reductions depend on the thread count when left
free (measured: 2.6393633 vs 2.6393638 after one round, 3.69 vs 4.03 after two), and the stacked
character LSTM (``fairfl.federated.stacked_lstm``)."""
from __future__ import annotations

import pytest
import torch

from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.runs.loop import simulate
from fairfl.runs.sweeps import ProcessBackend, SerialBackend, run_many

# 100 clients of 600 samples (60 steps of b = 10 each), 3 a round; evaluated at the end only (every
# client's training loss over all 60,000 samples was most of this test's time), checkpointed every round
CFG = ExperimentConfig(dataset="fashion_mnist", model="cnn_fmnist",
                       partition=PartitionSpec("shards", num_clients=100, shards_per_client=2),
                       local=LocalTraining(epochs=1, batch_size=10, lr=0.05), rounds=3, clients_per_round=3,
                       eval_every=3, checkpoint_every=1)
TEXT = ExperimentConfig(dataset="shakespeare", dataset_options={"max_samples": 40}, model="lstm_shakespeare",
                        partition=PartitionSpec("natural", num_clients=3), local=LocalTraining(epochs=1, batch_size=10, lr=0.8),
                        rounds=2, participation=1.0, eval_every=1, checkpoint_every=1)


def same(a, b) -> bool:
    return (a.train_loss, a.test_acc, a.test_loss, a.round_improved, a.info) == \
           (b.train_loss, b.test_acc, b.test_loss, b.round_improved, b.info)


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cnn", "lstm"])
def test_one_config_one_result_whatever_the_threads_backend_or_resume(fmnist, threads, tmp_path, name):
    config = {"cnn": CFG, "lstm": TEXT}[name]
    threads(1)
    one = run_many([config], backend=SerialBackend(), root=tmp_path / "one", progress=False)[0]
    threads(2)
    two = run_many([config], backend=SerialBackend(), root=tmp_path / "two", progress=False)[0]
    assert same(one, two), "1 and 2 torch threads give different histories"
    with ProcessBackend(workers=1) as pool:
        worker = run_many([config], backend=pool, root=tmp_path / "pool", progress=False)[0]
    assert same(one, worker), "a pool worker gives another history"
    simulate(config, checkpoint_dir=tmp_path / "resume", progress=False, stop_after=1)   # two threads ...
    threads(1)
    resumed = simulate(config, checkpoint_dir=tmp_path / "resume", progress=False)        # ... resumed under one
    assert same(one, resumed), "a run resumed under another thread count differs"
