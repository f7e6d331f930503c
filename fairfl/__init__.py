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
from .algorithms import ALGORITHMS, Algorithm, make_algorithm, register
from .client import LocalTraining
from .config import ExperimentConfig
from .errors import ConfigError, DatasetNotFoundError, FairFLError, RunFailedError, TrainingDivergedError
from .partition import PartitionSpec

__version__ = "0.2.0"
__all__ = ["ExperimentConfig", "PartitionSpec", "LocalTraining", "Algorithm", "ALGORITHMS", "make_algorithm",
           "register", "ConfigError", "DatasetNotFoundError", "FairFLError", "RunFailedError", "TrainingDivergedError"]
