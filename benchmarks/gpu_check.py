"""The GPU path in one command: everything a GPU machine should show, in sections that each have
their own time budget and survive each other's failures, written as ``gpu_check.json`` and
``gpu_check.md`` into the folder named on the command line (after every section, so that a
command stopped from outside still leaves what was done).

    python benchmarks/gpu_check.py OUT [--device cuda] [--bundle .gpu-bundle] [--smoke] [--sections ...]

Sections, in order (``--sections`` runs some of them, e.g. those that failed in a first call):

1. ``env``: Python, torch, CUDA and cuDNN, the device (name, memory, multiprocessors), the fairfl
   commit, the CUDA precision switches as fairfl sets them, and the packages imported;
2. ``tests``: ``tests/test_cuda.py`` under pytest (its family test left to the next part), then
   every algorithm family of ``tests/test_engine.py``'s small configs (and every other registered
   algorithm on its MLP config), each algorithm once before any twice, trained on the device against
   its CPU half (computed where the bundle was made, ``make gpu-bundle``, and used if it is of the
   same code): the largest difference of training loss, test loss and accuracy per family, against
   the tolerance of ``test_cuda.py`` and beside how far the family moves between two CPU kernels;
3. ``stacked``: instance-steps per second of one stacked local-training call through the engine
   (``fairfl.training.engine.execute``: plans, gathers, steps, as a run calls it) for the CNN (b = 10 and
   64), FMOL's LeNet (one head), the MLP, logistic regression and the character LSTM, breadth first
   (every model at N = 10, then 100, then 600, then 3,000 instances, the CNN's last), each item
   capped, eager and replayed from CUDA graphs, beside the anchors measured for a plain stacked step
   on one H100 (below); per row the stack sizes the exactness probe accepted, the graphs whose capture
   failed and the peak GPU memory; and the same with ``FAIRFL_EXACT=0`` (a child process) for three models;
4. ``round``: the reference round (FedMGDA+ Table 3's CNN, 100 clients, 10 per round, b = 10):
   seconds per round of one run and of notebook 01's 60-run sweep in lockstep, beside pfl's
   1.30-1.40 s on an H100;
5. ``profiles``: every notebook's ``paper`` profile — its sweeps read by ``benchmarks/notebook_sweeps.py``
   (the statements that build them executed with the training calls intercepted; sweeps chosen
   from earlier results counted from stand-ins, as estimates), the first rounds of each sweep
   trained on the device and timed, and the profile's time EXTRAPOLATED from its counted client
   steps (never measured end to end; ``benchmarks/paper_cost.py`` does the same for any device,
   per notebook and part); Shakespeare setup 1 apart: a few roles' first round, extrapolated to
   one run and to the set;
6. ``cores``: the machine's CPU (a GPU machine has 16 cores): one run's reference round on the CPU on
   1, 2, 4, 5, 8 and 16 threads (``fairfl.training.engine.cores``, one intra-op thread each; 5: the most stacks
   the round's 10 clients make), medians, with the updates compared bit for bit against one thread.

``--bundle`` checks the bundle of ``benchmarks/gpu_bundle.py`` against its manifest and stages its
data into a data root (``--data``, default a temporary folder), used as ``FAIRFL_DATA`` here and
by the tests. ``--smoke --device cpu`` runs every section at a tiny size in well under a minute
(``tests/test_scripts.py``), so the script cannot rot while no GPU is at hand; its numbers mean
nothing. The budgets add up to 445 s, inside the 470 s the whole call is given (``gpu_run.sh``), so that a
second call fits in a lease of 15; the profiles section has the most, since reading and timing all seven
notebooks took 227 s on an H200 (``benchmarks/measured/gpu/README.md``). A section that runs out of budget
skips its remaining items and says so. Every row (a family, a stacked item, a sweep) is written to the
report and printed as soon as it is done, so a call stopped from outside keeps what it measured.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "benchmarks"))

from notebook_sweeps import client_steps, read_sweeps  # noqa: E402 - the one sweep reader (section 5, paper_cost.py)

SECTIONS = ("env", "tests", "stacked", "round", "profiles", "cores")
# seconds per section (445 s in all; the call's 470 s: gpu_run.sh), and --smoke. Used on an H200: env 1,
# tests 38, round 32, profiles 227, cores 10; stacked takes what it is given (breadth first: a short budget
# loses the largest stacks, measured in four earlier calls: benchmarks/measured/gpu/)
BUDGETS = {"env": 15, "tests": 80, "stacked": 60, "round": 35, "profiles": 240, "cores": 15}
SMOKE_BUDGETS = {"env": 30, "tests": 60, "stacked": 30, "round": 30, "profiles": 60, "cores": 20}   # caps, not what it takes

# Anchors measured for the project (not shipped with it): a plain torch.func probe on one H100
# (instance-steps/s), and the targets
ANCHORS = {
    ("cnn_fmnist", 10): {"one eager": 426, "one graph": 5_617, "stacked best": 105_000, "target": 200_000},
    ("cnn_fmnist", 64): {"one eager": 707, "one graph": 4_285, "stacked best": 21_000},
    ("multi_lenet", 10): {"one eager": 419, "one graph": 5_264, "stacked best": 105_000},
    ("mlp2", 10): {"one eager": 781, "one graph": 12_496, "stacked best": 380_000, "target": 380_000},
    ("logreg", 10): {"one eager": 1_105, "one graph": 34_008, "stacked best": 6_500_000, "target": 6_500_000},
    ("lstm_shakespeare", 10): {"one eager": 116, "one graph": 601, "stacked best": 1_856, "target": 1_900},
}
PFL_ROUND = (1.30, 1.40)            # pfl-research 0.6.0's reference round on one H100, seconds
# tests/test_cuda.py's tolerance for a run on the GPU against the CPU
RTOL, ATOL, ACC_ATOL = 1e-3, 1e-5, 0.01
# A family is also ok on the GPU where it moves no more than this many times as far as between two CPU
# kernels (gpu_check.cpu_reference): its own sensitivity to the last bits, not the GPU's
SPREAD_FACTOR = 10


class OutOfBudget(Exception):
    """A section's time budget is spent: its remaining items are skipped."""


