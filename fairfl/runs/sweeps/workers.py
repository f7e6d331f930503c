"""What runs in a sweep's workers: a group of configs trained side by side into the cache
(:func:`_worker_run_group`), or, for a worker that shares no folder with the driver (Ray), into
this machine's scratch folder and sent back as bytes (:class:`ShippedGroup`, :func:`ship`,
:func:`receive_shipped`); why a run has no result (:class:`RunError`: diverged or crashed), and
what a group cost its worker (:class:`Measured`)."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from fairfl.base.atomic import atomic_write
from ..cache import Claim, checked_load, pack, prepare, receive, results_folder, store
from ..cache import entry as cache_entry
from ..cache import key as entry_key
from ..config import ExperimentConfig
from fairfl.base.errors import FairFLError, TrainingDivergedError
from ..history import CHECKPOINT
from ..loop import simulate_group


def portable(config: ExperimentConfig) -> tuple[dict, str]:
    """A config as plain data for a worker, with the module that defines its algorithm (a worker
    imports it, so that an algorithm registered outside fairfl is known there). An algorithm of
    ``__main__`` only ever reaches a worker in this process (:func:`_here_for_main`), where
    importing ``__main__`` is a no-op."""
    return config.to_dict(), type(config.algorithm).__module__


@dataclass(frozen=True)
class RunError:
    """Why a run of a sweep has no result: it **diverged** (its loss or update became NaN/Inf,
    :class:`~fairfl.base.errors.TrainingDivergedError`: an outcome of the method at its settings, which a
    table may report) or it **crashed** (any other error: a bug, a resource, a worker that died).
    The two are never merged: a crash read as divergence turns a bug into a finding (a thread-unsafe
    Hessian once made notebook 06 report FedNL as diverged on Adult)."""

    message: str
    diverged: bool = False

    @classmethod
    def of(cls, error: BaseException) -> "RunError":
        return cls(f"{type(error).__name__}: {error}", isinstance(error, TrainingDivergedError))


def _worker_run_group(args: tuple[list[tuple[dict, str]], str | None]) -> list[RunError | None]:
    """Runs in a worker: train (or resume) a group of configs side by side into the cache
    (``fairfl.runs.loop.simulate_group``), each stored as soon as it ends. Returns, per config, None or
    why it stopped."""
    portable, root = args
    import importlib
    for _, module in portable:
        importlib.import_module(module)
    configs = [ExperimentConfig.from_dict(d) for d, _ in portable]
    folder = Path(root) if root else None
    out: list[RunError | None] = [None] * len(configs)
    todo = [i for i, c in enumerate(configs) if checked_load(c, folder) is None]   # another worker may have done it
    claims = {i: Claim(prepare(configs[i], folder)) for i in todo}
    # the runs no other process is training now train together; each of the others is waited for,
    # then read, or trained here if that process stopped before it ended
    busy = [i for i in todo if not claims[i].take(wait=False)]
    try:
        for batch in [[i for i in todo if i not in busy]] + [[i] for i in busy]:
            for i in batch:
                if i in busy:
                    claims[i].wait(configs[i].label())
            batch = [i for i in batch if checked_load(configs[i], folder) is None]
            dirs = [claims[i].folder for i in batch]
            results = simulate_group([configs[i] for i in batch], dirs, progress=False,
                                     on_done=lambda j, history, dirs=dirs: store(history, dirs[j])) if batch else []
            for i, result in zip(batch, results):
                if isinstance(result, BaseException):
                    out[i] = RunError.of(result)
    finally:
        for claim in claims.values():
            claim.release()
    return out


@dataclass(frozen=True)
class Measured:
    """A group's result with what its worker spent on it: the CPU seconds of its process (all its
    threads), the wall seconds, the seconds of its parallel computations at each width
    (``fairfl.training.engine.cores.width_seconds``), and when it started and ended (``time.time()``) in
    which process. A worker trains one group at a time, so its process's CPU time over the group
    is the group's."""

    result: object
    cpu: float
    wall: float
    widths: dict
    start: float = 0.0
    end: float = 0.0
    pid: int = 0


