"""The algorithms, one module per paper's family, each registered where it is defined:

| name           | paper                                    | module    |
|----------------|------------------------------------------|-----------|
| fedavg         | McMahan et al. 2017                      | fedavg    |
| fedavg_n       | FedMGDA+ §6 (FedAvg on unit updates)     | fedavg    |
| fedprox        | Li et al. 2020 (FedProx)                 | fedavg    |
| fedavg_ft      | Wang et al. 2019 (FedAvg + fine-tuning)  | fedavg    |
| fedmgda        | FedMGDA+ §4 (vanilla MGDA)               | fedmgda   |
| fedmgda_plus   | FedMGDA+ Algorithm 1, eq. (25)           | fedmgda   |
| mgda_prox      | FedMGDA+ §6 (FedMGDA+ with prox)         | fedmgda   |
| qfedavg        | Li et al. 2020 (q-FFL), Algorithm 3      | qffl      |
| afl            | Mohri et al. 2019                        | afl       |
| fedfv          | Wang et al. 2021 (FedFV), Algorithms 1–3 | fedfv     |
| dqnfed         | Mohajer Hamidi (DQN-Fed), Algorithm 1    | dqnfed    |
| fmgda          | Yang et al. 2023 (FMOL), Algorithm 1     | fmgda     |
| term           | Li et al. 2021 (TERM), client tilting    | term      |
| ditto          | Li et al. 2021 (Ditto), Algorithm 1      | ditto     |
| fedlf          | Pan et al. 2024 (FedLF), Algorithm 1     | fedlf     |
| fedheal        | Chen et al. 2024 (FedHEAL), FPHL + FAEL  | fedheal   |
| fednl          | Safaryan et al. 2022 (FedNL), Alg. 1     | fednl     |
| fednew         | Elgabli et al. 2022 (FedNew)             | fednew    |

Every module in this folder is imported here, so a new algorithm is one new file: a frozen
dataclass subclassing :class:`Algorithm`, decorated with :func:`register` (see ``base`` and the
README's "Add your own algorithm"). An algorithm defined elsewhere registers itself the same way
when its module is imported.
"""
from __future__ import annotations

import importlib
import pkgutil

from .base import (ALGORITHMS, Algorithm, Context, ParamLayout, RoundPlan, ServerStep, init_state, make_algorithm,
                   option, register, sample_clients)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["ALGORITHMS", "Algorithm", "Context", "ParamLayout", "RoundPlan", "ServerStep", "init_state",
           "make_algorithm", "option", "register", "sample_clients"]