class Context:
    def __init__(self, args, out: Path):
        self.args, self.out = args, out
        self.smoke, self.device = args.smoke, args.device
        self.report = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "device": args.device,
                       "smoke": args.smoke, "sections": []}
        self.deadline = math.inf

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def check_budget(self, what: str) -> None:
        if self.left() <= 0:
            raise OutOfBudget(f"budget spent before {what}")

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            import torch
            torch.cuda.synchronize()

    def write(self) -> None:
        """The report as it stands, the section under way included (with what it has done so far):
        written after every row, family and sweep, so that a limit striking mid-section keeps them."""
        self.out.mkdir(parents=True, exist_ok=True)
        report = json.loads(json.dumps(self.report, default=str))
        for entry in report["sections"]:
            if "seconds" not in entry and entry["name"] in report.get("partial", {}):
                entry["result"], entry["incomplete"] = report["partial"][entry["name"]], "under way (or stopped from outside)"
        report.pop("partial", None)
        # atomically: a limit (SIGTERM) that strikes while a row is being written must leave the last report whole,
        # not a truncated file (an empty gpu_check.json was read once on a busy machine)
        from fairfl.base.atomic import atomic_write
        text, md = json.dumps(report, indent=1, default=str), markdown(report)
        atomic_write(self.out / "gpu_check.json", lambda p: p.write_text(text))
        atomic_write(self.out / "gpu_check.md", lambda p: p.write_text(md))

    def row_done(self, section: str, result, line: str) -> None:
        """A row of ``section`` done: kept in the partial result, written, and said on one line."""
        self.report.setdefault("partial", {})[section] = result
        self.write()
        print(f"   {line}", flush=True)


# ----------------------------------------------------------------------------- 1. environment

def section_env(ctx: Context) -> dict:
    import torch
    from fairfl.training.engine import resolve_device
    out = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
           "torch": torch.__version__, "cuda (torch built for)": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
           "cuda available": torch.cuda.is_available(), "commit": commit(ctx.args.bundle),
           "FAIRFL_EXACT": os.environ.get("FAIRFL_EXACT", "1"), "FAIRFL_DATA": os.environ.get("FAIRFL_DATA")}
    device = resolve_device(ctx.device)           # sets the exactness switches on CUDA
    out["device"] = str(device)
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        out.update({"device name": p.name, "memory GiB": round(p.total_memory / 2 ** 30, 1),
                    "multiprocessors": p.multi_processor_count, "capability": f"{p.major}.{p.minor}",
                    "devices": torch.cuda.device_count()})
    out["precision switches"] = precision_switches()
    graphs = _graphs()
    out["cuda graphs"] = "not built" if graphs is None else ("on" if graphs.enabled() else "off")
    out["packages"] = packages()
    return out


def precision_switches() -> dict:
    """What torch's CUDA precision and determinism switches read now (fairfl.training.engine.exactness sets
    them when a CUDA device is resolved); a switch that cannot be read gives its error."""
    import torch
    b = torch.backends
    readers = {"cuda.matmul.allow_tf32": lambda: b.cuda.matmul.allow_tf32, "cudnn.allow_tf32": lambda: b.cudnn.allow_tf32,
               "cudnn.deterministic": lambda: b.cudnn.deterministic, "cudnn.benchmark": lambda: b.cudnn.benchmark,
               "float32_matmul_precision": torch.get_float32_matmul_precision}
    for name, switch in (("cuda.matmul", b.cuda.matmul), ("cudnn.conv", getattr(b.cudnn, "conv", None)),
                         ("cudnn.rnn", getattr(b.cudnn, "rnn", None))):
        if hasattr(switch, "fp32_precision"):
            readers[f"{name}.fp32_precision"] = lambda s=switch: s.fp32_precision

    def enter():
        with b.cudnn.flags(enabled=b.cudnn.enabled):
            return "enters"
    readers["cudnn.flags()"] = enter
    out = {}
    for name, read in readers.items():
        try:
            out[name] = read()
        except Exception as e:  # noqa: BLE001 - what a mixed state reads
            out[name] = f"error: {type(e).__name__}: {str(e)[:120]}"
    return out


def commit(bundle: str | None) -> str:
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        if r.returncode == 0:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return r.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    if bundle and (Path(bundle) / "MANIFEST.json").is_file():
        return json.loads((Path(bundle) / "MANIFEST.json").read_text()).get("commit", "unknown") + " (the bundle's)"
    return "unknown (no git here, no bundle)"


def packages() -> dict[str, str]:
    """The installed distributions of the modules imported so far (but the standard library's)."""
    import importlib.metadata as md
    names = md.packages_distributions()
    out = {}
    for top in sorted({m.split(".")[0] for m in list(sys.modules)}):
        for dist in names.get(top, []):
            with contextlib.suppress(md.PackageNotFoundError):
                out[dist] = md.version(dist)
    return out


# ----------------------------------------------------------------------------- 2. tests and families

def section_tests(ctx: Context) -> dict:
    out = {}
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    if os.environ.get("FAIRFL_DATA"):
        env["FAIRFL_TEST_DATA"] = os.environ["FAIRFL_DATA"]     # the tests' data root: the staged one
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_cuda.py",
           "-k", "not every_family"]                             # the families: below, with their numbers
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=max(10.0, ctx.left() * (0.6 if not ctx.smoke else 0.7)))
        text, code = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        text, code = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")), "timeout"
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    out["test_cuda.py"] = {"command": " ".join(cmd[1:]), "exit": code, "summary": lines[-1] if lines else "",
                           "seconds": round(time.perf_counter() - t0, 1), "output tail": text[-4000:]}
    ctx.report.setdefault("partial", {})["tests"] = out
    out["families"] = families(ctx)
    bad = [f for f, r in out["families"]["rows"].items() if r.get("ok") is False or "error" in r]
    out["ok"] = code == 0 and not bad
    return out


