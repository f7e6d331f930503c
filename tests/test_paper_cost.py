"""The sweep reader (``benchmarks/notebook_sweeps.py``, used by ``benchmarks/paper_cost.py`` and
``benchmarks/gpu_check.py``) counts every notebook's ``paper`` profile: the runs and client steps it
reads from each notebook equal that notebook's own grids, derived by hand below from its ``PROFILES``
and grid definitions (each number's derivation is in the comment beside it), not from what the
reader returns. Client sizes that only the data fixes (a Dirichlet split, the Shakespeare roles a
seed draws) come from ``fairfl.federated.partition.train_sizes`` on partitions written out here, checked once
against the clients ``federate`` builds.

Nothing trains: the reader refuses any training call (checked on a notebook made here), so reading
all seven notebooks takes about a minute on two busy cores, most of it notebook 06 building its
2,484 configs.
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
    from fairfl.federated.data import report
    (_, status, _), = report(["cifar10"])
    return status == "ok"


def sizes(dataset: str, spec, **options) -> list[int]:
    from fairfl.federated.data import load_dataset
    from fairfl.federated.partition import train_sizes
    return list(train_sizes(load_dataset(dataset, **options), spec))


def epoch_steps(train: list[int], b: int) -> list[int]:
    """One epoch's steps of each client at batch size b."""
    return [math.ceil(n / b) for n in train]


def shakespeare_round(seed: int) -> int:
    """Client steps of one round of DQN-Fed's Shakespeare setup 1 (fairfl.studies.paper.dqnfed_shakespeare_config):
    the 31 roles a seed draws, each capped at 2,000 windows, split 80/10/10 in text order, all 31 taking
    part, one epoch at b = 10."""
    from fairfl.federated.partition import PartitionSpec
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
    # 32,561 rows of adult.data (UCI Adult's training file), 413 of them PhD (the "phd" domain of
    # fairfl/federated/data/adult.py) -> 32,148 / 413 -> 3,215 + 42 steps a round.
    # The official code's reading keeps int(0.8 n) of each (fairfl.federated.partition.as_in_fedmgda_code): 25,718 / 330
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

# The paper profile of notebook 06 (protocol 6.3, its PROFILES["paper"] and protocol text): five federations, K = 5
# configurations per method, tuning seeds 100 and 101 for EVERY method (twice="all"; quick tunes only the references
# FedAvg, FedAvg (uniform) and FedAvg-FT on both), edge extensions for every method (extend="all"), twelve reporting
# seeds 0..11 on every federation (a list applies to all; quick plans its seeds per federation)
FEDERATIONS_06 = ["FMNIST, 3 clients", "FMNIST, 100 shards", "FMNIST, Dirichlet", "Adult", "Shakespeare"]
K_06 = 5
TUNING_SEEDS_06 = (100, 101)
REPORTING_SEEDS_06 = {f: list(range(12)) for f in FEDERATIONS_06}
# η₀, the base local rate of each federation (the protocol's federation table): lr× multiplies it
BASE_LR = {"FMNIST, 3 clients": 0.1, "FMNIST, 100 shards": 0.1, "FMNIST, Dirichlet": 0.1, "Adult": 0.01,
           "Shakespeare": 0.8}
# the methods a criterion besides "mean" chooses for (a claim's mean-std: claims 3 and 4)
CLAIMED_06 = ("FedAvg (uniform)", "FedFV", "DQN-Fed")


