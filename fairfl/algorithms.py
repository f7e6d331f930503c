"""Algorithms by their papers' names. An algorithm is an aggregator plus what it changes in
the clients' local training (e.g. FedProx's proximal term), so that the round loop has no
special cases. Unknown names and bad options fail here, before any data is loaded."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from .aggregators import Aggregator, FedAvg, FedAvgN
from .errors import ConfigError
from .local import LocalTraining


@dataclass(frozen=True)
class Algorithm:
    name: str
    aggregator: Aggregator
    local_overrides: dict[str, Any] = field(default_factory=dict)

    def local_training(self, base: LocalTraining) -> LocalTraining:
        return replace(base, **self.local_overrides)


def _fedprox(mu: float = 0.01, weighting: str = "samples") -> Algorithm:
    if mu < 0:
        raise ConfigError(f"FedProx mu must be >= 0, got {mu}")
    return Algorithm("fedprox", FedAvg(weighting), {"prox_mu": mu})


REGISTRY: dict[str, Callable[..., Algorithm]] = {
    "fedavg": lambda **kw: Algorithm("fedavg", FedAvg(**kw)),
    "fedavg_n": lambda **kw: Algorithm("fedavg_n", FedAvgN(**kw)),
    "fedprox": _fedprox,
}


def check_algorithm_name(name: str) -> None:
    if name not in REGISTRY:
        raise ConfigError(f"unknown algorithm {name!r}; known: {', '.join(sorted(REGISTRY))}")


def make_algorithm(name: str, **options) -> Algorithm:
    """Build an algorithm by name; unknown options raise a ConfigError naming them."""
    check_algorithm_name(name)
    try:
        return REGISTRY[name](**options)
    except TypeError as e:
        raise ConfigError(f"bad options for algorithm {name!r}: {e}") from None