def family_configs(smoke: bool) -> dict:
    """Every family of tests/test_engine.py's GROUP, and every other registered algorithm on its MLP
    config (its defaults), ordered so that each algorithm comes once before any comes twice (the
    second-order ones included): a budget that cuts the tail loses variants, not families."""
    sys.path.insert(0, str(REPO / "tests"))
    from test_engine import GROUP, MLP
    from fairfl.federated.algorithms.base import ALGORITHMS, make_algorithm
    configs = dict(GROUP)
    covered = {c.algorithm.name for c in configs.values()}
    for name in sorted(set(ALGORITHMS) - covered):
        with contextlib.suppress(Exception):          # one that cannot train the MLP by default: not listed
            configs[f"mlp_{name}_defaults"] = MLP.replace(algorithm=make_algorithm(name))
    if smoke:                                         # the quickest
        return {k: configs[k] for k in ("adult_afl", "adult_phd_only")}
    first, rest, seen = {}, {}, set()
    for name, config in configs.items():
        (rest if config.algorithm.name in seen else first)[name] = config
        seen.add(config.algorithm.name)
    return {**first, **rest}


def summary(history) -> dict:
    """What the families compare of a run: the clients drawn, training loss, test loss, accuracy."""
    import numpy as np
    return {"sampled": [np.asarray(s).tolist() for s in history.sampled],
            "train loss": np.asarray(history.train_losses(), float).tolist(),
            "test loss": np.asarray(history.test_loss, float).tolist(),
            "accuracy": np.asarray(history.mean_acc(), float).tolist()}


