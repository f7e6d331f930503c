"""Speed of a federated round, and of a sweep of runs, on the reference configuration:
Fashion-MNIST, 100 clients x 600 images (label shards; each client's default 80/10/10 split, so
480 training images), 10 sampled per round, 1 local epoch of SGD, b = 10, lr 0.01, the CNN of
FedMGDA+ Table 3.

(i)  one round, batched path vs sequential reference path, in this process (median of --reps);
(iii) one run's batched round on 1 thread against --threads (every core by default:
     ``fairfl.training.engine.cores``), alternating, medians, and whether the two give the same bits;
(ii) a sweep of --runs runs x --rounds rounds through the project's executor (a pool of
     one-thread worker processes, batched path) vs the same runs one after another in this
     process with the sequential path. Evaluation happens only at the first and last round
     and the improved-share tracking is off, so both sides time training.

    python benchmarks/round_speed.py [--reps 5] [--runs 4] [--rounds 8] [--sweeps 3] [--smoke]

``--smoke`` (CI, seconds) runs every part once at a tiny size: the 5,000-image MNIST subset over 20
clients, 2 a round, 2 runs of one round, one worker, one sweep pair.

Both sides of (ii) are compared warm, as a notebook uses them: the sequential side runs in this
process after (i) has loaded the data and run the kernels once, and the executor keeps its
worker pool between sweeps (``ProcessBackend``). The executor's first, cold sweep (starting
the workers: importing torch, loading the data, first kernels) is timed and printed on its own.
The warm comparison is then repeated ``--sweeps`` times, the two sides alternating which goes
first, because this shared 2-core machine drifts by tens of per cent between minutes; the ratio
of each pair is printed, and the last line is the median,
``sweep throughput ratio vs sequential: X``.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairfl import ExperimentConfig, LocalTraining, PartitionSpec  # noqa: E402
from fairfl.federated.algorithms import sample_clients  # noqa: E402
from fairfl.training.client import flat_params, train_clients  # noqa: E402
from fairfl.training.engine import cores  # noqa: E402
from fairfl.runs.loop import federated_data, simulate  # noqa: E402
from fairfl.federated.models import build_model  # noqa: E402
from fairfl.runs.sweeps import ProcessBackend, run_many  # noqa: E402

REFERENCE = ExperimentConfig(
    dataset="fashion_mnist",
    partition=PartitionSpec("shards", num_clients=100, shards_per_client=2, seed=0),
    model="cnn_fmnist", local=LocalTraining(epochs=1, batch_size=10, lr=0.01),
    clients_per_round=10, track_improved=False,
)

# --smoke: the same round on the 5,000-image MNIST subset (the same image shape and model), 20
# clients of 250 images, 2 a round: every part runs, in seconds
SMOKE = REFERENCE.replace(dataset="mnist_5k", partition=dataclasses.replace(REFERENCE.partition, num_clients=20),
                          clients_per_round=2)


def time_rounds(config: ExperimentConfig, batched: bool, reps: int, threads: int = 1,
                updates: list | None = None) -> list[float]:
    """Seconds of ``reps`` rounds (after one to warm up) of one run's local training, its computations on
    ``threads`` threads (``fairfl.training.engine.cores``, each with one intra-op thread); the rounds' updates are
    appended to ``updates`` where given."""
    fed = federated_data(config)
    model = build_model(config.model, (1, 28, 28), 10, seed=0)
    w = flat_params(model)
    times = []
    cores.set_threads(threads)
    try:
        with cores.one_thread():                  # the caller too: a run computes on one intra-op thread
            for r in range(reps + 1):  # the first repetition warms up
                clients = sample_clients(0, r, config.partition.num_clients, config.num_sampled)
                t0 = time.perf_counter()
                out = train_clients(model, w, fed.clients, clients, config.local, 0, r, batched=batched,
                                    loss_before=False, loss_after=False)
                times.append(time.perf_counter() - t0)
                if updates is not None and r:
                    updates.append(out.updates)
    finally:
        cores.set_threads(None)
    return times[1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--sweeps", type=int, default=3, help="repetitions of the sweep comparison (median)")
    ap.add_argument("--threads", type=int, default=cores.usable_cores(),
                    help="threads of one run in part (iii), against one (default: every usable core)")
    ap.add_argument("--one-run", action="store_true", help="only part (iii): one run's round on 1 and --threads threads")
    ap.add_argument("--smoke", action="store_true", help="CI: every part once, at a tiny size (seconds)")
    if "--smoke" in sys.argv[1:]:
        ap.set_defaults(reps=1, runs=2, rounds=1, sweeps=1, workers=1, threads=2)
    args = ap.parse_args()
    reference = SMOKE if args.smoke else REFERENCE
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, {threads} torch threads in this process")

    # (iii) one run's round on one thread and on --threads, interleaved, with the bits compared
    one, many, bits_one, bits_many = [], [], [], []
    for _ in range(2):
        one += time_rounds(reference, True, max(1, args.reps // 2 + 1), 1, bits_one)
        many += time_rounds(reference, True, max(1, args.reps // 2 + 1), args.threads, bits_many)
    same = all(torch.equal(a, b) for a, b in zip(bits_one, bits_many))
    med_one, med_many = statistics.median(one), statistics.median(many)
    print(f"one run's round: {med_one:.3f} s on 1 thread, {med_many:.3f} s on {args.threads} "
          f"(medians of {len(one)}): {med_one / med_many:.2f}x, bit-identical: {'yes' if same else 'NO'}")
    if not same:
        raise SystemExit("one run's round differs between 1 and several threads")
    if args.one_run:
        return

    # (i) one round, both paths, interleaved so that machine noise hits both alike
    seq, bat = [], []
    for _ in range(2):
        seq += time_rounds(reference, False, max(1, args.reps // 2 + 1))
        bat += time_rounds(reference, True, max(1, args.reps // 2 + 1))
    med_seq, med_bat = statistics.median(seq), statistics.median(bat)

    # (ii) the sweep, --sweeps pairs, alternating which side runs first
    configs = [reference.replace(seed=s, rounds=args.rounds, eval_every=args.rounds) for s in range(args.runs)]

    def sequential() -> float:
        t0 = time.perf_counter()
        for c in configs:
            simulate(c.replace(batched=False), progress=False)
        return time.perf_counter() - t0

    backend = ProcessBackend(workers=args.workers, threads=1)

    def executor() -> float:
        with tempfile.TemporaryDirectory() as tmp:  # an empty cache: every run trains
            t0 = time.perf_counter()
            run_many(configs, backend=backend, root=Path(tmp), progress=False)
            return time.perf_counter() - t0

    try:
        t_cold = executor()
        print(f"executor, cold (starting {args.workers} workers): {t_cold:.1f} s")
        pairs = []
        for i in range(args.sweeps):
            if i % 2 == 0:
                t_seq = sequential()
                t_exec = executor()
            else:
                t_exec = executor()
                t_seq = sequential()
            pairs.append((t_seq, t_exec))
            print(f"sweep pair {i + 1}: sequential {t_seq:.1f} s, executor {t_exec:.1f} s, ratio {t_seq / t_exec:.2f}")
    finally:
        backend.close()
    t_seq = statistics.median(p[0] for p in pairs)
    t_exec = statistics.median(p[1] for p in pairs)
    ratio = statistics.median(p[0] / p[1] for p in pairs)

    rows = [
        ("one run's batched round, 1 thread", f"{med_one:.3f} s", f"median of {len(one)}"),
        (f"one run's batched round, {args.threads} threads", f"{med_many:.3f} s",
         f"median of {len(many)}, bit-identical: {'yes' if same else 'NO'}"),
        (f"  {args.threads} threads / 1 speed-up", f"{med_one / med_many:.2f}x", ""),
        ("one round, sequential path (reference)", f"{med_seq:.3f} s", f"median of {len(seq)}"),
        ("one round, batched path (fused, fairfl.federated.stacked)", f"{med_bat:.3f} s", f"median of {len(bat)}"),
        ("  batched / sequential speed-up", f"{med_seq / med_bat:.2f}x", ""),
        (f"sweep {args.runs} runs x {args.rounds} rounds, sequential, one after another", f"{t_seq:.1f} s",
         f"{threads} threads, median of {len(pairs)}"),
        (f"sweep through executor ({args.workers} workers x 1 thread, batched), warm", f"{t_exec:.1f} s",
         f"pool kept from the sweep before, median of {len(pairs)}"),
        ("sweep through executor, cold (first sweep: starting the workers)", f"{t_cold:.1f} s", "once"),
        ("  cold-start ratio (median sequential / cold executor)", f"{t_seq / t_cold:.2f}x", ""),
    ]
    w = max(len(r[0]) for r in rows)
    print(f"| {'measurement':<{w}} | {'time':>9} | note |")
    print(f"|{'-' * (w + 2)}|{'-' * 11}|------|")
    for a, b, c in rows:
        print(f"| {a:<{w}} | {b:>9} | {c} |")
    print(f"sweep throughput ratio vs sequential: {ratio:.2f}")


if __name__ == "__main__":
    main()
