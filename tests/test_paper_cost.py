"""The sweep reader (``benchmarks/notebook_sweeps.py``, used by ``benchmarks/paper_cost.py`` and
``benchmarks/gpu_check.py``) counts every notebook's ``paper`` profile: the runs and client steps it
reads from each notebook equal that notebook's own grids, derived by hand below from its ``PROFILES``
and grid definitions (each number's derivation is in the comment beside it), not from what the
reader returns. Client sizes that only the data fixes (a Dirichlet split, the Shakespeare roles a
seed draws) come from ``fairfl.partition.train_sizes`` on partitions written out here, checked once
against the clients ``federate`` builds.

Nothing trains: the reader refuses any training call (checked on a notebook made here), so reading
all seven notebooks takes about a minute on two busy cores, most of it notebook 06 building its
2,206 configs.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import notebook_sweeps as ns  # noqa: E402

NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.fixture(scope="module")
def paper():
    """Every notebook's paper profile, read once."""
    return {nb.stem[:2]: ns.read_sweeps(nb, "paper") for nb in NOTEBOOKS}


def counted(read) -> dict[str, tuple[int, float]]:
    """{sweep: (runs it trains, their client steps)} as the reader counts them."""
    return {s.name: (len(new), sum(c.rounds * ns.client_steps(c) for c in new))
            for s, new in zip(read.sweeps, read.new_runs)}


def check(read, expected: dict[str, tuple[int, float]]) -> None:
    """The reader's count equals ``expected``: the same sweeps, each's runs exactly, its client steps to rounding
    (a round's steps are sampled clients × a mean)."""
    got = counted(read)
    assert list(got) == list(expected), (list(got), list(expected))
    for name, (runs, steps) in expected.items():
        assert got[name][0] == runs, (read.notebook, name, got[name][0], runs)
        assert got[name][1] == pytest.approx(steps, rel=1e-12), (read.notebook, name, got[name][1], steps)


def cifar_here() -> bool:
    from fairfl.data import report
    (_, status, _), = report(["cifar10"])
    return status == "ok"


def sizes(dataset: str, spec, **options) -> list[int]:
    from fairfl.data import load_dataset
    from fairfl.partition import train_sizes
    return list(train_sizes(load_dataset(dataset, **options), spec))


def epoch_steps(train: list[int], b: int) -> list[int]:
    """One epoch's steps of each client at batch size b."""
    return [math.ceil(n / b) for n in train]


def shakespeare_round(seed: int) -> int:
    """Client steps of one round of DQN-Fed's Shakespeare setup 1 (fairfl.paper.dqnfed_shakespeare_config):
    the 31 roles a seed draws, each capped at 2,000 windows, split 80/10/10 in text order, all 31 taking
    part, one epoch at b = 10."""
    from fairfl.partition import PartitionSpec
    return sum(epoch_steps(sizes("shakespeare", PartitionSpec("natural", num_clients=31, seed=seed), max_samples=2000),
                           10))


def test_the_reader_covers_every_notebook(paper):
    assert set(paper) == {"00", "01", "02", "03", "04", "05", "06"}, "a notebook was added: derive its grid below"
    for number, read in paper.items():
        assert read.errors == [], (number, read.errors)        # no statement it executed failed


def test_00_tour(paper):
    # 2 methods (FedAvg, FedAvg-n) × 4 seeds; 3,000 rounds; 10 % of 100 clients = 10 a round; a client holds
    # 600 images (5 shards of 120), 80 % for training = 480, at b = 10: 48 steps
    check(paper["00"], {"runs": (8, 8 * 3000 * 10 * 48)})  # 11,520,000


def test_01_fedmgda_eps(paper):
    # datasets (Fashion-MNIST, and CIFAR-10 only where its files are) × iid/non-iid × 6 ε × 5 seeds; 2,000 rounds,
    # 10 clients a round; Fashion-MNIST: 600 images a client, 480 train, b = 10: 48 steps; CIFAR-10: 500, 400, 40
    runs, steps = 2 * 6 * 5, 2 * 6 * 5 * 2000 * 10 * 48                        # 60 runs, 57,600,000
    if cifar_here():
        runs, steps = runs * 2, steps + 2 * 6 * 5 * 2000 * 10 * 40
    check(paper["01"], {"runs": (runs, steps)})