def code_hash() -> str:
    """The code a reference was computed with: fairfl's modules, the families' configs, this script."""
    import hashlib
    h = hashlib.sha256()
    for f in sorted([*(REPO / "fairfl").rglob("*.py"), REPO / "tests" / "test_engine.py", Path(__file__).resolve()]):
        h.update(f.relative_to(REPO).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


OTHER_KERNELS = {"MKL_CBWR": "COMPATIBLE,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "default"}


def cpu_reference(smoke: bool = False, other_kernels: bool = True) -> dict:
    """The CPU half of the families, computed where the bundle is made (``make gpu-bundle``), so
    that the GPU machine computes only its own: every family's :func:`summary` on this CPU, and the
    same on other CPU kernels (MKL's compatible branch, oneDNN and torch capped at AVX2: another
    process) — how far a family moves when nothing but the last bits of its kernels change, the
    scale against which a GPU's difference is read."""
    from fairfl.runs.loop import simulate
    out = {"code": code_hash(), "torch": __import__("torch").__version__, "families": {}}
    for name, config in family_configs(smoke).items():
        t0 = time.perf_counter()
        try:
            out["families"][name] = {**summary(simulate(config, progress=False)), "cpu s": round(time.perf_counter() - t0, 2)}
        except Exception as e:  # noqa: BLE001 - the GPU side reports it
            out["families"][name] = {"error": f"{type(e).__name__}: {e}"}
        print(f"   cpu reference {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    if other_kernels:
        code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import gpu_check as g; "
                "from fairfl.runs.loop import simulate; smoke = sys.argv[2] == '1'; out = {}\n"
                "for name, c in g.family_configs(smoke).items():\n"
                "    try: out[name] = g.summary(simulate(c, progress=False))\n"
                "    except Exception as e: out[name] = {'error': repr(e)}\n"
                "print(json.dumps(out))")
        r = subprocess.run([sys.executable, "-c", code, str(REPO / "benchmarks"), "1" if smoke else "0"], cwd=REPO,
                           env={**os.environ, **OTHER_KERNELS, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                           timeout=1800)
        if r.returncode == 0:
            other = json.loads(r.stdout.strip().splitlines()[-1])
            for name, row in out["families"].items():
                if "error" not in row and "error" not in other.get(name, {"error": 1}):
                    row["kernel spread"] = {what: _max_diff(row[what], other[name][what])
                                            for what in ("train loss", "test loss", "accuracy")}
        else:
            out["other kernels"] = f"exit {r.returncode}: {r.stderr[-1500:]}"
    return out


def _max_diff(a, b) -> float:
    import numpy as np
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.shape != b.shape:
        return math.inf
    diff = np.abs(a - b)[~(np.isnan(a) & np.isnan(b))]
    return float(np.nanmax(diff)) if diff.size else 0.0


def load_reference(ctx: Context) -> tuple[dict | None, str]:
    """The bundled CPU half, if it was computed from this code; else None and why."""
    bundle = Path(ctx.args.bundle) if ctx.args.bundle else None
    path = bundle / "families_cpu.json" if bundle else None
    if path is None or not path.is_file():
        return None, "no bundled CPU reference: the CPU half is computed here"
    ref = json.loads(path.read_text())
    if ref.get("code") != code_hash():
        return None, f"the bundled CPU reference is of other code ({ref.get('code')}, here {code_hash()}): computed here"
    return ref, f"the CPU half from the bundle (code {ref['code']}, torch {ref['torch']})"


def families(ctx: Context) -> dict:
    """Every family of :func:`family_configs` trained on the device, against its CPU half (from the
    bundle where it was computed from this code, else here): the largest differences, beside the
    CPU's own spread between kernels."""
    import numpy as np
    from fairfl.runs.loop import simulate
    ref, source = load_reference(ctx)
    out: dict = {"CPU half": source, "rows": {}}
    rows = out["rows"]
    for name, config in family_configs(ctx.smoke).items():
        if ctx.left() <= 0:
            rows[name] = {"skipped": "budget spent"}
            continue
        try:
            cpu = (ref or {}).get("families", {}).get(name)
            row = {}
            if cpu is None or "error" in cpu:
                t0 = time.perf_counter()
                cpu = summary(simulate(config, progress=False))
                row["cpu s"] = round(time.perf_counter() - t0, 2)
            else:
                row["cpu s"] = f"{cpu.get('cpu s', '?')} (bundled)"
            t0 = time.perf_counter()
            dev = summary(simulate(config.replace(device=ctx.device), progress=False))
            row["device s"] = round(time.perf_counter() - t0, 2)
            row["same clients"] = dev["sampled"] == cpu["sampled"]
            spread = cpu.get("kernel spread") or {}
            close: dict[str, bool] = {}
            for what in ("train loss", "test loss", "accuracy"):
                a, b = np.asarray(dev[what], float), np.asarray(cpu[what], float)
                row[f"max |Δ| {what}"] = _max_diff(a, b)
                if what == "accuracy":
                    close[what] = bool(a.shape == b.shape and np.all((np.abs(a - b) <= ACC_ATOL) | (np.isnan(a) & np.isnan(b))))
                else:
                    close[what] = bool(a.shape == b.shape and np.allclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True))
            row["within tolerance"] = row["same clients"] and all(close.values())
            if spread:
                # a family that moves this far between two CPU kernels is chaotic at this size (momentum 0.9,
                # a diverging run): the GPU's own last bits may move it as far, and that is no GPU defect.
                # Per metric: within the tolerance, or within SPREAD_FACTOR times its spread
                row["CPU kernels' spread (train loss)"] = spread["train loss"]
                row[f"each metric within tolerance or {SPREAD_FACTOR:g}× its spread"] = row["same clients"] and all(
                    close[what] or row[f"max |Δ| {what}"] <= SPREAD_FACTOR * spread[what] for what in close)
            row["ok"] = row["within tolerance"] or bool(row.get(f"each metric within tolerance or {SPREAD_FACTOR:g}× its spread"))
        except Exception as e:  # noqa: BLE001 - reported per family
            row = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
        rows[name] = row
        said = "error" if "error" in row else ("ok" if row.get("ok") else "beyond the tolerance")
        ctx.row_done("tests", {**ctx.report.get("partial", {}).get("tests", {}), "families": out},
                     f"family {name}: {said} (train loss Δ {row.get('max |Δ| train loss', '?')})")
    return out


# ----------------------------------------------------------------------------- 3. stacked step

def _graphs():
    try:
        from fairfl.training.engine import graphs
        return graphs
    except ImportError:
        return None


def stacked_items(smoke: bool) -> list[tuple[str, int, int]]:
    """(model, batch size, N), breadth first: every model at N = 10, then at 100, then 600, then
    the largest (the CNN's N = 3,000 last), so that a budget cuts the largest stacks, never a model."""
    if smoke:
        return [("cnn_fmnist", 10, 2), ("mlp2", 10, 4), ("logreg", 10, 4), ("multi_lenet", 10, 2),
                ("lstm_shakespeare", 10, 2), ("cnn_fmnist", 64, 2)]
    models = [("cnn_fmnist", 10), ("mlp2", 10), ("logreg", 10), ("multi_lenet", 10), ("lstm_shakespeare", 10),
              ("cnn_fmnist", 64)]
    items = [(m, b, n) for n in (10, 100) for m, b in models]
    items += [(m, b, 600) for m, b in models if m != "lstm_shakespeare"]
    items += [("mlp2", 10, 3000), ("logreg", 10, 3000), ("lstm_shakespeare", 10, 600), ("cnn_fmnist", 10, 3000)]
    return items


ITEM_CAP = 25.0           # seconds one item of the stacked section may take (its calls included)


class ItemTimeout(Exception):
    """An item of the stacked section ran past its cap (raised by SIGALRM between operations)."""


@contextlib.contextmanager
def capped(seconds: float):
    """Raise :class:`ItemTimeout` in this (the main) thread after ``seconds``: the GPU's work is
    launched from Python, so the signal lands between two operations."""
    if seconds <= 0 or threading_main() is False:
        yield
        return

    def alarm(*_):
        raise ItemTimeout(f"over its cap of {seconds:.0f} s")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def threading_main() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def model_and_data(name: str, n: int, device):
    """A model of this name (FMOL's LeNet as its first objective's view) and n random samples."""
    import torch
    from fairfl.federated.models import build_model, objective_view
    g = torch.Generator().manual_seed(0)
    if name == "lstm_shakespeare":
        model = build_model(name, (80,), 81, seed=0)
        x, y = torch.randint(0, 81, (n, 80), generator=g), torch.randint(0, 81, (n,), generator=g)
    elif name == "multi_lenet":
        model = objective_view(build_model(name, (1, 36, 36), 10, seed=0, tasks=2), 0)
        x, y = torch.randn(n, 1, 36, 36, generator=g), torch.randint(0, 10, (n,), generator=g)
    else:
        model = build_model(name, (1, 28, 28), 10, seed=0)
        x, y = torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)
    return model.to(device), x.to(device), y.to(device)


def step_rate(name: str, b: int, n_inst: int, steps: int, device, reps: int, warm: bool = True,
              cap: float = math.inf) -> tuple[float, int]:
    """Instance-steps per second of one local-training call of n_inst instances, ``steps`` steps of
    b samples each, through the engine (the best of up to ``reps`` timed calls, after one untimed
    call if ``warm``; fewer where a call takes more than a quarter of ``cap``), and the calls timed."""
    import torch
    from fairfl import LocalTraining
    from fairfl.training.client import flat_params
    from fairfl.training.engine import Job, Source, execute
    from fairfl.base.seeding import Stream
    model, x, y = model_and_data(name, steps * b, device)
    start = flat_params(model).to(device)
    source = Source(x, y, 0, len(y))
    local = LocalTraining(epochs=1, batch_size=b, lr=0.01)
    times: list[float] = []
    t_start = time.perf_counter()
    for rep in range(reps + 1 if warm else reps):
        t0 = time.perf_counter()
        job = Job(model, start.expand(n_inst, -1).clone(), [source] * n_inst,
                  [Stream(rep, 0, k) for k in range(n_inst)], local, batched=batched(name))
        execute([job])
        if device.type == "cuda":
            torch.cuda.synchronize()
        took = time.perf_counter() - t0
        if rep or not warm:
            times.append(took)
        if times and time.perf_counter() - t_start + took > cap * 0.75:
            break                                    # another call would not fit the item's cap
        if not times and took > cap / 2:             # the untimed call was already long: time the next one only
            reps = 1
    return n_inst * steps / min(times), len(times)


def batched(name: str) -> bool:
    """Whether the engine stacks this model's instances: every model's, the character LSTM's too
    (``fairfl.federated.stacked_lstm``; before it, the LSTM trained one instance at a time on the reference
    path, which its anchors' "one eager" row measures)."""
    return True


def section_stacked(ctx: Context) -> dict:
    """Instance-steps per second per model and stack size (:func:`stacked_items`, breadth first),
    eager and replayed from CUDA graphs; each item capped at :data:`ITEM_CAP` s and skipped where
    the rate of the model's smaller stack predicts it would not fit; a row written and printed as
    soon as it is done, with the graphs' capture failures, the peak GPU memory and the stack sizes
    the exactness probe accepted."""
    import torch
    from fairfl.training.engine import exactness
    device = torch.device(ctx.device)
    graphs = _graphs()
    modes = ["eager"] + (["graphs"] if graphs is not None and device.type == "cuda" else [])
    steps, reps = (2, 1) if ctx.smoke else (20, 2)
    wanted = ctx.args.items
    rows: list[dict] = []
    out = {"rows": rows, "exact": exactness.EXACT, "item cap s": ITEM_CAP}
    rates: dict[tuple, float] = {}                    # (model, b, mode) -> rate at the largest N timed
    for name, b, n in stacked_items(ctx.smoke):
        if wanted and f"{name}:{b}" not in wanted:
            continue
        row = {"model": name, "b": b, "N": n, "steps": steps}
        for mode in modes:
            left = ctx.left()
            if left <= 0:
                row[mode] = "skipped: budget spent"
                continue
            cap = min(ITEM_CAP, left) if not ctx.smoke else left
            known = rates.get((name, b, mode))
            if known and n * steps * (reps + 1) / known > cap:
                row[mode] = f"skipped: {n * steps * (reps + 1) / known:.0f} s predicted at the smaller stack's rate"
                continue
            seen = dict(exactness._EXACT_SIZES)
            failed = dict(graphs.FAILED) if graphs is not None else {}
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            t0 = time.perf_counter()
            try:
                with capped(cap), (graphs.switched(mode == "graphs") if graphs is not None else contextlib.nullcontext()):
                    rate, timed = step_rate(name, b, n, steps if name != "lstm_shakespeare" else min(steps, 5), device,
                                            reps, warm=not ctx.smoke, cap=cap)
                row[mode] = round(rate)
                rates[(name, b, mode)] = rate
                if timed < reps:
                    row.setdefault("note", f"{mode}: {timed} timed call(s)")
            except ItemTimeout as e:
                row[mode] = f"stopped: {e}"
            except Exception as e:  # noqa: BLE001 - reported per item
                row[mode] = f"error: {type(e).__name__}: {str(e)[:300]}"
                row.setdefault("traceback", traceback.format_exc()[-1500:])
            row[f"{mode} s"] = round(time.perf_counter() - t0, 1)
            if device.type == "cuda":
                row[f"{mode} peak GiB"] = round(torch.cuda.max_memory_allocated(device) / 2 ** 30, 2)
                with contextlib.suppress(Exception):
                    torch.cuda.empty_cache()
            new = {m: ok for (key, m), ok in exactness._EXACT_SIZES.items() if ((key, m)) not in seen}
            if new:
                row.setdefault("probed sizes", {}).update({str(m): ok for m, ok in sorted(new.items())})
            if graphs is not None and mode == "graphs":
                fresh = [why for key, why in graphs.FAILED.items() if key not in failed]
                row["graphs failed"] = "; ".join(fresh)[:300] if fresh else ""
        anchor = ANCHORS.get((name, b), {})
        row["anchor (one eager / one graph / stacked best)"] = " / ".join(
            f"{anchor[k]:,}" for k in ("one eager", "one graph", "stacked best") if k in anchor)
        if "target" in anchor:
            row["target"] = anchor["target"]
        rows.append(row)
        ctx.row_done("stacked", out, f"{name} b={b} N={n}: " + ", ".join(f"{m} {row.get(m)}" for m in modes))
    accepted: dict[str, list] = {}
    for (key, m), ok in sorted(exactness._EXACT_SIZES.items(), key=lambda kv: kv[0][1]):
        accepted.setdefault(str(key[0][0] if isinstance(key[0], tuple) else key[0])[:60], []).append((m, ok))
    out["sizes probed (size, exact) per architecture"] = accepted
    if graphs is not None and graphs.FAILED:
        out["graphs failed (every capture)"] = {str(k)[:120]: v[:300] for k, v in graphs.FAILED.items()}
    if exactness.EXACT and not ctx.args.child and ctx.left() > 8:
        child = inexact_child(ctx)
        for other in child.get("rows", []):          # beside the exact rates, in the same rows
            for row in rows:
                if (row["model"], row["b"], row["N"]) == (other["model"], other["b"], other["N"]):
                    for mode in modes:
                        row[f"{mode}, FAIRFL_EXACT=0"] = other.get(mode, "")
        if "error" in child:
            out["FAIRFL_EXACT=0"] = child
    return out


def inexact_child(ctx: Context) -> dict:
    """The stacked rates of three models with FAIRFL_EXACT=0, in a child process (the switch is
    read at import): no probes, TF32 where torch defaults to it."""
    items = ["mlp2:10"] if ctx.smoke else ["cnn_fmnist:10", "mlp2:10", "logreg:10"]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, str(Path(__file__).resolve()), tmp, "--sections", "stacked", "--device", ctx.device,
               "--child", "--items", *items, "--stacked-budget", str(max(5, int(ctx.left() - 5)))]
        if ctx.smoke:
            cmd.append("--smoke")
        try:
            r = subprocess.run(cmd, cwd=REPO, env={**os.environ, "FAIRFL_EXACT": "0"}, capture_output=True,
                               text=True, timeout=max(10.0, ctx.left()))
        except subprocess.TimeoutExpired:
            return {"error": "the child process ran out of time"}
        path = Path(tmp) / "gpu_check.json"
        if not path.is_file():
            return {"error": f"exit {r.returncode}: {(r.stdout + r.stderr)[-1500:]}"}
        child = json.loads(path.read_text())
    sec = next((s for s in child["sections"] if s["name"] == "stacked"), None)
    if sec is None or sec.get("error"):
        return {"error": (sec or {}).get("error", "no stacked section")}
    return {"rows": sec["result"]["rows"]}


