"""Provenance of ``histories_2392cdc.json``: short runs of every algorithm family recorded with
the code of commit 2392cdc (before the one-contract refactor), one torch thread.

This script targets that commit's API (``algorithm_options``, ``server_lr`` / ``decay`` in the
config, ``fairfl.simulation``); it does not run against the current package. To re-record:

    git worktree add /tmp/fairfl-2392cdc 2392cdc
    cd /tmp/fairfl-2392cdc && <a venv with requirements.txt>/bin/python \
        /path/to/this/tests/golden/make_golden_2392cdc.py /path/to/this/tests/golden/histories_2392cdc.json

``tests/test_golden.py`` builds the same cases with the current API and asserts that the
histories are identical, bit for bit (everything but the wall-clock round times).

The CNN cases run without dropout (``model_options={"dropout": False}``): since cache version 4
dropout draws its masks from each client's stream (``fairfl.base.seeding.keep_mask``) instead of
torch's global generator, a deliberate change of the random stream, not of the arithmetic, which
these cases pin down. Recorded with Intel MKL in strict reproducibility mode (``MKL_CBWR=AUTO,STRICT``,
set below), as the current package computes; without it MKL rounds some products differently.

The kernels these numbers are bit-exact for are in ``cpu_kernels_2392cdc.json``
(``fairfl.runs.loop.cpu_kernels()`` on a machine where the recording reproduces bit for bit: the
project's AMD EPYC machines). Re-record both together; on other kernels the test compares to a
tolerance (``tests/test_golden.py``).
"""
import json
import os
import sys

# as the current package does on import (fairfl/__init__.py): MKL's results must not depend on
# memory alignment, which the fused engine changes
os.environ["MKL_CBWR"] = "AUTO,STRICT"

import torch  # noqa: E402

torch.set_num_threads(1)

from fairfl import ExperimentConfig, LocalTraining, PartitionSpec  # noqa: E402
from fairfl.simulation import simulate  # noqa: E402

FM = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (0, 1, 2)},
                      partition=PartitionSpec("shards", num_clients=30, shards_per_client=2), model="cnn_fmnist",
                      model_options={"dropout": False},
                      local=LocalTraining(epochs=1, batch_size=20, lr=0.05), rounds=3, clients_per_round=4,
                      eval_every=2, track_improved=True)
MLP = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (6, 2, 0), "normalize": "per_feature"},
                       model="mlp2", partition=PartitionSpec("one_class", num_clients=3, classes=(0, 1, 2), split=None),
                       local=LocalTraining(epochs=1, batch_size=None, lr=0.1), rounds=4, participation=1.0,
                       eval_every=2, track_improved=True)
ADULT = ExperimentConfig(dataset="adult", model="logreg",
                         partition=PartitionSpec("attribute", num_clients=2, attribute_values=(0, 1), split=None),
                         local=LocalTraining(epochs=1, batch_size=50, lr=0.01), rounds=2, clients_per_round=2,
                         eval_every=1, track_improved=False)
TEXT = ExperimentConfig(dataset="shakespeare", dataset_options={"max_samples": 60}, model="lstm_shakespeare",
                        partition=PartitionSpec("natural", num_clients=2), local=LocalTraining(epochs=1, batch_size=16, lr=0.8),
                        rounds=2, participation=1.0, eval_every=1, track_improved=False, batched=False)
BIAS = ({"kind": "bias", "client": 1, "bias": 1000.0, "on": "total"},)

