"""Throughput of one sweep on a multi-process Ray cluster against the process pool, on this machine.

The cluster is two Ray nodes started here with ``ray start`` (a head and a worker node, one CPU
each, so two slots as the pool has two workers), and the sweep goes to it through
``RayBackend(address=...)``: every group is a Ray task, and every finished run comes back as
bytes through Ray's object store and is written into the driver's cache. The pool
(``ProcessBackend(workers=2)``) trains the same sweep straight into the cache folder. Both sides
plan the same lockstep groups (two slots), start warm (workers up and data loaded by an untimed
first sweep), train into an empty cache each time, and alternate which goes first; the medians
over ``--reps`` pairs are printed as a table.

    python benchmarks/ray_throughput.py [--reps 3] [--runs 8] [--rounds 10] [--nodes 2] [--smoke]

``--smoke`` (CI, seconds once Ray is up): one node of two CPUs, no warm-up, one repetition of 2 runs of
one round.

The nodes are started with ``ray start --block`` under their own temporary folder and ports (not
``/tmp/ray``, so no other Ray user of this machine finds them), each in a session of its own, and
ended at the end by stopping those two commands, which stop the processes they started (as
``ray stop`` would, without touching another Ray on the machine), then whatever of their sessions
is left. ``--address host:port`` uses a running cluster instead.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairfl import ExperimentConfig, LocalTraining, PartitionSpec  # noqa: E402
from fairfl.runs.sweeps import ProcessBackend, RayBackend, run_many  # noqa: E402


def sweep(runs: int, rounds: int) -> list[ExperimentConfig]:
    """FedAvg on three Fashion-MNIST classes, the two-layer MLP, 10 clients of label shards, 4 per
    round, 2 epochs of b = 20: one seed per run."""
    base = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (0, 1, 2)}, model="mlp2",
                            partition=PartitionSpec("shards", num_clients=10, shards_per_client=2),
                            local=LocalTraining(epochs=2, batch_size=20, lr=0.05), rounds=rounds,
                            clients_per_round=4, eval_every=max(1, rounds // 2))
    return [base.replace(seed=s) for s in range(runs)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def start_cluster(temp: Path, procs: list[subprocess.Popen], nodes: int = 2) -> str:
    """A head and a worker node on this machine, one CPU each (``nodes=1``: a head of two CPUs
    alone); returns the head's address and
    leaves this process connected to it (RayBackend uses that connection). The two
    ``ray start --block`` commands are added to ``procs`` as they start."""
    ray = str(Path(sys.executable).parent / "ray")
    port = free_port()
    common = [f"--num-cpus={2 // nodes}", f"--temp-dir={temp}", "--block", "--disable-usage-stats"]
    # each node in a session of its own, so that stop_cluster can end every process it started
    head = subprocess.Popen([ray, "start", "--head", f"--port={port}", "--include-dashboard=false",
                             f"--ray-client-server-port={free_port()}", *common],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    procs.append(head)
    import ray as ray_module
    from ray._private.services import get_node_ip_address
    address = f"{get_node_ip_address()}:{port}"
    deadline = time.monotonic() + 240
    while True:                               # wait for the head, then add the second node
        try:
            subprocess.run([ray, "status", f"--address={address}"], check=True, capture_output=True, timeout=60)
            break
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            if time.monotonic() > deadline or head.poll() is not None:
                raise RuntimeError("the Ray head did not start")
            time.sleep(1)
    if nodes == 2:
        procs.append(subprocess.Popen([ray, "start", f"--address={address}", *common],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
    while True:             # the driver needs a registered raylet here: on a busy machine Ray's own wait can run out
        try:
            ray_module.init(address=address)
            break
        except ConnectionError:
            if time.monotonic() > deadline or head.poll() is not None:
                raise
            time.sleep(1)
    while len([n for n in ray_module.nodes() if n["Alive"]]) < nodes:
        if time.monotonic() > deadline:
            raise RuntimeError("the second Ray node did not join")
        if procs[-1].poll() is not None:
            raise RuntimeError("the second Ray node's `ray start` ended before it joined")
        time.sleep(1)
    return address


def stop_cluster(procs: list[subprocess.Popen]) -> None:
    for p in reversed(procs):                 # the worker node first, then the head
        p.send_signal(signal.SIGINT)          # what ray start --block stops its processes on
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
        try:                                  # what it left (a node's agents can outlive it): its session's group
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--address", help="a running Ray cluster (default: start two one-CPU nodes here)")
    ap.add_argument("--nodes", type=int, choices=(1, 2), default=2,
                    help="nodes to start here: 2 of one CPU each (default), or 1 of two CPUs")
    ap.add_argument("--smoke", action="store_true", help="CI: one node, one repetition of 2 runs of one round")
    if "--smoke" in sys.argv[1:]:
        ap.set_defaults(reps=1, runs=2, rounds=1, nodes=1)
    args = ap.parse_args()
    configs = sweep(args.runs, args.rounds)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # the nodes' workers inherit this environment: this checkout's fairfl, the data folder
    os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                                *filter(None, [os.environ.get("PYTHONPATH")])])
    temp = Path(tempfile.mkdtemp(prefix="fairfl-ray-"))
    procs: list[subprocess.Popen] = []
    try:
        address = args.address
        if address is None:
            t0 = time.perf_counter()
            try:
                address = start_cluster(temp, procs, args.nodes)
            except (ConnectionError, RuntimeError) as e:
                # Ray gives a starting node 30 s to register (hard-coded); a busy machine misses it now and
                # then, and the node's `ray start` ends: start the cluster once more
                print(f"the Ray cluster did not start ({type(e).__name__}: {e}); starting it once more", flush=True)
                if "ray" in sys.modules and sys.modules["ray"].is_initialized():
                    sys.modules["ray"].shutdown()
                stop_cluster(procs)
                procs.clear()
                address = start_cluster(temp, procs, args.nodes)
            shape = "two one-CPU nodes" if args.nodes == 2 else "one two-CPU node"
            print(f"Ray cluster of {shape} at {address} started in {time.perf_counter() - t0:.1f} s")
        ray_backend = RayBackend(address=address)
        pool = ProcessBackend(workers=2)
        sides = {"ProcessBackend(workers=2)": pool, f"RayBackend, {ray_backend.workers} nodes' CPUs": ray_backend}

        def timed(backend) -> float:
            with tempfile.TemporaryDirectory() as tmp:     # an empty cache: every run trains
                t0 = time.perf_counter()
                run_many(configs, backend=backend, root=Path(tmp), progress=False)
                return time.perf_counter() - t0

        for backend in sides.values() if not args.smoke else ():    # untimed: workers up, data loaded
            with tempfile.TemporaryDirectory() as tmp:
                run_many([c.replace(rounds=1, eval_every=1) for c in configs[:2]], backend=backend,
                         root=Path(tmp), progress=False)
        times: dict[str, list[float]] = {name: [] for name in sides}
        for i in range(args.reps):
            order = list(sides) if i % 2 == 0 else list(reversed(sides))
            for name in order:
                times[name].append(timed(sides[name]))
            print(f"pair {i + 1}: " + ", ".join(f"{n} {times[n][-1]:.1f} s" for n in sides), flush=True)
        pool.close()
        ray_backend.close()
    finally:
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():
            sys.modules["ray"].shutdown()           # the driver's connection of start_cluster
        stop_cluster(procs)
        shutil.rmtree(temp, ignore_errors=True)
    print(f"\n{len(configs)} runs ({args.rounds} rounds each), medians of {args.reps} repetitions, fresh cache each:")
    print("| backend | sweep time | runs / min |")
    print("|---|---|---|")
    for name, t in times.items():
        m = statistics.median(t)
        print(f"| {name} | {m:.1f} s | {60 * len(configs) / m:.1f} |")


if __name__ == "__main__":
    main()