# ----------------------------------------------------------------------------- 4. reference round

def reference_configs(smoke: bool, rounds: int, runs: int):
    """FedMGDA+ Table 3's CNN on 100 clients (10 per round, b = 10): notebook 01's grid, 2
    partitions × 6 values of ε × 5 seeds = 60 runs (--smoke: on mnist_5k, 20 clients, 2 a round)."""
    from sweep_speed import sweep_a
    configs = []
    for seed in range(5):
        configs += [c.replace(seed=seed, rounds=rounds, eval_every=rounds) for c in sweep_a(rounds)[::2]]
    if smoke:
        configs = [c.replace(dataset="mnist_5k", partition=dataclasses.replace(c.partition, num_clients=20),
                             clients_per_round=2) for c in configs]
    return configs[:runs]


def section_round(ctx: Context) -> dict:
    from fairfl.runs.loop import simulate
    from fairfl.runs.sweeps import SerialBackend, run_many
    rounds = 2 if ctx.smoke else 6
    one = reference_configs(ctx.smoke, rounds, 1)[0].replace(device=ctx.device)
    t0 = time.perf_counter()
    h = simulate(one, progress=False)
    wall = time.perf_counter() - t0
    inner = h.round_time[1:-1] or h.round_time          # without round 0 (probes, first kernels) and the last (evaluation)
    per = statistics.median(inner)
    out = {"one run": {"config": one.label(), "rounds": rounds, "wall s": round(wall, 2),
                       "seconds per round (median, rounds 1..R-2)": round(per, 4),
                       "vs pfl on an H100 (1.30-1.40 s)": f"{PFL_ROUND[0] / per:.0f}-{PFL_ROUND[1] / per:.0f}x faster"}}
    ctx.report.setdefault("partial", {})["round"] = out
    ctx.check_budget("the 60-run sweep")
    runs = 2 if ctx.smoke else 60
    sweep_rounds = 2 if ctx.smoke else 3
    configs = [c.replace(device=ctx.device) for c in reference_configs(ctx.smoke, sweep_rounds, runs)]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        histories = run_many(configs, backend=SerialBackend(), root=Path(tmp), progress=False)
        wall = time.perf_counter() - t0
    second = [hh.round_time[1] for hh in histories if len(hh.round_time) > 1]
    out[f"{runs}-run sweep"] = {"rounds": sweep_rounds, "wall s": round(wall, 2),
                                "seconds per round of the sweep (median of the runs' round 1)":
                                    round(statistics.median(second), 4) if second else None,
                                "instance-steps per round": runs * configs[0].num_sampled * 48}
    return out


