"""FMOL Table 2 under each reading of the MultiMNIST setting that the reference codes support
(``fairfl.studies.paper.FMOL_READINGS``: Sener & Koltun's pixel scaling, construction and two-task MGDA
solver, alone and together; the Xavier / Kaiming initialisations as probes, which no code uses),
at the paper's size: FMGDA (full batch), M = 10 clients × 256, η_L = η_t = 0.1, K ∈ {1, 5, 10,
20}, iid and non-iid, rounds to a training loss of 10⁻² per task beside the paper's.

The readings are declared in ``fairfl.studies.paper`` before any of these runs; every run is
``fmol_config(..., reading=r)``, so "ours" is exactly scripts/fmol_table2.py's (and notebook
05's) run and shares its cache, and notebook 05 can load the others with the same call. Runs go
through the sweep engine (``fairfl.run_many``), are cached under ``$FAIRFL_RESULTS`` and
checkpoint every 10 rounds, so an interrupted call resumes.

    .venv/bin/python scripts/fmol_readings.py [--seeds 0 1 2] [--rounds 100 | --rounds-factor F] [--K 1 5 10 20]
        [--readings ours sk-pixels sk-solver xavier sk-all] [--settings iid non-iid] [--workers N] [--out CSV]
        [--smoke]

``--smoke`` (CI, seconds): the "ours" and "sk-all" readings, iid, K = 1, seed 0, 2 rounds, in this
process.

``--rounds-factor F`` runs each K for ceil(F × the paper's largest Table 2 count for that K) rounds
(F = 2: 192 / 48 / 26 / 12 rounds for K = 1 / 5 / 10 / 20) instead of one horizon for all: a
horizon fixed from the paper's counts before running, which says whether a reading gets within F
times the paper's speed, at a third of the cost of 100 rounds everywhere. ``--out`` writes one row
per run (reading, setting, K, seed, horizon, rounds to 10⁻² and final loss per task, and the sum of
the run's round wall times, which in a lockstep group includes waiting for the group's other runs)
into the CSV, replacing the rows of the same runs and keeping the others, which notebook 05 shows beside the paper's Table 2 (``notebooks/measured/fmol_readings.csv``).

Cost: one reading at the paper's size is the work of scripts/fmol_table2.py, about 25 CPU-minutes
per seed and setting at 100 rounds (most of it K = 20), i.e. ~2.5 CPU-hours for 3 seeds × 2
settings; the five default readings ~12.5 CPU-hours (~10 if "ours" is cached already).

Prints, per reading, the rounds to 10⁻² (mean ± std over seeds; "> T" = not within T rounds) for
L and R beside the paper's, and the losses after the last round; then one summary table.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairfl.studies.notebook import format_rounds  # noqa: E402
from fairfl.studies.paper import FMOL_READINGS, FMOL_TABLE2, fmol_config  # noqa: E402
from fairfl.runs.sweeps import ProcessBackend, SerialBackend, run_many  # noqa: E402

THRESHOLD = 1e-2            # Table 2: rounds to a training loss of 10⁻²
DEFAULT_READINGS = ["ours", "sk-pixels", "sk-solver", "xavier", "sk-all"]
SETTINGS = {"iid": True, "non-iid": False}


def paper_rounds(setting: str, k: int) -> tuple:
    row = FMOL_TABLE2[(FMOL_TABLE2.setting == setting) & (FMOL_TABLE2.K == k)]
    return (int(row.L.iloc[0]), int(row.R.iloc[0])) if len(row) else ("-", "-")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    horizon = ap.add_mutually_exclusive_group()
    horizon.add_argument("--rounds", type=int, default=100, help="rounds of every run (default 100)")
    horizon.add_argument("--rounds-factor", type=float, default=None,
                         help="run each K for ceil(F x the paper's largest round count for that K) rounds instead")
    ap.add_argument("--out", type=Path, default=None, help="write one CSV row per run here")
    ap.add_argument("--K", type=int, nargs="+", default=[1, 5, 10, 20], dest="ks")
    ap.add_argument("--readings", nargs="+", default=DEFAULT_READINGS,
                    help=f"of {', '.join(FMOL_READINGS)} (default: {' '.join(DEFAULT_READINGS)})")
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    ap.add_argument("--smoke", action="store_true",
                    help="CI: readings ours and sk-all, iid, K = 1, seed 0, 2 rounds, in this process")
    if "--smoke" in sys.argv[1:]:
        ap.set_defaults(seeds=[0], rounds=2, ks=[1], readings=["ours", "sk-all"], settings=["iid"], workers=1)
    args = ap.parse_args()
    if args.rounds < 1 or min(args.ks) < 1 or min(args.seeds) < 0:
        ap.error("--rounds and every K must be >= 1, every seed >= 0")
    if args.rounds_factor is not None and args.rounds_factor <= 0:
        ap.error("--rounds-factor must be > 0")
    if args.rounds_factor is not None and set(args.ks) - set(FMOL_TABLE2.K):
        ap.error(f"--rounds-factor needs the paper's counts: every K must be one of {sorted(set(FMOL_TABLE2.K))}")
    unknown = [r for r in args.readings if r not in FMOL_READINGS]
    if unknown:
        ap.error(f"unknown reading(s) {', '.join(unknown)}; the readings are {', '.join(FMOL_READINGS)}")

    print("readings (declared in fairfl.studies.paper.FMOL_READINGS before running):")
    for r in args.readings:
        print(f"  {r:<16} {FMOL_READINGS[r][0]}")
    horizon = {k: (math.ceil(args.rounds_factor * FMOL_TABLE2[FMOL_TABLE2.K == k][["L", "R"]].to_numpy().max())
                   if args.rounds_factor is not None else args.rounds) for k in args.ks}
    print("rounds per K: " + ", ".join(f"K={k}: {t}" for k, t in horizon.items()))
    grid = {(r, st, k, s): fmol_config(K=k, iid=SETTINGS[st], seed=s, rounds=horizon[k], reading=r)
            for r in args.readings for st in args.settings for k in args.ks for s in args.seeds}
    t0 = time.perf_counter()
    with (SerialBackend() if args.workers == 1 else ProcessBackend(workers=args.workers)) as backend:
        runs = dict(zip(grid, run_many(list(grid.values()), backend=backend, progress=True)))
    wall = time.perf_counter() - t0

    rows = [{"reading": r, "setting": st, "K": k, "seed": s, "rounds": horizon[k],
             "L": h.rounds_to(THRESHOLD)[0], "R": h.rounds_to(THRESHOLD)[1],
             "loss_L": h.train_losses()[-1][0], "loss_R": h.train_losses()[-1][1],
             "seconds": float(np.sum(h.round_time))} for (r, st, k, s), h in runs.items()]
    if args.out is not None:
        import pandas as pd
        from fairfl.base.atomic import atomic_write
        table = pd.DataFrame(rows)
        if args.out.exists():       # merge: this call's rows replace those of the same runs, the others stay
            key = ["reading", "setting", "K", "seed"]
            old = pd.read_csv(args.out)
            kept = old[~old.set_index(key).index.isin(table.set_index(key).index)]
            table = pd.concat([kept, table], ignore_index=True).sort_values(key, kind="stable")
        atomic_write(args.out, lambda tmp: table.to_csv(tmp, index=False))
        print(f"wrote {len(rows)} rows to {args.out} ({len(table)} in all)")

    summary = {}
    for r in args.readings:
        print(f"\n[{r}] {FMOL_READINGS[r][0]}")
        print(f"FMOL Table 2 (M = 10 x 256, FMGDA, eta_L = eta_t = 0.1): rounds to a training loss of {THRESHOLD:g}, "
              f"{len(args.seeds)} seed(s) {args.seeds}")
        print(f"{'setting':<8} {'K':>3} | {'L':<28} {'paper':>5} | {'R':<28} {'paper':>5} | "
              f"loss after the last round (L / R, mean) | s per run (sum of its rounds' wall times; in a lockstep group "
              "this includes waiting for the group's other runs)")
        for st in args.settings:
            for k in args.ks:
                T = horizon[k]
                hs = [runs[(r, st, k, s)] for s in args.seeds]
                rounds = np.stack([h.rounds_to(THRESHOLD) for h in hs])
                paper = paper_rounds(st, k)
                last = np.mean([h.train_losses()[-1] for h in hs], axis=0)
                secs = np.mean([np.sum(h.round_time) for h in hs])
                cells = (format_rounds(rounds[:, 0], T), format_rounds(rounds[:, 1], T))
                summary[(r, st, k)] = (cells, last)
                print(f"{st:<8} {k:>3} | {cells[0]:<28} {paper[0]:>5} | {cells[1]:<28} {paper[1]:>5} | "
                      f"{last[0]:.4f} / {last[1]:.4f} | {secs:.0f}")

    print(f"\nSummary: rounds to {THRESHOLD:g}, L / R (mean over seeds; loss after the last round in brackets)")
    cells = {key: f"{lr_} / {rr_} [{last[0]:.3f}/{last[1]:.3f}]" for key, ((lr_, rr_), last) in summary.items()}
    width = max(max(map(len, cells.values())), max(map(len, args.readings)))
    print(f"{'setting':<8} {'K':>3} {'paper':>8} | " + " | ".join(f"{r:<{width}}" for r in args.readings))
    for st in args.settings:
        for k in args.ks:
            paper = paper_rounds(st, k)
            print(f"{st:<8} {k:>3} {paper[0]!s:>3}/{paper[1]!s:<4} | "
                  + " | ".join(cells[(r, st, k)].ljust(width) for r in args.readings))
    print(f"\nwall time of this call: {wall:.0f} s ({len(grid)} runs, cached ones included)")


if __name__ == "__main__":
    main()
