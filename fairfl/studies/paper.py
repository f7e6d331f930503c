"""The papers' reported numbers, as tidy tables (one row per setting, one column per quantity),
for side-by-side comparison with ours (:func:`fairfl.studies.notebook.beside`); never used to produce
ours. A key left empty (NaN) matches every value of ours ("FedMGDA+, any bias").

Sources: Hu et al., "Federated Learning Meets Multi-objective Optimization" (FedMGDA+, IEEE TNSE
2022; arXiv:2006.11489); Wang et al., "Federated Learning with Fair Averaging" (FedFV, IJCAI 2021;
arXiv:2104.14937); Yang et al., "Federated Multi-Objective Learning" (FMOL, NeurIPS 2023;
arXiv:2310.09866); Mohajer Hamidi, "Distributed Quasi-Newton Method for Fair and Fast Federated
Learning" (DQN-Fed, TMLR).
"""
from __future__ import annotations

import math

import pandas as pd

NAN = math.nan


def _frame(columns: list[str], rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=columns)


# FedMGDA+ Table 7 (Adult, 500 rounds, 5 seeds): test accuracy %. "uniform" = accuracy over all
# test samples (non-PhD dominates it). FedMGDA+ and the PhD-only baseline hold for any bias.
FEDMGDA_TABLE7 = _frame(["method", "bias", "uniform", "phd", "non_phd"], [
    ("AFL", 0.0, 83.26, 77.90, 83.32),
    ("AFL", 0.01, 83.28, 76.58, 83.36),
    ("AFL", 0.1, 82.30, 74.59, 82.39),
    ("AFL", 1.0, 81.86, 74.25, 81.94),
    ("q-FedAvg (q=5)", 0.0, 83.26, 76.80, 83.33),
    ("q-FedAvg (q=5)", 1000.0, 83.34, 76.57, 83.41),
    ("q-FedAvg (q=5)", 5000.0, 81.19, 74.14, 81.27),
    ("q-FedAvg (q=5)", 10000.0, 81.07, 73.48, 81.16),
    ("q-FedAvg (q=2)", 0.0, 83.30, 76.46, 83.38),
    ("q-FedAvg (q=2)", 1000.0, 83.33, 76.24, 83.41),
    ("q-FedAvg (q=2)", 5000.0, 83.11, 75.69, 83.20),
    ("q-FedAvg (q=2)", 10000.0, 82.50, 75.69, 82.58),
    ("q-FedAvg (q=0.1)", 0.0, 83.44, 76.46, 83.52),
    ("q-FedAvg (q=0.1)", 1000.0, 83.34, 76.35, 83.42),
    ("q-FedAvg (q=0.1)", 5000.0, 83.35, 76.57, 83.42),
    ("q-FedAvg (q=0.1)", 10000.0, 83.36, 76.80, 83.43),
    ("FedMGDA+", NAN, 83.24, 76.58, 83.32),
    ("PhD only", NAN, 81.05, 72.82, 81.14),
])

# FedFV Table 3 (Fashion-MNIST, three clients = shirt / pullover / T-shirt, all selected, 200
# rounds, full batch, η = 0.1, E = 1, 5 seeds): per-class test accuracy %, their mean, and "Var."
# — which is the standard deviation (in points) of the three accuracies, not a variance.
FEDFV_TABLE3 = _frame(["method", "shirt", "pullover", "tshirt", "mean", "std"], [
    ("FedAvg", 64.26, 87.03, 89.97, 80.42, 11.50),
    ("AFL (η_λ=0.01)", 71.09, 81.89, 84.29, 79.09, 5.76),
    ("AFL (η_λ=0.1)", 76.34, 79.00, 79.06, 78.13, 1.27),
    ("AFL (η_λ=0.5)", 76.57, 78.77, 79.09, 78.14, 1.12),
    ("q-FedAvg (q=5)", 71.29, 81.46, 82.86, 78.53, 5.16),
    ("q-FedAvg (q=15)", 77.09, 75.40, 60.69, 71.06, 7.46),
    ("FedMGDA+ (ε=0.05)", 44.63, 57.77, 99.09, 67.16, 23.39),
    ("FedMGDA+ (ε=0.1)", 72.26, 79.71, 86.03, 79.33, 6.45),
    ("FedMGDA+ (ε=1)", 72.46, 79.74, 85.66, 79.29, 6.42),
    ("FedFV (α=0)", 61.06, 89.31, 91.06, 80.48, 13.76),
    ("FedFV (α=1/3)", 77.09, 80.69, 81.06, 79.61, 1.91),
    ("FedFV (α=2/3)", 77.91, 81.46, 81.46, 80.28, 1.77),
])

