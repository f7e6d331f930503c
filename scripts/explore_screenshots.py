"""Regenerate the README's explorer screenshots (docs/explore-1.png, docs/explore-2.png).

    .venv/bin/python scripts/explore_screenshots.py [CACHE] [--smoke]     # CACHE: default tmp/explore-cache

Fills CACHE with a small real sweep whose curves show something (notebook 04's setting: the three
one-class Fashion-MNIST clients of FedFV/DQN-Fed with the 2-layer MLP, full-batch local steps;
40 rounds, 3 seeds, FedAvg, q-FFL, FedMGDA+ at two ε, FedFV and DQN-Fed: 18 runs, 12.5 minutes on
two cores shared with other work (load 10); cached runs are loaded, not trained again), then runs
tests/test_jupyterlab.py with ``FAIRFL_DOCS_SCREENSHOTS=CACHE``: the browser test then opens
``fairfl.explore(root=CACHE)`` in JupyterLab and screenshots it after two selections.

``--smoke`` (CI, seconds) trains the six methods for one round with one seed into CACHE (in this
process) and makes the screenshots' two selections in a static explorer, writing its two figures
into CACHE; it leaves docs/ alone and starts no browser (``make test`` runs tests/test_jupyterlab.py,
the browser part, itself).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import fairfl
from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.federated.algorithms.dqnfed import DQNFed
from fairfl.federated.algorithms.fedavg import FedAvg
from fairfl.federated.algorithms.fedfv import FedFV
from fairfl.federated.algorithms.fedmgda import FedMGDAPlus
from fairfl.federated.algorithms.qffl import QFedAvg
from fairfl.runs.sweeps import SerialBackend, run_many

REPO = Path(__file__).resolve().parent.parent

# notebook 04's methods and setting (04_dqnfed_convergence.ipynb), fewer rounds
METHODS = [FedAvg(weighting="uniform"), QFedAvg(q=5.0), FedMGDAPlus(eps=0.1, server_lr=0.1, decay=0.1),
           FedMGDAPlus(eps=0.5, server_lr=0.1, decay=0.1), FedFV(alpha=2 / 3), DQNFed()]
BASE = ExperimentConfig(
    dataset="fashion_mnist", dataset_options={"classes": (6, 2, 0), "normalize": "per_feature"}, model="mlp2",
    partition=PartitionSpec("one_class", num_clients=3, classes=(0, 1, 2), split=None),
    local=LocalTraining(epochs=1, batch_size=None, lr=0.1),
    rounds=40, participation=1.0, eval_every=2, track_improved=True)
# the screenshots' two selections (tests/test_jupyterlab.py's _docs_screenshots): A and B, and the metric
SELECTIONS = [(("fedmgda_plus", "fedavg"), "mean accuracy (%)"),
              (("qfedavg", "dqnfed"), "per-client accuracy distribution")]


def static_selections(cache: Path) -> list[Path]:
    """The screenshots' two selections in a static explorer over ``cache``; one PNG each, in ``cache``."""
    explorer = fairfl.explore(root=cache, static=True)
    paths = []
    for which, ((a, b), metric) in enumerate(SELECTIONS, start=1):
        explorer.select("A", algorithm=a)
        explorer.select("B", algorithm=b)
        explorer.set_metric(metric)
        if not (explorer.selected("A") and explorer.selected("B")):
            raise SystemExit(f"explore: selection {which} ({a} against {b}) found no runs: {explorer.summary}")
        paths.append(cache / f"explore-{which}.png")
        paths[-1].write_bytes(explorer.png())
        print(f"selection {which}: A {explorer.describe('A')}; B {explorer.describe('B')}; {metric}; "
              f"redrawn in {explorer.last_redraw:.2f} s -> {paths[-1]}")
    return paths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cache", nargs="?", type=Path, default=REPO / "tmp" / "explore-cache",
                    help="results folder for the sweep (default: tmp/explore-cache)")
    ap.add_argument("--smoke", action="store_true",
                    help="CI: 6 runs of one round, the two selections in a static explorer; no browser, docs/ untouched")
    args = ap.parse_args()
    cache = args.cache.resolve()
    if args.smoke:
        run_many([BASE.replace(algorithm=m, seed=0, rounds=1, eval_every=1) for m in METHODS], root=cache,
                 backend=SerialBackend(), progress=False)
        static_selections(cache)
        return 0
    run_many([BASE.replace(algorithm=m, seed=s) for m in METHODS for s in (0, 1, 2)], root=cache)
    env = {**os.environ, "FAIRFL_DOCS_SCREENSHOTS": str(cache)}
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s",
                            str(REPO / "tests" / "test_jupyterlab.py")], cwd=REPO, env=env)


if __name__ == "__main__":
    sys.exit(main())
