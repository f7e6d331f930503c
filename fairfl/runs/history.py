"""What a run leaves: its :class:`History` (the per-round and per-evaluation record every figure,
table, the results index and the explorer read), and the checkpoint a run resumes from
(:class:`RunState`, :func:`save_checkpoint`, :func:`load_checkpoint`).

A low floor of the house: the readers of results (``fairfl.runs.cache``, ``index``, ``plotting``,
``explorer``) import this module, not the round loop that writes it (``fairfl.runs.loop``).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fairfl.federated.algorithms.base import state_from_plain, state_to_plain
from fairfl.base.atomic import atomic_write, read_json_npz, write_json_npz
from .config import ExperimentConfig
from fairfl.base.errors import CacheError


# ----------------------------------------------------------------------------- history

@dataclass
class History:
    """Everything a run measured. Saved as JSON (config, per-round scalars) + NPZ (per-client
    arrays); never pickled. For a multi-objective run (FMOL) every evaluation holds one value per
    objective: ``test_acc`` [eval][client][objective], ``train_loss`` [eval][objective]."""

    config: dict[str, Any]
    eval_rounds: list[int] = field(default_factory=list)      # rounds completed at each evaluation
    test_acc: list[list] = field(default_factory=list)         # [eval][client]
    test_loss: list[list] = field(default_factory=list)
    train_loss: list = field(default_factory=list)             # uniform mean over all clients
    round_lr: list[float] = field(default_factory=list)        # ηₜ per round
    round_improved: list[float] = field(default_factory=list)  # share of improved participants (NaN: not tracked)
    round_time: list[float] = field(default_factory=list)      # wall seconds per round (shared by a lockstep group)
    sampled: list[list[int]] = field(default_factory=list)     # client ids per round
    info: dict[str, list] = field(default_factory=dict)        # the rule's per-round log (scalars or short vectors)
    # With config.averaged_iterate: the same measures at w̄_T = (1/T)·Σ_{t=1..T} w_t, the average of the
    # global models after rounds 1..T (at round 0 the initial model), scored as a global model.
    avg_test_acc: list[list] = field(default_factory=list)
    avg_test_loss: list[list] = field(default_factory=list)
    avg_train_loss: list = field(default_factory=list)
    # With config.track_validation: per-client accuracy and loss on the validation splits, at every
    # evaluation — what a tuning protocol selects on, never the test split
    val_acc: list[list] = field(default_factory=list)
    val_loss: list[list] = field(default_factory=list)

    # -- views
    @property
    def rounds_done(self) -> int:
        return len(self.round_lr)

    def acc(self) -> np.ndarray:
        """(evaluations, clients[, objectives]) test accuracy."""
        return np.asarray(self.test_acc, dtype=np.float64)

    def final_acc(self) -> np.ndarray:
        return self.acc()[-1]

    def averaged_acc(self) -> np.ndarray:
        """(evaluations, clients[, objectives]) test accuracy of the averaged iterate."""
        if not self.avg_test_acc:
            raise ValueError("this run did not score the averaged iterate: run it with averaged_iterate=True")
        return np.asarray(self.avg_test_acc, dtype=np.float64)

    def validation_acc(self) -> np.ndarray:
        """(evaluations, clients) accuracy on the clients' validation splits: what a tuning protocol
        may select on (``fairfl.studies.protocol``)."""
        if not self.val_acc:
            raise ValueError("this run did not score the validation splits: run it with track_validation=True")
        return np.asarray(self.val_acc, dtype=np.float64)

    def mean_acc(self) -> np.ndarray:
        """Average client test accuracy per evaluation (per objective: (evaluations, S))."""
        return np.nanmean(self.acc(), axis=1)

    def train_losses(self) -> np.ndarray:
        """(evaluations,) averaged training loss, or (evaluations, S) per objective."""
        return np.asarray(self.train_loss, dtype=np.float64)

    def rounds_to(self, threshold: float) -> np.ndarray:
        """First evaluated round at which the training loss is ≤ ``threshold`` (per objective for
        a multi-objective run); inf where the run never reached it (so that "more than T rounds"
        orders correctly)."""
        from fairfl.federated.metrics import rounds_to_reach
        loss = self.train_losses()
        columns = loss[:, None] if loss.ndim == 1 else loss
        r = np.array([rounds_to_reach(self.eval_rounds, columns[:, s], threshold, above=False)
                      for s in range(columns.shape[1])])
        r = np.where(np.isnan(r), np.inf, r)
        return r[0] if loss.ndim == 1 else r

    def info_array(self, key: str) -> np.ndarray:
        """The rule's per-round log ``key`` as an array (rounds[, …])."""
        return np.asarray(self.info[key], dtype=np.float64)

    # -- (de)serialisation
    def to_state(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_state(cls, s: dict[str, Any]) -> "History":
        return cls(**s)

    def record(self, done: int, ev) -> None:
        """An evaluation (``fairfl.training.client.Evaluation``: per-client test accuracy and loss, the
        training loss) after ``done`` rounds."""
        self.eval_rounds.append(done)
        self.test_acc.append(ev.test_acc)
        self.test_loss.append(ev.test_loss)
        self.train_loss.append(ev.train_loss)
        if getattr(ev, "val_acc", None) is not None:
            self.val_acc.append(ev.val_acc)
            self.val_loss.append(ev.val_loss)

    def record_averaged(self, ev) -> None:
        """The averaged iterate's evaluation at the round :meth:`record` was last called with."""
        self.avg_test_acc.append(ev.test_acc)
        self.avg_test_loss.append(ev.test_loss)
        self.avg_train_loss.append(ev.train_loss)

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        arrays = {"test_acc": self.acc(), "test_loss": np.asarray(self.test_loss, dtype=np.float64),
                  "sampled": np.asarray(self.sampled, dtype=np.int64)}
        scalars = {k: v for k, v in self.to_state().items() if k not in arrays}
        write_json_npz(folder, scalars, arrays)

    @classmethod
    def load(cls, folder: Path) -> "History":
        """A saved history, checked (``fairfl.base.atomic.read_json_npz``); a CacheError names the folder."""
        scalars, arrays = read_json_npz(folder)
        try:
            return cls(**scalars, **{k: v.tolist() for k, v in arrays.items()})
        except TypeError as e:
            raise CacheError(f"cache entry {folder} does not hold a history ({e}); delete it to have the run "
                             "trained again") from None


# ----------------------------------------------------------------------------- checkpoints

CHECKPOINT = "checkpoint.pt"


@dataclass
class RunState:
    """Everything a run needs to continue after round ``round``."""

    round: int
    params: torch.Tensor
    state: Any
    optimizer: Any
    clients: dict[int, Any]
    history: History
    iterate_sum: torch.Tensor | None = None    # Σ_{t=1..round} w_t in float64, with config.averaged_iterate


def save_checkpoint(folder: Path, config: ExperimentConfig, run: RunState) -> None:
    blob = {"config_key": config.key(), "round": run.round, "params": run.params,
            "state": state_to_plain(run.state), "optimizer": state_to_plain(run.optimizer),
            "clients": {int(k): state_to_plain(v) for k, v in run.clients.items()},
            "history": run.history.to_state(), "iterate_sum": run.iterate_sum}
    atomic_write(Path(folder) / CHECKPOINT, lambda p: torch.save(blob, p))


def load_checkpoint(folder: Path, config: ExperimentConfig) -> RunState | None:
    """The checkpoint of ``config`` in ``folder``, or None (no checkpoint, or another config's). An
    unreadable one (a damaged file) is reported and removed: the run starts again from round 0."""
    path = Path(folder) / CHECKPOINT
    if not path.is_file():
        return None
    try:
        blob = torch.load(path, weights_only=True)  # no arbitrary unpickling
        if blob.get("config_key") != config.key():
            return None
        algo = config.algorithm
        return RunState(blob["round"], blob["params"], state_from_plain(algo.State, blob["state"]), blob["optimizer"],
                        {int(k): state_from_plain(algo.ClientState, v) for k, v in blob["clients"].items()},
                        History.from_state(blob["history"]), blob.get("iterate_sum"))
    except Exception as e:  # noqa: BLE001 - any failure to read it means the same: it cannot be resumed from
        first = (str(e).splitlines() or ["an empty file" if path.stat().st_size == 0 else "no message"])[0][:200]
        warnings.warn(f"checkpoint {path} is unreadable ({type(e).__name__}: {first}); it is "
                      "removed and the run starts again from round 0", stacklevel=2)
        path.unlink(missing_ok=True)
        return None


# ----------------------------------------------------------------------------- the loop

# A run computes with RUN_THREADS intra-op threads and Intel MKL in strict mode (run_threads);
# these rules, cpu_kernels and the other bit-exactness rules live in fairfl.training.engine.exactness.