# FedFV Table 4: std of client test accuracy (points) with α = 0, τ = 0, by projection order.
FEDFV_TABLE4 = _frame(["dataset", "order", "std"], [
    ("fashion_mnist", "loss", 13.76), ("fashion_mnist", "random", 20.14), ("fashion_mnist", "reverse", 22.05),
    ("cifar10", "loss", 13.19), ("cifar10", "random", 14.12), ("cifar10", "reverse", 16.28),
])

# FMOL Table 2 (MultiMNIST, M = 10 clients × 256 samples, η_L = η_t = 0.1): communication rounds
# needed for a training loss of 10⁻², per task, by data partition and local steps K. The paper
# gives neither the batch size of this table nor its number of seeds.
FMOL_TABLE2 = _frame(["setting", "K", "L", "R"], [
    ("iid", 1, 82, 84), ("iid", 5, 18, 20), ("iid", 10, 10, 9), ("iid", 20, 5, 5),
    ("non-iid", 1, 96, 82), ("non-iid", 5, 24, 20), ("non-iid", 10, 13, 10), ("non-iid", 20, 6, 5),
])

# DQN-Fed Table 6, Shakespeare setup 1 (31 speaking roles, all participating, E = 1, 500 rounds,
# 5 seeds): mean client test accuracy %, std, worst 10 %, best 10 %. FedHEAL has no row in Table 6.
DQNFED_TABLE6_SETUP1 = _frame(["method", "mean", "std", "worst", "best"], [
    ("FedAvg", 53.21, 9.25, 51.01, 58.41),
    ("q-FFL", 53.90, 7.52, 51.52, 58.47),
    ("FedMGDA", 53.08, 8.14, 52.84, 58.51),
    ("FedLF", 54.58, 8.44, 52.87, 59.84),
    ("TERM", 54.16, 8.21, 52.09, 59.15),
    ("Ditto", 60.74, 8.32, 53.57, 64.92),
    ("FedNL", 60.25, 8.24, 53.15, 64.15),
    ("FedNew", 60.59, 7.55, 53.18, 64.09),
    ("DQN-Fed", 61.65, 6.55, 53.79, 64.86),
])

# DQN-Fed Table 1, CIFAR-10 setup 1 (200 label shards over 100 clients, 2-hidden-layer MLP, E = 1,
# b = 64, η = 0.1, 2000 rounds, 10 % sampled; 5 seeds): mean, std, worst 5 %, best 5 % of client
# test accuracy. FedLF has no row in Table 1.
DQNFED_TABLE1_SETUP1 = _frame(["method", "mean", "std", "worst", "best"], [
    ("FedAvg", 46.85, 3.54, 19.84, 69.28),
    ("q-FFL", 46.30, 3.27, 23.39, 68.02),
    ("FedMGDA", 45.34, 3.37, 24.00, 68.51),
    ("FedHEAL", 46.40, 3.61, 19.33, 69.30),
    ("TERM", 47.11, 3.66, 28.21, 69.51),
    ("Ditto", 46.31, 3.44, 27.14, 68.44),
    ("FedNL", 47.33, 3.92, 24.41, 69.52),
    ("FedNew", 47.51, 3.68, 25.77, 69.74),
    ("DQN-Fed", 47.72, 3.20, 29.34, 69.37),
])