def protocol_grids():
    """Notebook 06's method table on the paper grid ({method: (track, knobs)}), copied from its protocol table
    (method_table("paper")): the shared server step η and local multiplier lr× (0.25 … 4, beyond: 0.125, 8) where a
    method has them, its own knob's paper grid and declared steps beyond. FedLF's ηᵗ has its own grid on the shared
    column; FedHEAL's β is declared (0.4), not tuned."""
    from fairfl.studies.protocol import Axis
    server = Axis("server_lr", (0.25, 0.5, 1, 2, 4), 0.125, 8)
    local = Axis("lr×", (0.25, 0.5, 1, 2, 4), 0.125, 8)
    mu = Axis("mu", (0.001, 0.01, 0.1, 1, 10), 1e-4, 100)
    return {
        "FedAvg": ("global", [server, local]), "FedAvg (uniform)": ("global", [server, local]),
        "FedAvg-n": ("global", [server, local]),
        "FedProx": ("global", [mu, server, local]), "FedMGDA": ("global", [server, local]),
        "FedMGDA+": ("global", [Axis("eps", (0.01, 0.05, 0.1, 0.5, 1), None, None), server, local]),
        "MGDA-Prox": ("global", [mu, server, local]),
        "q-FedAvg": ("global", [Axis("q", (0.01, 0.1, 1, 5, 10), 0.001, 20), local]),
        "AFL": ("global", [Axis("lr_lambda", (0.001, 0.01, 0.1, 0.2, 0.5), 1e-4, 1.0), local]),
        "FedFV": ("global", [Axis("alpha", (0, 0.1, 0.2, 1 / 3, 2 / 3), None, None), local]),
        "TERM": ("global", [Axis("t", (0.1, 0.5, 1, 2, 5), 0.01, 10), local]),
        "FedLF": ("global", [Axis("server_lr", (0.01, 0.05, 0.1, 0.5, 1), 0.005, 2), local]),
        "FedNL": ("global", [Axis("mu", (0.001, 0.01, 0.1, 1, 10), 1e-4, 100), server]),
        "FedNew": ("global", [Axis("rho", (1, 10, 100, 1000, 10000), 0.1, 1e5), server]),
        "DQN-Fed": ("global", [local]), "DQN-Fed (Thm 4.2 safeguard)": ("global", [local]),
        "FedHEAL": ("global", [Axis("tau", (0.1, 0.2, 0.3, 0.4, 0.5), None, 0.7), server, local]),
        "FedAvg-FT": ("personal", [server, local]), "Local-only": ("personal", [local]),
        "Ditto": ("personal", [Axis("lam", (0.01, 0.1, 0.5, 2, 5), 0.001, 10), server, local]),
    }


def allowed_06(fed: str, method: str):
    """The one check that refuses a configuration of the paper grid or of a declared step beyond it: Ditto's personal
    step diverges once η·λ ≥ 2, η the local rate η₀·lr× (fairfl.federated.algorithms.ditto.Ditto.check). Every other grid value
    and step lies inside its option's bounds (FedHEAL τ ≤ 1, FedFV α and FedMGDA+ ε in [0, 1], rates > 0)."""
    return (lambda p: p["lam"] * BASE_LR[fed] * p["lr×"] < 2) if method == "Ditto" else (lambda p: True)


def designs_06(fed: str) -> dict:
    """Every method's paper design on ``fed``, by the notebook's declared rule: one shared (η, lr×) design
    (protocol.shared_design(5)) and each method's own columns against it (protocol.method_design), Ditto's own column
    the best that passes its check."""
    from fairfl.studies.protocol import SHARED, method_design, shared_design
    shared = dict(zip(SHARED, shared_design(K_06)))
    return {m: method_design(axes, K_06, shared, allowed=allowed_06(fed, m))
            for m, (_, axes) in protocol_grids().items()}


def extensions_under_the_stand_in_rule(fed: str, method: str, design) -> int:
    """How many edge extensions notebook 06 runs for ``method`` on ``fed`` when every configuration ties (the
    reader's stand-in: every criterion takes the first configuration of the design, so a second criterion adds
    none): protocol.edge_extensions of that configuration (one per knob on an edge with a declared step beyond),
    less any already a design point or refused by the method's check."""
    from fairfl.studies.protocol import edge_extensions, point_label
    axes = protocol_grids()[method][1]
    ok = allowed_06(fed, method)
    labels = {point_label(p) for p in design.points}
    return sum(1 for e in edge_extensions(axes, design.points[0]) if point_label(e) not in labels and ok(e))


