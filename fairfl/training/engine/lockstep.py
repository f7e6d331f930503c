"""How runs share the engine: a lone run's jobs run at once (:class:`Immediate`); the runs of a
group, each in its own thread, meet in :class:`Lockstep`, where a job waits for every other run
of the group and all waiting jobs are executed together (``fairfl.training.engine.dispatch.execute``).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from . import cores, dispatch
from .jobs import Job, Predict, Trained


class Immediate:
    """A lone run's trainer: each job runs at once."""

    def __call__(self, job: Job | Predict) -> Trained | torch.Tensor:
        (result,) = dispatch.execute([job])
        if isinstance(result, BaseException):
            raise result
        return result


class Turns:
    """A counting semaphore whose size may change while it is held: ``slots`` is a number, or a
    function read at each acquire (``fairfl.training.engine.cores.threads``: a pool worker's share grows
    when it borrows the cores of workers left without work). A smaller size never takes a turn
    back; it only makes the next acquire wait."""

    def __init__(self, slots: int | Callable[[], int]) -> None:
        self._size = slots if callable(slots) else (lambda n=max(1, int(slots)): n)
        self._held = 0
        self._cond = threading.Condition()

    def acquire(self) -> None:
        with self._cond:
            while self._held >= max(1, self._size()):
                self._cond.wait(0.05)           # the size may grow without anyone releasing
            self._held += 1

    def release(self) -> None:
        with self._cond:
            self._held -= 1
            self._cond.notify()

    def __enter__(self) -> "Turns":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class Lockstep:
    """The trainer of a group of runs, each in its own thread: a job waits until every run of the
    group that has not finished is waiting too, then all waiting jobs run together
    (``dispatch.execute``). The run whose call completes the group executes them; the others sleep.
    ``enter()`` once per run before any run starts, ``bind(i)`` in run i's thread, ``leave()`` when
    a run ends (however it ends).

    The waiting jobs are executed in the order of their runs' indices, not in the order the threads
    arrived: which rows share a fused kernel, and where, then never depends on thread timing (it
    did: the same group gave results one ulp apart from one execution to the next).

    A small dense model's predictions (its losses and evaluations, :class:`Predict`) meet the same
    way, and go first: when every run waits, some with predictions and some with training, only
    the predictions are executed; the training waits for the predicting runs' training to join it.

    Between fused steps each run does its own work (aggregation, other evaluations) in its thread. At most
    ``slots`` runs compute at once (:meth:`turn`): each run computes with one intra-op thread, so
    a group of 12 runs in a one-core worker would otherwise run 12 compute threads on that core
    (measured: the CNN sweep ran 10 % slower fused than one run at a time, with evaluation threads
    contending). A run gives its turn up while it waits for a fused step; the fused step itself
    takes a turn. Which thread computes when never changes a result, only how busy the cores are."""

    def __init__(self, slots: int | Callable[[], int] = 1) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._rank: dict[int, int] = {}
        self._waiting: list[tuple[int, Job | Predict, dict]] = []
        self._turns = Turns(slots)
        self._holding: set[int] = set()
        self.aborted: BaseException | None = None
        self.flushes = 0            # how many fused executions (for the benchmark's report)

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Compute inside the block only while holding one of the group's ``slots``."""
        me = threading.get_ident()
        self._turns.acquire()
        self._holding.add(me)
        try:
            yield
        finally:
            if me in self._holding:
                self._holding.discard(me)
                self._turns.release()

    def _give_up_turn(self) -> bool:
        me = threading.get_ident()
        if me in self._holding:
            self._holding.discard(me)
            self._turns.release()
            return True
        return False

    def _take_turn(self) -> None:
        self._turns.acquire()
        self._holding.add(threading.get_ident())

    def enter(self) -> None:
        with self._cond:
            self._active += 1

    def bind(self, rank: int) -> None:
        """Declare the calling thread to be run ``rank`` of the group. Its own computations between
        fused steps (a model's predictions that do not stack) may use its part of the process's
        cores, which grows as the group's other runs finish (``fairfl.training.engine.cores``); a fused step
        executes while every run waits, and uses them all."""
        with self._cond:
            self._rank[threading.get_ident()] = rank
        cores.bind_width(lambda: max(1, cores.threads() // max(1, self._active)))

    def leave(self) -> None:
        with self._cond:
            self._active -= 1
            batch = self._take()
        self._run(batch)

    def abort(self, error: BaseException) -> None:
        """Make every waiting and future job of the group raise ``error`` (an interrupt)."""
        with self._cond:
            self.aborted = error
            for _, _, slot in self._waiting:
                slot["result"] = error
            self._waiting = []
            self._cond.notify_all()

    def _take(self) -> list[tuple[int, Job | Predict, dict]]:
        """The jobs to execute now: none until every active run waits; then the predictions alone
        if some runs wait with predictions and others with training (the predicting runs train
        next, and their training should meet the others'), else everything."""
        if not self._waiting or len(self._waiting) < self._active:
            return []
        ordered = sorted(self._waiting, key=lambda w: w[0])
        predictions = [w for w in ordered if isinstance(w[1], Predict)]
        if predictions and len(predictions) < len(ordered):
            self._waiting = [w for w in ordered if not isinstance(w[1], Predict)]
            return predictions
        self._waiting = []
        return ordered

    def _run(self, batch: list[tuple[int, Job | Predict, dict]]) -> None:
        if not batch:
            return
        # the batch executes while every run of it waits: on every thread of the process (``bind``),
        # not on the part of the run whose thread happens to execute it
        own = cores.bind_width(None)
        try:
            with self._turns:
                results = dispatch.execute([job for _, job, _ in batch])
                cores.trim_free_memory()        # the step's buffers are freed; glibc would keep them (cores)
        except BaseException as e:  # noqa: BLE001 - every run of the batch must wake up, with the error
            results = [e] * len(batch)
        finally:
            cores.bind_width(own)
        with self._cond:
            self.flushes += 1
            for (_, _, slot), result in zip(batch, results):
                slot["result"] = result
            self._cond.notify_all()

    def __call__(self, job: Job | Predict) -> Trained | torch.Tensor:
        slot: dict = {}
        with self._cond:
            if self.aborted is not None:
                raise self.aborted
            self._waiting.append((self._rank.get(threading.get_ident(), 0), job, slot))
            batch = self._take()
        held = self._give_up_turn()
        try:
            self._run(batch)
            with self._cond:
                while "result" not in slot:
                    self._cond.wait()
        finally:
            if held:
                self._take_turn()
        result = slot["result"]
        if isinstance(result, BaseException):
            raise result
        return result


# What a run's client runtime hands its jobs to: an Immediate, or a Lockstep shared with other runs.
Trainer = Callable[[Job | Predict], Trained | torch.Tensor]