# Readings of FMOL's MultiMNIST setting that the reference codes support (FMOL releases no code):
# name -> (what it is, the options it sets: dataset_options / model_options / algorithm options).
# "S&K" = Sener & Koltun 2018's released code (isl-org/MultiObjectiveOptimization), which FedCMOO
# (askinb/FedCMOO) copies for these points; where each option is read from is documented at the option
# (fairfl.federated.data.multimnist, fairfl.federated.models.reinitialise, fairfl.federated.algorithms.fmgda). The init probes are
# no code's reading: both codes keep PyTorch's default initialisation, as "ours" does.
FMOL_READINGS: dict[str, tuple[str, dict[str, dict]]] = {
    "ours": ("composite-set standardisation, offset-8 bilinear construction, exact QP on all parameters, "
             "PyTorch default init", {}),
    "sk-pixels": ("S&K's pixel scaling: (x − 0.1307) / 0.3081", {"dataset": {"normalize": "mnist"}}),
    "sk-construction": ("S&K's construction: right digit at offset 6, byte-scaled, nearest resize, independent "
                        "pairs (our standardisation)", {"dataset": {"construction": "sener_koltun"}}),
    "sk-solver": ("S&K's MGDA: two-task closed form (λ ∈ {0.001, 0.999} at a vertex) on the shared trunk",
                  {"algorithm": {"solver": "sener_koltun", "qp_params": "shared"}}),
    "xavier": ("probe, no code's reading: Xavier-uniform weights, zero biases", {"model": {"init": "xavier"}}),
    "kaiming": ("probe, no code's reading: Kaiming-uniform (ReLU) weights, zero biases", {"model": {"init": "kaiming"}}),
    "sk-all": ("every S&K reading together: pixels, construction, solver on the trunk (init: PyTorch default, "
               "as theirs)", {"dataset": {"normalize": "mnist", "construction": "sener_koltun"},
                              "algorithm": {"solver": "sener_koltun", "qp_params": "shared"}}),
}


def fmol_config(K: int, b: int | None = None, iid: bool = False, seed: int = 0, centralised: bool = False,
                n: int = 256, clients: int = 10, rounds: int = 100, lr: float = 0.1, reading: str = "ours"):
    """One run of FMOL §5 / App. D's MultiMNIST setting: M = ``clients`` clients of n training
    images (each holds 25 % more, split off 10 / 10 as its validation and test data), both
    tasks held by every client, η_L = η_t = ``lr``, K local steps per objective with minibatches
    of b (None or b ≥ n: full batch, FMGDA), iid or at most two task-L labels per client. The
    partition seed follows the run's seed; the image pairs are those of data seed 0.

    ``centralised``: MGD / SMGD on the pooled data of the same clients (§5, 1-c): one step per
    iteration on a union batch of M·b, K iterations per round (K·T in all, evaluated every K
    iterations, so evaluation t is after round t's worth of steps).

    ``reading``: one of :data:`FMOL_READINGS` ("ours", the default, is the config as it always was,
    so its cache key is unchanged)."""
    from fairfl.federated.algorithms.fmgda import FMGDA
    from fairfl.base.errors import ConfigError
    if reading not in FMOL_READINGS:
        raise ConfigError(f"fmol_config: reading={reading!r} is not one of {', '.join(FMOL_READINGS)}")
    changes = FMOL_READINGS[reading][1]
    from fairfl.training.client import LocalTraining
    from fairfl.runs.config import ExperimentConfig
    from fairfl.federated.partition import PartitionSpec
    full = b is None or b >= n
    partition = PartitionSpec("iid" if iid else "label_limited", num_clients=clients, samples_per_client=n * 5 // 4,
                              shards_per_client=2, label_column=0, seed=seed, pooled=centralised)
    if centralised:
        local = LocalTraining(steps=1, batch_size=None if full else clients * b, lr=lr)
        rounds, eval_every = K * rounds, K
    else:
        local, eval_every = LocalTraining(steps=K, batch_size=None if full else b, lr=lr), 1
    return ExperimentConfig(dataset="multimnist", dataset_options={"source": "auto", "seed": 0, **changes.get("dataset", {})},
                            model="multi_lenet", model_options=dict(changes.get("model", {})), partition=partition,
                            local=local, algorithm=FMGDA(server_lr=lr, **changes.get("algorithm", {})), rounds=rounds,
                            participation=1.0, eval_every=eval_every, seed=seed, track_improved=False,
                            checkpoint_every=10 * eval_every)


