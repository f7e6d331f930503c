"""What a lockstep group holds, with and without handing glibc's free pages back
(``fairfl.training.engine.cores.trim_free_memory``: after each fused execution and when the group ends).

    .venv/bin/python benchmarks/group_memory.py [--runs 32] [--rounds 3] [--repeats 3] [--family mlp|shards] [--smoke]

Each measurement is a fresh process that loads the data, then trains ``--runs`` FedAvg runs (server steps
0.5, 0.6, …) side by side as one group: ``mlp`` is notebook 06's 3-client MLP (full batch, the family that
set its workers' peak), ``shards`` its 100-shard logistic regression. It prints the resident memory after
the data is loaded, the peak during the group (sampled every 50 ms), what the process holds after the group,
and the group's seconds; "trims off" replaces the trims by nothing. The two settings alternate, and the
table gives medians over ``--repeats``. ``--smoke`` (CI, seconds): 2 runs of one round on MNIST-5k, once each.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MiB = 2 ** 20


def child(family: str, runs: int, rounds: int, trims: bool) -> dict:
    import psutil

    from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
    from fairfl.federated.algorithms.fedavg import FedAvg
    from fairfl.runs.loop import federated_data, simulate_group
    from fairfl.runs.sweeps.usage import MemoryPeak
    from fairfl.training.engine import cores
    if not trims:
        cores.trim_free_memory = lambda: None
    common = dict(rounds=rounds, eval_every=rounds, track_validation=True, track_improved=False, seed=100)
    if family == "mlp":
        base = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (6, 2, 0), "normalize": "per_feature"},
                                model="mlp2", partition=PartitionSpec("one_class", num_clients=3, classes=(0, 1, 2),
                                                                      split=None, val_fraction=0.1, seed=100),
                                local=LocalTraining(epochs=1, batch_size=None, lr=0.1), participation=1.0, **common)
    elif family == "shards":
        base = ExperimentConfig(dataset="fashion_mnist", model="logreg",
                                partition=PartitionSpec("shards", num_clients=100, shards_per_client=2, seed=100,
                                                        test_source="file"),
                                local=LocalTraining(epochs=1, batch_size=50, lr=0.1), participation=0.1, **common)
    else:                               # smoke
        base = ExperimentConfig(dataset="mnist_5k", partition=PartitionSpec("iid", num_clients=3, seed=100),
                                local=LocalTraining(epochs=1, batch_size=50, lr=0.05), **common)
    configs = [base.replace(algorithm=FedAvg(server_lr=0.5 + 0.1 * i)).validate() for i in range(runs)]
    me = psutil.Process()
    federated_data(configs[0])
    loaded = me.memory_info().rss
    t0 = time.perf_counter()
    with MemoryPeak(every=0.05) as peak:          # the sweeps' own sampler (this process has no children)
        results = simulate_group(configs, progress=False)
    seconds = time.perf_counter() - t0
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise failed[0]
    after = me.memory_info().rss
    return dict(loaded=loaded / MiB, peak=max(peak.peak or 0, loaded, after) / MiB, after=after / MiB,
                seconds=seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--family", choices=("mlp", "shards"), default="mlp")
    ap.add_argument("--smoke", action="store_true", help="CI: 2 runs of one round on MNIST-5k, once each")
    ap.add_argument("--child", nargs=4, metavar=("FAMILY", "RUNS", "ROUNDS", "TRIMS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        family, runs, rounds, trims = args.child
        print(json.dumps(child(family, int(runs), int(rounds), trims == "on")))
        return
    if args.runs < 1 or args.rounds < 1 or args.repeats < 1:
        ap.error("--runs, --rounds and --repeats must be >= 1")
    family, runs, rounds, repeats = ("smoke", 2, 1, 1) if args.smoke else (args.family, args.runs, args.rounds, args.repeats)
    rows: dict[str, list[dict]] = {"on": [], "off": []}
    for i in range(repeats):
        for trims in (("on", "off") if i % 2 == 0 else ("off", "on")):          # alternating order
            out = subprocess.run([sys.executable, __file__, "--child", family, str(runs), str(rounds), trims],
                                 check=True, capture_output=True, text=True).stdout
            rows[trims].append(json.loads(out.strip().splitlines()[-1]))
    print(f"\ngroup_memory: {runs} runs of {family}, {rounds} round(s), medians of {repeats}")
    print(f"{'trims':<6} | {'after data MiB':>14} | {'peak MiB':>9} | {'after group MiB':>15} | {'seconds':>8}")
    for trims in ("off", "on"):
        med = {k: statistics.median(r[k] for r in rows[trims]) for k in ("loaded", "peak", "after", "seconds")}
        print(f"{trims:<6} | {med['loaded']:14.0f} | {med['peak']:9.0f} | {med['after']:15.0f} | {med['seconds']:8.1f}")


if __name__ == "__main__":
    main()
