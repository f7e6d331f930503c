"""Atomic file writes: write a temporary file in the destination's folder, then rename it
into place, so that a crash, a full disk or a NaN raised mid-write never leaves a half-written
dataset file, checkpoint, history or figure under the final name."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


def atomic_write(dest: Path | str, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp_path)``, then rename ``tmp_path`` to ``dest``; on error, remove it."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_npz(dest: Path | str, arrays: dict) -> None:
    """``np.savez_compressed`` of ``arrays`` to ``dest``, atomically. The temporary file is
    written through a file object: given a path, numpy would append ".npz" to it."""
    import numpy as np

    def write(p: Path) -> None:
        with open(p, "wb") as f:
            np.savez_compressed(f, **arrays)
    atomic_write(dest, write)


def write_json_npz(folder: Path | str, meta: dict, arrays: dict) -> None:
    """A history as two files, ``history.json`` (scalars, lists) and ``history.npz`` (arrays),
    each written atomically; no pickle."""
    import json
    folder = Path(folder)
    atomic_write_npz(folder / "history.npz", arrays)
    atomic_write(folder / "history.json", lambda p: Path(p).write_text(json.dumps(meta, indent=1)))


def read_json_npz(folder: Path | str) -> tuple[dict, dict]:
    """The (meta, arrays) written by :func:`write_json_npz`; arrays as numpy arrays."""
    import json

    import numpy as np
    folder = Path(folder)
    meta = json.loads((folder / "history.json").read_text())
    with np.load(folder / "history.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return meta, arrays
