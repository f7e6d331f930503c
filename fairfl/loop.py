"""The one round loop, for every algorithm:

    configure → clients' update → attacks → aggregate → server step → (evaluate) → (checkpoint)

Each step is the algorithm's (``fairfl.algorithms.base``); the loop only keeps the run's state
(global model, the rule's state, the server optimiser's state, the clients' states), records the
:class:`History` and writes checkpoints.

Determinism: every random choice of round t is drawn from a generator of (seed, t, purpose)
(``fairfl.seeding``), never from a generator carried across rounds. A resumed run therefore
needs only the states and the history from its checkpoint to continue exactly as an
uninterrupted run would (tested). And a run computes with one intra-op thread, whatever the
calling process set (:data:`RUN_THREADS`), so that one config gives one result in a notebook, in
a pool worker, or resumed elsewhere (tested).
"""
from __future__ import annotations

import json
import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .algorithms.base import Context, state_from_plain, state_to_plain
from .atomic import atomic_write, read_json_npz, write_json_npz
from .attacks import make_attack
from .client import ClientRuntime, Evaluation, flat_params
from .config import ExperimentConfig
from .data import load_dataset
from .engine import RUN_THREADS, Lockstep, Trainer, cpu_kernels, resolve_device, run_threads  # noqa: F401 (cpu_kernels: read from here)
from .errors import CacheError, TrainingDivergedError
from .models import build_model
from .partition import FederatedData, federate
from .progress import RoundReporter

try:
    from tqdm.auto import tqdm
except ImportError:  # pragma: no cover
    tqdm = None


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
        from .metrics import rounds_to_reach
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

    def record(self, done: int, ev: Evaluation) -> None:
        self.eval_rounds.append(done)
        self.test_acc.append(ev.test_acc)
        self.test_loss.append(ev.test_loss)
        self.train_loss.append(ev.train_loss)

    def record_averaged(self, ev: Evaluation) -> None:
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
        """A saved history, checked (``fairfl.atomic.read_json_npz``); a CacheError names the folder."""
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
# these rules, cpu_kernels and the other bit-exactness rules live in fairfl.engine.exactness.

_FEDERATED: dict[tuple[str, str], FederatedData] = {}
_FEDERATED_LOCK = threading.Lock()


def federated_data(config: ExperimentConfig, device: torch.device | str = "cpu") -> FederatedData:
    """The partitioned dataset of a config on ``device``, memoised per process (a sweep of many
    runs on one partition loads and splits the data once per worker, and moves it to a GPU once)."""
    key = json.dumps([config.dataset, dict(config.dataset_options), config.to_dict()["partition"]],
                     sort_keys=True, default=str)
    device = str(torch.device(device))
    with _FEDERATED_LOCK:     # the runs of a lockstep group start in threads
        if (key, "cpu") not in _FEDERATED:
            _remember((key, "cpu"), federate(load_dataset(config.dataset, **dict(config.dataset_options)),
                                             config.partition))
        if (key, device) not in _FEDERATED:
            _remember((key, device), _FEDERATED[(key, "cpu")].to(device))
        return _FEDERATED[(key, device)]


def _remember(key: tuple[str, str], fed: FederatedData) -> None:
    if len(_FEDERATED) >= 4:  # bound the memory of a long-lived worker
        _FEDERATED.pop(next(iter(_FEDERATED)))
    _FEDERATED[key] = fed


def _check_evaluation(ev: Evaluation, round_: int) -> None:
    if not np.isfinite(np.asarray(ev.train_loss, dtype=np.float64)).all():
        raise TrainingDivergedError(f"round {round_}: the training loss of the global model is {ev.train_loss}; "
                                    "the last checkpoint is kept")


def _improved(before: torch.Tensor, after: torch.Tensor) -> float:
    """Share of participants none of whose (held) objectives' training loss increased; ties
    count as improved (FedMGDA+ footnote 6, DQN-Fed eq. 29)."""
    ok = (after <= before) | torch.isnan(before)          # NaN before: an objective the client does not hold
    if ok.ndim == 2:
        ok = ok.all(dim=1)
    return float(ok.double().mean())


