"""Process helpers shared by the tests that check which processes an interrupt or a dead parent
leaves behind (read from /proc: Linux only, as the tests that use them)."""
from __future__ import annotations

from pathlib import Path


def children(pid: int) -> list[int]:
    """The live (not zombie) child processes of ``pid``."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out
