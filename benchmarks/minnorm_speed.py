"""Speed of the min-norm QP of FedMGDA+ eq. (25): the fast solver (quadprog) vs the cvxpy
reference (CLARABEL), both through ``fairfl.federated.minnorm.min_norm_weights`` on the same Gram matrix
(validation, scaling and the feasibility / KKT check included, as an aggregator pays them).

m ∈ {10, 100} random vectors in d = 1000 (Gram matrix computed once, outside the timing),
λ₀ uniform, ε ∈ {0.1, 1}; median of --reps calls after one warm-up call.

    python benchmarks/minnorm_speed.py [--reps 15] [--vectors gaussian|shared]

``--vectors shared`` adds a common component and log-normal norms (like client updates), so
that many bounds are active at λ* — the harder case for an active-set solver.
The last line is ``speed-up of the fast solver vs cvxpy at m=100: X`` (geometric mean over ε
of the ratio of medians).
"""
from __future__ import annotations

import os

# One BLAS thread: an m ≤ 100 QP is too small to gain from more, and timings stay stable when
# the machine is busy.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairfl.federated.minnorm import min_norm_weights  # noqa: E402

SOLVERS = ("quadprog", "cvxpy")
SIZES = (10, 100)
EPSILONS = (0.1, 1.0)
DIM = 1000


def vectors(rng: np.random.Generator, m: int, kind: str) -> np.ndarray:
    v = rng.standard_normal((m, DIM))
    if kind == "shared":
        v = (rng.standard_normal(DIM) + 0.5 * v) * rng.lognormal(0.0, 1.0, (m, 1))
    return v


def median_ms(gram: np.ndarray, eps: float, solver: str, reps: int) -> float:
    min_norm_weights(gram, eps=eps, solver=solver)          # warm-up (imports, caches)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        min_norm_weights(gram, eps=eps, solver=solver)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--vectors", choices=("gaussian", "shared"), default="gaussian")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    grams = {m: (lambda v: v @ v.T)(vectors(rng, m, args.vectors)) for m in SIZES}
    results: dict[tuple[str, int, float], float] = {}
    for m in SIZES:
        for eps in EPSILONS:
            for solver in SOLVERS:
                results[solver, m, eps] = median_ms(grams[m], eps, solver, args.reps)

    print(f"min-norm QP, {args.vectors} vectors in d = {DIM}, median of {args.reps} calls\n")
    print("| solver | m | eps | median ms |")
    print("| --- | ---: | ---: | ---: |")
    for m in SIZES:
        for eps in EPSILONS:
            for solver in SOLVERS:
                print(f"| {solver} | {m} | {eps:g} | {results[solver, m, eps]:.3f} |")
    ratios = [results["cvxpy", 100, eps] / results["quadprog", 100, eps] for eps in EPSILONS]
    speedup = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"\nspeed-up of the fast solver vs cvxpy at m=100: {speedup:.1f}")


if __name__ == "__main__":
    main()