def simulate(config: ExperimentConfig, checkpoint_dir: Path | None = None, progress: bool = True,
             fed: FederatedData | None = None, stop_after: int | None = None) -> History:
    """Run ``config`` to the end (or, for tests of resuming, only up to round ``stop_after``).

    With ``checkpoint_dir`` a checkpoint is written atomically every ``checkpoint_every`` rounds
    and the run resumes from it. A NaN/Inf raises TrainingDivergedError; the last checkpoint
    stays as it was. The run computes with :data:`RUN_THREADS` intra-op threads."""
    config.validate()
    resolve_device(config.device)
    with run_threads():
        return _simulate(config, checkpoint_dir, progress, fed, stop_after)


def simulate_group(configs: Sequence[ExperimentConfig], checkpoint_dirs: Sequence[Path | None] | None = None,
                   progress: bool = True, on_done: Callable[[int, History], None] | None = None,
                   stop_after: int | None = None) -> list[History | BaseException]:
    """Run several configs side by side, each in its own thread, their local training fused
    (``fairfl.engine.Lockstep``): every run's result is the one it gives alone (tested). Each run
    keeps its own checkpoints in ``checkpoint_dirs[i]``; ``on_done(i, history)`` is called as soon
    as run i ends (to store it before the others finish). Returns each run's History, or the
    exception that stopped it; a failed run does not stop the others. The calling thread only
    waits (an interrupt stops every run at its last checkpoint)."""
    devices = []
    for c in configs:
        c.validate()
        devices.append(resolve_device(c.device))
    # The current CUDA device is a thread's own, and a new thread starts on GPU 0: the runs'
    # threads take the caller's, so that "cuda" is the GPU a worker was given (ProcessBackend(gpus=...))
    gpu = torch.cuda.current_device() if any(d.type == "cuda" for d in devices) else None
    dirs = list(checkpoint_dirs) if checkpoint_dirs is not None else [None] * len(configs)
    if len(configs) == 1:     # nothing to fuse with: no thread
        try:
            history = simulate(configs[0], dirs[0], progress, stop_after=stop_after)
        except Exception as e:  # noqa: BLE001 - returned like a group's failures
            return [e]
        if on_done is not None:
            on_done(0, history)
        return [history]
    lockstep = Lockstep(slots=max(1, torch.get_num_threads() // RUN_THREADS))  # the cores this process may use
    results: list[History | BaseException | None] = [None] * len(configs)

    def one(i: int) -> None:
        lockstep.bind(i)
        try:
            if gpu is not None:
                torch.cuda.set_device(gpu)
            with run_threads(), lockstep.turn():    # torch's thread count is per thread: set in each
                results[i] = _simulate(configs[i], dirs[i], False, None, stop_after, lockstep)
            if on_done is not None:
                on_done(i, results[i])
        except BaseException as e:  # noqa: BLE001 - reported per run
            results[i] = e
        finally:
            lockstep.leave()

    for _ in configs:
        lockstep.enter()
    threads = [threading.Thread(target=one, args=(i,), name=f"fairfl-run-{i}", daemon=True) for i in range(len(configs))]
    bar = (tqdm(total=len(configs), desc=f"{len(configs)} runs side by side", leave=False,
                **({} if progress else {"disable": True})) if tqdm else None)
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
            if bar is not None:
                bar.update(1)
    except BaseException as e:     # KeyboardInterrupt: every run stops at its next local training (or stacked prediction)
        lockstep.abort(e if isinstance(e, Exception) else RunInterrupted("interrupted"))
        for t in threads:
            t.join()
        raise
    finally:
        if bar is not None:
            bar.close()
    return results


class RunInterrupted(Exception):
    """A run of a lockstep group stopped because the group was interrupted."""


def _simulate(config: ExperimentConfig, checkpoint_dir: Path | None, progress: bool, fed: FederatedData | None,
              stop_after: int | None, trainer: Trainer | None = None) -> History:
    algo = config.algorithm
    attacks = [make_attack(spec) for spec in config.attacks]
    forced = tuple(sorted({a.client for a in attacks if a.every_round}))
    device = resolve_device(config.device)
    fed = federated_data(config, device) if fed is None else fed.to(device)
    ds = fed.dataset
    model = build_model(config.model, ds.input_shape, ds.num_classes, seed=config.seed, tasks=ds.num_tasks,
                        **dict(config.model_options))
    w = flat_params(model)                       # the global model lives on the CPU, with the server rule
    clients = ClientRuntime(model.to(device), fed.clients, config.seed, config.batched, trainer)
    optimizer = algo.server_optimizer()
    base = Context(rounds=config.rounds, seed=config.seed, local=config.local, num_clients=fed.num_clients,
                   num_sampled=config.num_sampled, eligible=config.eligible_clients, forced=forced)

    run = load_checkpoint(checkpoint_dir, config) if checkpoint_dir else None
    if run is not None:
        clients.states = run.clients
    else:
        run = RunState(0, w, algo.init(w, fed.num_clients), optimizer.init(w), clients.states, History(config.to_dict()))
        ev = algo.evaluate(replace(base, params=w), run.state, clients)
        run.history.record(0, ev)
        if config.averaged_iterate:
            run.history.record_averaged(ev)
    history = run.history

    end = config.rounds if stop_after is None else min(stop_after, config.rounds)
    report = RoundReporter(checkpoint_dir, config.rounds)    # progress.json beside the checkpoint (fairfl.progress)
    report(run.round)
    # no explicit disable=False: TQDM_DISABLE=1 (CI, stored outputs) must still switch the bar off
    bar = tqdm(range(run.round, end), initial=run.round, total=config.rounds, desc=config.label(), leave=False,
               **({} if progress else {"disable": True})) if tqdm else range(run.round, end)
    for t in bar:
        t0 = time.perf_counter()
        w = run.params
        ctx = replace(base, round=t, params=w)
        clients.round = t
        plan = algo.configure(ctx, run.state)
        if config.track_improved:
            plan = replace(plan, loss_before=True)
        honest = algo.client_update(ctx, plan, clients)
        reports = honest
        for attack in attacks:  # what the server receives
            reports = attack.apply(reports)
        agg = algo.aggregate(reports, run.state, ctx)
        if not torch.isfinite(agg.direction).all():
            raise TrainingDivergedError(f"round {t}: {algo.name} produced a NaN/Inf direction; "
                                        "the last checkpoint is kept")
        step, run.optimizer, opt_info = optimizer.update(agg.direction, run.optimizer, t, config.rounds)
        w_new = w - step
        if not torch.isfinite(w_new).all():
            raise TrainingDivergedError(f"round {t}: the server step made the global model NaN/Inf; "
                                        "the last checkpoint is kept")
        improved = float("nan")
        if config.track_improved:   # true losses, not reported ones
            improved = _improved(honest.loss_before, clients.losses(w_new, plan.clients))
        run.params, run.state, run.round = w_new, agg.state, t + 1
        if config.averaged_iterate:
            run.iterate_sum = w_new.double() + (0 if run.iterate_sum is None else run.iterate_sum)
        history.round_lr.append(float(opt_info.get("lr", 1.0)))
        history.round_improved.append(improved)
        history.sampled.append([int(k) for k in plan.clients])
        for k, v in agg.info.items():
            history.info.setdefault(k, []).append(float(v) if np.ndim(v) == 0 else np.asarray(v, float).tolist())
        done = t + 1
        if done % config.eval_every == 0 or done == config.rounds:
            ev = algo.evaluate(replace(ctx, params=w_new), run.state, clients)
            _check_evaluation(ev, t)
            history.record(done, ev)
            if config.averaged_iterate:    # as a global model, whatever the algorithm reports (AFL: its own average)
                history.record_averaged(clients.evaluate((run.iterate_sum / done).to(w_new.dtype)))
            if hasattr(bar, "set_postfix"):
                acc = np.asarray(ev.test_acc, dtype=np.float64)
                if np.isfinite(acc).any():
                    bar.set_postfix(acc=f"{np.nanmean(acc):.3f}", loss=f"{np.mean(ev.train_loss):.3f}")
        history.round_time.append(time.perf_counter() - t0)
        saved = checkpoint_dir and (done % config.checkpoint_every == 0 or done == end)
        if saved:
            save_checkpoint(checkpoint_dir, config, run)
        report(done, final=bool(saved))      # what a checkpoint holds is what the progress file says
    return history
