"""Run experiments with an on-disk cache, one or many at once (sweeps).

``run(config)`` returns the cached :class:`History` when ``results/<config.key()>/`` holds a
finished run, resumes from its checkpoint when it holds an interrupted one, and trains
otherwise. ``run_many(configs)`` trains only the runs that are not cached and returns every
History in the order given, reporting the failures of single runs without losing the others.

A sweep is one computation: the uncached runs that share dataset, model and device form a
*family*; :func:`plan_groups` deals each family out into groups (at most :data:`MAX_GROUP`
runs, as many groups as the backend has slots), and a group advances in lockstep
(:func:`fairfl.loop.simulate_group`) so that all (run, client) pairs of a round train in one
fused computation (:mod:`fairfl.engine`). Each run keeps its own sampling, algorithm state,
checkpoint and cache entry, and its history equals the one-run-at-a-time result bit for bit.

Where the groups run is a backend's (``fairfl.backends``: in this process, a pool of worker
processes, a Ray cluster; imported here too, so ``from fairfl.sweeps import ProcessBackend``
works). A backend whose workers share the cache folder (serial, process) trains straight into it;
one that says ``shares_files = False`` (Ray: no shared filesystem is assumed) is sent the runs'
checkpoints with the configs, and its workers send each finished entry back as bytes, which the
sweep writes into the cache atomically.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from .atomic import atomic_write
from .backends import (Backend, Failure, ProcessBackend, RayBackend, SerialBackend, WorkerDied,  # noqa: F401
                       chosen_backend, default_backend)
from .cache import FILES as CACHE_FILES
from .cache import Claim, checked_load, is_cached, pack, prepare, receive, results_folder, store
from .cache import load as load_entry
from .cache import entry as cache_entry
from .cache import key as entry_key
from .config import ExperimentConfig
from .engine import schedule_key
from .errors import ConfigError, FairFLError, RunFailedError
from .history import CHECKPOINT, History
from .loop import simulate, simulate_group
from .progress import SweepProgress


def run_dir(config: ExperimentConfig, root: Path | None = None) -> Path:
    """The run's cache entry (``fairfl.cache``)."""
    return cache_entry(config, root)


def run(config: ExperimentConfig, cache: bool = True, root: Path | None = None,
        progress: bool = True) -> History:
    """One experiment, cached (``fairfl.cache``): a good cached run is returned, an interrupted
    one resumes from its checkpoint, an unusable entry is reported and trained again."""
    check_devices([config])              # a device this machine lacks is named before any data is read
    if not cache:
        return simulate(config, progress=progress)
    results_folder(root)                 # so is a results path that cannot be used
    cached = checked_load(config, root)
    if cached is not None:
        return cached
    d = prepare(config, root)
    with Claim(d) as claim:
        claim.wait(config.label())       # another process training this run: its result is read
        cached = checked_load(config, root)
        if cached is not None:
            return cached
        watch = SweepProgress([d], [config.rounds], enabled=progress, desc=config.label())
        try:
            history = simulate(config, checkpoint_dir=d, progress=False)
            store(history, d)
            watch.finished([0])
        finally:
            watch.close()
    return history


def check_devices(configs: Sequence[ExperimentConfig]) -> None:
    """Each device the configs train on exists here (``fairfl.engine.resolve_device``), checked
    before any data is read or cache entry made. (A config was validated when it was made: it is
    frozen, so it needs no second check.)"""
    from .engine import resolve_device
    bad = [c for c in configs if not isinstance(c, ExperimentConfig)]
    if bad:
        raise ConfigError(f"expected ExperimentConfig objects, got {type(bad[0]).__name__}: {bad[0]!r:.100}")
    for device in sorted({c.device for c in configs}):
        resolve_device(device)


def _portable(config: ExperimentConfig) -> tuple[dict, str]:
    """A config as plain data for a worker, with the module that defines its algorithm (a worker
    imports it, so that an algorithm registered outside fairfl is known there). An algorithm of
    ``__main__`` only ever reaches a worker in this process (:func:`_here_for_main`), where
    importing ``__main__`` is a no-op."""
    return config.to_dict(), type(config.algorithm).__module__


def _here_for_main(configs: Sequence[ExperimentConfig], backend: Backend, root: Path | None) -> Backend:
    """An algorithm defined in ``__main__`` — a notebook cell, or a script run as ``python my.py``
    — cannot be imported by a worker process (nor a Ray task): a sweep with one trains in this
    process instead, with its progress and cache as usual, and says so in one line. A notebook cell
    is where a new algorithm is first written, so this is its route, not an error."""
    if isinstance(backend, SerialBackend):
        return backend
    names = sorted({c.algorithm.name for c in configs
                    if type(c.algorithm).__module__ == "__main__" and not is_cached(c, root)})
    if not names:
        return backend
    print(f"{', '.join(names)}: defined in this notebook or script (__main__), which worker processes cannot "
          "import, so this sweep trains in this process (put it in a module to use the workers)", flush=True)
    return SerialBackend()