def test_02_attacks(paper):
    # Adult, two clients (non-PhD, PhD) both every round, b = 10, 500 rounds. Training rows, true split: the
    # 32,561 rows of adult.data, 413 of them PhD (REPRODUCTION.md) -> 32,148 / 413 -> 3,215 + 42 steps a round.
    # The official code's reading keeps int(0.8 n) of each (fairfl.partition.as_in_fedmgda_code): 25,718 / 330
    # -> 2,572 + 33 steps. "PhD only" trains the PhD client alone.
    true_both, true_phd = 500 * (3215 + 42), 500 * 42
    code_both, code_phd = 500 * (2572 + 33), 500 * 33
    # true split: AFL 4 biases + q-FedAvg 3 q × 4 biases + FedMGDA+ 3 + FedAvg 3 = 22 two-client runs, + PhD only;
    # the official code's reading: AFL 4 + q-FedAvg 12 + FedMGDA+ (bias 0) = 17, + PhD only; + PhD only without
    # momentum on the official code's rows; all × 5 seeds
    adult_runs = 5 * (22 + 1 + 17 + 1 + 1)                                        # 210
    adult_steps = 5 * (22 * true_both + true_phd + 17 * code_both + code_phd + code_phd)    # 290,117,500
    # scaling attack on Fashion-MNIST: 7 methods × {no attack, scaled ×10} × 5 seeds, 1,500 rounds, p = 0.2 of 100
    # clients = 20 a round, 480 training images at b = 400: 2 steps
    scaling_runs, scaling_steps = 7 * 2 * 5, 7 * 2 * 5 * 1500 * 20 * 2           # 70, 4,200,000
    check(paper["02"], {"adult": (adult_runs, adult_steps), "scaling": (scaling_runs, scaling_steps)})


def test_03_fedfv(paper):
    # 2 models × 12 methods (FedAvg, AFL ×3, q-FedAvg ×2, FedMGDA+ ×3, FedFV ×3) × 5 seeds in loss order, + FedFV α = 0
    # in 2 more orders × 2 models × 5 seeds = 120 + 20 runs; 200 rounds, 3 clients, full batch (1 step each)
    check(paper["03"], {"runs": (140, 140 * 200 * 3)})  # 84,000


def test_04_dqnfed(paper):
    # Fashion-MNIST: 13 methods × 5 seeds (second_order_seeds=None: every seed for FedNL and FedNew too); 300 rounds,
    # 3 clients, full batch
    expected = {"sweep": (13 * 5, 13 * 5 * 300 * 3)}                           # 65, 58,500
    # Shakespeare setup 1: the 10 methods of the paper's tables + the Thm 4.2 safeguard × 5 seeds, 500 rounds; its
    # partition takes no seed (dqnfed_shakespeare_config): every run has the roles of PartitionSpec's seed 0
    expected["text"] = (11 * 5, 11 * 5 * 500 * shakespeare_round(0))
    if cifar_here():
        # CIFAR-10 setup 1: 10 methods × 5 seeds, 2,000 rounds, 10 of 100 clients, 400 training images at b = 64: 7
        expected["cifar"] = (10 * 5, 10 * 5 * 2000 * 10 * 7)
    check(paper["04"], expected)


def test_05_fmol(paper):
    # Per seed (5 seeds), the points dict of cell 3 keyed by (method, K, b, iid): Fig. 1(a) federated K = 10,
    # b ∈ {16, 64, 128, 256}, non-iid (4); Fig. 1(b) federated b = 256, K ∈ {1, 5, 10, 20} × iid/non-iid (8, of which
    # (K=10, b=256, non-iid) repeats Fig. 1(a)); Fig. 2(a) {federated, centralised} × K × b ∈ {256, 64}, non-iid (16, of
    # which federated b = 256 (4) and federated b = 64, K = 10 (1) repeat): 4 + 7 + 11 = 22 runs a seed.
    # Federated: 10 clients, K steps each, 100 rounds -> 1,000·K steps; the K of the 14 federated runs add up to
    # 4·10 + (1+5+10+20) + (1+5+20) + (1+5+20) = 128. Centralised: one pooled client, 1 step a round, K·100 rounds ->
    # 100·K; the 8 centralised runs' K add up to 2·36 = 72.
    runs = 5 * 22
    steps = 5 * (1000 * 128 + 100 * 72)                                           # 676,000
    # the feasibility cell: centralised MGD, K = 1, iid, 200 steps, 5 seeds
    check(paper["05"], {"runs": (runs, steps), "feasible": (5, 5 * 200)})


# ----------------------------------------------------------------------------- notebook 06