def _measure(fn, item) -> Measured:
    import time
    from fairfl.training.engine.cores import width_seconds
    cpu, wall, widths, start = time.process_time(), time.perf_counter(), width_seconds(), time.time()
    result = fn(item)
    after = width_seconds()
    return Measured(result, time.process_time() - cpu, time.perf_counter() - wall,
                    {w: after[w] - widths.get(w, 0.0) for w in after if after[w] > widths.get(w, 0.0)},
                    start, time.time(), os.getpid())


def measured_run_group(args) -> Measured:
    return _measure(_worker_run_group, args)


def measured_ship_group(group: "ShippedGroup") -> Measured:
    return _measure(_worker_ship_group, group)


@dataclass(frozen=True)
class ShippedGroup:
    """A group for a worker that shares no folder with the driver (``RayBackend``): the configs,
    the checkpoints the driver holds for them (bytes, or None), and the device type they train on
    (a backend reserves a GPU for a CUDA group)."""

    runs: list[tuple[dict, str]]
    checkpoints: list[bytes | None]
    device_type: str = "cpu"


def scratch_root() -> Path:
    """The worker-side results folder of :func:`_worker_ship_group`: one per machine and user, not
    per task, so that a task that Ray sends again to the same machine after its worker died
    resumes from the checkpoints that worker left."""
    import tempfile
    return Path(tempfile.gettempdir()) / f"fairfl-worker-{os.getuid() if hasattr(os, 'getuid') else 'user'}"


def _worker_ship_group(group: ShippedGroup) -> list[tuple[RunError | None, str, dict[str, bytes] | None]]:
    """Runs in a worker that shares no folder with the driver: train (or resume) the group into
    this machine's :func:`scratch_root` as :func:`_worker_run_group` does into the cache, then
    return, per config, (the error that stopped it or None, its entry's key here, the files of its
    finished entry as bytes); the driver writes them into its cache (``fairfl.runs.cache.receive``) and
    this machine keeps nothing. The key lets the driver refuse a run trained on other data than
    its own (the key holds the data's fingerprint and the cache version)."""
    import importlib
    for _, module in group.runs:
        importlib.import_module(module)
    configs = [ExperimentConfig.from_dict(d) for d, _ in group.runs]
    root = results_folder(scratch_root())
    for c, blob in zip(configs, group.checkpoints):
        d = prepare(c, root)
        # one left here by an earlier attempt of this task is newer than the driver's (which only
        # a sweep on a backend that shares the cache folder has written)
        if blob is not None and not (d / CHECKPOINT).is_file():
            atomic_write(d / CHECKPOINT, lambda p, b=blob: Path(p).write_bytes(b))
    errors = _worker_run_group((group.runs, str(root)))
    out = []
    for c, error in zip(configs, errors):
        d = cache_entry(c, root)
        files = pack(d) if error is None else None
        if error is None:
            shutil.rmtree(d, ignore_errors=True)
        out.append((error, entry_key(c, root), files))
    return out


def ship(configs: Sequence[ExperimentConfig], root: Path | None) -> ShippedGroup:
    blobs = []
    for c in configs:
        path = cache_entry(c, root) / CHECKPOINT
        blobs.append(path.read_bytes() if path.is_file() else None)
    device = "cuda" if any(c.device_type == "cuda" for c in configs) else "cpu"
    return ShippedGroup([portable(c) for c in configs], blobs, device)


def receive_shipped(config: ExperimentConfig, shipped: tuple[RunError | None, str, dict[str, bytes] | None],
             root: Path | None) -> RunError | None:
    """Write a run a worker sent back into the cache; why it has no result, or None."""
    error, key, files = shipped
    if error is not None:
        return error
    if key != entry_key(config, root):
        return RunError("the worker's data or fairfl differ from this machine's (its cache key is another): give "
                        "every node the same data files and fairfl version")
    try:
        receive(config, files, root)
    except FairFLError as e:
        return RunError.of(e)
    return None
