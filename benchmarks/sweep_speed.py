"""Speed of whole sweeps: the run-batched engine (the runs of a sweep in lockstep groups, their
local training fused, ``fairfl.training.engine``) against the executor as it was before it (one run per
job in a pool of one-thread worker processes, each run's clients fused, ``max_group=1``), on
three notebook-shaped sweeps:

(a) notebook 01's grid: FedMGDA+ with 6 values of ε × iid / label shards × 2 seeds (24 runs) on
    the reference CNN, 100 clients of 600 images, 10 per round, 1 epoch of b = 10, 10 rounds;
(b) notebook 02's Adult grid: AFL, q-FedAvg, FedMGDA+ and FedAvg under the bias attack, and
    FedAvg on the PhD client only, 3 seeds (45 runs), logistic regression on two clients of
    unequal size, b = 10, 5 rounds. The executor runs them as notebook 02 did before the engine,
    on the reference path (``batched=False``: faster than fusing two clients of unequal size);
    the engine fuses the runs (``batched=True``);
(c) notebook 04's grid: 8 methods × 3 seeds (24 runs), the two-layer MLP on three one-class
    clients, full batch, 30 rounds.

Both sides run the same runs on the same warm pool (workers started and data loaded by an untimed
first sweep), into an empty cache each time, alternating which side goes first; the medians over
``--reps`` pairs are printed in a table, and as the last line
``sweep speed-up vs executor (geometric mean): X``.

    python benchmarks/sweep_speed.py [--reps 3] [--sweeps a b c] [--device cpu|cuda] [--smoke]

``--smoke`` (CI, seconds): one worker, no warm-up, one pair per sweep, each cut to its first two runs
of one round on less data (see ``smoke``).

With ``--device cuda`` every run trains on the GPU and the engine's side runs in this process
(one process feeds one GPU best); instance-steps per second are printed beside the rates measured
for a stacked CNN step on an H100 (105,000 at N ≥ 600 instances; the aim is 200,000). For the CNN sweep the achieved GFLOP/s of training is printed against the
machine's float32 matrix-product rate (one 2048² product per worker thread, measured here).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairfl import ExperimentConfig, LocalTraining, PartitionSpec  # noqa: E402
from fairfl.federated.algorithms.afl import AFL  # noqa: E402
from fairfl.federated.algorithms.ditto import Ditto  # noqa: E402
from fairfl.federated.algorithms.dqnfed import DQNFed  # noqa: E402
from fairfl.federated.algorithms.fedavg import FedAvg  # noqa: E402
from fairfl.federated.algorithms.fedfv import FedFV  # noqa: E402
from fairfl.federated.algorithms.fedmgda import FedMGDAPlus  # noqa: E402
from fairfl.federated.algorithms.qffl import QFedAvg  # noqa: E402
from fairfl.federated.algorithms.term import TERM  # noqa: E402
from fairfl.runs.sweeps import ProcessBackend, SerialBackend, run_many  # noqa: E402

# FLOPs of one training sample of the Table 3 CNN, forward and backward (≈ 3× the forward's
# multiply-adds × 2): 17.3 GFLOP for a reference round of 10 clients × 600 samples.
CNN_FLOP_PER_SAMPLE = 17.3e9 / 6000


def sweep_a(rounds: int) -> list[ExperimentConfig]:
    def one(iid, eps, seed):
        partition = (PartitionSpec("iid", num_clients=100) if iid
                     else PartitionSpec("shards", num_clients=100, shards_per_client=5))
        return ExperimentConfig(dataset="fashion_mnist", model="cnn_fmnist", partition=partition,
                                local=LocalTraining(epochs=1, batch_size=10, lr=0.01),
                                algorithm=FedMGDAPlus(eps=eps, normalize=False, server_lr=1.0, decay=0.1),
                                rounds=rounds, participation=0.1, eval_every=rounds, seed=seed, track_improved=False)
    return [one(iid, eps, seed) for iid in (True, False) for eps in (0.0, 0.01, 0.05, 0.1, 0.5, 1.0) for seed in (0, 1)]


def sweep_b(rounds: int) -> list[ExperimentConfig]:
    base = ExperimentConfig(dataset="adult", model="logreg",
                            partition=PartitionSpec("attribute", num_clients=2, attribute_values=(0, 1), split=None),
                            local=LocalTraining(epochs=1, batch_size=10, lr=0.01), rounds=rounds, clients_per_round=2,
                            eval_every=rounds, track_improved=False)

    def bias(b, target):
        return ({"kind": "bias", "client": 1, "bias": b, "target": target},) if b else ()
    runs = [dict(algorithm=AFL(lr_lambda=0.5), attacks=bias(b, "mean")) for b in (0.0, 0.01, 0.1, 1.0)]
    runs += [dict(algorithm=QFedAvg(q=5.0, L=0.1), attacks=bias(b, "total")) for b in (0.0, 1000.0, 5000.0, 10000.0)]
    runs += [dict(algorithm=FedMGDAPlus(eps=0.1, server_lr=1.0, decay=1 / 3), attacks=bias(b, "mean"))
             for b in (0.0, 1.0, 10000.0)]
    runs += [dict(algorithm=FedAvg(), attacks=bias(b, "mean")) for b in (0.0, 1.0, 10000.0)]
    runs += [dict(algorithm=FedAvg(), eligible_clients=(1,), clients_per_round=1)]
    return [base.replace(seed=s, **r) for r in runs for s in (0, 1, 2)]


def sweep_c(rounds: int) -> list[ExperimentConfig]:
    base = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (6, 2, 0), "normalize": "per_feature"},
                            model="mlp2", partition=PartitionSpec("one_class", num_clients=3, classes=(0, 1, 2), split=None),
                            local=LocalTraining(epochs=1, batch_size=None, lr=0.1), rounds=rounds, participation=1.0,
                            eval_every=5, track_improved=True)
    methods = [DQNFed(), FedAvg(weighting="uniform"), QFedAvg(q=5.0), FedMGDAPlus(eps=0.1, server_lr=0.1, decay=0.1),
               FedFV(alpha=2 / 3), TERM(t=1.0, weighting="uniform"), Ditto(lam=1.0, weighting="uniform"),
               DQNFed(step="algorithm1", server_lr=0.1, decay=0.1)]
    return [base.replace(algorithm=m, seed=s) for m in methods for s in (0, 1, 2)]


SWEEPS = {
    "a": ("(a) nb 01: CNN, 24 runs", sweep_a, 10),
    "b": ("(b) nb 02: Adult, 45 runs", sweep_b, 5),
    "c": ("(c) nb 04: MLP, 24 runs", sweep_c, 30),
}


def smoke(name: str, configs: list[ExperimentConfig]) -> list[ExperimentConfig]:
    """--smoke: the sweep's first runs, one round, evaluated at its end, on less data: (a) on the
    5,000-image MNIST subset (the same image shape) over 20 clients, (b) at b = 500."""
    configs = [c.replace(rounds=1, eval_every=1) for c in configs[:2]]
    if name == "a":
        return [c.replace(dataset="mnist_5k", partition=dataclasses.replace(c.partition, num_clients=20))
                for c in configs]
    if name == "b":
        return [c.replace(local=dataclasses.replace(c.local, batch_size=500)) for c in configs]
    return configs


def instance_steps(configs: list[ExperimentConfig]) -> int:
    """Client SGD steps of the sweep's ordinary local training (instance-steps)."""
    total = 0
    for c in configs:
        if c.dataset == "fashion_mnist" and c.model == "cnn_fmnist":
            per_client = 600 // c.local.batch_size * c.local.epochs
        else:
            return 0          # other sweeps: not counted (sizes depend on the data)
        total += c.rounds * c.num_sampled * per_client
    return total