# ----------------------------------------------------------------------------- 6. cores of the CPU

def section_cores(ctx: Context) -> dict:
    """One run's reference round on the CPU at 1, 2, 4, 5, 8, 16 threads (those this machine has), in
    rotating order, medians; each count's updates against one thread's, bit for bit."""
    import torch
    from fairfl.training.engine import cores
    from round_speed import REFERENCE, SMOKE, time_rounds
    config = SMOKE if ctx.smoke else REFERENCE
    # 5: the round's 10 clients make at most 5 stacks (1 is not an exact stack size: benchmarks/README.md)
    counts = [n for n in (1, 2, 4, 5, 8, 16) if n <= max(2, cores.usable_cores())]
    times: dict[int, list[float]] = {n: [] for n in counts}
    bits: dict[int, list] = {n: [] for n in counts}
    out = {"usable cores": cores.usable_cores(), "config": "the reference round (FedMGDA+ Table 3's CNN, 10 clients, "
           "b = 10), local training only, on the CPU"}
    ctx.report.setdefault("partial", {})["cores"] = out
    for rep in range(1 if ctx.smoke else 3):
        for n in counts[rep % len(counts):] + counts[:rep % len(counts)]:
            ctx.check_budget(f"{n} threads")
            times[n] += time_rounds(config, True, 1, n, bits[n] if rep == 0 else None)
    base = statistics.median(times[1])
    for n in counts:
        med = statistics.median(times[n])
        out[f"{n} threads"] = {"seconds per round (median)": round(med, 3), "speed-up": round(base / med, 2),
                               "bit-identical to 1 thread": all(torch.equal(a, b) for a, b in zip(bits[1], bits[n]))}
    return out


# ----------------------------------------------------------------------------- 5. paper profiles

