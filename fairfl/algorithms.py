"""Algorithms by their papers' names. An algorithm is an aggregator plus what it changes in
the clients' local training (e.g. FedProx's proximal term), so that the round loop has no
special cases. Unknown names and bad options fail here, before any data is loaded.

| name           | paper                                   | aggregator            | clients          |
|----------------|-----------------------------------------|-----------------------|------------------|
| fedavg         | McMahan et al. 2017                     | FedAvg                | SGD              |
| fedavg_n       | FedMGDA+ §6 (FedAvg on unit updates)    | FedAvgN               | SGD              |
| fedprox        | Li et al. 2020 (FedProx)                | FedAvg                | SGD + (μ/2)‖w−wₜ‖² |
| fedmgda        | FedMGDA+ §4 (vanilla MGDA)              | FedMGDAPlus(ε=1, raw) | SGD              |
| fedmgda_plus   | FedMGDA+ Algorithm 1, eq. (25)          | FedMGDAPlus(ε)        | SGD              |
| mgda_prox      | FedMGDA+ §6 (FedMGDA+ with prox)        | FedMGDAPlus(ε)        | SGD + prox       |
| qfedavg        | Li et al. 2020 (q-FFL), Algorithm 3     | QFedAvg(q, L)         | SGD              |
| afl            | Mohri et al. 2019                       | AFL(γ_λ)              | SGD              |
| fedfv          | Wang et al. 2021 (FedFV), Algorithms 1–3 | FedFV(α, τ, order)   | SGD              |
| dqnfed         | Mohajer Hamidi (DQN-Fed), Algorithm 1   | DQNFed                | gradient + BFGS d̃ₖ |
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from .aggregators import AFL, Aggregator, DQNFed, FedAvg, FedAvgN, FedFV, FedMGDAPlus, QFedAvg, fedmgda
from .errors import ConfigError
from .local import LocalTraining
from .quasi_newton import dqnfed_client_updates


@dataclass(frozen=True)
class Algorithm:
    """``client_update`` replaces the clients' local training when an algorithm's clients do
    something else than SGD epochs (DQN-Fed: gradients and BFGS rates); it is called as
    ``client_update(model, w, w_previous, data, clients, local, seed, round, batched, loss_before, cache)``,
    where ``cache`` is a dict the hook may keep between the rounds of one run to avoid recomputing
    something; it must never change a result (a resumed run starts with it empty)."""
    name: str
    aggregator: Aggregator
    local_overrides: dict[str, Any] = field(default_factory=dict)
    client_update: Callable[..., Any] | None = None

    def local_training(self, base: LocalTraining) -> LocalTraining:
        return replace(base, **self.local_overrides)


def _prox(mu: float) -> dict[str, float]:
    if not mu >= 0:
        raise ConfigError(f"proximal mu must be >= 0, got {mu}")
    return {"prox_mu": float(mu)}


def _fedprox(local: LocalTraining, mu: float = 0.01, weighting: str = "samples") -> Algorithm:
    return Algorithm("fedprox", FedAvg(weighting), _prox(mu))


def _qfedavg(local: LocalTraining, q: float = 1.0, L: float | None = None) -> Algorithm:
    # q-FFL's code sets the Lipschitz estimate L to 1 / (local learning rate)
    return Algorithm("qfedavg", QFedAvg(q, L if L is not None else 1.0 / local.lr))


REGISTRY: dict[str, Callable[..., Algorithm]] = {
    "fedavg": lambda local, **kw: Algorithm("fedavg", FedAvg(**kw)),
    "fedavg_n": lambda local, **kw: Algorithm("fedavg_n", FedAvgN(**kw)),
    "fedprox": _fedprox,
    "fedmgda": lambda local, **kw: Algorithm("fedmgda", fedmgda(**kw)),
    "fedmgda_plus": lambda local, **kw: Algorithm("fedmgda_plus", FedMGDAPlus(**kw)),
    "mgda_prox": lambda local, mu=0.1, **kw: Algorithm("mgda_prox", FedMGDAPlus(**kw), _prox(mu)),
    "qfedavg": _qfedavg,
    "afl": lambda local, **kw: Algorithm("afl", AFL(**kw)),
    "fedfv": lambda local, **kw: Algorithm("fedfv", FedFV(**kw)),
    "dqnfed": lambda local, **kw: Algorithm("dqnfed", DQNFed(**kw), client_update=dqnfed_client_updates),
}


def check_algorithm_name(name: str) -> None:
    if name not in REGISTRY:
        raise ConfigError(f"unknown algorithm {name!r}; known: {', '.join(sorted(REGISTRY))}")


def make_algorithm(name: str, local: LocalTraining | None = None, **options) -> Algorithm:
    """Build an algorithm by name; ``local`` is the clients' base training (q-FedAvg derives L
    from its learning rate). Unknown options raise a ConfigError naming them."""
    check_algorithm_name(name)
    try:
        return REGISTRY[name](local or LocalTraining(), **options)
    except TypeError as e:
        raise ConfigError(f"bad options for algorithm {name!r}: {e}") from None