def protocol_grids():
    """Notebook 06's METHODS table with its paper grid ({method: (track, knobs)}), copied from the notebook."""
    from fairfl.protocol import Axis
    five = lambda name, values, below, above: Axis(name, values, below, above)   # noqa: E731
    server = five("server_lr", (0.25, 0.5, 1, 2, 4), 0.125, 8)
    local = five("lr×", (0.25, 0.5, 1, 2, 4), 0.125, 8)
    mu = five("mu", (0.001, 0.01, 0.1, 1, 10), 1e-4, 100)
    return {
        "FedAvg": ("global", [server, local]), "FedAvg-n": ("global", [server, local]),
        "FedProx": ("global", [mu, server, local]), "FedMGDA": ("global", [server, local]),
        "FedMGDA+": ("global", [five("eps", (0.01, 0.05, 0.1, 0.5, 1), None, None), server, local]),
        "MGDA-Prox": ("global", [mu, server, local]),
        "q-FedAvg": ("global", [five("q", (0.01, 0.1, 1, 5, 10), 0.001, 20), local]),
        "AFL": ("global", [five("lr_lambda", (0.001, 0.01, 0.1, 0.2, 0.5), 1e-4, 1.0), local]),
        "FedFV": ("global", [five("alpha", (0, 0.1, 0.2, 1 / 3, 2 / 3), None, None), local]),
        "TERM": ("global", [five("t", (0.1, 0.5, 1, 2, 5), 0.01, 10), local]),
        "FedLF": ("global", [five("server_lr", (0.01, 0.05, 0.1, 0.5, 1), 0.005, 2), local]),
        "FedNL": ("global", [five("mu", (0.001, 0.01, 0.1, 1, 10), 1e-4, 100), server]),
        "FedNew": ("global", [five("rho", (1, 10, 100, 1000, 10000), 0.1, 1e5), server]),
        "DQN-Fed": ("global", [local]), "DQN-Fed (Thm 4.2 safeguard)": ("global", [local]),
        "FedHEAL": ("global", [five("tau", (0.1, 0.2, 0.3, 0.4, 0.5), None, 0.7),
                               five("beta", (0.2, 0.3, 0.4, 0.5, 0.6), None, 0.8), server, local]),
        "FedAvg-FT": ("personal", [server, local]), "Local-only": ("personal", [local]),
        "Ditto": ("personal", [five("lam", (0.01, 0.1, 0.5, 2, 5), 0.001, 10), server, local]),
    }


BASE_LR = {"FMNIST, 3 clients": 0.1, "FMNIST, 100 shards": 0.1, "FMNIST, Dirichlet": 0.1, "Adult": 0.01,
           "Shakespeare": 0.8}


def extensions_under_the_stand_in_rule(fed: str, method: str, axes) -> int:
    """1 where notebook 06 runs an edge extension for ``method`` on ``fed`` when every configuration ties (the
    reader's stand-in: every criterion takes the first configuration of the design), else 0. The design is the
    notebook's (protocol.latin_design, k = 5, seed 606) with the one check that refuses configurations on the
    paper grid: Ditto's η·λ < 2 (fairfl.algorithms.ditto); its edge rule is protocol.extension."""
    from fairfl.protocol import extension, latin_design, point_label

    def allowed(p):
        return method != "Ditto" or p["lam"] * BASE_LR[fed] * p["lr×"] < 2
    design = latin_design(axes, 5, 606, allowed=allowed)
    assert len(design) == 5
    ext = extension(axes, design[0])
    labels = {point_label(p) for p in design}
    return int(ext is not None and allowed(ext) and point_label(ext) not in labels)


