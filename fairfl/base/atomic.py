"""Atomic file writes: write a temporary file in the destination's folder, flush it to disk, then
rename it into place, so that a crash, a full disk or a NaN raised mid-write never leaves a
half-written dataset file, checkpoint, history or figure under the final name.

A temporary file is named ``.<name>.<pid>.<random>.tmp``: a process killed during a write leaves
one behind, and :func:`remove_stale_temporaries` tells it from one a live process is writing.
Files get the permissions the process's umask gives (``tempfile`` alone would make them 0600).
A write that fails (disk full, read-only folder, no permission) raises one :class:`WriteError`
naming the file.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Callable

from .errors import CacheError, WriteError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:       # not every file system syncs a folder
        pass
    finally:
        os.close(fd)


def atomic_write(dest: Path | str, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp_path)``, flush it to disk, then rename ``tmp_path`` to ``dest``; on
    error, remove it. OS errors become a :class:`WriteError` naming ``dest``."""
    dest = Path(dest)
    tmp = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.{os.getpid()}.", suffix=".tmp")
        os.close(fd)
        write(Path(tmp))
        os.chmod(tmp, _FILE_MODE)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dest)
        _fsync_dir(dest.parent)
    except OSError as e:
        if isinstance(e, WriteError):
            raise
        reason = e.strerror or str(e)
        raise WriteError(f"cannot write {dest}: {reason}. Free some space, or make the folder writable "
                         "(results: FAIRFL_RESULTS, data: FAIRFL_DATA, figures: FAIRFL_FIGURES)") from e
    except RuntimeError as e:     # torch.save reports a full disk as "[enforce fail at inline_container.cc …]"
        if "inline_container" not in str(e) and "PytorchStreamWriter" not in str(e):
            raise
        raise WriteError(f"cannot write {dest}: {str(e).splitlines()[0]} (is the disk full?)") from e
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def remove_stale_temporaries(folder: Path | str) -> list[Path]:
    """Delete the temporary files in ``folder`` left by processes that no longer run (killed
    during a write); returns them."""
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for path in folder.glob(".*.tmp"):
        parts = path.name.split(".")
        pid = next((int(p) for p in parts[2:-1] if p.isdigit()), None)
        if pid is not None and _alive(pid):       # a live writer (this process included): not stale
            continue
        try:
            path.unlink()
            removed.append(path)
        except OSError:
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def atomic_write_npz(dest: Path | str, arrays: dict) -> None:
    """``np.savez_compressed`` of ``arrays`` to ``dest``, atomically. The temporary file is
    written through a file object: given a path, numpy would append ".npz" to it."""
    import numpy as np

    def write(p: Path) -> None:
        with open(p, "wb") as f:
            np.savez_compressed(f, **arrays)
    atomic_write(dest, write)


def _digest(meta: dict) -> str:
    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()


def write_json_npz(folder: Path | str, meta: dict, arrays: dict) -> None:
    """A history as two files, ``history.npz`` (arrays) then ``history.json`` (scalars, lists,
    and the sha256 of both parts), each written atomically; no pickle."""
    folder = Path(folder)
    atomic_write_npz(folder / "history.npz", arrays)
    npz_sha = hashlib.sha256((folder / "history.npz").read_bytes()).hexdigest()
    record = {**meta, "integrity": {"npz_sha256": npz_sha, "json_sha256": _digest(meta)}}
    atomic_write(folder / "history.json", lambda p: Path(p).write_text(json.dumps(record, indent=1)))


def read_json_npz(folder: Path | str) -> tuple[dict, dict]:
    """The (meta, arrays) written by :func:`write_json_npz`, checked against their sha256. An
    unreadable or altered pair is a :class:`CacheError` naming the folder."""
    import numpy as np
    folder = Path(folder)
    advice = f"delete {folder} to have the run trained again"
    try:
        record = json.loads((folder / "history.json").read_text())
        npz_bytes = (folder / "history.npz").read_bytes()
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CacheError(f"cache entry {folder} is unreadable ({type(e).__name__}: {e}); {advice}") from None
    check_json_npz(record, npz_bytes, f"cache entry {folder}", advice)
    try:
        with np.load(folder / "history.npz", allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise CacheError(f"cache entry {folder}: history.npz is unreadable ({e}); {advice}") from None
    return record, arrays


def check_json_npz(record: dict, npz_bytes: bytes, what: str, advice: str) -> dict:
    """Check a history pair (the parsed ``history.json`` and the bytes of ``history.npz``) against
    the sha256 recorded by :func:`write_json_npz`; the record is returned without its integrity
    part. A pair that fails is a :class:`CacheError` naming ``what``."""
    integrity = record.pop("integrity", None) if isinstance(record, dict) else None
    if not isinstance(integrity, dict):
        raise CacheError(f"{what} has no integrity record (written by an older fairfl, or edited); {advice}")
    if integrity.get("json_sha256") != _digest(record) or \
            integrity.get("npz_sha256") != hashlib.sha256(npz_bytes).hexdigest():
        raise CacheError(f"{what} was changed after it was written (its checksums differ); {advice}")
    return record
