"""The character LSTM's local training on the CPU: the reference path (one ``nn.LSTM`` instance after
another, ``batched=False``) against the stacked path (``fairfl.federated.stacked_lstm``, ``batched=True``), in
instance-steps per second.

Shakespeare's model (``lstm_shakespeare``: embedding 8, two LSTM layers of 256, 81 classes) at b = 10 on
80-character windows, as DQN-Fed's Shakespeare setup trains it. One call of the engine
(``fairfl.training.engine.execute``) trains N instances --steps SGD steps each (N copies of one start, each its own
batch order on one pool of random windows: the arithmetic does not depend on the values); a call's rate
is N × steps / its seconds. Each (N, threads, path) gets one untimed call first (the stacked path's
exactness probes, once per process and stack size, fall there: their seconds are printed apart), then
--reps timed calls; the repetitions go round every cell in turn and the two paths alternate which goes
first, so that a shared machine's drift falls on both sides alike. The table gives medians.

The engine cuts the stacks as it would in a run (``fairfl.training.engine.fused``: within its memory budget and
over the threads); the stack sizes it trained are printed. ``--one-stack`` also times the stacked path
with the budget lifted, every instance in one stack (N up to that value), which shows why the budget
keeps the CPU's stacks small.

    python benchmarks/lstm_speed.py [--n 1 10 100] [--threads 1 2] [--steps 3] [--reps 3] [--one-stack 10] [--smoke]

``--smoke`` (CI, seconds): N = 1 and 2, one step, one repetition.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

B, LENGTH, VOCAB = 10, 80, 81


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, nargs="+", default=[1, 10, 100], help="instances per call")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="threads the engine may use")
    ap.add_argument("--steps", type=int, default=3, help="SGD steps of b = 10 per instance and call")
    ap.add_argument("--reps", type=int, default=3, help="timed calls per cell")
    ap.add_argument("--one-stack", type=int, default=10, help="also time one stack of all N, for N up to this (0: not)")
    ap.add_argument("--smoke", action="store_true", help="CI: N = 1 and 2, one step, one repetition")
    args = ap.parse_args()
    if args.smoke:
        args.n, args.steps, args.reps, args.one_stack = [1, 2], 1, 1, 2

    import torch

    import fairfl  # noqa: F401  (MKL's strict mode, before torch first computes)
    from fairfl import LocalTraining
    from fairfl.training.client import flat_params
    from fairfl.training.engine import Job, Source, cores, execute, fused
    from fairfl.federated.models import build_model
    from fairfl.base.seeding import Stream

    g = torch.Generator().manual_seed(0)
    model = build_model("lstm_shakespeare", (LENGTH,), VOCAB, seed=0)
    start = flat_params(model)
    n_samples = args.steps * B
    source = Source(torch.randint(0, VOCAB, (n_samples, LENGTH), generator=g),
                    torch.randint(0, VOCAB, (n_samples,), generator=g), 0, n_samples)
    local = LocalTraining(epochs=1, batch_size=B, lr=0.5)
    cuts: list[list[tuple[int, int]]] = []
    real_chunks = fused._chunks

    def recording(*a):
        out = real_chunks(*a)
        cuts.append([(len(c), n) for c, n in out])
        return out
    fused._chunks = recording

    def call(n: int, threads: int, path: str, rep: int) -> float:
        """Seconds of one call: n instances, ``args.steps`` steps each, on ``path``."""
        cores.set_threads(threads)
        budget = fused.FUSED_FLOATS["cpu"]
        if path == "one stack":
            fused.FUSED_FLOATS["cpu"] = 2 ** 62
        try:
            job = Job(model, start.expand(n, -1).clone(), [source] * n, [Stream(rep, 0, k) for k in range(n)], local,
                      batched=path != "reference")
            t0 = time.perf_counter()
            out = execute([job])[0]
            took = time.perf_counter() - t0
        finally:
            fused.FUSED_FLOATS["cpu"] = budget
            cores.set_threads(None)
        if isinstance(out, BaseException):
            raise out
        return took

    paths = {n: ["reference", "stacked"] + (["one stack"] if 1 < n <= args.one_stack else []) for n in args.n}
    cells = [(n, k, p) for n in args.n for k in args.threads for p in paths[n]]
    load = os.getloadavg()
    print(f"lstm_speed: b = {B}, {LENGTH}-character windows, {args.steps} step(s) per instance and call, "
          f"N = {args.n}, threads {args.threads}, {args.reps} rep(s); load average before {load[0]:.1f}", flush=True)
    first: dict[tuple, float] = {}
    trained: dict[tuple, set] = {}
    for cell in cells:                          # untimed: the probes of the stacked path's sizes fall here
        cuts.clear()
        first[cell] = call(*cell, rep=99)
        trained[cell] = {c + pad for cut in cuts for c, pad in cut}
    seconds: dict[tuple, list[float]] = {cell: [] for cell in cells}
    for rep in range(args.reps):
        for n in args.n:
            for k in args.threads:
                order = paths[n] if rep % 2 == 0 else paths[n][::-1]
                for p in order:
                    seconds[n, k, p].append(call(n, k, p, rep))
        print(f"rep {rep + 1}: " + ", ".join(f"N={n} t={k} {p}: {seconds[n, k, p][-1]:.2f} s" for n, k, p in cells),
              flush=True)
    load = os.getloadavg()
    print(f"load average after {load[0]:.1f} (1 min), {load[1]:.1f} (5 min)\n")
    rate = {cell: cell[0] * args.steps / statistics.median(s) for cell, s in seconds.items()}
    print("| N | threads | reference (instance-steps/s) | stacked | stacked / reference | stacks trained | "
          "one stack of N | first call, stacked (probes) |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.n:
        for k in args.threads:
            ref, st = rate[n, k, "reference"], rate[n, k, "stacked"]
            one = rate.get((n, k, "one stack"))
            sizes = ", ".join(str(s) for s in sorted(trained[n, k, "stacked"]))
            print(f"| {n} | {k} | {ref:.2f} | {st:.2f} | {st / ref:.2f}× | {sizes} | "
                  f"{f'{one:.2f}' if one else '—'} | {first[n, k, 'stacked']:.1f} s |")
    for n in args.n:
        print(f"stacked / reference at N = {n}: " + ", ".join(
            f"{rate[n, k, 'stacked'] / rate[n, k, 'reference']:.2f}× on {k} thread(s)" for k in args.threads))


if __name__ == "__main__":
    main()