def dqnfed_shakespeare_config(algorithm, roles: int = 31, max_samples: int = 2000, rounds: int = 500, seed: int = 0,
                              eval_every: int | None = None, track_improved: bool = True, batched: bool = False):
    """One run of DQN-Fed §5.4's Shakespeare setup 1 (Table 6): ``roles`` speaking roles as
    clients (LEAF's natural split), all taking part in every round, the character LSTM
    (``lstm_shakespeare``), E = 1, b = 10, local η = 0.8, each role capped at ``max_samples``
    windows (``fairfl.federated.data.shakespeare``). The paper's η decay of 0.95 "per" an unstated unit is
    not applied. ``track_improved`` records eq. (29)'s improved participants every round (one more
    loss evaluation per participant; notebook 04's inline config before this function had it off);
    ``eval_every`` defaults to max(1, rounds // 25), about 25 evaluations in a long run.

    ``batched=False`` (the default) trains each role's instance through ``nn.LSTM`` (the reference
    path); ``True`` stacks the instances of a round and of the runs trained alongside
    (``fairfl.federated.stacked_lstm``), which is a different config (its own cache entries, equal to float
    tolerance). On a CPU the reference path is the faster one: oneDNN's fused LSTM cell against the
    stack's batched products, 1.6-2× (``benchmarks/lstm_speed.py``); the stacked path is meant for a
    GPU, where one instance's products at b = 10 leave the device idle."""
    from fairfl.training.client import LocalTraining
    from fairfl.runs.config import ExperimentConfig
    from fairfl.federated.partition import PartitionSpec
    return ExperimentConfig(
        dataset="shakespeare", dataset_options={"max_samples": max_samples}, model="lstm_shakespeare",
        partition=PartitionSpec("natural", num_clients=roles), local=LocalTraining(epochs=1, batch_size=10, lr=0.8),
        algorithm=algorithm, rounds=rounds, participation=1.0, eval_every=eval_every or max(1, rounds // 25), seed=seed,
        track_improved=track_improved, batched=batched)


# ----------------------------------------------------------------------------- a run's reported numbers

def _fedfv_method(algorithm: dict) -> str | None:
    """FedFV Table 3's row name of an algorithm with the options of that table, else None."""
    name = algorithm.get("name")
    if name == "fedavg":
        return "FedAvg"
    if name == "afl":
        return f"AFL (η_λ={algorithm['lr_lambda']:g})"
    if name == "qfedavg":
        return f"q-FedAvg (q={algorithm['q']:g})"
    if name == "fedmgda_plus":
        return f"FedMGDA+ (ε={algorithm['eps']:g})"
    if name == "fedfv" and algorithm.get("order") == "loss":
        return {0.0: "FedFV (α=0)", round(1 / 3, 6): "FedFV (α=1/3)",
                round(2 / 3, 6): "FedFV (α=2/3)"}.get(round(float(algorithm["alpha"]), 6))
    return None


def _dqnfed_method(algorithm: dict) -> str | None:
    name = algorithm.get("name")
    if name == "dqnfed" and algorithm.get("step") == "eq17":
        return "DQN-Fed"
    return {"fedavg": "FedAvg", "qfedavg": "q-FFL", "fedmgda": "FedMGDA", "fedmgda_plus": "FedMGDA", "term": "TERM",
            "ditto": "Ditto", "fedlf": "FedLF", "fedheal": "FedHEAL", "fednl": "FedNL", "fednew": "FedNew"}.get(name)


def reported(config: dict) -> tuple[str, dict[str, float], float] | None:
    """What a paper reports for the setting of ``config`` (a config dict), where one of the
    tables above has it: (source, {"mean" / "std" / "worst" / "best": value in %}, the fraction
    of clients its worst / best average over). None where no table has this setting. Matched on
    the dataset, the partition's shape and the algorithm with its options — not on the number of
    rounds or seeds, which a quick profile shortens."""
    dataset, part, algorithm = config.get("dataset"), config.get("partition", {}), config.get("algorithm", {})
    if not isinstance(algorithm, dict):
        return None
    if dataset == "fashion_mnist" and part.get("scheme") == "one_class" and part.get("num_clients") == 3:
        method, table, source, fraction = _fedfv_method(algorithm), FEDFV_TABLE3, "FedFV Table 3", None
    elif dataset == "cifar10" and part.get("scheme") == "shards" and part.get("num_clients") == 100:
        method, table, source, fraction = _dqnfed_method(algorithm), DQNFED_TABLE1_SETUP1, "DQN-Fed Table 1", 0.05
    elif dataset == "shakespeare":
        method, table, source, fraction = _dqnfed_method(algorithm), DQNFED_TABLE6_SETUP1, "DQN-Fed Table 6", 0.1
    else:
        return None
    row = table[table["method"] == method]
    if method is None or row.empty:
        return None
    values = {k: float(row[k].iloc[0]) for k in ("mean", "std", "worst", "best") if k in row}
    return f"{source}, {method}", values, fraction
