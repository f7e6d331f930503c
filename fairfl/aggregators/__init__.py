"""Server aggregation rules, one module per family (see ``base`` for the interface)."""
from .base import Aggregate, Aggregator, State, normalise_rows, row_norms
from .fedavg import FedAvg, FedAvgN

__all__ = ["Aggregate", "Aggregator", "State", "normalise_rows", "row_norms", "FedAvg", "FedAvgN"]