def test_06_one_protocol(paper):
    from fairfl.partition import PartitionSpec
    grids = protocol_grids()
    feds = list(BASE_LR)
    # the tracks each federation tunes: the global one everywhere; the personal one where the best constant per
    # client scores below 99 %: not on "FMNIST, 3 clients", where each client holds one class (100 %)
    tracks = {f: {"global"} if f == "FMNIST, 3 clients" else {"global", "personal"} for f in feds}
    methods = {f: [m for m, (t, _) in grids.items() if t in tracks[f]] for f in feds}
    assert [len(methods[f]) for f in feds] == [16, 19, 19, 19, 19]

    def round_steps(fed: str, seed: int) -> float:
        """Client steps of one round (the expected count where a round samples some clients)."""
        if fed == "FMNIST, 3 clients":      # 3 one-class clients, all every round, full batch: 1 step each
            return 3
        if fed == "FMNIST, 100 shards":     # 2 shards of 300 = 600 images, 480 train, b = 50: 10 steps; 10 clients
            return 10 * 10
        if fed == "FMNIST, Dirichlet":      # 50 clients, Dir(0.5), split 60/20/20, min 250; b = 50; 5 clients a round
            train = sizes("fashion_mnist", PartitionSpec("dirichlet", num_clients=50, beta=0.5, split=(0.6, 0.2, 0.2),
                                                         min_size=250, seed=seed))
            return 5 * sum(epoch_steps(train, 50)) / 50
        if fed == "Adult":                  # 90 % of 32,148 and of 413 rows (10 % validation), b = 10
            return math.ceil(math.floor(0.9 * 32148) / 10) + math.ceil(math.floor(0.9 * 413) / 10)  # 2,894 + 38
        # Shakespeare: 31 roles the seed draws, ≤ 2,000 windows, 80/10/10, b = 10, all every round
        return shakespeare_round(seed)
    rounds = {"FMNIST, 3 clients": 300, "FMNIST, 100 shards": 500, "FMNIST, Dirichlet": 500, "Adult": 500,
              "Shakespeare": 500}
    per_run = {(f, s): rounds[f] * round_steps(f, s) for f in feds for s in [100, 101, *range(12)]}

    # tuning: every tracked method's K = 5 configurations (each grid has more than 5 allowed points) × 2 tuning seeds
    tuning = (sum(5 * 2 * len(methods[f]) for f in feds),                          # (16 + 4·19)·10 = 920
              sum(5 * len(methods[f]) * per_run[f, s] for f in feds for s in (100, 101)))
    # edge extensions (an estimate: from the stand-ins' tie): per method and federation at most one (every
    # criterion takes the same first configuration), × 2 tuning seeds
    ext = {f: sum(extensions_under_the_stand_in_rule(f, m, grids[m][1]) for m in methods[f]) for f in feds}
    extensions = (2 * sum(ext.values()), sum(ext[f] * per_run[f, s] for f in feds for s in (100, 101)))
    # reporting (an estimate): one chosen configuration per tracked method and federation × 12 seeds
    final = (12 * sum(len(methods[f]) for f in feds),                               # 92·12 = 1,104
             sum(len(methods[f]) * per_run[f, s] for f in feds for s in range(12)))
    check(paper["06"], {"tuning": tuning, "tuning#2": extensions, "final": final})
    assert [(s.name, s.from_results) for s in paper["06"].sweeps] == [
        ("tuning", False), ("tuning#2", True), ("final", True)]
    # bounds the estimate must respect whatever the results: extensions at most one per method, federation and
    # criterion that chooses (FedAvg, FedFV and DQN-Fed have two), reporting at most two configurations for those
    assert 0 <= extensions[0] <= 2 * (92 + 3 * 5) and 1104 <= final[0] <= 1104 + 12 * 3 * 5


def test_every_sweep_but_06s_dependent_ones_is_exact(paper):
    for number, read in paper.items():
        flagged = [s.name for s in read.sweeps if s.from_results]
        assert flagged == (["tuning#2", "final"] if number == "06" else []), (number, flagged)


def test_the_sizes_used_are_the_clients_federate_builds():
    """The two partitions whose sizes only the data fixes, once: train_sizes agrees with federate's clients."""
    from fairfl.data import load_dataset
    from fairfl.partition import PartitionSpec, federate, train_sizes
    for dataset, spec, options in [
            ("fashion_mnist", PartitionSpec("dirichlet", num_clients=50, beta=0.5, split=(0.6, 0.2, 0.2), min_size=250,
                                            seed=3), {}),
            ("shakespeare", PartitionSpec("natural", num_clients=31, seed=1), {"max_samples": 2000})]:
        ds = load_dataset(dataset, **options)
        assert list(train_sizes(ds, spec)) == [len(c.y_train) for c in federate(ds, spec).clients]


# ----------------------------------------------------------------------------- the reader's rules, on a notebook made here

def write_notebook(path: Path, cells: list[tuple[str, list[str]]]) -> Path:
    nb = {"cells": [{"cell_type": "code", "metadata": {"tags": tags}, "source": src, "outputs": [],
                     "execution_count": None} for src, tags in cells],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb))
    return path


HEADER = '''
from dataclasses import replace
from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.algorithms.fedavg import FedAvg
from fairfl.notebook import start
PROFILES = {"smoke": dict(seeds=[0], lrs=[0.1]), "paper": dict(seeds=[0, 1, 2], lrs=[0.1, 0.2, 0.4])}
session = start(profile, PROFILES)
P = session.settings
BASE = ExperimentConfig(dataset="adult", model="logreg", rounds=7,
                        partition=PartitionSpec("attribute", num_clients=2, attribute_values=(0, 1), split=None),
                        local=LocalTraining(epochs=1, batch_size=10, lr=0.1), clients_per_round=2)
def config(lr, seed):
    return BASE.replace(local=replace(BASE.local, lr=lr), seed=seed)
'''