def section_profiles(ctx: Context) -> dict:
    """Every notebook's sweeps under the profile (paper; smoke with --smoke), read by
    ``benchmarks/notebook_sweeps.py`` (every sweep; those built from an earlier sweep's results,
    notebook 06's edge extensions and reporting sweep, counted from stand-in results and marked
    as estimates), each sweep's runs counted once per config, the first rounds of each timed on the
    device (its first 64 runs, in lockstep), and the whole sweep's time extrapolated from its
    counted client steps at that rate; a sweep left untimed by the budget takes the rate of a
    timed sweep of the same model and batch size."""
    from fairfl.runs.sweeps import SerialBackend, run_many
    profile = "smoke" if ctx.smoke else "paper"
    notebooks = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    rows, per_notebook, shakespeare = [], {}, []
    out = {"profile": profile, "note": "EXTRAPOLATED from counted client steps at the rate of each sweep's first "
           "rounds on this device (evaluations included); not measured end to end", "sweeps": rows,
           "per notebook": per_notebook}
    rounds = 1
    reserve = 0.25 * ctx.left()           # for Shakespeare setup 1, after the notebooks
    rates: dict[tuple, float] = {}        # (model, batch size) -> client steps/s measured
    for nb in notebooks:
        if ctx.left() <= reserve:
            per_notebook[nb.stem] = {"sweeps found": "not read: budget spent"}
            continue
        read = read_sweeps(nb, profile, ctx.device)
        per_notebook[nb.stem] = {"sweeps found": len(read.sweeps), "runs": len(read.runs()),
                                 "read s": round(read.seconds, 1),
                                 "statements that failed (first 3)": "; ".join(read.errors[:3])}
        # a row per sweep and kind of run (notebook 06's sweeps span five federations and four models)
        parts = []
        for sweep, new in zip(read.sweeps, read.new_runs):
            kinds: dict[tuple, list] = {}
            for c in new:         # a run asked for by an earlier sweep of the notebook is cached by then: not here
                kinds.setdefault((c.dataset, c.model, json.dumps(dict(c.model_options), sort_keys=True),
                                  c.local.batch_size), []).append(c)
            parts += [(sweep, configs) for configs in kinds.values()]
        for sweep, configs in parts:
            c0 = configs[0]
            row = {"notebook": nb.stem[:2], "sweep": sweep.name, "runs": len(configs), "rounds": c0.rounds,
                   "dataset": c0.dataset, "model": c0.model, "b": c0.local.batch_size,
                   "counted": "ESTIMATE (from stand-in results)" if sweep.from_results else "exact"}
            rows.append(row)
            if c0.dataset == "shakespeare":
                if not shakespeare or dict(c0.model_options) == dict(shakespeare[0][0].model_options):
                    shakespeare.append(configs)
                    row["note"] = "Shakespeare setup 1: below"
                else:
                    row["note"] = "not timed here (another LSTM size): benchmarks/paper_cost.py times it"
                continue
            if ctx.smoke and (any("timed s" in r for r in rows) or c0.model not in ("logreg", "mlp2")):
                row["note"] = "smoke: one small sweep is counted and timed"
                continue
            try:
                steps = sum(c.rounds * client_steps(c) for c in configs)
                row["client steps"] = round(steps)
                if ctx.left() > reserve:
                    sub = [c.replace(rounds=rounds, eval_every=rounds) for c in configs[:1 if ctx.smoke else 64]]
                    counted = sum(rounds * client_steps(c) for c in sub)
                    with tempfile.TemporaryDirectory() as tmp:
                        t0 = time.perf_counter()
                        run_many(sub, backend=SerialBackend(), root=Path(tmp), progress=False,
                                 keep_diverged=True)     # a tuning grid's largest rates may diverge
                        wall = time.perf_counter() - t0
                    rate = rates[(c0.model, c0.local.batch_size)] = counted / wall
                    row.update({"timed runs × rounds": f"{len(sub)} × {rounds}", "timed s": round(wall, 2),
                                "client steps/s": round(rate), "extrapolated s": round(steps / rate, 1)})
                elif (c0.model, c0.local.batch_size) in rates:
                    row["extrapolated s"] = round(steps / rates[(c0.model, c0.local.batch_size)], 1)
                    row["note"] = "not timed (budget): the rate of a timed sweep of this model and b"
                else:
                    row["note"] = "not timed: budget spent"
            except Exception as e:  # noqa: BLE001 - reported per sweep
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                out["ok"] = False
        per_notebook[nb.stem]["extrapolated s"] = round(sum(r.get("extrapolated s", 0.0) for r in rows
                                                            if r["notebook"] == nb.stem[:2]), 1)
        ctx.report.setdefault("partial", {})["profiles"] = out
    out["extrapolated s, every profile but Shakespeare"] = round(sum(r.get("extrapolated s", 0.0) for r in rows), 1)
    out["sweeps without an estimate"] = sum("extrapolated s" not in r and r["dataset"] != "shakespeare" for r in rows)
    try:
        out["Shakespeare setup 1"] = shakespeare_estimate(ctx, shakespeare)
    except Exception as e:  # noqa: BLE001 - reported; the notebooks' estimates stand
        out["Shakespeare setup 1"] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
        out["ok"] = False
    return out


def shakespeare_estimate(ctx: Context, captured: list[list]) -> dict:
    """DQN-Fed's Shakespeare setup 1 (its notebook's sweep, else 30 runs of the paper's setting):
    one run trained for one round on its first few roles, its rate extrapolated by counted client
    steps to one whole run and to the set."""
    from fairfl.federated.algorithms.dqnfed import DQNFed
    from fairfl.runs.loop import simulate
    from fairfl.studies.paper import dqnfed_shakespeare_config
    ctx.check_budget("Shakespeare setup 1")
    configs = [c for sweep in captured for c in sweep] or [dqnfed_shakespeare_config(DQNFed(), roles=31,
                                                                                     max_samples=2000, rounds=500)] * 30
    first = configs[0]
    roles = 2 if ctx.smoke else 4          # its first roles (the partition is LEAF's natural one, by role)
    part = first.replace(partition=dataclasses.replace(first.partition, num_clients=roles), rounds=1, eval_every=1,
                         track_improved=False, device=ctx.device)
    if ctx.smoke:
        part = part.replace(dataset_options={**dict(first.dataset_options), "max_samples": 16})
    t0 = time.perf_counter()
    simulate(part, progress=False)
    wall = time.perf_counter() - t0
    rate = client_steps(part) / wall
    one = first.rounds * client_steps(first) / rate
    total = sum(c.rounds * client_steps(c) for c in configs) / rate
    return {"timed": f"{roles} roles of {first.label()}, 1 round (its evaluations included)", "timed s": round(wall, 2),
            "client steps/s": round(rate, 1), "one run": f"{first.partition.num_clients} roles, {first.rounds} rounds",
            "one run, extrapolated s": round(one), "runs in the set": len(configs),
            "the set, extrapolated h (one GPU)": round(total / 3600, 1)}


# ----------------------------------------------------------------------------- the report

SECTION_FUNCTIONS = {"env": section_env, "tests": section_tests, "stacked": section_stacked, "round": section_round,
                     "profiles": section_profiles, "cores": section_cores}
TITLES = {"env": "1. Environment", "tests": "2. tests/test_cuda.py and every family against the CPU",
          "stacked": "3. The stacked step (instance-steps/s)", "round": "4. The reference round",
          "profiles": "5. The paper profiles (extrapolated)", "cores": "6. One run's round on the CPU's cores"}


