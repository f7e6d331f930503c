"""fairfl: fair and multi-objective federated learning, reproduced (FedMGDA+, FedFV, FMOL, DQN-Fed).

Start with ``notebooks/00_tour.ipynb``. The pieces, by module:
data (real loaders) -> partition (clients) -> models -> client (local training, the simulated
clients) -> algorithms (one module per paper's family: the round's configure, client update,
aggregation, server step and evaluation) -> loop (the one round loop) -> sweeps (cache, many
runs) -> metrics / plotting / notebook. Messages between the two sides are in ``messages``,
the one min-norm QP in ``minnorm``, server step sizes in ``schedules``, the seeding scheme in
``seeding``. Notebooks check the papers' claims with ``claims`` (holds / FAILED / not reproduced
with a documented diagnosis).
"""
import os as _os

# Intel MKL's strict reproducibility, ``fairfl.engine.exactness.MKL_CBWR`` (why: see there), must be
# set before torch first calls MKL, so here, without importing torch; FAIRFL_EXACT=0 leaves it out.
if _os.environ.get("FAIRFL_EXACT", "1").strip() != "0":
    _os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

from .errors import ConfigError, DatasetNotFoundError, FairFLError, RunFailedError, TrainingDivergedError  # noqa: E402

# The package's names load on first use (PEP 562), so that `import fairfl` and `python -m fairfl
# --help` do not wait for torch; `fairfl.ExperimentConfig` and `from fairfl import ...` work as usual.
_LAZY = {"ALGORITHMS": "algorithms", "Algorithm": "algorithms", "make_algorithm": "algorithms", "register": "algorithms",
         "LocalTraining": "client", "ExperimentConfig": "config", "PartitionSpec": "partition"}


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
    """The index of cached runs as a pandas DataFrame (``fairfl.index.results``)."""
    from .index import results as index
    return index(where, root, **settings)


def explore(sweep=None, *, root=None, static=None, backend=None):
    """An ipywidgets explorer over the run cache, or over a notebook's sweep (``fairfl.explorer``)."""
    from .explorer import explore as open_explorer
    return open_explorer(sweep, root=root, static=static, backend=backend)


__version__ = "0.2.0"
__all__ = ["ExperimentConfig", "PartitionSpec", "LocalTraining", "Algorithm", "ALGORITHMS", "make_algorithm",
           "register", "results", "explore", "ConfigError", "DatasetNotFoundError", "FairFLError", "RunFailedError", "TrainingDivergedError"]
