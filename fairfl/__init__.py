"""fairfl: fair and multi-objective federated learning, reproduced (FedMGDA+, FedFV, FMOL, DQN-Fed).

Start with ``notebooks/00_tour.ipynb``. The package stands in layers, lowest first, each importing
only from itself and the layers below (docs/package.md):

- ``base``: errors, atomic writes, paths, progress, input checks, the seeding scheme, profiles;
- ``federated``: data (real loaders) -> partition (clients) -> models; the algorithms, one module per
  paper's family; metrics, the min-norm QP, server step sizes, the messages between the two sides;
- ``training``: client (local training, the simulated clients) and the run-batched engine;
- ``runs``: config -> loop (the one round loop) -> cache and sweeps (many runs); Flower;
- ``studies``: claims (holds / FAILED / not reproduced with a documented diagnosis), the papers'
  numbers, the benchmark protocol, plotting, the explorer, a notebook's header;
- ``cli``: ``python -m fairfl``.

The public names are here (``from fairfl import ExperimentConfig``); the modules' former paths
(``fairfl.algorithms``, ``fairfl.sweeps``...) still import the same modules.
"""
import os as _os

# Intel MKL's strict reproducibility, ``fairfl.training.engine.exactness.MKL_CBWR`` (why: see there), must be
# set before torch first calls MKL, so here, without importing torch; FAIRFL_EXACT=0 leaves it out.
if _os.environ.get("FAIRFL_EXACT", "1").strip() != "0":
    _os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import importlib as _importlib  # noqa: E402
import importlib.abc as _importlib_abc  # noqa: E402
import importlib.util as _importlib_util  # noqa: E402
import sys as _sys  # noqa: E402

from .base.errors import (ConfigError, DatasetNotFoundError, FairFLError, RunFailedError,  # noqa: E402
                          TrainingDivergedError)

# The layers, lowest first (docs/package.md; tests/test_architecture.py enforces that none imports one
# above it), and the modules and packages each holds.
LAYERS = {
    "base": ("errors", "atomic", "paths", "progress", "validation", "seeding", "profiles", "figure_checks"),
    "federated": ("data", "partition", "models", "stacked", "stacked_lstm", "attacks", "algorithms", "metrics",
                  "minnorm", "messages", "schedules"),
    "training": ("engine", "client", "backends"),
    "runs": ("config", "history", "server", "loop", "cache", "index", "sweeps", "flower", "flower_wire"),
    "studies": ("claims", "paper", "protocol", "plotting", "explorer", "notebook"),
}
_LAYER_OF = {unit: layer for layer, units in LAYERS.items() for unit in units}


class _FormerPaths(_importlib_abc.MetaPathFinder, _importlib_abc.Loader):
    """``fairfl.algorithms.fedavg``, ``fairfl.sweeps``, ``fairfl.engine.fused``...: every module's path
    from before the package stood in layers is the same module object as its layered path
    (``fairfl.federated.algorithms.fedavg``), so that code written against those paths keeps working
    and a class imported either way is one class. First on ``sys.meta_path``: otherwise the path finder
    would load a second copy of a module under its former name."""

    def find_spec(self, fullname, path=None, target=None):
        parts = fullname.split(".")
        if len(parts) > 1 and parts[0] == __name__ and parts[1] in _LAYER_OF:
            return _importlib_util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        # the import system returns what sys.modules holds under the name once this returns
        parts = module.__name__.split(".")
        _sys.modules[module.__name__] = _importlib.import_module(".".join([parts[0], _LAYER_OF[parts[1]], *parts[1:]]))


if not any(isinstance(f, _FormerPaths) for f in _sys.meta_path):
    _sys.meta_path.insert(0, _FormerPaths())

# The package's names load on first use (PEP 562), so that `import fairfl` and `python -m fairfl
# --help` do not wait for torch; `fairfl.ExperimentConfig` and `from fairfl import ...` work as usual.
_LAZY = {"ALGORITHMS": "federated.algorithms", "Algorithm": "federated.algorithms",
         "make_algorithm": "federated.algorithms", "register": "federated.algorithms",
         "LocalTraining": "training.client", "ExperimentConfig": "runs.config", "PartitionSpec": "federated.partition"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fairfl' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))



def results(where=None, root=None, **settings):
    """The index of cached runs as a pandas DataFrame (``fairfl.runs.index.results``)."""
    from .runs.index import results as index
    return index(where, root, **settings)


def explore(sweep=None, *, root=None, static=None, backend=None):
    """An ipywidgets explorer over the run cache, or over a notebook's sweep (``fairfl.studies.explorer``)."""
    from .studies.explorer import explore as open_explorer
    return open_explorer(sweep, root=root, static=static, backend=backend)


__version__ = "0.2.0"
__all__ = ["ExperimentConfig", "PartitionSpec", "LocalTraining", "Algorithm", "ALGORITHMS", "make_algorithm",
           "register", "results", "explore", "ConfigError", "DatasetNotFoundError", "FairFLError", "RunFailedError", "TrainingDivergedError"]
