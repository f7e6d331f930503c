"""Run experiments with an on-disk cache, one or many at once (sweeps).

``run(config)`` returns the cached :class:`History` when ``results/<config.key()>/`` holds a
finished run, resumes from its checkpoint when it holds an interrupted one, and trains
otherwise. ``run_many(configs)`` trains only the runs that are not cached and returns every
History in the order given, reporting the failures of single runs without losing the others.

A sweep is one computation: the uncached runs that share dataset, model and device form a
*family*; :func:`plan_groups` deals each family out into groups (at most :data:`MAX_GROUP`
runs; enough groups for the backend's slots, cut by the seconds each family cost the last sweeps
into the same results folder), and a group advances in lockstep
(:func:`fairfl.runs.loop.simulate_group`) so that all (run, client) pairs of a round train in one
fused computation (:mod:`fairfl.training.engine`). Each run keeps its own sampling, algorithm state,
checkpoint and cache entry, and its history equals the one-run-at-a-time result bit for bit.

Where the groups run is a backend's (``fairfl.training.backends``: in this process, a pool of worker
processes, a Ray cluster; imported here too, so ``from fairfl.runs.sweeps import ProcessBackend``
works). A backend whose workers share the cache folder (serial, process) trains straight into it;
one that says ``shares_files = False`` (Ray: no shared filesystem is assumed) is sent the runs'
checkpoints with the configs, and its workers send each finished entry back as bytes, which the
sweep writes into the cache atomically.

The modules: here, the driver (:func:`run`, :func:`run_many`, a sweep's failures and its
interruption); :mod:`~fairfl.runs.sweeps.plan` (families, groups, expected costs and measured rates),
:mod:`~fairfl.runs.sweeps.workers` (what a worker runs, shipped groups, :class:`RunError`),
:mod:`~fairfl.runs.sweeps.usage` (:class:`SweepUsage`: how busy a sweep kept its cores). Every name is
importable from ``fairfl.runs.sweeps``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from fairfl.training.backends import (Backend, Failure, ProcessBackend, RayBackend, SerialBackend, WorkerDied,  # noqa: F401
                                      chosen_backend, default_backend)
from ..cache import FILES as CACHE_FILES
from ..cache import Claim, checked_load, is_cached, prepare, results_folder, store
from ..cache import load as load_entry
from ..cache import entry as cache_entry
from ..config import ExperimentConfig
from fairfl.base.errors import ConfigError, FairFLError, RunFailedError
from ..history import History
from ..loop import simulate
from fairfl.base.progress import SweepProgress
from .plan import (MAX_GROUP, RATES_FILE, expected_cost, measured_rates, plan_groups, rate_key,  # noqa: F401
                   remember_rates)
from .usage import GroupSpan, MemoryPeak, SweepUsage, backend_cores, others_share
from .workers import (Measured, RunError, ShippedGroup, measured_run_group, measured_ship_group,  # noqa: F401
                      portable, receive_shipped, scratch_root, ship)


def run_dir(config: ExperimentConfig, root: Path | None = None) -> Path:
    """The run's cache entry (``fairfl.runs.cache``)."""
    return cache_entry(config, root)


def run(config: ExperimentConfig, cache: bool = True, root: Path | None = None,
        progress: bool = True) -> History:
    """One experiment, cached (``fairfl.runs.cache``): a good cached run is returned, an interrupted
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


def check_devices(configs: Sequence[ExperimentConfig], backend: Backend | None = None) -> None:
    """Each device the configs train on exists where they train, checked before any data is read
    or cache entry made: on this machine (``fairfl.training.engine.resolve_device``) unless ``backend``
    trains elsewhere (``trains_here = False``: Ray, whose cluster may have GPUs that this driver
    lacks). Then only the device names are checked here, and CUDA configs need a backend that asks
    the cluster for GPUs (``RayBackend(device="cuda")``, which names a cluster without one): a task
    asking for a GPU that no node has would wait for ever. (A config was validated when it was
    made: it is frozen, so it needs no second check.)"""
    from fairfl.training.engine import resolve_device
    from fairfl.training.engine.device import parse_device
    bad = [c for c in configs if not isinstance(c, ExperimentConfig)]
    if bad:
        raise ConfigError(f"expected ExperimentConfig objects, got {type(bad[0]).__name__}: {bad[0]!r:.100}")
    devices = sorted({c.device for c in configs})
    if getattr(backend, "trains_here", True):
        for device in devices:
            resolve_device(device)
        return
    for device in devices:
        parse_device(device)
    if any(c.device_type == "cuda" for c in configs) and getattr(backend, "device", "cuda") != "cuda":
        raise ConfigError(f"{type(backend).__name__}(device={getattr(backend, 'device', None)!r}) gives its tasks no "
                          "GPU, but some configs train on CUDA: use a backend made with device='cuda'")


class _NamesOnly:
    """A stand-in backend for :func:`check_devices`: check the configs' device names only."""

    trains_here = False
    device = "cuda"


