"""How much computations side by side slow each other on this machine: the ceiling of any split of
one run over its cores, whatever computes the pieces.

k copies of the same work (the reference round's first --clients clients, trained as one stack on
one intra-op thread: FedMGDA+ Table 3's CNN, b = 10, as in ``round_speed.py``) are computed at once,
for k = 1, 2, 4, ... up to the usable cores, in two ways:

- ``processes``: k one-thread worker processes, started once (spawned), each with its own copy of the
  data and model;
- ``threads``: k threads of this process (``fairfl.training.engine.cores.parallel``, one intra-op thread each),
  as a lone run's stacks are computed.

Each copy's seconds are timed inside it; a width's figure is the mean over its copies, and the table
gives the median over --reps repetitions, widths and ways taken in rotating order (this shared
machine drifts by tens of per cent between minutes), and the slowdown against one copy alone. A
slowdown s at width k bounds what k stacks of one run can gain over one stack of the same size to
k / s. Where both ways slow down alike, the loss is the machine's (shared cache, memory bandwidth,
a host that places virtual cores on one physical core's hardware threads), not Python's lock or
torch's threads. Every copy's updates are compared bit for bit with the first copy's alone.

    python benchmarks/core_contention.py [--reps 5] [--clients 5] [--widths 1 2] [--smoke]

``--smoke`` (CI, seconds): the 5,000-image MNIST subset, one client, widths 1 and 2, one repetition.
"""
from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
from multiprocessing.connection import wait
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent))

WAYS = ("processes", "threads")


class Work:
    """One copy of the work: its model and global weights built once (the data is memoised per
    process: copies in one process share it, read-only); :meth:`round` trains the round's first
    ``clients`` clients as one stack on one thread and returns (seconds, digest of the updates)."""

    def __init__(self, smoke: bool, clients: int):
        from fairfl.federated.algorithms import sample_clients
        from fairfl.training.client import flat_params
        from fairfl.training.engine import cores
        from fairfl.runs.loop import federated_data
        from fairfl.federated.models import build_model
        from round_speed import REFERENCE, SMOKE

        cores.set_threads(1)               # one stack on one thread: the work of one core
        self.config = SMOKE if smoke else REFERENCE
        self.fed = federated_data(self.config)
        self.model = build_model(self.config.model, (1, 28, 28), 10, seed=0)   # both configs: 28x28, 10 classes
        self.w = flat_params(self.model)
        n = self.config.partition.num_clients
        self.clients = sample_clients(0, 0, n, self.config.num_sampled)[:clients]

    def round(self) -> tuple[float, str]:
        from fairfl.training.client import train_clients
        from fairfl.training.engine import cores
        with cores.one_thread():
            t0 = time.perf_counter()
            out = train_clients(self.model, self.w, self.fed.clients, self.clients, self.config.local, 0, 0,
                                batched=True, loss_before=False, loss_after=False)
            seconds = time.perf_counter() - t0
        return seconds, hashlib.sha256(out.updates.numpy().tobytes()).hexdigest()[:16]


def _worker(conn, smoke: bool, clients: int) -> None:
    """A worker process: builds its copy, then computes a round per message until told to stop."""
    work = Work(smoke, clients)
    conn.send("ready")
    while conn.recv():
        conn.send(work.round())
    conn.close()


