"""FMOL Table 2 at the paper's size, on its own: rounds of FMGDA (full batch) needed for a
training loss of 10⁻², for K ∈ {1, 5, 10, 20} local steps, iid and non-iid MultiMNIST,
M = 10 clients × 256 samples, η_L = η_t = 0.1, beside the paper's numbers.

These are exactly the Fig. 1(b) / Table 2 runs of notebook 05's ``paper`` profile (both build
them with ``fairfl.studies.paper.fmol_config``, so they share the run cache): this script runs that part
alone, for the seeds and horizon given, without the batch-size and centralised runs of the
rest of the profile (about 25 min of CPU per seed and setting at 100 rounds here, most of it
K = 20). With ``--rounds`` other than 100 they are longer or shorter versions of those runs (their
own cache entries). Runs are cached under ``$FAIRFL_RESULTS`` and checkpoint every 10 rounds, so an
interrupted call resumes.

    .venv/bin/python scripts/fmol_table2.py --seeds 0 1 2 [--rounds 100] [--workers 2] [--smoke]

Prints the table (mean ± std over seeds; "> T" = not reached within the T rounds), the losses
after the last round and the run times, and writes the loss curves to
``figures/05_table2_paper_size_T<rounds>[_K<ks>].png/.pdf`` (``$FAIRFL_FIGURES`` moves it).
``--smoke`` (CI, seconds): seed 0, K = 1, 2 rounds, in this process.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairfl.studies import plotting  # noqa: E402
from fairfl.studies.notebook import format_rounds  # noqa: E402
from fairfl.studies.paper import FMOL_TABLE2, fmol_config  # noqa: E402
from fairfl.runs.sweeps import ProcessBackend, SerialBackend, run_many  # noqa: E402

THRESHOLD = 1e-2            # Table 2: rounds to a training loss of 10⁻²


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 5, 10, 20])
    ap.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    ap.add_argument("--smoke", action="store_true", help="CI: seed 0, K = 1, 2 rounds, in this process")
    if "--smoke" in sys.argv[1:]:
        ap.set_defaults(seeds=[0], rounds=2, ks=[1], workers=1)
    args = ap.parse_args()
    if args.rounds < 1 or min(args.ks) < 1:
        ap.error("--rounds and every K must be >= 1")

    grid = {(iid, k, s): fmol_config(K=k, iid=iid, seed=s, rounds=args.rounds)
            for s in args.seeds for iid in (True, False) for k in args.ks}
    with (SerialBackend() if args.workers == 1 else ProcessBackend(workers=args.workers)) as backend:
        runs = dict(zip(grid, run_many(list(grid.values()), backend=backend, progress=True)))

    T = args.rounds
    print(f"\nFMOL Table 2 at the paper's size (M = 10 x 256, FMGDA, eta_L = eta_t = 0.1): rounds to a training "
          f"loss of {THRESHOLD:g}, {len(args.seeds)} seed(s) {args.seeds}, runs of {T} rounds")
    print(f"{'setting':<8} {'K':>3} | {'ours L':<28} {'paper L':>7} | {'ours R':<28} {'paper R':>7} | "
          f"loss after round {T} (L / R, mean) | s per run")
    for iid in (True, False):
        setting = "iid" if iid else "non-iid"
        for k in args.ks:
            hs = [runs[(iid, k, s)] for s in args.seeds]
            r = np.stack([h.rounds_to(THRESHOLD) for h in hs])
            row = FMOL_TABLE2[(FMOL_TABLE2.setting == setting) & (FMOL_TABLE2.K == k)]
            paper = (row.L.iloc[0], row.R.iloc[0]) if len(row) else ("-", "-")
            last = np.mean([h.train_losses()[-1] for h in hs], axis=0)
            secs = np.mean([np.sum(h.round_time) for h in hs])
            print(f"{setting:<8} {k:>3} | {format_rounds(r[:, 0], T):<28} {paper[0]:>7} | "
                  f"{format_rounds(r[:, 1], T):<28} {paper[1]:>7} | {last[0]:.4f} / {last[1]:.4f} | {secs:.0f}")

    plotting.use_style()
    fig = plotting.fmol_local_steps(lambda iid, k: np.stack([runs[(iid, k, s)].train_losses() for s in args.seeds]),
                                    args.ks, THRESHOLD)
    plotting.suptitle(fig, f"FMOL Table 2 runs at the paper's size: FMGDA, M = 10 × 256, seeds {args.seeds} "
                           "(dotted: 10⁻²; mean over seeds, band: min–max)")
    name = f"05_table2_paper_size_T{T}" + ("" if args.ks == [1, 5, 10, 20] else "_K" + "-".join(map(str, args.ks)))
    paths = plotting.save_figure(fig, name)
    print("figure:", ", ".join(str(p) for p in paths))


if __name__ == "__main__":
    main()
