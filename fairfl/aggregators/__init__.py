"""Server aggregation rules, one module per family (see ``base`` for the interface):
fedavg (FedAvg, FedAvg-n), mgda (FedMGDA, FedMGDA+, MGDA-Prox), qffl (q-FedAvg), afl (AFL),
fedfv (FedFV), dqnfed (DQN-Fed's server)."""
from .afl import AFL, project_simplex
from .base import Aggregate, Aggregator, State, normalise_rows, row_norms
from .fedavg import FedAvg, FedAvgN, sample_weights
from .fedfv import FedFV
from .dqnfed import DQNFed
from .mgda import FedMGDAPlus, fedmgda
from .qffl import QFedAvg

__all__ = ["Aggregate", "Aggregator", "State", "normalise_rows", "row_norms", "sample_weights",
           "FedAvg", "FedAvgN", "FedFV", "DQNFed", "FedMGDAPlus", "fedmgda", "QFedAvg", "AFL", "project_simplex"]