def _worker_run_group(args: tuple[list[tuple[dict, str]], str | None]) -> list[str | None]:
    """Runs in a worker: train (or resume) a group of configs side by side into the cache
    (``fairfl.loop.simulate_group``), each stored as soon as it ends. Returns, per config, None or
    the error that stopped it."""
    portable, root = args
    import importlib
    for _, module in portable:
        importlib.import_module(module)
    configs = [ExperimentConfig.from_dict(d) for d, _ in portable]
    folder = Path(root) if root else None
    out: list[str | None] = [None] * len(configs)
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
                    out[i] = f"{type(result).__name__}: {result}"
    finally:
        for claim in claims.values():
            claim.release()
    return out


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


def _worker_ship_group(group: ShippedGroup) -> list[tuple[str | None, str, dict[str, bytes] | None]]:
    """Runs in a worker that shares no folder with the driver: train (or resume) the group into
    this machine's :func:`scratch_root` as :func:`_worker_run_group` does into the cache, then
    return, per config, (the error that stopped it or None, its entry's key here, the files of its
    finished entry as bytes); the driver writes them into its cache (``fairfl.cache.receive``) and
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


def _ship(configs: Sequence[ExperimentConfig], root: Path | None) -> ShippedGroup:
    blobs = []
    for c in configs:
        path = cache_entry(c, root) / CHECKPOINT
        blobs.append(path.read_bytes() if path.is_file() else None)
    device = "cuda" if any(c.device_type == "cuda" for c in configs) else "cpu"
    return ShippedGroup([_portable(c) for c in configs], blobs, device)


def _receive(config: ExperimentConfig, shipped: tuple[str | None, str, dict[str, bytes] | None],
             root: Path | None) -> str | None:
    """Write a run a worker sent back into the cache; its error, or None."""
    error, key, files = shipped
    if error is not None:
        return error
    if key != entry_key(config, root):
        return ("the worker's data or fairfl differ from this machine's (its cache key is another): give every "
                "node the same data files and fairfl version")
    try:
        receive(config, files, root)
    except FairFLError as e:
        return f"{type(e).__name__}: {e}"
    return None


# Runs of one family — same data, model and shape of local training — share their fused steps best.
# A group is at most this many runs (memory: each holds its own model, state and history). A GPU
# needs many instances per step to be busy (a stacked step of the Table 3 CNN was measured to fill
# an H100 only near 600 instances); a 2-core CPU gains little beyond a few hundred.
MAX_GROUP = {"cpu": 32, "cuda": 512}


def _family(config: ExperimentConfig) -> str:
    """Runs of one family share lockstep groups: what the engine's rule of fusion
    (``fairfl.engine.fusion_key``) asks of their jobs, read off a config — the architecture (by its
    data and model) and the steps (``fairfl.engine.schedule_key``). Runs that differ only in the kind
    of update (momentum, weight decay, proximal term) still share a group: each of its executions
    trains their stacks side by side."""
    return json.dumps([config.dataset, dict(config.dataset_options), config.model, dict(config.model_options),
                       *schedule_key(config.local), config.batched, config.device_type], sort_keys=True, default=str)


def plan_groups(configs: Sequence[ExperimentConfig], slots: int, max_group: int | None = None) -> list[list[int]]:
    """Indices of ``configs`` in lockstep groups: runs of one family together, each family cut into
    enough groups to keep ``slots`` workers busy (in proportion to its share of the runs) and none
    larger than ``max_group`` (default: :data:`MAX_GROUP` of the family's device); members dealt out
    in turn so that the groups of a family cost alike. A family that is not ``batched`` (the reference
    loop, which fuses nothing) goes out as single runs. Largest groups first."""
    families: dict[str, list[int]] = {}
    for i, c in enumerate(configs):
        families.setdefault(_family(c), []).append(i)
    groups = []
    for members in families.values():
        if not configs[members[0]].batched:
            # nothing fuses in the reference loop, so a group would only train its runs one after another:
            # single runs let the workers balance to the last run (a worker loads the data once, fairfl.loop)
            groups += [[i] for i in members]
            continue
        cap = max_group or MAX_GROUP[configs[members[0]].device_type]
        k = max(-(-len(members) // cap), round(slots * len(members) / max(1, len(configs))), 1)
        k = min(k, len(members))
        groups += [members[j::k] for j in range(k)]
    return sorted(groups, key=len, reverse=True)


def run_many(configs: Iterable[ExperimentConfig], backend: Backend | None = None,
             root: Path | None = None, progress: bool = True, raise_on_failure: bool = True,
             max_group: int | None = None) -> list[History | None]:
    """Run many configs (validated first, all of them, before any training), each once even if
    listed twice. Returns their histories in the given order. If some fail, the others are kept
    in the cache, and a RunFailedError lists the failures (or, with
    ``raise_on_failure=False``, their places hold None).

    The runs to train go to the backend in lockstep groups (:func:`plan_groups`), each group's
    local training fused (``fairfl.engine``); ``max_group=1`` sends one run per job instead.

    The process backend spawns its workers: from a Python *script* (not a notebook), call
    ``run_many`` under ``if __name__ == "__main__":``, or every worker re-runs the script."""
    configs = list(configs)
    check_devices(configs)
    results_folder(root)
    own = backend is None   # a pool made for this call only is closed after it
    device = "cuda" if any(c.device_type == "cuda" for c in configs) else "cpu"
    if backend is None:      # one run trains in this process, unless $FAIRFL_BACKEND asks for another place
        one = sum(not is_cached(c, root) for c in configs) <= 1
        backend = SerialBackend() if one and chosen_backend() is None else default_backend(device)
    backend = _here_for_main(configs, backend, root)
    try:
        return _sweep(configs, backend, root, progress, raise_on_failure, max_group)
    finally:
        if own and hasattr(backend, "close"):
            backend.close()


def _sweep(configs: Sequence[ExperimentConfig], backend: Backend, root: Path | None, progress: bool,
           raise_on_failure: bool, max_group: int | None = None) -> list[History | None]:
    """Send the validated, not yet cached configs (each once) to ``backend`` in lockstep groups
    (:func:`plan_groups`), then load every config's history in order. Failed runs are collected
    and raised together (or hold None), the others stay cached. A group whose worker keeps dying
    is split into single runs, so that only the run that kills its worker fails."""
    what = "runs"
    unique = {c.key(): c for c in configs}
    done = {k: checked_load(c, root) for k, c in unique.items()}        # an unusable entry is reported, removed
    todo = [c for k, c in unique.items() if done[k] is None]
    failures: dict[str, str] = {}
    if todo:
        # per-round progress of every run, wherever it trains: read from the progress files its
        # worker writes into the run's cache entry (fairfl.progress)
        watch = SweepProgress([run_dir(c, root) for c in todo], [c.rounds for c in todo], enabled=progress,
                              desc=f"{len(todo)} {what}" + (f" ({len(configs) - len(todo)} cached)" if len(todo) < len(unique) else ""))
        groups = plan_groups(todo, max(1, int(getattr(backend, "workers", 1))), max_group)
        # A backend whose workers share no folder with this process (shares_files = False: Ray on a
        # cluster) gets the runs' checkpoints with the configs and sends the finished entries back,
        # which are written here; the others train straight into the cache folder.
        shared = getattr(backend, "shares_files", True)
        try:
            while groups:
                if shared:
                    job, items = _worker_run_group, [([_portable(todo[i]) for i in g], str(root) if root else None)
                                                     for g in groups]
                else:
                    job, items = _worker_ship_group, [_ship([todo[i] for i in g], root) for g in groups]
                again = []
                for gi, result in backend.submit_all(job, items):
                    group = groups[gi]
                    if isinstance(result, Failure) and isinstance(result.error, WorkerDied) and len(group) > 1:
                        again += [[i] for i in group]
                        continue
                    if not shared and not isinstance(result, Failure):
                        result = [_receive(todo[i], shipped, root) for i, shipped in zip(group, result)]
                    for n, i in enumerate(group):
                        error = (f"{type(result.error).__name__}: {result.error}" if isinstance(result, Failure)
                                 else result[n])
                        if error is not None:
                            failures[todo[i].key()] = f"{todo[i].label()}: {error}"
                        watch.finished([i], failed=error is not None)
                groups = again
        except KeyboardInterrupt:
            raise _interrupted(backend, watch, list(unique.values()), root) from None
        finally:
            watch.close()
    for c in todo:
        if c.key() not in failures:
            try:
                done[c.key()] = load_entry(c, root)
            except FairFLError as e:
                failures[c.key()] = f"{c.label()}: {type(e).__name__}: {e}"
    out = [None if c.key() in failures else done[c.key()] for c in configs]
    if failures and raise_on_failure:
        raise RunFailedError(f"{len(failures)} of {len(todo)} {what} failed (the others are cached):\n  " +
                             "\n  ".join(failures.values()))
    return out


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by Ctrl-C or the kernel's interrupt. Its message is the whole story, so a
    notebook shows that one line instead of a traceback (IPython asks ``_render_traceback_``)."""

    def _render_traceback_(self) -> list[str]:
        return [str(self)]


def _interrupted(backend: Backend, watch: SweepProgress, configs: Sequence[ExperimentConfig],
                 root: Path | None) -> SweepInterrupted:
    """Stop the backend's workers (each run stops at its last checkpoint) and say what is kept:
    counted once they are stopped, so that a run that finished (its entry written) before its
    worker was told is cached, not running, whether or not its result had reached the sweep."""
    watch.close()
    stop = getattr(backend, "terminate", None)
    if stop is not None:
        stop()
    cached = sum(is_cached(c, root) for c in configs)
    running = sum(not all((Path(folder) / name).is_file() for name in CACHE_FILES) for folder in watch.started_folders())
    message = (f"interrupted: {cached} of {len(configs)} runs cached, {running} running stopped at their "
               "checkpoints; re-run to resume")
    return SweepInterrupted(message)