_NAMES_ONLY = _NamesOnly()


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


# the last sweep of this process that trained something (fairfl.studies.notebook prints it after a sweep)
last_usage: SweepUsage | None = None


def run_many(configs: Iterable[ExperimentConfig], backend: Backend | None = None,
             root: Path | None = None, progress: bool = True, keep_diverged: bool = False,
             max_group: int | None = None) -> list[History | None]:
    """Run many configs (validated first, all of them, before any training), each once even if
    listed twice. Returns their histories in the given order. If some fail, the others are kept
    in the cache, and a RunFailedError lists the failures. With ``keep_diverged=True`` a run that
    diverged (:class:`RunError`: its loss became NaN/Inf, an outcome of the method) holds None in
    its place instead; a run that crashed raises all the same, so no table is drawn over a bug.

    The runs to train go to the backend in lockstep groups (:func:`plan_groups`), each group's
    local training fused (``fairfl.training.engine``); ``max_group=1`` sends one run per job instead.

    The process backend spawns its workers: from a Python *script* (not a notebook), call
    ``run_many`` under ``if __name__ == "__main__":``, or every worker re-runs the script."""
    configs = list(configs)
    check_devices(configs, _NAMES_ONLY)          # types and device names, before anything is read
    results_folder(root)
    own = backend is None   # a pool made for this call only is closed after it
    device = "cuda" if any(c.device_type == "cuda" for c in configs) else "cpu"
    if backend is None:      # one run trains in this process, unless $FAIRFL_BACKEND asks for another place
        one = sum(not is_cached(c, root) for c in configs) <= 1
        backend = SerialBackend() if one and chosen_backend() is None else default_backend(device)
    backend = _here_for_main(configs, backend, root)
    try:
        check_devices(configs, backend)          # the devices exist where the runs train (made lazily: nothing started)
        return _sweep(configs, backend, root, progress, keep_diverged, max_group)
    finally:
        if own and hasattr(backend, "close"):
            backend.close()