def test_loops_that_build_points_run_and_what_only_draws_or_checks_does_not(tmp_path):
    body = '''
points = []
for s in P["seeds"]:
    for lr in P["lrs"]:
        if lr > 0.3 and s == 2:
            continue
        points.append(dict(lr=lr, seed=s))
never = 1 / 0                       # needed by nothing: never executed
for p in points:                    # only draws: never executed
    open("/nonexistent/figure.png", "w").write(str(p))
print(undefined_name)
assert False
runs = session.sweep(config, points=points)
scores = [h.final_acc() for h in runs.histories]     # analysis after the last sweep: never executed
'''
    nb = write_notebook(tmp_path / "t.ipynb", [("profile = None", ["parameters"]), (HEADER, []), (body, [])])
    read = ns.read_sweeps(nb, "paper")
    assert read.errors == []
    (sweep,) = read.sweeps
    assert sweep.name == "runs" and not sweep.from_results
    # 3 seeds × 3 rates, less (0.4, seed 2): 8 runs of 7 rounds
    assert sorted((c.local.lr, c.seed) for c in sweep.configs) == sorted(
        (lr, s) for s in (0, 1, 2) for lr in (0.1, 0.2, 0.4) if not (lr > 0.3 and s == 2))
    assert read.statements[0] < read.statements[1]
    # the smoke profile of the same notebook: its own grid
    assert len(ns.read_sweeps(nb, "smoke").sweeps[0].configs) == 1


def test_a_sweep_chosen_from_results_is_counted_and_flagged(tmp_path):
    body = '''
tuning = session.sweep(config, lr=P["lrs"], seed=[100])
best = max(P["lrs"], key=lambda lr: tuning.one(lr=lr, seed=100).validation_acc()[-1].mean())
final = session.sweep(config, lr=[best], seed=P["seeds"])
'''
    nb = write_notebook(tmp_path / "t.ipynb", [("profile = None", ["parameters"]), (HEADER, []), (body, [])])
    read = ns.read_sweeps(nb, "paper")
    assert read.errors == []
    assert [(s.name, len(s.configs), s.from_results) for s in read.sweeps] == [("tuning", 3, False), ("final", 3, True)]
    # the stand-ins tie: the first configuration is chosen
    assert {c.local.lr for c in read.sweeps[1].configs} == {0.1}


def test_nothing_trains_while_a_notebook_is_read(tmp_path):
    body = '''
from fairfl.loop import simulate
lrs = [0.1]
lrs.append(simulate(config(0.2, 0)))       # what the sweep below reads: executed, and refused
runs = session.sweep(config, lr=lrs, seed=[0])
'''
    nb = write_notebook(tmp_path / "t.ipynb", [("profile = None", ["parameters"]), (HEADER, []), (body, [])])
    read = ns.read_sweeps(nb, "paper")
    # the call that would train is refused (and reported), the sweep after it is still read
    assert len(read.errors) == 1 and "TrainingRefused" in read.errors[0], read.errors
    assert [len(sweep.configs) for sweep in read.sweeps] == [1]
    # the real functions are back afterwards
    import fairfl.loop
    import fairfl.sweeps
    assert fairfl.sweeps.run_many.__module__ == "fairfl.sweeps" and fairfl.loop.simulate.__name__ == "simulate"
    import sys
    held = {(name, attr): value for name, module in list(sys.modules.items())
            if module is not None and (name == "fairfl" or name.startswith("fairfl."))
            for attr, value in vars(module).items() if attr in ("simulate", "simulate_group", "run_many")}
    assert held and all(getattr(v, "__module__", "").startswith("fairfl.") and "refus" not in getattr(v, "__qualname__", "")
                        and "fake" not in getattr(v, "__qualname__", "") for v in held.values()), held
    assert fairfl.sweeps.workers.simulate_group is fairfl.loop.simulate_group


def test_gpu_check_uses_this_reader():
    import gpu_check
    assert gpu_check.read_sweeps is ns.read_sweeps and gpu_check.client_steps is ns.client_steps
    assert not hasattr(gpu_check, "sweep_statements") and not hasattr(gpu_check, "NOTEBOOK_CELL_SECONDS")