def matmul_gflops(threads: int) -> float:
    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    torch.set_num_threads(1)
    return 2 * 2048 ** 3 / statistics.median(times) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sweeps", nargs="*", default=list(SWEEPS), choices=list(SWEEPS))
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--smoke", action="store_true",
                    help="CI: one pair per sweep, the first runs of each, one round (seconds)")
    if "--smoke" in sys.argv[1:]:
        ap.set_defaults(reps=1, workers=1)
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if cuda else ""))
    executor = ProcessBackend(workers=args.workers, threads=1)
    engine = SerialBackend() if cuda else executor

    rows, speedups = [], []
    try:
        for name in args.sweeps:
            title, build, rounds = SWEEPS[name]
            configs = [c.replace(device=args.device) for c in build(rounds)]
            if args.smoke:
                configs = smoke(name, configs)
            before = [c.replace(batched=False) for c in configs] if name == "b" else configs

            def timed(side: str) -> float:
                with tempfile.TemporaryDirectory() as tmp:     # an empty cache: every run trains
                    t0 = time.perf_counter()
                    if side == "engine":
                        run_many(configs, backend=engine, root=Path(tmp), progress=False)
                    else:
                        run_many(before, backend=executor, root=Path(tmp), progress=False, max_group=1)
                    return time.perf_counter() - t0
            with tempfile.TemporaryDirectory() as tmp:          # untimed: start the workers, load the data
                if not args.smoke:                              # (--smoke: the one pair pays for it)
                    run_many([c.replace(rounds=1, eval_every=1) for c in configs[:args.workers]], backend=executor,
                             root=Path(tmp), progress=False)
                if cuda:
                    run_many([c.replace(rounds=1, eval_every=1) for c in configs[:2]], backend=engine,
                             root=Path(tmp) / "gpu", progress=False)
            pairs = []
            for i in range(args.reps):
                order = ("executor", "engine") if i % 2 == 0 else ("engine", "executor")
                t = {side: timed(side) for side in order}
                pairs.append((t["executor"], t["engine"]))
                print(f"{title} pair {i + 1}: executor {t['executor']:.1f} s, engine {t['engine']:.1f} s, "
                      f"ratio {t['executor'] / t['engine']:.2f}", flush=True)
            t_exec = statistics.median(p[0] for p in pairs)
            t_eng = statistics.median(p[1] for p in pairs)
            ratio = statistics.median(p[0] / p[1] for p in pairs)
            speedups.append(ratio)
            steps = instance_steps(configs)
            note = ""
            if steps:
                rate = steps / t_eng
                note = f"{rate:,.0f} CNN instance-steps/s"
                if not cuda:
                    flops = CNN_FLOP_PER_SAMPLE * steps * configs[0].local.batch_size / t_eng / 1e9
                    peak = matmul_gflops(1) * args.workers
                    note += f"; {flops:.1f} GFLOP/s of training vs {peak:.0f} GFLOP/s matmul ({args.workers} × 1 thread)"
                else:
                    note += " (H100 reference: 105,000 stacked at N ≥ 600; aim 200,000)"
            rows.append((title, f"{t_exec:.1f} s", f"{t_eng:.1f} s", f"{ratio:.2f}x", note))
    finally:
        executor.close()
    w = max(len(r[0]) for r in rows)
    print(f"\n| {'sweep':<{w}} | executor (1 run per job) | run-batched engine | speed-up | note |")
    print(f"|{'-' * (w + 2)}|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]:<{w}} | {r[1]} | {r[2]} | {r[3]} | {r[4]} |")
    print(f"sweep speed-up vs executor (geometric mean): {math.exp(statistics.mean(math.log(s) for s in speedups)):.2f}")


if __name__ == "__main__":
    main()
