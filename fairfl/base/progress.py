"""Progress of the runs of a sweep, wherever they train.

A run that trains into its cache entry (``fairfl.runs.cache``) writes ``progress.json`` there every
round — ``{"done": rounds done, "rounds": rounds in all}`` — replaced atomically, so a reader
never sees half a file. The process that sent the sweep reads these files and shows one bar:
rounds done out of the sweep's rounds, and how many runs have finished. Nothing else is shared,
so this works the same for runs in this process, in a pool of worker processes, or on any
backend whose workers write to the same results folder.

How the bar looks: a live notebook gets tqdm's widget; anything else — a terminal, a notebook
executed by papermill (``python -m fairfl reproduce`` sets ``FAIRFL_PROGRESS=text``), where a
widget would be stored with no state and read 0 % forever — gets tqdm's text bar on stdout,
whose last line is stored as the final state. ``FAIRFL_PROGRESS=off`` or ``TQDM_DISABLE=1``
switches it off.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Iterable, Sequence

PROGRESS = "progress.json"
_EVERY = 0.25        # seconds between two writes of one run's file (and the last round always)


class RoundReporter:
    """Writes a run's ``progress.json`` (at most every :data:`_EVERY` seconds, and always at the
    end of the run and with ``final=True``: where a call stops early, ``stop_after``, or a
    checkpoint is written); does nothing without a folder."""

    def __init__(self, folder: Path | None, rounds: int):
        self.path = Path(folder) / PROGRESS if folder else None
        self.rounds = rounds
        self._last = 0.0

    def __call__(self, done: int, final: bool = False) -> None:
        now = time.monotonic()
        if self.path is None or (done < self.rounds and not final and now - self._last < _EVERY):
            return
        self._last = now
        # a temporary name that fairfl.base.atomic.remove_stale_temporaries recognises (.<name>.<pid>.…tmp)
        tmp = self.path.parent / f".{PROGRESS}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            tmp.write_text(json.dumps({"done": int(done), "rounds": int(self.rounds)}))
            os.replace(tmp, self.path)
        except OSError:      # progress is a courtesy: a full disk must not stop the run (its checkpoint will say so)
            tmp.unlink(missing_ok=True)


def read(folder: Path, since: float = 0.0) -> int | None:
    """Rounds done by the run training in ``folder``, if its progress file was written at or
    after ``since`` (a wall-clock time: a file from an earlier, interrupted sweep is not this
    sweep's progress), else None."""
    path = Path(folder) / PROGRESS
    try:
        if path.stat().st_mtime < since:
            return None
        return int(json.loads(path.read_text())["done"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def mode() -> str:
    """"widget", "text" or "off" (see the module's docstring)."""
    wanted = os.environ.get("FAIRFL_PROGRESS", "auto").lower()
    if wanted in ("off", "0", "false", "no") or os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true", "yes"):
        return "off"
    if wanted == "text":
        return "text"
    try:
        from IPython import get_ipython
        shell = get_ipython()
    except ImportError:      # pragma: no cover - IPython is a dependency
        shell = None
    return "widget" if shell is not None and type(shell).__name__ == "ZMQInteractiveShell" else "text"


def bar(total: int, desc: str, initial: int = 0, enabled: bool = True, postfix: str | None = None):
    """A tqdm bar in the way :func:`mode` says, or None when off."""
    how = mode() if enabled else "off"
    if how == "off":
        return None
    if how == "widget":
        try:
            from tqdm.notebook import tqdm as notebook_tqdm
            return notebook_tqdm(total=total, initial=initial, desc=desc, unit="round", disable=False,
                                 postfix=postfix)
        except ImportError:  # no ipywidgets: the text bar below
            pass
    import sys
    from tqdm.std import tqdm as text_tqdm
    # stdout, not stderr: an executed notebook shows stdout as plain output; mininterval keeps the
    # stored text of a long run short (each refresh is a line of the stored stream)
    # disable=False: mode() has read TQDM_DISABLE now; tqdm itself reads it once, when it is imported
    return text_tqdm(total=total, initial=initial, desc=desc, unit="round", file=sys.stdout, mininterval=2.0,
                     ascii=False, dynamic_ncols=False, ncols=100, disable=False, postfix=postfix)


class SweepProgress:
    """One bar over the runs of a sweep: a thread reads their progress files twice a second.

    ``folders[i]`` is run i's cache entry and ``rounds[i]`` its number of rounds; the sweep calls
    :meth:`finished` for runs it knows have ended (a run found cached by a worker writes no
    progress). :meth:`running` says how many were under way when a sweep is interrupted.

    The bar's postfix says what is happening: until a run reports its first round (worker
    processes starting, each run loading its data: up to a minute) :data:`STARTING`, then
    ``training, k/n runs done``; at the end ``n/n runs done``."""

    STARTING = "starting workers, loading data…"

    def __init__(self, folders: Sequence[Path], rounds: Sequence[int], enabled: bool = True, desc: str = ""):
        self.folders, self.rounds = list(folders), list(rounds)
        self.since = time.time() - 1.0          # file times have coarse resolution on some file systems
        self.done = [0] * len(self.folders)
        self.ended: set[int] = set()
        self.started: set[int] = set()         # runs that wrote progress in this sweep
        self._lock = threading.Lock()
        self._stop = threading.Event()
        n = len(self.folders)
        self._postfix = self.STARTING
        self.bar = bar(sum(self.rounds), desc or f"{n} run{'s' * (n != 1)}", enabled=enabled, postfix=self._postfix)
        self._thread = None
        if self.bar is not None:
            self._refresh()
            self._thread = threading.Thread(target=self._watch, name="fairfl-progress", daemon=True)
            self._thread.start()

    def finished(self, indices: Iterable[int], failed: bool = False) -> None:
        """Runs that have ended: all their rounds are done, unless they ``failed``."""
        with self._lock:
            for i in indices:
                self.ended.add(i)
                if not failed:
                    self.done[i] = self.rounds[i]

    def poll(self) -> None:
        with self._lock:
            for i, folder in enumerate(self.folders):
                if i in self.ended:
                    continue
                n = read(folder, self.since)
                if n is not None:
                    self.started.add(i)
                    self.done[i] = min(n, self.rounds[i])

    def running(self) -> int:
        """Runs that reported progress in this sweep and have not ended."""
        self.poll()
        with self._lock:
            return len(self.started - self.ended)

    def started_folders(self) -> list[Path]:
        """The cache entries of the runs that reported progress in this sweep and that the sweep has
        not seen end (some may have ended since: their entries say so)."""
        self.poll()
        with self._lock:
            return [self.folders[i] for i in sorted(self.started - self.ended)]


    def _state(self) -> tuple[int, str, bool]:
        """Rounds done, the postfix that says what is happening, and whether every run has ended."""
        with self._lock:
            n, ended, started = sum(self.done), len(self.ended), len(self.started | self.ended)
        runs = f"{ended}/{len(self.folders)} runs done"
        if ended == len(self.folders):
            return n, runs, True
        return n, (f"training, {runs}" if started else self.STARTING), False

    def _refresh(self) -> None:
        if self.bar is None:
            return
        n, postfix, final = self._state()
        if final:
            return      # the final state is close()'s to draw, once (the watcher saw every run end first)
        moved = postfix != self._postfix          # a new phase is shown at once, whatever mininterval says
        self._postfix = postfix
        self.bar.set_postfix_str(postfix, refresh=False)
        if n < self.bar.n:                      # a resumed run restarts from its checkpoint's round
            self.bar.n = n
            self.bar.refresh()
        elif not self.bar.update(n - self.bar.n) and moved:     # update redraws at most every mininterval
            self.bar.refresh()

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            self.poll()
            self._refresh()

    def close(self) -> None:
        """Stop reading, show the final state and close the bar (it stays visible)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.poll()
        if self.bar is not None:
            # the final state drawn once, by close() (at the overall rate): drawing it here too
            # (update, refresh) printed the last line up to three times, each with another rate
            n, postfix, _ = self._state()
            self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.n = n
            self.bar.close()
