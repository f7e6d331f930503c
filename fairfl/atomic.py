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
