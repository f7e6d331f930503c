"""Where a command's memory goes: runs it and samples its process tree every ``--every`` seconds,
each process's resident set (RSS) and proportional set (PSS: a page shared by n processes counts
1/n in each, so the tree's PSS is what the tree really holds, where summed RSS counts the libraries
every worker maps once per worker).

    .venv/bin/python benchmarks/memory_trace.py [--every 1] [--csv trace.csv] -- COMMAND ...

Prints, when the command ends, the peak of the tree's summed PSS and RSS (and when it came), each
process's own peak with its role (read off its command line), and the command's exit status (which
this script returns). ``--csv`` writes the timeline: one row per sample and process.
``--smoke`` (CI, seconds): traces a short Python child that allocates 200 MiB.
"""
from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import time
from pathlib import Path

import psutil

MiB = 2 ** 20


def pss(p: psutil.Process) -> int | None:
    """The process's proportional set size (bytes) from /proc/PID/smaps_rollup; None where it cannot be
    read (not Linux, or the process ended)."""
    try:
        for line in Path(f"/proc/{p.pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def role(p: psutil.Process) -> str:
    """A short name for what the process is (its command line, with the interesting part kept)."""
    try:
        cmd = p.cmdline()
    except psutil.Error:
        return "?"
    text = " ".join(cmd)
    for mark in ("ipykernel", "papermill", "multiprocessing", "fairfl", "pytest"):
        if mark in text:
            return f"{mark}: {text[-70:]}" if mark != "ipykernel" else "kernel"
    return text[-80:]


def trace(command: list[str], every: float, out_csv: Path | None) -> int:
    child = subprocess.Popen(command)
    root = psutil.Process(child.pid)
    peaks: dict[int, tuple[int, int, str]] = {}     # pid -> (peak RSS, peak PSS, role)
    best = (0, 0, 0.0)                              # (tree PSS, tree RSS, seconds) at the PSS peak
    best_rss = 0
    t0 = time.monotonic()
    writer, handle = None, None
    if out_csv:
        handle = open(out_csv, "w", newline="")
        writer = csv.writer(handle)
        writer.writerow(["seconds", "pid", "role", "rss_mib", "pss_mib"])
    try:
        while child.poll() is None:
            now = time.monotonic() - t0
            try:
                family = [root, *root.children(recursive=True)]
            except psutil.Error:
                break
            tree_pss = tree_rss = 0
            for p in family:
                try:
                    rss = p.memory_info().rss
                except psutil.Error:
                    continue
                share = pss(p)
                share = rss if share is None else share
                tree_rss += rss
                tree_pss += share
                old = peaks.get(p.pid)
                name = old[2] if old else role(p)
                peaks[p.pid] = (max(rss, old[0] if old else 0), max(share, old[1] if old else 0), name)
                if writer:
                    writer.writerow([f"{now:.1f}", p.pid, name, f"{rss / MiB:.0f}", f"{share / MiB:.0f}"])
            if tree_pss > best[0]:
                best = (tree_pss, tree_rss, now)
            best_rss = max(best_rss, tree_rss)
            time.sleep(every)
    except KeyboardInterrupt:
        child.send_signal(2)
    finally:
        code = child.wait()
        if handle:
            handle.close()
    wall = time.monotonic() - t0
    print(f"\nmemory_trace: exit {code} after {wall:.0f} s; peak of the tree: {best[0] / 2 ** 30:.2f} GiB PSS "
          f"(at {best[2]:.0f} s; RSS then {best[1] / 2 ** 30:.2f} GiB), summed RSS at most {best_rss / 2 ** 30:.2f} GiB")
    print(f"{'peak RSS MiB':>12} {'peak PSS MiB':>12}  process")
    for pid, (rss, share, name) in sorted(peaks.items(), key=lambda kv: -kv[1][1])[:15]:
        print(f"{rss / MiB:12.0f} {share / MiB:12.0f}  {pid} {name}")
    return code


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    ap.add_argument("--csv", type=Path, default=None, help="write the timeline here")
    ap.add_argument("--smoke", action="store_true", help="CI: a short child that allocates 200 MiB")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.smoke:
        command, args.every = [sys.executable, "-c", "import time; b = bytearray(200 * 2 ** 20); time.sleep(1.5)"], 0.2
    if not command:
        ap.error("give the command to trace after --")
    return trace(command, args.every, args.csv)


if __name__ == "__main__":
    sys.exit(main())
