"""Redraw time of the explorer (``fairfl.explore``) over a cache of many runs.

Fills a temporary run cache (``FAIRFL_RESULTS`` pointed at a temporary folder) with ``--seeds`` ×
4 real tiny runs — FedMGDA+ with ε ∈ {0, 0.1, 0.5, 1} on Adult's two clients (PhD / non-PhD),
``--rounds`` rounds, evaluated every round — then opens the explorer over the whole cache (scan +
loading every history, timed once) and times ``--repeats`` redraws, each after a change a user
makes (selection B's ε, the metric, the seeds), each drawing both selections with all their seeds.
Prints the median and the largest redraw. The machine's load average is printed too: on a shared
machine it explains most of the spread.

    python benchmarks/explore_redraw.py [--seeds 30] [--rounds 5] [--repeats 20] [--smoke]

``--smoke`` (CI, seconds): 2 seeds, one round, 3 redraws (one of each change).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--smoke", action="store_true", help="CI: 2 seeds, one round, 3 redraws")
    if "--smoke" in sys.argv[1:]:
        p.set_defaults(seeds=2, rounds=1, repeats=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["FAIRFL_RESULTS"] = tmp
        import fairfl
        from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
        from fairfl.federated.algorithms.fedmgda import FedMGDAPlus
        from fairfl.runs.sweeps import SerialBackend, run_many
        base = ExperimentConfig(dataset="adult", model="logreg",
                                partition=PartitionSpec("attribute", num_clients=2, attribute_values=(0, 1), split=None),
                                local=LocalTraining(epochs=1, batch_size=500, lr=0.1), rounds=args.rounds,
                                clients_per_round=2, eval_every=1)
        configs = [base.replace(algorithm=FedMGDAPlus(eps=eps), seed=s)
                   for eps in (0.0, 0.1, 0.5, 1.0) for s in range(args.seeds)]
        t0 = time.perf_counter()
        run_many(configs, backend=SerialBackend(), progress=False)
        print(f"filled the cache with {len(configs)} runs in {time.perf_counter() - t0:.1f} s")

        t0 = time.perf_counter()
        explorer = fairfl.explore(static=True)
        print(f"opened the explorer over {len(explorer.runs)} cached runs (scan + load every history) in "
              f"{time.perf_counter() - t0:.2f} s; factors: {', '.join(explorer.factors)}")
        metrics = [m for m in explorer.metrics if not m.endswith("(per round)")]
        changes = [lambda i: explorer.select("B", **{"algorithm.eps": (0.0, 0.5, 1.0)[i % 3]}),
                   lambda i: explorer.set_metric(metrics[i % len(metrics)]),
                   lambda i: setattr(explorer, "chosen_seeds", list(range(args.seeds))[: args.seeds - i % 2])
                   or explorer.redraw()]
        times = []
        for i in range(args.repeats):
            changes[i % len(changes)](i)
            times.append(explorer.last_redraw)
        n = len(explorer.selected("A")) + len(explorer.selected("B"))
        print(f"redraw ({n} runs drawn, {len(explorer.runs)} in the explorer), {args.repeats} redraws: "
              f"median {statistics.median(times):.3f} s, max {max(times):.3f} s")
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
