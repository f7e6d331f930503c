"""The explorer (fairfl.explore) over a real tiny cache and over a sweep: its factors are found
from the configs, selections cascade, every metric draws, the static output is a figure and a
line of text, and "run it" trains a changed setting through run_many and adds it."""
from __future__ import annotations

import pytest

import fairfl
from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.algorithms.fedavg import FedAvg
from fairfl.algorithms.fedmgda import FedMGDAPlus
from fairfl.errors import ConfigError
from fairfl.notebook import Sweep
from fairfl.sweeps import SerialBackend, run_many

CFG = ExperimentConfig(dataset="adult", model="logreg",
                       partition=PartitionSpec("attribute", num_clients=2, attribute_values=(0, 1), split=None),
                       local=LocalTraining(epochs=1, batch_size=500, lr=0.1), rounds=2, clients_per_round=2,
                       eval_every=1)
CONFIGS = [CFG.replace(algorithm=FedMGDAPlus(eps=e), seed=s) for e in (0.1, 1.0) for s in (0, 1)] + \
          [CFG.replace(algorithm=FedAvg(), seed=0)]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("explore")
    run_many(CONFIGS, backend=SerialBackend(), root=root, progress=False)
    return root


def test_factors_come_from_the_configs_and_every_metric_draws(root, capsys):
    ex = fairfl.explore(root=root, static=True)
    assert ex.factors[:3] == ["dataset", "model", "algorithm"] and "algorithm.eps" in ex.factors
    assert "local.lr" not in ex.factors                       # the same in every run
    assert ex.selection["A"]["algorithm.eps"] != ex.selection["B"]["algorithm.eps"]
    ex.select("B", algorithm="fedavg")
    assert ex.selection["B"]["algorithm.eps"] == "–" and len(ex.selected("B")) == 1 and len(ex.selected("A")) == 2
    for metric in ex.metrics:
        ex.set_metric(metric)
        assert ex.png().startswith(b"\x89PNG")
    with pytest.raises(ConfigError, match="not a factor"):
        ex.select("A", epsilon=0.1)
    ex._ipython_display_()
    assert "explorer (static" in capsys.readouterr().out


def test_run_it_trains_a_changed_setting_and_adds_it(root):
    ex = fairfl.explore(root=root, static=True)
    ex.select("A", algorithm="fedmgda_plus", **{"algorithm.eps": 0.1})
    histories = ex.run_it("algorithm.eps=0.5", seeds=[0])
    assert histories[0] is not None and histories[0].config["algorithm"]["eps"] == 0.5
    assert ex.selection["A"]["algorithm.eps"] == 0.5 and len(ex.selected("A")) == 1
    assert len(fairfl.results(["eps=0.5"], root=root)) == 1
    with pytest.raises(ConfigError):
        ex.run_it("algorithm.eps=7")                          # a bad change is named before training


def test_over_a_sweep_its_factors_are_the_controls(root):
    histories = run_many(CONFIGS[:4], root=root, backend=SerialBackend(), progress=False)
    sweep = Sweep([dict(eps=e, seed=s) for e in (0.1, 1.0) for s in (0, 1)], histories)
    ex = sweep.explore(static=True)
    assert ex.factors == ["eps"] and ex.seeds == [0, 1]
    assert ex.redraw() > 0 and "eps=0.1" in ex.summary and "eps=1" in ex.summary
