"""Regenerate the README's explorer screenshots (docs/explore-1.png, docs/explore-2.png).

    .venv/bin/python scripts/explore_screenshots.py [CACHE]      # CACHE: default tmp/explore-cache

Fills CACHE with a small real sweep whose curves show something (notebook 04's setting: the three
one-class Fashion-MNIST clients of FedFV/DQN-Fed with the 2-layer MLP, full-batch local steps;
40 rounds, 3 seeds, FedAvg, q-FFL, FedMGDA+ at two ε, FedFV and DQN-Fed: 18 runs, 12.5 minutes on
two cores shared with other work (load 10); cached runs are loaded, not trained again), then runs
tests/test_jupyterlab.py with ``FAIRFL_DOCS_SCREENSHOTS=CACHE``: the browser test then opens
``fairfl.explore(root=CACHE)`` in JupyterLab and screenshots it after two selections.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.algorithms.dqnfed import DQNFed
from fairfl.algorithms.fedavg import FedAvg
from fairfl.algorithms.fedfv import FedFV
from fairfl.algorithms.fedmgda import FedMGDAPlus
from fairfl.algorithms.qffl import QFedAvg
from fairfl.sweeps import run_many

REPO = Path(__file__).resolve().parent.parent

# notebook 04's methods and setting (04_dqnfed_convergence.ipynb), fewer rounds
METHODS = [FedAvg(weighting="uniform"), QFedAvg(q=5.0), FedMGDAPlus(eps=0.1, server_lr=0.1, decay=0.1),
           FedMGDAPlus(eps=0.5, server_lr=0.1, decay=0.1), FedFV(alpha=2 / 3), DQNFed()]
BASE = ExperimentConfig(
    dataset="fashion_mnist", dataset_options={"classes": (6, 2, 0), "normalize": "per_feature"}, model="mlp2",
    partition=PartitionSpec("one_class", num_clients=3, classes=(0, 1, 2), split=None),
    local=LocalTraining(epochs=1, batch_size=None, lr=0.1),
    rounds=40, participation=1.0, eval_every=2, track_improved=True)

if __name__ == "__main__":
    cache = Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "tmp" / "explore-cache").resolve()
    run_many([BASE.replace(algorithm=m, seed=s) for m in METHODS for s in (0, 1, 2)], root=cache)
    env = {**os.environ, "FAIRFL_DOCS_SCREENSHOTS": str(cache)}
    sys.exit(subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s",
                              str(REPO / "tests" / "test_jupyterlab.py")], cwd=REPO, env=env))