CASES = {
    "fedavg_cnn": FM.replace(algorithm="fedavg"),
    "fedavg_cnn_sequential": FM.replace(algorithm="fedavg", batched=False),
    "fedavg_uniform_mlp": MLP.replace(algorithm="fedavg", algorithm_options={"weighting": "uniform"}),
    "fedavg_n_cnn": FM.replace(algorithm="fedavg_n", server_lr=0.5, decay=0.5, seed=1),
    "fedprox_mlp": MLP.replace(algorithm="fedprox", algorithm_options={"mu": 0.1}),
    "fedprox_cnn": FM.replace(algorithm="fedprox", algorithm_options={"mu": 0.5}, local=LocalTraining(epochs=2, batch_size=40, lr=0.05, momentum=0.5)),
    "fedmgda_cnn": FM.replace(algorithm="fedmgda"),
    "fedmgda_plus_cnn": FM.replace(algorithm="fedmgda_plus", algorithm_options={"eps": 0.1}, server_lr=1.0, decay=0.1),
    "fedmgda_plus_eps0_raw": FM.replace(algorithm="fedmgda_plus", algorithm_options={"eps": 0.0, "normalize": False}),
    "fedmgda_plus_decay_long": MLP.replace(algorithm="fedmgda_plus", algorithm_options={"eps": 0.5}, server_lr=0.3,
                                           decay=0.25, rounds=130, eval_every=65, track_improved=False),
    "mgda_prox_cnn": FM.replace(algorithm="mgda_prox", algorithm_options={"eps": 0.1, "mu": 0.01}, decay=0.1),
    "qfedavg_mlp": MLP.replace(algorithm="qfedavg", algorithm_options={"q": 2.0}),
    "afl_mlp": MLP.replace(algorithm="afl", algorithm_options={"lr_lambda": 0.5}),
    "fedfv_loss_mlp": MLP.replace(algorithm="fedfv", algorithm_options={"alpha": 0.0}),
    "fedfv_random_mlp": MLP.replace(algorithm="fedfv", algorithm_options={"alpha": 1 / 3, "order": "random", "seed": 2},
                                    seed=2),
    "fedfv_reverse_cnn": FM.replace(algorithm="fedfv", algorithm_options={"order": "reverse"}),
    "fedfv_tau_cnn": FM.replace(algorithm="fedfv", algorithm_options={"alpha": 0.25, "tau": 2}, rounds=5,
                                partition=PartitionSpec("shards", num_clients=6, shards_per_client=2), eval_every=5),
    "dqnfed_mlp": MLP.replace(algorithm="dqnfed"),
    "dqnfed_alg1_mlp": MLP.replace(algorithm="dqnfed", algorithm_options={"step": "algorithm1"}, server_lr=0.1,
                                   decay=0.1),
    "dqnfed_two_epochs_mlp": MLP.replace(algorithm="dqnfed", local=LocalTraining(epochs=2, batch_size=None, lr=0.05)),
    "scaling_attack_fedavg_cnn": FM.replace(algorithm="fedavg", attacks=({"kind": "scaling", "client": 3, "factor": 10.0},),
                                            participation=0.2, clients_per_round=None, seed=3),
    "adult_qfedavg_bias": ADULT.replace(algorithm="qfedavg", algorithm_options={"q": 5.0, "L": 0.1}, attacks=BIAS),
    "adult_afl_bias_batched": ADULT.replace(algorithm="afl", algorithm_options={"lr_lambda": 0.5}, batched=True,
                                            attacks=({"kind": "bias", "client": 1, "bias": 1.0},)),
    "adult_fedmgda_plus_sequential": ADULT.replace(algorithm="fedmgda_plus", algorithm_options={"eps": 0.1},
                                                   server_lr=1.0, decay=1 / 3, batched=False),
    "adult_phd_only": ADULT.replace(algorithm="fedavg", eligible_clients=(1,), clients_per_round=1),
    "shakespeare_fedavg": TEXT.replace(algorithm="fedavg"),
}


def record(h) -> dict:
    state = h.to_state()
    state.pop("round_time")
    return state


if __name__ == "__main__":
    out = {}
    for name, cfg in CASES.items():
        out[name] = {"config": cfg.to_dict(), "history": record(simulate(cfg, progress=False))}
        print(name, out[name]["history"]["train_loss"])
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=0)
