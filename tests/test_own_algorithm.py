"""The README's "Add your own algorithm" example, taken from the README itself, defined in a
temporary module through the public API only, and run: on hand-made vectors, for two rounds of
the loop, and in a sweep whose worker processes import the module by themselves."""
from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fairfl import ConfigError, ExperimentConfig, LocalTraining, PartitionSpec, make_algorithm
from fairfl.algorithms import Context
from fairfl.loop import simulate
from fairfl.messages import ClientUpdates

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.fixture(scope="module")
def my_algorithms(tmp_path_factory):
    blocks = re.findall(r"```python\n(# my_algorithms\.py\n.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1, "the README has one my_algorithms.py example"
    folder = tmp_path_factory.mktemp("own_algorithm")
    (folder / "my_algorithms.py").write_text(blocks[0])
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module("my_algorithms")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("my_algorithms", None)


def test_the_rule_on_hand_made_vectors(my_algorithms):
    g = torch.tensor([[0.0, 10.0], [1.0, -50.0], [2.0, 1.0], [100.0, 2.0]])
    r = ClientUpdates(np.arange(4), g, torch.full((4,), 5))
    agg = my_algorithms.TrimmedMean(trim=1).aggregate(r, None, Context())
    torch.testing.assert_close(agg.direction, torch.tensor([1.5, 1.5]))        # (1 + 2) / 2, (1 + 2) / 2
    assert agg.info == {"kept": 2}
    with pytest.raises(ConfigError, match=r"trimmed_mean: trim=-1 is not allowed; it must be an integer in \[0, inf\)"):
        my_algorithms.TrimmedMean(trim=-1)


CFG = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (0, 1, 2)}, model="logreg",
                       partition=PartitionSpec("iid", num_clients=6), local=LocalTraining(epochs=1, batch_size=100, lr=0.05),
                       rounds=2, clients_per_round=4,
                       eval_every=1)


def test_it_runs_on_the_loop_by_object_and_by_name(my_algorithms, fmnist):
    h = simulate(CFG.replace(algorithm=my_algorithms.TrimmedMean(trim=1)), progress=False)
    assert h.rounds_done == 2 and h.info["kept"] == [2.0, 2.0]
    assert h.train_loss[-1] < h.train_loss[0]
    by_name = simulate(ExperimentConfig.from_dict({**CFG.to_dict(), "algorithm": {"name": "trimmed_mean", "trim": 1}}),
                       progress=False)
    assert by_name.train_loss == h.train_loss
    assert isinstance(make_algorithm("trimmed_mean"), my_algorithms.TrimmedMean)
    with pytest.raises(ConfigError, match="drops every one of the 4 clients"):
        CFG.replace(algorithm=my_algorithms.TrimmedMean(trim=2)).validate()


@pytest.mark.slow
def test_worker_processes_import_the_module_by_themselves(my_algorithms, fmnist, tmp_path):
    from fairfl.sweeps import ProcessBackend, run_many
    cfgs = [CFG.replace(algorithm=my_algorithms.TrimmedMean(trim=1), seed=s) for s in (0, 1)]
    with ProcessBackend(workers=2) as backend:
        out = run_many(cfgs, backend=backend, root=tmp_path, progress=False)
    assert [h.train_loss for h in out] == [simulate(c, progress=False).train_loss for c in cfgs]
