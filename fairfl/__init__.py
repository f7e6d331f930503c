"""fairfl: fair and multi-objective federated learning, reproduced (FedMGDA+, FedFV, FMOL, DQN-Fed).

Start with ``notebooks/00_tour.ipynb``. The pieces, by module:
datasets (real loaders) -> partition (clients) -> models -> local (client training) ->
aggregators (server rules) -> simulation (round loop) -> experiments (cache, many runs) ->
metrics / plotting.
"""
from .config import ExperimentConfig
from .errors import ConfigError, DatasetNotFoundError, FairFLError, RunFailedError, TrainingDivergedError
from .local import LocalTraining
from .partition import PartitionSpec

__version__ = "0.1.0"
__all__ = ["ExperimentConfig", "PartitionSpec", "LocalTraining", "ConfigError", "DatasetNotFoundError",
           "FairFLError", "RunFailedError", "TrainingDivergedError"]
