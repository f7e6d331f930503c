"""What a worker's memory holds for the partitions of one lockstep group: n partitions of one
dataset (notebook 06 quick's reporting seeds of one federation: 11 seeds, 100 clients), each with
the engine's pool of its clients' training data, as a group's runs hold them.

For each partition count it reports the process's resident memory above the start (psutil) and the
bytes of the distinct tensor storages the partitions and their pools hold (exact, whatever the
allocator keeps). A partition's clients are views of one gathered block per field, and a pool of
all its clients is a view of the training block (``fairfl.training.engine.jobs.joined``): a pool
that copied the clients' data would add the training block's bytes once more per partition.

    python benchmarks/partition_memory.py [--partitions 11] [--scheme shards|dirichlet] [--smoke]

``--smoke`` (CI, seconds): the 5,000-image MNIST subset, 10 clients, 2 partitions.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

from fairfl import ExperimentConfig, LocalTraining, PartitionSpec  # noqa: E402
from fairfl.runs.loop import federated_data  # noqa: E402
from fairfl.training.client.training import pool_of  # noqa: E402

MiB = 2 ** 20


def storage_bytes(held) -> int:
    """Bytes of the distinct storages of the partitions' clients and of their pools."""
    seen: dict[int, int] = {}
    for fed, pool in held:
        tensors = [getattr(c, f) for c in fed.clients for f in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test")]
        for t in tensors + [pool.x, pool.y]:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=11)
    ap.add_argument("--scheme", choices=("shards", "dirichlet"), default="shards")
    ap.add_argument("--smoke", action="store_true", help="MNIST's 5,000-image subset, 10 clients, 2 partitions")
    args = ap.parse_args()
    if args.partitions < 1:
        ap.error(f"--partitions {args.partitions}: at least 1")
    dataset, clients, n = ("mnist_5k", 10, 2) if args.smoke else ("fashion_mnist", 100, args.partitions)
    scheme = (dict(scheme="shards", shards_per_client=2) if args.scheme == "shards"
              else dict(scheme="dirichlet", beta=0.5))
    base = ExperimentConfig(dataset=dataset, model="mlp2", local=LocalTraining(batch_size=50, lr=0.05), rounds=1)
    proc = psutil.Process()
    start = proc.memory_info().rss
    held = []
    print(f"{dataset}, {args.scheme}, {clients} clients: partitions held with their training pools")
    print("| partitions | resident MiB above the start | distinct storages MiB | of which per partition |")
    print("|---|---|---|---|")
    for seed in range(n):
        fed = federated_data(base.replace(partition=PartitionSpec(**scheme, num_clients=clients, seed=seed)))
        held.append((fed, pool_of(fed.clients)))
        stored = storage_bytes(held)
        print(f"| {seed + 1} | {(proc.memory_info().rss - start) / MiB:,.0f} | {stored / MiB:,.1f} | "
              f"{stored / MiB / (seed + 1):,.1f} |", flush=True)
    one = storage_bytes(held[:1])
    blocks = sum(b.untyped_storage().nbytes() for b in held[0][0].blocks.values())
    print(f"one partition: {one / MiB:,.1f} MiB of storages, its blocks {blocks / MiB:,.1f} MiB: "
          f"the pool {'adds nothing' if one == blocks else f'adds {(one - blocks) / MiB:,.1f} MiB'}")


if __name__ == "__main__":
    main()
