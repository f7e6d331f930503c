"""The run cache: one folder per experiment under the results root (``$FAIRFL_RESULTS`` or
``<repo>/results``), holding ``config.json`` and ``version.json`` (the cache version it was written
under, so that ``python -m fairfl results --prune`` can find entries no version of the code will read
again), then ``checkpoint.pt`` while the run trains, then ``history.json`` + ``history.npz`` (no
pickle) when it has finished.

The folder's name is a hash of three things, so that the cache never returns a result that is
not the one asked for: the canonical config (equal experiments, one key), the fingerprint of the
data as loaded (a replaced or damaged data file is other data), and the cache version (a change
of the code that changes results). A finished entry is checked when it is read: its checksums
(an edited file), and the config it was trained for (a renamed or swapped folder). An entry that
fails a check is a :class:`~fairfl.base.errors.CacheError` naming the folder; ``run`` and ``run_many``
report it and train that run again, without stopping a sweep.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import warnings
from pathlib import Path

from fairfl.base.atomic import atomic_write, check_json_npz, remove_stale_temporaries
from .config import CACHE_VERSION, ExperimentConfig
from fairfl.federated.data.base import fingerprint
from fairfl.training.engine import exactness
from fairfl.base.errors import CacheError, FairFLError
from .history import CHECKPOINT, History
from fairfl.base.paths import results_root

FILES = ("history.json", "history.npz")
VERSION_FILE = "version.json"


def results_folder(root: Path | str | None = None) -> Path:
    """The results root, made if needed; a path that is a file, or a folder that cannot be made
    or written, is a CacheError naming it."""
    root = Path(root) if root is not None else results_root()
    if root.exists() and not root.is_dir():
        raise CacheError(f"the results folder {root} is a file, not a folder; point FAIRFL_RESULTS at a folder")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CacheError(f"the results folder {root} cannot be made: {e.strerror or e}; point FAIRFL_RESULTS at a "
                         "writable folder") from None
    return root


# The data fingerprints, remembered with the stamps of the files they were computed from
# (``fairfl.federated.data.base.fingerprint``): a cached run is then read without loading its data.
FINGERPRINTS = ".fingerprints"


def key(config: ExperimentConfig, root: Path | str | None = None) -> str:
    """The entry's name: the config's canonical key and the fingerprint of its data."""
    memo = Path(root if root is not None else results_root()) / FINGERPRINTS
    data = fingerprint(config.dataset, config.dataset_options, memo=memo)
    if not exactness.EXACT:
        # FAIRFL_EXACT=0 trains within rounding of the config's result, not to its bits: such a run
        # is kept apart, never read as the exact result (nor the other way round)
        data += ":inexact"
    return hashlib.sha256(f"{config.key()}:{data}".encode()).hexdigest()[:16]


def entry(config: ExperimentConfig, root: Path | str | None = None) -> Path:
    return Path(root if root is not None else results_root()) / key(config, root)


def is_cached(config: ExperimentConfig, root: Path | str | None = None) -> bool:
    """A finished entry exists (it is checked when it is loaded)."""
    d = entry(config, root)
    return all((d / f).is_file() for f in FILES)


def load(config: ExperimentConfig, root: Path | str | None = None) -> History:
    """The finished run of ``config``, checked; a CacheError names the folder if it is unreadable,
    altered or holds another config's run."""
    d = entry(config, root)
    history = History.load(d)
    if history.config != config.to_dict():
        raise CacheError(f"cache entry {d} holds the results of another config (a renamed or swapped folder); "
                         f"delete it to have the run trained again")
    return history


def discard(folder: Path, reason: str) -> None:
    """Report an unusable entry and remove it, so that its run is trained again."""
    warnings.warn(f"{reason}; it is removed and the run will be trained again", stacklevel=3)
    shutil.rmtree(folder, ignore_errors=True)