def main() -> None:
    from fairfl.training.engine import cores
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--clients", type=int, default=5, help="clients in the stack each copy trains (default 5: "
                    "half of the reference round, what each of two threads computes)")
    ap.add_argument("--whole", type=int, default=10, help="clients of the whole round (default 10, the reference's), "
                    "also timed as one stack alone: what one run computes on one thread")
    ap.add_argument("--widths", type=int, nargs="+", default=None,
                    help="copies side by side (default 1, 2, 4, ..., every usable core, and --whole / --clients "
                    "where the cores allow: the threads one run's round of --whole clients would use)")
    ap.add_argument("--smoke", action="store_true", help="CI: tiny data, one client, widths 1 and 2, once")
    if "--smoke" in sys.argv[1:]:
        ap.set_defaults(reps=1, clients=1, whole=2, widths=[1, 2])
    args = ap.parse_args()
    if args.reps < 1 or args.clients < 1 or min(args.widths or [1]) < 1 or args.whole < args.clients:
        ap.error("--reps, --clients and every --widths must be at least 1, and --whole at least --clients")
    usable = cores.usable_cores()
    pieces = args.whole / args.clients
    if args.widths is None:       # at most 16: an affinity mask may show a host's cores beyond a container's quota
        top = min(usable, 16)
        args.widths = [2 ** i for i in range(5) if 2 ** i <= top] + [top] + \
            ([int(pieces)] if pieces == int(pieces) and pieces <= top else [])
    widths = sorted(set(args.widths) | {1})
    print(f"{usable} usable cores; widths {widths}; a stack of {args.clients} client(s) per copy; {args.reps} reps")

    local = [Work(args.smoke, args.clients) for _ in range(max(widths))]     # a model per thread
    whole = Work(args.smoke, args.whole)
    if len(whole.clients) < args.whole:
        ap.error(f"--whole {args.whole}: the round samples only {len(whole.clients)} clients")
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for _ in range(max(widths)):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child, args.smoke, args.clients), daemon=True)
        proc.start()
        child.close()                 # the worker's end: this process keeps only its own, so a dead worker is seen
        pipes.append(parent)
        procs.append(proc)

    def receive(i: int):
        """Worker i's answer; a worker that died is an error, not a wait for ever."""
        wait([pipes[i], procs[i].sentinel])
        try:
            return pipes[i].recv()
        except EOFError:
            raise SystemExit(f"worker {i} ended (exit status {procs[i].exitcode}); its error is above") from None

    try:
        for i in range(len(pipes)):
            receive(i)

        def measure(way: str, k: int) -> list[tuple[float, str]]:
            if way == "whole":
                return [whole.round()]
            if way == "threads":
                return cores.parallel([work.round for work in local[:k]], limit=k)
            for pipe in pipes[:k]:
                pipe.send(True)
            return [receive(i) for i in range(k)]

        reference = local[0].round()[1]
        whole.round()
        # every other copy warms up (its first kernels), all at once
        warm = cores.parallel([work.round for work in local[1:]], limit=len(local) - 1) if len(local) > 1 else []
        for pipe in pipes:
            pipe.send(True)
        warm += [receive(i) for i in range(len(pipes))]
        same = all(digest == reference for _, digest in warm)
        cells = [(way, k) for way in WAYS for k in widths] + [("whole", 1)]
        seconds: dict[tuple[str, int], list[float]] = {c: [] for c in cells}
        slowest: dict[tuple[str, int], list[float]] = {c: [] for c in cells}     # what a round waits for
        for rep in range(args.reps):
            for way, k in cells[rep % len(cells):] + cells[:rep % len(cells)]:
                got = measure(way, k)
                same &= way == "whole" or all(digest == reference for _, digest in got)
                seconds[way, k].append(statistics.mean(s for s, _ in got))
                slowest[way, k].append(max(s for s, _ in got))
            # as it goes, so that a time limit keeps what was measured
            print(f"rep {rep + 1}: " + ", ".join(f"{way} {k}: {seconds[way, k][-1]:.3f} s" for way, k in cells),
                  flush=True)
    finally:
        for pipe in pipes:
            try:
                pipe.send(False)
            except OSError:           # that worker has ended
                pass
        for proc in procs:
            proc.join(10)

    print("\n| copies side by side | " + " | ".join(f"{w}: s per copy, slowdown" for w in WAYS) + " |")
    print("|---|" + "---|" * len(WAYS))
    alone = {way: statistics.median(seconds[way, 1]) for way in WAYS}
    for k in widths:
        row = [f"{statistics.median(seconds[way, k]):.3f} s, {statistics.median(seconds[way, k]) / alone[way]:.2f}x"
               for way in WAYS]
        print(f"| {k} | " + " | ".join(row) + " |")
    print(f"\nbit-identical to one copy alone: {'yes' if same else 'NO'}")
    top = max(widths)
    slow = {way: statistics.median(seconds[way, top]) / alone[way] for way in WAYS}
    print(f"time per copy, {top} side by side over one alone: processes {slow['processes']:.2f}x, threads "
          f"{slow['threads']:.2f}x; so {top} stacks can compute at most {top / slow['processes']:.2f}x (processes) "
          f"and {top / slow['threads']:.2f}x (threads) the work of one stack of the same size in its time")
    w = statistics.median(seconds["whole", 1])
    line = (f"one stack of the whole round's {args.whole} clients alone: {w:.3f} s, {w / alone['threads']:.2f}x one "
            f"stack of {args.clients} (the kernels' efficiency by stack size)")
    if pieces == int(pieces) and int(pieces) in widths:
        ceiling = w / statistics.median(slowest["threads", int(pieces)])
        line += (f"; so one run of {args.whole} clients on {pieces:g} threads can be at most {ceiling:.2f}x faster "
                 "than on one")
    print(line)
    if not same:
        raise SystemExit("a copy's updates differ from one copy alone")


if __name__ == "__main__":
    main()
