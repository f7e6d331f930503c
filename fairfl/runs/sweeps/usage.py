"""How busy a sweep kept the cores it had (:class:`SweepUsage`, one :class:`GroupSpan` per group):
its idle share, the idle tail after the first worker ran out of groups, and the share of the
machine that other processes used meanwhile (:func:`others_share`); the cores a backend may keep
busy (:func:`backend_cores`)."""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from fairfl.training.backends import Backend, ProcessBackend, SerialBackend


@dataclass(frozen=True)
class GroupSpan:
    """One group of a sweep as its worker ran it: how many runs, the worker's process id, when it
    started and ended (seconds from the sweep's start) and the CPU seconds it used."""

    runs: int
    pid: int
    start: float
    end: float
    cpu: float


@dataclass(frozen=True)
class SweepUsage:
    """How busy a sweep kept the cores it had: ``cores`` (the backend's workers × their threads, or
    this process's for one in-process), the sweep's wall seconds, the CPU seconds its groups used,
    the seconds of parallel computation at each width, summed over the groups, and each group's
    span (:class:`GroupSpan`, in the order they ended). ``idle`` is the fraction of the core-time
    (cores × wall) no group used: what an idle tail, or work that cannot use several threads,
    costs; ``tail`` is the part of it after the first worker ran out of groups for good. ``others`` is
    the share of the machine's core-time (all its cores × wall) that processes other than the sweep's
    (this one and those it started) used meanwhile, which an idle share counts as idle (None where it
    cannot be known, e.g. workers on other machines)."""

    cores: int
    wall: float
    cpu: float
    widths: dict
    groups: tuple = ()
    others: float | None = None
    peak_rss: float | None = None           # bytes: the largest resident memory of the process tree seen

    @property
    def idle(self) -> float:
        return max(0.0, 1.0 - self.cpu / (self.cores * self.wall)) if self.wall > 0 else 0.0

    @property
    def tail(self) -> float:
        """The part of ``idle`` that came after the first of the sweep's workers ended its last group:
        the core-time from then to the end that the groups still training did not use (their CPU
        seconds taken as spread evenly over each group's span), over cores × wall. 0 with a single
        worker or without spans."""
        last: dict[int, float] = {}
        for g in self.groups:
            last[g.pid] = max(last.get(g.pid, 0.0), g.end)
        if len(last) < 2 or self.wall <= 0:
            return 0.0
        t0 = min(last.values())
        used = sum(g.cpu * max(0.0, g.end - max(g.start, t0)) / (g.end - g.start)
                   for g in self.groups if g.end > g.start)
        return max(0.0, self.cores * (self.wall - t0) - used) / (self.cores * self.wall)

    def __str__(self) -> str:
        return (f"{self.wall:.0f} s on {self.cores} core{'s' * (self.cores != 1)}, "
                f"{self.idle:.0%} of the core-time idle" +
                (f" ({self.tail:.0%} at the end)" if len({g.pid for g in self.groups}) > 1 else "") +
                # where others used the cores, part of the idle share is theirs, not the scheduler's
                (f"; other processes used {self.others:.0%} of the machine's core-time meanwhile"
                 if self.others is not None and self.others >= 0.005 else "") +
                (f"; peak memory {self.peak_rss / 2 ** 30:.1f} GiB (this process and its workers, resident)"
                 if self.peak_rss else ""))


def others_share(busy: float | None, tree: dict[int, float], wall: float) -> float | None:
    """The share of the machine's core-time over ``wall`` seconds that processes outside this one's
    tree used, from the machine's busy CPU seconds and the tree's (``engine.cores``) at the start."""
    from fairfl.training.engine import cores
    after = cores.machine_busy()
    if busy is None or after is None or wall <= 0:
        return None
    end = cores.tree_cpu()
    if cores.CHILDREN_TIMES:
        # totals, not process by process: a process of the tree that ended (a worker killed, a pool's
        # workers stopped) took its CPU into its parent's figure when it was waited for (engine.cores.tree_cpu)
        ours = sum(end.values()) - sum(tree.values())
    else:       # no children's times: what the processes still there used (one that ended is missed)
        ours = sum(t - tree.get(pid, 0.0) for pid, t in end.items())
    return min(1.0, max(0.0, (after - busy - ours) / ((os.cpu_count() or 1) * wall)))


def backend_cores(backend: Backend) -> int:
    """The cores a sweep on ``backend`` may keep busy: a pool's workers × threads, Ray's slots, this
    process's threads for one that trains in it."""
    from fairfl.training.engine import cores
    if isinstance(backend, ProcessBackend):
        return backend.workers * backend.threads
    if isinstance(backend, SerialBackend):
        return cores.threads()
    return max(1, int(getattr(backend, "workers", 1)))


def tree_rss() -> int | None:
    """The resident memory (bytes) of this process and its descendants, summed (shared pages, such as
    the libraries every worker maps, counted once per process: an upper bound); None without psutil."""
    try:
        import psutil
        me = psutil.Process()
        family = [me, *me.children(recursive=True)]
    except Exception:                                   # noqa: BLE001 - a report, never an error
        return None
    total = 0
    for p in family:
        try:
            total += p.memory_info().rss
        except Exception:                               # noqa: BLE001 - it ended meanwhile
            pass
    return total


class MemoryPeak:
    """The peak of :func:`tree_rss` over a stretch of time, sampled every ``every`` seconds by a
    daemon thread (a sweep's: how much memory its workers held at most). ``with MemoryPeak() as m:
    ...`` then ``m.peak`` (bytes, None where it cannot be read)."""

    def __init__(self, every: float = 0.5):
        self.every, self.peak = every, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="fairfl-memory")

    def _watch(self) -> None:
        while True:
            rss = tree_rss()
            if rss is not None:
                self.peak = rss if self.peak is None else max(self.peak, rss)
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> "MemoryPeak":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
