"""Process helpers shared by the tests that check which processes an interrupt or a dead parent
leaves behind (read from /proc: Linux only, as the tests that use them)."""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def stop_group(process: subprocess.Popen, grace: float = 30) -> None:
    """End a process started as the leader of its own group (a server and its kernels): SIGTERM to
    the group, SIGKILL after ``grace`` seconds."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


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