def prepare(config: ExperimentConfig, root: Path | str | None = None) -> Path:
    """The entry folder of a run about to train: made, stale temporary files of killed writers
    removed, the config written (for people and the results index)."""
    results_folder(root)
    d = entry(config, root)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CacheError(f"cannot make the cache entry {d}: {e.strerror or e}") from None
    remove_stale_temporaries(d)
    atomic_write(d / "config.json", lambda p: Path(p).write_text(json.dumps(config.to_dict(), indent=1)))
    atomic_write(d / VERSION_FILE, lambda p: Path(p).write_text(json.dumps({"cache_version": CACHE_VERSION})))
    return d


# ----------------------------------------------------------------------------- one trainer per entry

LOCK = ".training.lock"


class Claim:
    """The right to train into an entry folder: an exclusive ``flock`` on its lock file, held by
    one process at a time, so that two processes asked for one run (two notebooks, two
    ``fairfl run`` on one results folder) never train it twice: one trains, the other waits and
    then reads the result. The lock goes with its process, so a killed trainer leaves no stale lock:
    the next one resumes from the checkpoint it left. The holder writes its pid into the file for
    the message of those who wait."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._fd: int | None = None

    def take(self, wait: bool) -> bool:
        """Take the claim; without ``wait``, False when another process holds it."""
        import fcntl
        fd = os.open(self.folder / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:       # Ctrl-C while waiting
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return True

    def holder(self) -> str:
        try:
            pid = (self.folder / LOCK).read_text().strip()
        except OSError:
            pid = ""
        return f"pid {pid}" if pid else "pid unknown"

    def wait(self, label: str) -> None:
        """Take the claim, waiting for the process that holds it (said once, on stderr)."""
        if not self.take(wait=False):
            print(f"{label}: being trained by another process ({self.holder()}) into {self.folder}; waiting for it "
                  "(its result is read when it ends)", file=sys.stderr, flush=True)
            self.take(wait=True)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def store(history: History, folder: Path) -> None:
    """Write the finished history; the checkpoint it replaces is removed."""
    history.save(folder)
    (folder / CHECKPOINT).unlink(missing_ok=True)


def pack(folder: Path) -> dict[str, bytes]:
    """The files of a finished entry, as bytes: what a worker that shares no folder with the
    driver sends back (``fairfl.runs.sweeps``)."""
    return {name: (Path(folder) / name).read_bytes() for name in FILES}


def receive(config: ExperimentConfig, files: dict[str, bytes], root: Path | str | None = None) -> Path:
    """Write a finished entry trained elsewhere (the bytes of :func:`pack`) into this cache. The
    pair is checked against its own checksums and config before anything is written, so bytes
    damaged on the way are an error, not an entry; each file is then written atomically, the
    arrays first: until ``history.json`` lands the entry counts as unfinished (``is_cached``), so
    an interrupted write never leaves half a history under the final names."""
    where = f"the results of {config.label()} sent by a worker"
    try:
        record = check_json_npz(json.loads(files["history.json"]), files["history.npz"], where,
                                "the run will be trained again")
    except (KeyError, UnicodeDecodeError, ValueError) as e:
        raise CacheError(f"{where} are incomplete or unreadable ({type(e).__name__}: {e})") from None
    if record.get("config") != config.to_dict():
        raise CacheError(f"{where} hold the history of another config")
    d = prepare(config, root)
    for name in ("history.npz", "history.json"):
        atomic_write(d / name, lambda p, data=files[name]: Path(p).write_bytes(data))
    (d / CHECKPOINT).unlink(missing_ok=True)
    return d


def checked_load(config: ExperimentConfig, root: Path | str | None = None) -> History | None:
    """The cached run if there is a good one; an unusable entry is reported and removed (None)."""
    if not is_cached(config, root):
        return None
    try:
        return load(config, root)
    except CacheError as e:
        discard(entry(config, root), str(e))
        return None


__all__ = ["results_folder", "key", "entry", "is_cached", "load", "checked_load", "prepare", "store", "discard",
           "pack", "receive", "Claim", "FairFLError"]
