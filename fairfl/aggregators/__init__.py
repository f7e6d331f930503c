"""Server aggregation rules, one module per family (see ``base`` for the interface):
fedavg (FedAvg, FedAvg-n), mgda (FedMGDA, FedMGDA+, MGDA-Prox), qffl (q-FedAvg), afl (AFL)."""
from .afl import AFL, project_simplex
from .base import Aggregate, Aggregator, State, normalise_rows, row_norms
from .fedavg import FedAvg, FedAvgN, sample_weights
from .mgda import FedMGDAPlus, fedmgda
from .qffl import QFedAvg

__all__ = ["Aggregate", "Aggregator", "State", "normalise_rows", "row_norms", "sample_weights",
           "FedAvg", "FedAvgN", "FedMGDAPlus", "fedmgda", "QFedAvg", "AFL", "project_simplex"]
