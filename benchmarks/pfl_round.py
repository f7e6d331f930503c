"""The reference round in pfl-research (``pfl`` 0.6.0, PyPI), and fairfl's beside it.

The round is ``round_speed.py``'s: Fashion-MNIST in fairfl's 100 label-shard clients (480 training
images each, read by fairfl's loader, so both tools train on the same images), the CNN of FedMGDA+
Table 3 (``fairfl.federated.models.build_model("cnn_fmnist")``, the same ``nn.Module`` inside pfl's
``PyTorchModel``), 10 clients a round, 1 local epoch of SGD, b = 10, lr 0.01, FedAvg.

    python benchmarks/pfl_round.py [--rounds 8] [--processes 2] [--smoke]
    python benchmarks/pfl_round.py --compare 5 [--rounds 8] [--smoke]

The first form runs pfl's simulation with ``--processes`` worker processes, each with one torch
thread, launched as pfl documents for several processes on one machine (``PFL_WORKER_ADDRESSES``
and ``PFL_WORKER_RANK``: ``torch.distributed`` over gloo; the cohort is shared out, 5 clients a
process, and the model updates are all-reduced). It times ``--rounds`` rounds after one warm-up round
and prints ``pfl round: X s (median of R, P processes)``.

``--compare N`` runs, N times and in rotating order, three fresh processes each timing ``--rounds``
rounds after a warm-up: fairfl's round on 1 thread and on 2 threads (``fairfl.training.engine.cores
.set_threads``; ``round_speed.time_rounds``, the batched path) and pfl's with ``--processes``
processes. It prints each side's median of the per-process medians and the median of the per-turn
ratios; the last line is ``fairfl (2 threads) vs pfl (P processes): X.XXx``. Fresh processes
alternate, rather than both tools in one process, because pfl's import sets process-wide state
(torch's multiprocessing start method, its distributed context) and each side should start from
the same cold state; rotating the order spreads the drift of a shared machine over all three.

``--smoke`` (CI, under a minute) runs the same code on round_speed's smoke federation: the 5,000-image MNIST
subset over 20 clients, 2 a round (one a process), 1 timed round.

pfl needs ``.pfl/`` (``bash benchmarks/pfl_setup.sh`` or ``make pfl-env``): pfl and the packages it
needs that fairfl's ``.venv`` lacks. pfl runs with this same Python and ``.pfl/`` first on its path,
so both tools use the same torch and numpy.

Where pfl's round differs from fairfl's (the timed parts are kept as close to "train the 10 clients
and average" as pfl allows):

- Each of pfl's rounds also computes each client's model difference in float32, sums them per
  process, all-reduces the sums between the processes, averages them and applies them through its
  central optimizer (``torch.optim.SGD``, lr 1: w + mean of the differences, FedAvg). fairfl's timed
  part is ``train_clients``: the sampled clients' local training and their pseudo-gradients; the
  server's weighted mean of 10 vectors of the CNN's 21,840 parameters (about 0.1 ms) is outside it.
- pfl evaluates every sampled client before and after training in the rounds where
  ``iteration % evaluation_frequency == 0``; that is round 0 only here, which is the warm-up and
  not timed. No validation cohort is drawn (``val_cohort_size=0``).
- pfl averages the clients' differences unweighted (no weighting postprocessor), fairfl weights by
  training-set size: the same average here, where every client has 480 images.
- pfl goes through each client's images in their stored order each epoch (its ``Dataset.iter``);
  fairfl draws a permutation per epoch. pfl samples clients with its ``minimize_reuse`` sampler,
  fairfl with its own seeded draw: different clients, the same work (48 steps each).
- A round's time in pfl is the time between the ends of consecutive rounds on process 0 (its
  callback ``after_central_iteration``); the all-reduce of every round makes process 0 wait for the
  slower process. After the last round, process 0 reports its global model's accuracy on the
  standard test images (not timed), which shows that pfl trained.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PFL_DIR = REPO / ".pfl"
SETUP = "bash benchmarks/pfl_setup.sh"
TIMEOUT = 1800          # seconds for one side's process(es): start-up, data, warm-up and the timed rounds

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number, at least 1")
    return value


# ----------------------------------------------------------------------------- pfl, one process


def pfl_worker(rounds: int, smoke: bool, out: Path) -> None:
    """One of pfl's processes (launched by :func:`run_pfl`): FedAvg for 1 + ``rounds`` rounds; process 0
    writes the time of every round after the warm-up, and the trained model's test accuracy, to ``out``."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    import pfl
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.internal.ops import pytorch_ops
    from pfl.metrics import Metrics, Weighted
    from pfl.model.pytorch import PyTorchModel

    from fairfl.runs.loop import federated_data
    from fairfl.federated.models import build_model
    from round_speed import REFERENCE, SMOKE

    config = SMOKE if smoke else REFERENCE
    fed = federated_data(config)
    # torch tensors, which pfl passes on as they are (numpy arrays it would convert at every batch)
    users = {k: [c.x_train, c.y_train] for k, c in enumerate(fed.clients)}

    class Net(torch.nn.Module):
        """fairfl's Table 3 CNN with the two methods pfl's PyTorchModel calls: ``loss`` (training mode,
        the mean cross-entropy of the batch, as fairfl's local SGD) and ``metrics`` (evaluation)."""

        def __init__(self, net: torch.nn.Module) -> None:
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(x)

        def loss(self, x, y, eval=False):  # noqa: A002 - pfl's keyword
            self.train()
            return F.cross_entropy(self.net(x), y)

        @torch.no_grad()
        def metrics(self, x, y, eval=True):  # noqa: A002 - pfl's keyword
            self.eval()
            logits = self.net(x)
            return {"loss": Weighted(F.cross_entropy(logits, y, reduction="sum").item(), len(y)),
                    "accuracy": Weighted((logits.argmax(1) == y).sum().item(), len(y))}

    net = Net(build_model(config.model, (1, 28, 28), fed.dataset.num_classes, seed=0))
    model = PyTorchModel(model=net, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
    clients = FederatedDataset.from_slices(users, get_user_sampler("minimize_reuse", list(users)))
    backend = SimulatedBackend(training_data=clients, val_data=clients, postprocessors=[])

    class Clock(TrainingProcessCallback):
        """The end of every round, on this process's clock."""

        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_train_begin(self, *, model):
            self.ends = [time.perf_counter()]
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            self.ends.append(time.perf_counter())
            return False, Metrics()

    clock = Clock()
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(central_num_iterations=1 + rounds, evaluation_frequency=rounds + 2,
                                           train_cohort_size=config.num_sampled, val_cohort_size=0),
        backend=backend, model=model,
        model_train_params=NNTrainHyperParams(local_learning_rate=config.local.lr, local_num_epochs=config.local.epochs,
                                              local_batch_size=config.local.batch_size),
        model_eval_params=NNEvalHyperParams(local_batch_size=1000),
        callbacks=[clock], send_metrics_to_platform=False)
    times = [b - a for a, b in zip(clock.ends, clock.ends[1:])][1:]         # round 0 warms up (and evaluates)

    distributed = pytorch_ops.distributed
    if distributed.global_rank == 0:
        net.eval()
        x, y = fed.dataset.x_test, fed.dataset.y_test
        with torch.no_grad():
            correct = sum(int((net(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum()) for i in range(0, len(y), 1000))
        out.write_text(json.dumps({
            "times": times, "accuracy": correct / len(y), "test_images": len(y), "pfl": pfl.__version__,
            "torch": torch.__version__, "torch_file": torch.__file__, "processes": distributed.world_size,
            "rounds_trained": 1 + rounds}))
    # every process waits for process 0's report, then takes its process group down: a gloo group left to
    # the interpreter's exit aborted a process now and then ("terminate called without an active
    # exception", status -6; twice in three `make pfl-bench` runs on machine B), and the launcher then
    # stopped process 0 before it had written
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- pfl, launched


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _tail(text: str, n: int = 3000) -> str:
    return text[-n:]


def _require_pfl(pfl_dir: Path) -> None:
    if not (pfl_dir / "pfl" / "__init__.py").is_file():
        sys.exit(f"error: pfl is not installed in {pfl_dir}; run `{SETUP}` (or `make pfl-env`) first")


def run_pfl(rounds: int, processes: int, smoke: bool, pfl_dir: Path) -> dict:
    """pfl's simulation in ``processes`` fresh processes (this Python, ``pfl_dir`` first on the path):
    what its process 0 reported."""
    _require_pfl(pfl_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PFL_")}
    env.update(PYTHONPATH=os.pathsep.join([str(pfl_dir), str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",   # a process, one core: P processes on P cores
               PFL_PYTORCH_DEVICE="cpu")                      # the CPU round, also where a GPU is present
    if processes > 1:
        env["PFL_WORKER_ADDRESSES"] = ",".join(f"localhost:{_free_port()}" for _ in range(processes))
    with tempfile.TemporaryDirectory(prefix="pfl-round-") as tmp:
        out = Path(tmp) / "rank0.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--role", "pfl-worker", "--rounds", str(rounds),
               "--out", str(out)] + (["--smoke"] if smoke else [])
        logs = [open(Path(tmp) / f"rank{r}.log", "w+") for r in range(processes)]
        procs = [subprocess.Popen(cmd, cwd=REPO, env={**env, "PFL_WORKER_RANK": str(r)}, stdout=log,
                                  stderr=subprocess.STDOUT) for r, log in enumerate(logs)]
        deadline, late = time.monotonic() + TIMEOUT, False
        try:
            # until all have ended, or one has failed: the others would wait for it in a collective
            while any(p.poll() is None for p in procs) and not any(p.poll() for p in procs):
                if time.monotonic() > deadline:
                    late = True
                    break
                time.sleep(0.2)
        finally:
            killed = [p.poll() is None for p in procs]
            for p, k in zip(procs, killed):
                if k:
                    p.kill()
                    p.wait()
        texts = []
        for log in logs:
            log.seek(0)
            texts.append(log.read())
            log.close()
        if late:
            sys.exit(f"error: pfl's processes did not finish in {TIMEOUT} s:\n{_tail(texts[0])}")
        # the process that failed first, not one stopped here because it waited for that one
        failed = ([r for r, p in enumerate(procs) if p.returncode != 0 and not killed[r]]
                  or ([] if out.exists() else [0]))
        if failed and out.exists():
            # process 0 wrote after every process had trained (the barrier above): a failure after that is
            # in the teardown, and the times stand
            r = failed[0]
            print(f"note: pfl's process {r} ended with status {procs[r].returncode} after the report was written")
            failed = []
        if failed:
            r = failed[0]
            sys.exit(f"error: pfl's process {r} failed (exit status {procs[r].returncode}):\n{_tail(texts[r])}")
        return json.loads(out.read_text())


# ----------------------------------------------------------------------------- fairfl, one process


def fairfl_worker(rounds: int, threads: int, smoke: bool) -> None:
    """fairfl's round in this process on ``threads`` threads: ``round_speed.time_rounds`` (the batched
    path, one warm-up round), the times printed as one JSON line."""
    import torch

    from round_speed import REFERENCE, SMOKE, time_rounds

    times = time_rounds(SMOKE if smoke else REFERENCE, True, rounds, threads)
    print("FAIRFL " + json.dumps({"times": times, "threads": threads, "torch": torch.__version__}))


def run_fairfl(rounds: int, threads: int, smoke: bool) -> dict:
    """fairfl's round in a fresh process of this Python, with this tree's fairfl and without pfl."""
    pfl = str(PFL_DIR)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != Path(pfl)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO)] + paths), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--role", "fairfl", "--threads", str(threads),
           "--rounds", str(rounds)] + (["--smoke"] if smoke else [])
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    lines = [line for line in r.stdout.splitlines() if line.startswith("FAIRFL ")]
    if r.returncode != 0 or not lines:
        sys.exit(f"error: fairfl's round on {threads} thread(s) failed (exit status {r.returncode}):\n"
                 f"{_tail(r.stdout + r.stderr)}")
    return json.loads(lines[-1][len("FAIRFL "):])


