"""The runs an explorer offers: each finished run as a :class:`Run` (its value of every factor,
its seed, config and a loader of its History), from the run cache (:func:`runs_from_cache`, the
factors found from the settings that vary among the cached configs) or from a notebook's sweep
(:func:`runs_from_sweep`, its named factors)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fairfl.runs.history import History

MISSING = "–"          # the value of a setting a run does not have (an option of another algorithm)
# settings that never tell runs apart in a way worth a control
_IGNORED = {"checkpoint_every", "seed", "device"}


# ----------------------------------------------------------------------------- the runs

@dataclass
class Run:
    factors: dict[str, Any]         # its value of every factor
    seed: int
    config: dict
    load: Callable[[], History | None]


def value_label(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def runs_from_cache(root: Path | str | None = None) -> tuple[list[Run], list[str]]:
    """The finished runs of the cache, and the settings that vary among them (dataset, model and
    algorithm first, then the algorithm's options, then the rest by name)."""
    from fairfl.runs.index import load_history, scan
    entries = [e for e in scan(root) if e.finished and e.config]
    keys = sorted({k for e in entries for k in e.settings} - _IGNORED)
    varying = [k for k in keys if len({repr(e.settings.get(k, MISSING)) for e in entries}) > 1]
    first = ["dataset", "model", "algorithm"]
    order = [k for k in first if k in varying or k in keys] + \
        sorted((k for k in varying if k not in first), key=lambda k: (not k.startswith("algorithm."), k))
    runs = [Run({k: e.settings.get(k, MISSING) for k in order}, int(e.settings.get("seed", 0)), e.config,
                (lambda e=e: load_history(e))) for e in entries]
    return runs, order


def runs_from_sweep(sweep) -> tuple[list[Run], list[str]]:
    """The runs of a notebook's :class:`fairfl.studies.notebook.Sweep` (failed ones left out), its
    factors except the seed."""
    factors = [f for f in sweep.factors if f != "seed"]
    runs = []
    for point, history in sweep:
        if history is None:
            continue
        seed = point.get("seed", history.config.get("seed", 0))
        runs.append(Run({f: point.get(f, MISSING) for f in factors}, int(seed), history.config,
                        (lambda h=history: h)))
    return runs, factors