def test_06_one_protocol(paper):
    from fairfl.federated.partition import PartitionSpec
    grids = protocol_grids()
    feds = FEDERATIONS_06
    # the tracks each federation tunes: the global one everywhere; the personal one where the best constant per
    # client scores below 99 %: not on "FMNIST, 3 clients", where each client holds one class (100 %)
    tracks = {f: {"global"} if f == "FMNIST, 3 clients" else {"global", "personal"} for f in feds}
    methods = {f: [m for m, (t, _) in grids.items() if t in tracks[f]] for f in feds}
    # 17 global-track methods (FedAvg (uniform) new in 6.3, FedHEAL with β declared) + 3 personal ones
    assert [len(methods[f]) for f in feds] == [17, 20, 20, 20, 20]                 # 97 (method, federation) pairs

    def round_steps(fed: str, seed: int) -> float:
        """Client steps of one round (the expected count where a round samples some clients)."""
        if fed == "FMNIST, 3 clients":      # 3 one-class clients, all every round, full batch: 1 step each
            return 3
        if fed == "FMNIST, 100 shards":     # 2 shards of 300 = 600 images, 80 % = 480 train, b = 50: 10 steps;
            return 10 * 10                  # 10 % of 100 clients = 10 a round
        if fed == "FMNIST, Dirichlet":      # 50 clients, Dir(0.5), split 60/20/20, min 250; b = 50; 5 clients a round
            train = sizes("fashion_mnist", PartitionSpec("dirichlet", num_clients=50, beta=0.5, split=(0.6, 0.2, 0.2),
                                                         min_size=250, seed=seed, test_source="file"))
            return 5 * sum(epoch_steps(train, 50)) / 50
        if fed == "Adult":                  # 90 % of 32,148 and of 413 rows (10 % validation), b = 10
            return math.ceil(math.floor(0.9 * 32148) / 10) + math.ceil(math.floor(0.9 * 413) / 10)  # 2,894 + 38
        # Shakespeare: 31 roles the seed draws, ≤ 2,000 windows, 80/10/10, b = 10, all every round
        return shakespeare_round(seed)
    rounds = {"FMNIST, 3 clients": 300, "FMNIST, 100 shards": 500, "FMNIST, Dirichlet": 500, "Adult": 500,
              "Shakespeare": 500}
    per_run = {(f, s): rounds[f] * round_steps(f, s) for f in feds for s in [*TUNING_SEEDS_06, *range(12)]}
    # a run's client steps over both tuning seeds, and over the reporting seeds
    tuned = {f: sum(per_run[f, s] for s in TUNING_SEEDS_06) for f in feds}
    reported = {f: sum(per_run[f, s] for s in REPORTING_SEEDS_06[f]) for f in feds}

    designs = {f: designs_06(f) for f in feds}
    # tuning: every tracked method's K = 5 configurations (a Latin design: each of 5 values of every knob once, so
    # 5 distinct points; Ditto's check changes its own column, not its budget) × both tuning seeds (paper: all methods)
    assert all(len(designs[f][m].points) == K_06 and designs[f][m].refused == 0 for f in feds for m in methods[f])
    tuning = (sum(K_06 * len(TUNING_SEEDS_06) * len(methods[f]) for f in feds),     # 97·5·2 = 970
              sum(K_06 * len(methods[f]) * tuned[f] for f in feds))

    # edge extensions (an estimate: from the stand-ins' tie), per method and federation one per edge knob of its
    # first configuration, each on both tuning seeds. That configuration takes the shared design's first point,
    # (η, lr×) = (0.25, 0.25), the lower edge of both: one extension per shared knob a method has, + its own knob's
    # where its first value is an edge with a step beyond: q 0.01, γ_λ 0.001, t 0.1, FedLF's ηᵗ 0.01, FedNL's μ 0.001,
    # FedNew's ρ 1 (FedFV's α = 0 is its bound; μ, ε, τ, λ start inside). Global track: 14 methods with two, FedFV,
    # DQN-Fed and its safeguard one = 31; personal: FedAvg-FT 2, Local-only 1, Ditto 2 = 5 (on Shakespeare Ditto's
    # own column starts at λ = 5, whose step λ = 10 has η·λ = 10·0.8·0.25 = 2 and is refused)
    ext = {f: sum(extensions_under_the_stand_in_rule(f, m, designs[f][m]) for m in methods[f]) for f in feds}
    assert [ext[f] for f in feds] == [31, 36, 36, 36, 36]
    extensions = (len(TUNING_SEEDS_06) * sum(ext.values()),                        # 175·2 = 350
                  sum(ext[f] * tuned[f] for f in feds))
    # reporting (an estimate): one chosen configuration per tracked method and federation (mean-std takes the same
    # first one) × the federation's 12 reporting seeds
    final = (sum(len(REPORTING_SEEDS_06[f]) * len(methods[f]) for f in feds),      # 97·12 = 1,164
             sum(len(methods[f]) * reported[f] for f in feds))
    check(paper["06"], {"tuning": tuning, "tuning#2": extensions, "final": final})
    # the extensions' sweep is added to `tuning` (hence "tuning#2"); both it and the reporting one are chosen on the
    # tuning sweep's (stand-in) results
    assert [(s.name, s.from_results) for s in paper["06"].sweeps] == [
        ("tuning", False), ("tuning#2", True), ("final", True)]
    # bounds the estimates must respect whatever the results (every federation speaking, no method diverging
    # everywhere): at most one extension per knob of a method for each criterion that chooses for it ("mean", and
    # mean-std for the three claimed methods), each on both tuning seeds — per federation 36 knobs of the 17 global
    # methods + 5 of the claimed ones' second choice, + 6 personal knobs off the 3 clients: 2·(5·41 + 4·6) = 458;
    # reporting one configuration per tracked method (97·12 = 1,164), at most two for the claimed ones (+ 3·5·12)
    criteria = lambda m: 1 + (m in CLAIMED_06)                                     # noqa: E731
    most = len(TUNING_SEEDS_06) * sum(criteria(m) * len(grids[m][1]) for f in feds for m in methods[f])
    fewest_reported = sum(len(REPORTING_SEEDS_06[f]) * len(methods[f]) for f in feds)
    second = sum(len(REPORTING_SEEDS_06[f]) for f in feds for m in methods[f] if m in CLAIMED_06)
    assert (most, fewest_reported, second) == (458, 1164, 180)
    assert 0 <= extensions[0] <= most and fewest_reported <= final[0] <= fewest_reported + second