# ----------------------------------------------------------------------------- the two side by side


def compare(turns: int, rounds: int, processes: int, smoke: bool, pfl_dir: Path) -> None:
    sides = [("fairfl, 1 thread", lambda: run_fairfl(rounds, 1, smoke)),
             ("fairfl, 2 threads", lambda: run_fairfl(rounds, 2, smoke)),
             (f"pfl, {processes} processes", lambda: run_pfl(rounds, processes, smoke, pfl_dir))]
    medians: dict[str, list[float]] = {name: [] for name, _ in sides}
    for turn in range(turns):
        order = sides[turn % 3:] + sides[:turn % 3]
        for name, side in order:
            result = side()
            medians[name].append(statistics.median(result["times"]))
            note = (f", test accuracy {100 * result['accuracy']:.1f} % after {result['rounds_trained']} rounds "
                    "(not timed)" if "accuracy" in result else "")
            print(f"turn {turn + 1}: {name}: {medians[name][-1]:.3f} s a round "
                  f"(median of {len(result['times'])}: {', '.join(f'{t:.3f}' for t in result['times'])}){note}",
                  flush=True)
    one, two, other = (medians[name] for name, _ in sides)
    ratio = lambda a, b: statistics.median(x / y for x, y in zip(a, b))  # noqa: E731 - per-turn ratios
    rows = [(name, f"{statistics.median(medians[name]):.3f} s") for name, _ in sides]
    head = "one run, the reference round"
    w = max(len(head), *(len(r[0]) for r in rows))
    print(f"| {head:<{w}} | {'median':>9} |")
    print(f"|{'-' * (w + 2)}|{'-' * 11}|")
    for a, b in rows:
        print(f"| {a:<{w}} | {b:>9} |")
    print(f"medians of {turns} turn(s), each the median of {rounds} round(s) in a fresh process; ratios are medians "
          "of the turns' ratios")
    print(f"fairfl 2 threads vs 1 thread: {ratio(one, two):.2f}x")
    print(f"fairfl (1 thread) vs pfl ({processes} processes): {ratio(other, one):.2f}x")
    print(f"fairfl (2 threads) vs pfl ({processes} processes): {ratio(other, two):.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=_positive, default=8, help="timed rounds per process, after one warm-up round")
    ap.add_argument("--processes", type=_positive, default=2, help="pfl's worker processes (one torch thread each)")
    ap.add_argument("--compare", type=_positive, metavar="N",
                    help="N turns of fairfl (1 and 2 threads) and pfl, alternating, each in fresh processes")
    ap.add_argument("--pfl-dir", type=Path, default=PFL_DIR, help="where benchmarks/pfl_setup.sh installed pfl")
    ap.add_argument("--smoke", action="store_true", help="CI: a tiny federation, 1 timed round")
    ap.add_argument("--role", choices=("pfl-worker", "fairfl"), help=argparse.SUPPRESS)   # the processes it starts
    ap.add_argument("--threads", type=_positive, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    if "--smoke" in sys.argv[1:]:
        ap.set_defaults(rounds=1)
    args = ap.parse_args()
    if args.role == "pfl-worker":
        return pfl_worker(args.rounds, args.smoke, args.out)
    if args.role == "fairfl":
        return fairfl_worker(args.rounds, args.threads, args.smoke)

    _require_pfl(args.pfl_dir)               # before any side runs
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{cores} usable cores; pfl from {args.pfl_dir}")
    if cores < 2:
        print("note: fewer than 2 usable cores: 2 threads and 2 processes share one core here")
    if args.compare:
        return compare(args.compare, args.rounds, args.processes, args.smoke, args.pfl_dir)
    result = run_pfl(args.rounds, args.processes, args.smoke, args.pfl_dir)
    print(f"pfl {result['pfl']} with torch {result['torch']} ({result['torch_file']}); test accuracy "
          f"{100 * result['accuracy']:.1f} % after {result['rounds_trained']} rounds (not timed)")
    print(f"round times: {', '.join(f'{t:.3f}' for t in result['times'])} s")
    print(f"pfl round: {statistics.median(result['times']):.3f} s (median of {len(result['times'])}, "
          f"{result['processes']} processes)")


if __name__ == "__main__":
    main()
