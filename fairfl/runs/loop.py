"""The one round loop, for every algorithm:

    configure → clients' update → attacks → aggregate → server step → (evaluate) → (checkpoint)

Each step is the algorithm's (``fairfl.federated.algorithms.base``); the loop only keeps the run's state
(global model, the rule's state, the server optimiser's state, the clients' states), records the
:class:`History` and writes checkpoints.

Determinism: every random choice of round t is drawn from a generator of (seed, t, purpose)
(``fairfl.base.seeding``), never from a generator carried across rounds. A resumed run therefore
needs only the states and the history from its checkpoint to continue exactly as an
uninterrupted run would (tested). And a run computes with one intra-op thread, whatever the
calling process set (:data:`RUN_THREADS`), so that one config gives one result in a notebook, in
a pool worker, or resumed elsewhere (tested).
"""
from __future__ import annotations

import json
import threading
import time
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from fairfl.federated.algorithms.base import Context, ParamLayout, init_state
from fairfl.federated.attacks import make_attack
from fairfl.training.client import ClientRuntime, Evaluation, flat_params
from .config import ExperimentConfig
from fairfl.federated.data import load_dataset
from fairfl.federated.data.base import fingerprint
from fairfl.training.engine import (RUN_THREADS, Lockstep, Trainer, cpu_kernels,  # noqa: F401 (cpu_kernels: read from here)
                                    resolve_device, run_threads)
from fairfl.training.engine import cores
from fairfl.base.errors import ConfigError, TrainingDivergedError
from .history import History, RunState, load_checkpoint, save_checkpoint
from .server import record_round, server_half
from fairfl.federated.models import build_model
from fairfl.federated.partition import FederatedData, federate
from fairfl.base.progress import RoundReporter

try:
    from tqdm.auto import tqdm
except ImportError:  # pragma: no cover
    tqdm = None


_FEDERATED: dict[tuple[str, str], FederatedData] = {}
# every partition a run still holds, kept or not: a lockstep group of runs on more partitions than
# _remember keeps (notebook 06: ten seeds, each its own partition) shares each one among its runs
# instead of building it again per run (one copy of Fashion-MNIST per run filled 24 GB)
_ALIVE: "weakref.WeakValueDictionary[tuple[str, str], FederatedData]" = weakref.WeakValueDictionary()
_FEDERATED_LOCK = threading.Lock()


def federated_data(config: ExperimentConfig, device: torch.device | str = "cpu") -> FederatedData:
    """The partitioned dataset of a config on ``device``, memoised per process (a sweep of many
    runs on one partition loads and splits the data once per worker, and moves it to a GPU once).

    The memo is keyed as the run cache is (``fairfl.runs.cache.key``): by the data's fingerprint, which
    is remembered with the data root and the stamps of the files read. So a kernel whose
    ``FAIRFL_DATA`` now points elsewhere, or whose data files were edited, partitions the data of
    now, never the partition made from what was there before (which would then be stored under
    the new data's cache entry)."""
    data = fingerprint(config.dataset, config.dataset_options)
    key = json.dumps([config.dataset, dict(config.dataset_options), config.to_dict()["partition"], data],
                     sort_keys=True, default=str)
    device = memo_device(device)
    with _FEDERATED_LOCK:     # the runs of a lockstep group start in threads
        cpu = _FEDERATED.get((key, "cpu")) or _ALIVE.get((key, "cpu"))
        if cpu is None:
            cpu = federate(load_dataset(config.dataset, **dict(config.dataset_options)), config.partition)
        _remember((key, "cpu"), cpu)
        fed = _FEDERATED.get((key, device)) or _ALIVE.get((key, device))
        if fed is None:
            fed = cpu.to(device)
        _remember((key, device), fed)
        return fed