def test_every_sweep_but_06s_dependent_ones_is_exact(paper):
    # notebook 06's tuning sweep comes from its settings alone; its edge extensions ("tuning#2", added to `tuning`)
    # and its reporting sweep ("final") are chosen on the tuning runs' validation scores: built from stand-ins
    for number, read in paper.items():
        flagged = [s.name for s in read.sweeps if s.from_results]
        assert flagged == (["tuning#2", "final"] if number == "06" else []), (number, flagged)


def test_the_sizes_used_are_the_clients_federate_builds():
    """The two partitions whose sizes only the data fixes, once: train_sizes agrees with federate's clients."""
    from fairfl.federated.data import load_dataset
    from fairfl.federated.partition import PartitionSpec, federate, train_sizes
    for dataset, spec, options in [
            ("fashion_mnist", PartitionSpec("dirichlet", num_clients=50, beta=0.5, split=(0.6, 0.2, 0.2), min_size=250,
                                            seed=3, test_source="file"), {}),
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
from fairfl.federated.algorithms.fedavg import FedAvg
from fairfl.studies.notebook import start
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
from fairfl.runs.loop import simulate
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
    import fairfl.runs.loop
    import fairfl.runs.sweeps
    assert fairfl.runs.sweeps.run_many.__module__ == "fairfl.runs.sweeps" and fairfl.runs.loop.simulate.__name__ == "simulate"
    import sys
    held = {(name, attr): value for name, module in list(sys.modules.items())
            if module is not None and (name == "fairfl" or name.startswith("fairfl."))
            for attr, value in vars(module).items() if attr in ("simulate", "simulate_group", "run_many")}
    assert held and all(getattr(v, "__module__", "").startswith("fairfl.") and "refus" not in getattr(v, "__qualname__", "")
                        and "fake" not in getattr(v, "__qualname__", "") for v in held.values()), held
    assert fairfl.runs.sweeps.workers.simulate_group is fairfl.runs.loop.simulate_group


def test_gpu_check_uses_this_reader():
    import gpu_check
    assert gpu_check.read_sweeps is ns.read_sweeps and gpu_check.client_steps is ns.client_steps
    assert not hasattr(gpu_check, "sweep_statements") and not hasattr(gpu_check, "NOTEBOOK_CELL_SECONDS")
