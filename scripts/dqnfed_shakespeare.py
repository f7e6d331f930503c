"""DQN-Fed's step on Shakespeare setup 1 (DQN-Fed §5.4, Table 6; issue 17 §4): eq. (17) against
Theorem 4.2's safeguard (``DQNFed(step="eq17_safeguarded")``, a declared variant), at a size
stated on the command line, through the sweep engine (cached under ``$FAIRFL_RESULTS``,
checkpointed, so an interrupted call resumes). Every run is
``fairfl.studies.paper.dqnfed_shakespeare_config`` — notebook 04's Shakespeare config.

    .venv/bin/python scripts/dqnfed_shakespeare.py [--roles 31] [--max-samples 64] [--rounds 50]
        [--seeds 0] [--workers N] [--out CSV] [--smoke]

Paper size: 31 roles, 2,000 windows per role, 500 rounds, 5 seeds — about a day per run on 2 CPU
cores. Prints per step rule and seed: eq. (29)'s share of improved participants over the last 10 %
of rounds and over all rounds, the clients' final test accuracy (mean, std, worst / best 10 %),
the training loss (final, lowest), and for the safeguard the share of rounds it shortened the
step in and the mean factor. ``--out`` writes the same as one CSV row per run (notebook 04 shows
``notebooks/measured/dqnfed_shakespeare.csv``). ``--smoke`` (CI, seconds): 2 roles of at most 4
windows, 2 rounds, in this process.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairfl.federated import metrics  # noqa: E402
from fairfl.federated.algorithms.dqnfed import DQNFed  # noqa: E402
from fairfl.studies.paper import dqnfed_shakespeare_config  # noqa: E402
from fairfl.runs.sweeps import ProcessBackend, SerialBackend, run_many  # noqa: E402

STEPS = {"eq17": DQNFed(), "eq17_safeguarded": DQNFed(step="eq17_safeguarded")}


def summary(h) -> dict:
    acc = 100 * h.final_acc()
    improved = 100 * np.asarray(h.round_improved, dtype=float)
    last = max(1, len(improved) // 10)
    row = {"improved_last10pct": float(improved[-last:].mean()), "improved_all": float(improved.mean()),
           "mean": metrics.mean(acc), "std": metrics.std(acc), "worst": metrics.worst(acc, 0.1),
           "best": metrics.best(acc, 0.1), "train_loss_final": float(h.train_loss[-1]),
           "train_loss_lowest": float(np.min(h.train_loss)), "seconds": float(np.sum(h.round_time))}
    if "safeguard" in h.info:
        factor = np.asarray(h.info["safeguard"], dtype=float)
        row.update(shortened_share=float(np.mean(factor < 1)), mean_factor=float(factor.mean()))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--roles", type=int, default=31)
    ap.add_argument("--max-samples", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    ap.add_argument("--out", type=Path, default=None, help="write one CSV row per run here")
    ap.add_argument("--smoke", action="store_true", help="CI: 2 roles x <= 4 windows, 2 rounds, in this process")
    if "--smoke" in sys.argv[1:]:
        ap.set_defaults(roles=2, max_samples=4, rounds=2, workers=1)
    args = ap.parse_args()
    if min(args.roles, args.max_samples, args.rounds) < 1 or min(args.seeds) < 0:
        ap.error("--roles, --max-samples and --rounds must be >= 1, every seed >= 0")

    grid = {(step, s): dqnfed_shakespeare_config(algorithm, roles=args.roles, max_samples=args.max_samples,
                                                 rounds=args.rounds, seed=s)
            for step, algorithm in STEPS.items() for s in args.seeds}
    print(f"Shakespeare setup 1 at {args.roles} roles x <= {args.max_samples} windows, {args.rounds} rounds, "
          f"seeds {args.seeds} (paper: 31 x 2,000, 500 rounds, 5 seeds)")
    t0 = time.perf_counter()
    with (SerialBackend() if args.workers == 1 else ProcessBackend(workers=args.workers)) as backend:
        runs = dict(zip(grid, run_many(list(grid.values()), backend=backend, progress=True)))
    wall = time.perf_counter() - t0

    rows = [{"step": step, "seed": s, "roles": args.roles, "max_samples": args.max_samples, "rounds": args.rounds,
             **summary(h)} for (step, s), h in runs.items()]
    import pandas as pd
    frame = pd.DataFrame(rows)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(frame.round(3).to_string(index=False))
    if args.out is not None:
        from fairfl.base.atomic import atomic_write
        atomic_write(args.out, lambda tmp: frame.to_csv(tmp, index=False))
        print(f"wrote {len(rows)} rows to {args.out}")
    print(f"wall time of this call: {wall:.0f} s ({len(grid)} runs, cached ones included)")


if __name__ == "__main__":
    main()