def run_section(ctx: Context, name: str, budget: float) -> None:
    """One section, guarded: its error is reported with the traceback (and what it had done), a
    spent budget ends it as incomplete, and the report is written before and after."""
    ctx.deadline = time.perf_counter() + budget
    entry = {"name": name, "title": TITLES[name], "budget s": budget, "ok": False}
    ctx.report["sections"].append(entry)
    ctx.write()
    t0 = time.perf_counter()
    print(f"== {TITLES[name]} (budget {budget:.0f} s)", flush=True)
    try:
        entry["result"] = SECTION_FUNCTIONS[name](ctx)
        entry["ok"] = bool(entry["result"].get("ok", True)) if isinstance(entry["result"], dict) else True
    except OutOfBudget as e:
        entry["ok"], entry["incomplete"] = True, str(e)
        entry["result"] = ctx.report.get("partial", {}).get(name)
    except Exception as e:  # noqa: BLE001 - reported, and the next section runs
        entry["error"] = f"{type(e).__name__}: {e}"
        entry["traceback"] = traceback.format_exc()
        entry["result"] = ctx.report.get("partial", {}).get(name)
        print(entry["traceback"], flush=True)
    entry["seconds"] = round(time.perf_counter() - t0, 1)
    ctx.report.pop("partial", None)
    print(f"   {'ok' if entry['ok'] else 'FAILED'} in {entry['seconds']} s", flush=True)
    ctx.write()


def markdown(report: dict) -> str:
    lines = [f"# GPU check: {report['device']}{' (smoke: sizes tiny, numbers meaningless)' if report['smoke'] else ''}",
             "", f"`{report['command']}`", ""]
    if report.get("bundle"):
        lines += ["**the bundle**", ""] + md_result(report["bundle"]) + [""]
    for s in report["sections"]:
        status = ("ok" if s["ok"] else "FAILED") + (f", incomplete: {s['incomplete']}" if s.get("incomplete") else "")
        lines += [f"## {s['title']}: {status} ({s.get('seconds', '?')} s of {s['budget s']:.0f})", ""]
        if s.get("error"):
            lines += ["```", s.get("traceback", s["error"]).rstrip(), "```", ""]
        result = s.get("result")
        if isinstance(result, dict):
            lines += md_result(result)
    return "\n".join(lines) + "\n"


def md_result(result: dict, depth: int = 0) -> list[str]:
    lines = []
    for key, value in result.items():
        if key in ("traceback", "output tail"):
            lines += [f"<details><summary>{key}</summary>", "", "```", str(value).rstrip(), "```", "", "</details>", ""]
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            lines += [f"**{key}**", ""] + md_table(value) + [""]
        elif isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            lines += [f"**{key}**", ""] + md_table([{"": k, **v} for k, v in value.items()]) + [""]
        elif isinstance(value, dict):
            lines += [f"**{key}**", ""] + md_result(value, depth + 1) + [""]
        else:
            lines.append(f"- {key}: {value}")
    return lines


def md_table(rows: list[dict]) -> list[str]:
    cols = []
    for r in rows:
        cols += [k for k in r if k not in cols and k != "traceback"]

    def cell(v):
        if isinstance(v, float):
            v = f"{v:.3g}"
        elif isinstance(v, int) and not isinstance(v, bool):
            v = f"{v:,}"
        return str(v).replace("|", "\\|").replace("\n", " ")[:200]
    return (["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            + ["| " + " | ".join(cell(r.get(c, "")) for c in cols) + " |" for r in rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="folder for gpu_check.json and gpu_check.md")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="every section at a tiny size (CI: --device cpu, < 60 s)")
    ap.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    ap.add_argument("--bundle", default=None, help="the GPU bundle (make gpu-bundle): check it and stage its data")
    ap.add_argument("--data", type=Path, default=None, help="the data root to stage the bundle into")
    ap.add_argument("--items", nargs="*", default=None, help=argparse.SUPPRESS)        # model:b of section 3
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)          # the FAIRFL_EXACT=0 child
    ap.add_argument("--stacked-budget", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--budget", action="append", default=[], metavar="SECTION=SECONDS",
                    help="another budget for a section, e.g. profiles=200 in a second call that reruns it alone")
    args = ap.parse_args()
    extra_budgets = {}
    for item in args.budget:
        name, _, seconds = item.partition("=")
        try:
            if name not in SECTIONS or float(seconds) <= 0:
                raise ValueError
        except ValueError:
            ap.error(f"--budget {item!r}: expected SECTION=SECONDS with SECTION one of {', '.join(SECTIONS)}")
        extra_budgets[name] = float(seconds)
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))       # nothing the check trains or draws lands in the repository
    os.environ.setdefault("FAIRFL_RESULTS", str(scratch / "results"))
    os.environ.setdefault("FAIRFL_FIGURES", str(scratch / "figures"))
    ctx = Context(args, args.out)
    if args.bundle:
        root = args.data or Path(tempfile.mkdtemp(prefix="fairfl-data-"))
        t0 = time.perf_counter()
        try:
            from gpu_bundle import stage
            staged = stage(Path(args.bundle), root)
            os.environ["FAIRFL_DATA"] = str(root)
            ctx.report["bundle"] = {"staged into": str(root), "entries": len(staged),
                                    "seconds": round(time.perf_counter() - t0, 1)}
        except Exception as e:  # noqa: BLE001 - reported; the sections run (and say what data they miss)
            ctx.report["bundle"] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            print(ctx.report["bundle"]["traceback"], flush=True)
    os.environ.setdefault("FAIRFL_OFFLINE", "1")
    # the exactness switches (TF32 off, deterministic cuDNN) whatever --sections runs: section_env
    # reports them, but a rerun of some sections must time what a run computes
    from fairfl.training.engine import resolve_device
    resolve_device(args.device)
    budgets = dict(SMOKE_BUDGETS if args.smoke else BUDGETS)
    if args.stacked_budget:
        budgets["stacked"] = args.stacked_budget
    budgets.update(extra_budgets)
    t0 = time.perf_counter()
    for name in SECTIONS:
        if name in args.sections:
            run_section(ctx, name, budgets[name])
    ctx.report["seconds"] = round(time.perf_counter() - t0, 1)
    ctx.write()
    print(f"gpu_check: {sum(s['ok'] for s in ctx.report['sections'])} of {len(ctx.report['sections'])} sections ok "
          f"in {ctx.report['seconds']} s; report in {args.out}/gpu_check.md", flush=True)


if __name__ == "__main__":
    main()
