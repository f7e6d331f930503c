"""Accuracy reads in one unit, %, wherever a person reads it (the curves, the explorer, the
``fairfl results`` table, a notebook's summary table), and a notebook's summary table has one
flat row of self-explaining column names, without a spread over seeds where there is one seed."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

import fairfl  # noqa: E402
from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.studies import plotting  # noqa: E402
from fairfl.federated.algorithms.fedavg import FedAvg  # noqa: E402
from fairfl.federated.algorithms.fedmgda import FedMGDAPlus  # noqa: E402
from fairfl.runs.index import format_table, rows  # noqa: E402
from fairfl.studies.notebook import Sweep, client_fairness  # noqa: E402
from fairfl.runs.sweeps import SerialBackend, run_many  # noqa: E402

CFG = ExperimentConfig(dataset="adult", model="logreg",
                       partition=PartitionSpec("attribute", num_clients=2, attribute_values=(0, 1), split=None),
                       local=LocalTraining(epochs=1, batch_size=500, lr=0.1), rounds=2, clients_per_round=2,
                       eval_every=1)
POINTS = [dict(method=m, seed=s) for m in ("FedAvg", "FedMGDA+") for s in (0, 1)]
METHODS = {"FedAvg": FedAvg(), "FedMGDA+": FedMGDAPlus(eps=0.1)}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("units")
    histories = run_many([CFG.replace(algorithm=METHODS[p["method"]], seed=p["seed"]) for p in POINTS],
                         backend=SerialBackend(), root=root, progress=False)
    return root, Sweep(POINTS, histories)


def test_accuracy_reads_the_same_in_percent_everywhere(cache):
    root, sweep = cache
    h = sweep.one(method="FedAvg", seed=0)
    percent = 100 * float(h.mean_acc()[-1])
    assert 1 < percent <= 100

    fig, ax = plt.subplots()
    plotting.curves({"FedAvg": [h]}, "mean_acc", ax=ax)
    assert ax.get_lines()[0].get_ydata()[-1] == pytest.approx(percent) and "(%)" in ax.get_ylabel()
    plt.close(fig)

    ex = fairfl.explore(root=root, static=True)
    ex.select("A", algorithm="fedavg")
    ex.chosen_seeds = [0]
    x, ys = ex._curves("A")
    assert ys[0, -1] == pytest.approx(percent) and ex.metric.endswith("(%)")

    table = format_table(rows(root, ["algorithm=fedavg", "seed=0"])).splitlines()
    header, line = table[0].split(), table[1].split()
    assert line[header.index("mean_acc%")] == f"{percent:.2f}"

    assert client_fairness(h)["mean acc (%)"] == pytest.approx(percent)


def test_summary_has_one_flat_header_and_a_spread_only_over_several_seeds(cache):
    _, sweep = cache
    two = sweep.summary("method", fairness=client_fairness)
    assert not isinstance(two.columns, pd.MultiIndex)
    assert list(two.columns[:4]) == ["seeds", "mean acc (%)", "mean acc (%) ± over seeds", "std over clients (points)"]
    assert list(two["seeds"]) == [2, 2]
    fedavg = [100 * sweep.one(method="FedAvg", seed=s).final_acc().mean() for s in (0, 1)]
    assert two.loc["FedAvg", "mean acc (%)"] == pytest.approx(np.mean(fedavg))
    assert two.loc["FedAvg", "mean acc (%) ± over seeds"] == pytest.approx(np.std(fedavg))

    one = sweep.select(seed=0).summary("method", fairness=client_fairness)
    assert list(one["seeds"]) == [1, 1]
    assert not [c for c in one.columns if "±" in c], list(one.columns)
    assert not isinstance(one.columns, pd.MultiIndex) and "mean acc (%)" in one.columns


def test_a_row_of_one_seed_shows_no_spread_beside_rows_of_several(cache):
    """A method run on fewer seeds (notebook 04's FedNL and FedNew in quick) has NaN, not 0.0, in the ±
    columns."""
    _, sweep = cache
    mixed = sweep.select(method="FedAvg") + sweep.select(method=[m for m in sweep.values("method") if m != "FedAvg"][0],
                                                        seed=0)
    table = mixed.summary("method", fairness=client_fairness)
    assert list(table["seeds"]) == [2, 1]
    spread = table["mean acc (%) ± over seeds"]
    assert np.isfinite(spread.iloc[0]) and np.isnan(spread.iloc[1])