def _sweep(configs: Sequence[ExperimentConfig], backend: Backend, root: Path | None, progress: bool,
           keep_diverged: bool, max_group: int | None = None) -> list[History | None]:
    """Send the validated, not yet cached configs (each once) to ``backend`` in lockstep groups
    (:func:`plan_groups`), then load every config's history in order. Failed runs are collected
    and raised together (or hold None), the others stay cached. A group whose worker keeps dying
    is split into single runs, so that only the run that kills its worker fails."""
    what = "runs"
    unique = {c.key(): c for c in configs}
    done = {k: checked_load(c, root) for k, c in unique.items()}        # an unusable entry is reported, removed
    todo = [c for k, c in unique.items() if done[k] is None]
    failures: dict[str, tuple[ExperimentConfig, RunError]] = {}
    if todo:
        # per-round progress of every run, wherever it trains: read from the progress files its
        # worker writes into the run's cache entry (fairfl.base.progress)
        watch = SweepProgress([run_dir(c, root) for c in todo], [c.rounds for c in todo], enabled=progress,
                              desc=f"{len(todo)} {what}" + (f" ({len(configs) - len(todo)} cached)" if len(todo) < len(unique) else ""))
        groups = plan_groups(todo, max(1, int(getattr(backend, "workers", 1))), max_group, measured_rates(root))
        import time
        started, cpu, widths, spans, rates = time.perf_counter(), 0.0, {}, [], {}
        clock = time.time()
        from fairfl.training.engine import cores
        local = isinstance(backend, (ProcessBackend, SerialBackend))      # its workers share this machine's cores
        busy, tree = (cores.machine_busy(), cores.tree_cpu()) if local else (None, {})
        # A backend whose workers share no folder with this process (shares_files = False: Ray on a
        # cluster) gets the runs' checkpoints with the configs and sends the finished entries back,
        # which are written here; the others train straight into the cache folder.
        shared = getattr(backend, "shares_files", True)
        memory = MemoryPeak().__enter__() if local else None
        try:
            while groups:
                if shared:
                    job, items = measured_run_group, [([portable(todo[i]) for i in g], str(root) if root else None)
                                                       for g in groups]
                else:
                    job, items = measured_ship_group, [ship([todo[i] for i in g], root) for g in groups]
                again = []
                for gi, result in backend.submit_all(job, items):
                    group = groups[gi]
                    if isinstance(result, Measured):
                        cpu += result.cpu
                        for w, t in result.widths.items():
                            widths[w] = widths.get(w, 0.0) + t
                        spans.append(GroupSpan(len(group), result.pid, result.start - clock, result.end - clock,
                                               result.cpu))
                        # a group its worker came back from: its family's rate (a run that diverged or failed
                        # stopped early, so the rate errs low by its share; notebook 06's MLP groups, where
                        # one run of 24 diverges, cost 13 times what a typical family's rate said)
                        work = sum(expected_cost(todo[i]) for i in group)
                        if isinstance(result.result, list) and work > 0 and result.cpu > 0:
                            rates.setdefault(rate_key(todo[group[0]]), []).append(result.cpu / work)
                        result = result.result
                    if isinstance(result, Failure) and isinstance(result.error, WorkerDied) and len(group) > 1:
                        again += [[i] for i in group]
                        continue
                    if not shared and not isinstance(result, Failure):
                        result = [receive_shipped(todo[i], shipped, root) for i, shipped in zip(group, result)]
                    for n, i in enumerate(group):
                        error = RunError.of(result.error) if isinstance(result, Failure) else result[n]
                        if error is not None:
                            failures[todo[i].key()] = (todo[i], error)
                        watch.finished([i], failed=error is not None)
                groups = again
            remember_rates(rates, root)
            global last_usage
            wall = time.perf_counter() - started
            if memory is not None:
                memory.__exit__()
            last_usage = SweepUsage(backend_cores(backend), wall, cpu, widths, tuple(spans),
                                    others_share(busy, tree, wall), None if memory is None else memory.peak)
        except KeyboardInterrupt:
            raise _interrupted(backend, watch, list(unique.values()), root) from None
        finally:
            if memory is not None:
                memory.__exit__()
            watch.close()
    for c in todo:
        if c.key() not in failures:
            try:
                done[c.key()] = load_entry(c, root)
            except FairFLError as e:
                failures[c.key()] = (c, RunError.of(e))
    out = [None if c.key() in failures else done[c.key()] for c in configs]
    crashed = [(c, e) for c, e in failures.values() if not e.diverged]
    diverged = [(c, e) for c, e in failures.values() if e.diverged]
    if crashed or (diverged and not keep_diverged):
        raise RunFailedError(_failure_report(crashed, diverged, len(todo), what, keep_diverged))
    return out


def _failure_report(crashed: list, diverged: list, trained: int, what: str, keep_diverged: bool) -> str:
    """The message of a sweep's RunFailedError: the crashes first (each a bug or a resource to look
    at: never a result), then the divergences."""
    lines = []
    if crashed:
        lines.append(f"{len(crashed)} of {trained} {what} crashed (an error, not a divergence; the others are "
                     "cached):")
        lines += [f"  {c.label()}: {e.message}" for c, e in crashed]
    if diverged:
        lines.append(f"{len(diverged)} of {trained} {what} diverged (loss or update NaN/Inf)" +
                     (" and hold None" if keep_diverged else "; the others are cached") + ":")
        lines += [f"  {c.label()}: {e.message}" for c, e in diverged]
    return "\n".join(lines)


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