def memo_device(device: torch.device | str) -> str:
    """The full name of the device that tensors moved to ``device`` land on: plain ``"cuda"`` is
    the calling thread's current GPU, named with its index, so that data moved for GPU 1 is never
    handed to a run on GPU 0 (a group's threads and a worker's runs may be on different GPUs)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return str(device)


# What the memo keeps of partitions no run holds: the most recently used within this many bytes, and
# the last one whatever its size. Only the last, by default: a sweep deals each partition's runs into
# groups of their own (runs.sweeps.plan), so a worker's next group is on the same partition or on one
# it has not built; building one again costs about half a second (Fashion-MNIST in 100 shards or 50
# Dirichlet clients), against 180 MiB kept per partition in every worker and in the notebook's kernel.
# Keeping 512 MiB, each worker of notebook 06's reporting sweep grew by 70 MiB a group of the 3-client
# MLP (one partition each) until it held 512 MiB of partitions no group would use again; keeping the
# last one, it stays flat (benchmarks/README.md, "group_memory.py and memory_trace.py").
KEEP_BYTES = 0


def _remember(key: tuple[str, str], fed: FederatedData) -> None:
    """Keep ``fed`` as the most recently used, dropping the least recently used beyond
    :data:`KEEP_BYTES` (a long-lived worker's memory); what runs still hold stays reachable through
    ``_ALIVE``."""
    _FEDERATED.pop(key, None)
    _FEDERATED[key] = fed
    _ALIVE[key] = fed
    held = sum(map(_held_bytes, _FEDERATED.values()))
    while len(_FEDERATED) > 1 and held > KEEP_BYTES:
        held -= _held_bytes(_FEDERATED.pop(next(iter(_FEDERATED))))


def _held_bytes(fed: FederatedData) -> int:
    """The bytes of a partition's own blocks (its dataset is the loader's, kept apart)."""
    return sum(b.untyped_storage().nbytes() for b in (fed.blocks or {}).values())


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
    device = resolve_device(config.device)      # once per run, carried (a config was validated when made)
    with run_threads():
        return _simulate(config, device, checkpoint_dir, progress, fed, stop_after)


def simulate_group(configs: Sequence[ExperimentConfig], checkpoint_dirs: Sequence[Path | None] | None = None,
                   progress: bool = True, on_done: Callable[[int, History], None] | None = None,
                   stop_after: int | None = None) -> list[History | BaseException]:
    """Run several configs side by side, each in its own thread, their local training fused
    (``fairfl.training.engine.Lockstep``): every run's result is the one it gives alone (tested). Each run
    keeps its own checkpoints in ``checkpoint_dirs[i]``; ``on_done(i, history)`` is called as soon
    as run i ends (to store it before the others finish). Returns each run's History, or the
    exception that stopped it; a failed run does not stop the others. The calling thread only
    waits (an interrupt stops every run at its last checkpoint)."""
    try:
        return _simulate_group(configs, checkpoint_dirs, progress, on_done, stop_after)
    finally:
        # what the group held, handed back before a worker's next group: glibc keeps freed pages for
        # the next allocation (engine.cores), and a worker kept the peak of its largest group for good
        # (notebook 06: 3.7 GB, of which 2.7 GB free). Here, not inside the group's frame, whose
        # objects are freed only when it returns
        cores.trim_free_memory()


def _simulate_group(configs: Sequence[ExperimentConfig], checkpoint_dirs: Sequence[Path | None] | None,
                    progress: bool, on_done: Callable[[int, History], None] | None,
                    stop_after: int | None) -> list[History | BaseException]:
    devices = [resolve_device(c.device) for c in configs]     # once per run, carried to its thread
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
    cores.limit_malloc_arenas()     # the runs' threads share two allocator arenas (engine.cores: memory)
    lockstep = Lockstep(slots=lambda: max(1, cores.threads() // RUN_THREADS))  # the cores this process may use now
    results: list[History | BaseException | None] = [None] * len(configs)

    def one(i: int) -> None:
        lockstep.bind(i)
        try:
            if gpu is not None:
                torch.cuda.set_device(gpu)
            with run_threads(), lockstep.turn():    # torch's thread count is per thread: set in each
                results[i] = _simulate(configs[i], devices[i], dirs[i], False, None, stop_after, lockstep)
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


def _simulate(config: ExperimentConfig, device: torch.device, checkpoint_dir: Path | None, progress: bool,
              fed: FederatedData | None, stop_after: int | None, trainer: Trainer | None = None) -> History:
    algo = config.algorithm
    attacks = [make_attack(spec) for spec in config.attacks]
    forced = tuple(sorted({a.client for a in attacks if a.every_round}))
    fed = federated_data(config, device) if fed is None else fed.to(device)
    ds = fed.dataset
    model = build_model(config.model, ds.input_shape, ds.num_classes, seed=config.seed, tasks=ds.num_tasks,
                        **dict(config.model_options))
    w = flat_params(model)                       # the global model lives on the CPU, with the server rule
    clients = ClientRuntime(model.to(device), fed.clients, config.seed, config.batched, trainer)
    if config.track_validation:
        if ds.num_tasks > 1:
            raise ConfigError(f"{config.label()}: track_validation scores single-task models; {config.dataset} has "
                              f"{ds.num_tasks} objectives")
        clients.validation = True
    optimizer = algo.server_optimizer()
    base = Context(rounds=config.rounds, seed=config.seed, local=config.local, num_clients=fed.num_clients,
                   num_sampled=config.num_sampled, eligible=config.eligible_clients, forced=forced,
                   layout=ParamLayout.of(model))

    run = load_checkpoint(checkpoint_dir, config) if checkpoint_dir else None
    if run is not None:
        clients.states = run.clients
    else:
        run = RunState(0, w, init_state(algo, w, fed.num_clients, base.layout), optimizer.init(w), clients.states,
                       History(config.to_dict()))
        ev = algo.evaluate(replace(base, params=w), run.state, clients)
        run.history.record(0, ev)
        if config.averaged_iterate:
            run.history.record_averaged(ev)
    history = run.history

    end = config.rounds if stop_after is None else min(stop_after, config.rounds)
    report = RoundReporter(checkpoint_dir, config.rounds)    # progress.json beside the checkpoint (fairfl.base.progress)
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
        step = server_half(algo, optimizer, reports, run.state, run.optimizer, ctx, config.rounds)
        w_new = step.params
        improved = float("nan")
        if config.track_improved:   # true losses, not reported ones
            improved = _improved(honest.loss_before, clients.losses(w_new, plan.clients))
        run.params, run.state, run.optimizer, run.round = w_new, step.state, step.optimizer, t + 1
        if config.averaged_iterate:
            run.iterate_sum = w_new.double() + (0 if run.iterate_sum is None else run.iterate_sum)
        record_round(history, step, plan.clients, improved)
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
