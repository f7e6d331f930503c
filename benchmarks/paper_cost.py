"""What each notebook's ``paper`` profile costs: its runs and client steps, counted from the
notebook itself, and its time on this device, EXTRAPOLATED from a few timed rounds (never run end
to end).

    python benchmarks/paper_cost.py --device cpu [--out cost.json] [--notebooks 02 06]
    python benchmarks/paper_cost.py --smoke          # CI: the smoke profiles, tiny timings (seconds)

**Counting** (``benchmarks/notebook_sweeps.py``, the reader ``gpu_check.py`` uses too): each
notebook's sweeps under the profile, read by executing the statements that build them with the
training calls intercepted. A run is a distinct config (``run_many`` trains a repeat once);
its client steps are rounds × sampled clients × the mean local steps of a client
(``notebook_sweeps.client_steps``). Sweeps built from an earlier sweep's results (notebook 06's
edge extensions and reporting sweep) are counted from stand-in results and marked as estimates
(the reader's docstring says how).

**Timing.** The runs are grouped by what a client step costs: dataset, model (and its options),
batch size (a full batch by its size), whether the family fuses (``batched``). Each kind is timed
once per notebook on ``--device`` (:func:`time_key`), with the notebook's own runs dealt round robin
over its algorithms (what a round costs depends on the algorithm: a second-order method's Hessian
products, Ditto's personal model, DQN-Fed's BFGS pairs, losses tracked for improved clients; notebook
02's four Adult methods are not notebook 06's nineteen): a family that
fuses as one lockstep group (``fairfl.runs.loop.simulate_group``, as a sweep trains it), as large as a
sweep's groups (``fairfl.runs.sweeps.MAX_GROUP``) where ``--key-seconds`` of training allow, else smaller
(a pilot of two runs gives the seconds of a step): the size of the group changes the rate of a step
(stack sizes, the coordination of its runs), so the group timed is made as large as a sweep's can be;
the reference loop (Shakespeare's LSTM), which fuses nothing, one run at a time with a round cut at
``--max-steps`` client steps (the first clients of its pool: the rate of a step is what is measured).
Each is trained ``--rounds`` rounds, the last evaluated: round 0 is left out (warm-up), the rounds
between give the client steps per second, the last round's excess over them the seconds of one
evaluation. A run's time is then rounds × its client steps per round / rate + its evaluations ×
seconds per evaluation, and a notebook's time the sum over its runs divided by the workers that run
them side by side (on the CPU one one-thread worker per core, as ``fairfl.training.backends.default_backend``
makes them, timed here as one such worker: one thread; on a GPU one process). The runs of a timing
that diverge (a tuning grid's largest rates) are left out and the kind timed again.

On a shared machine a rate is what the machine gave at the time: the load average is printed beside
it, and on the CPU the share of its core the timing process got (its CPU time over the wall time); the
last time column divides that share out, an estimate of the time were the cores the sweep's own. A
real sweep's groups are often larger than the group timed, so for families that fuse the estimate
errs long.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "benchmarks"))

from notebook_sweeps import client_steps, read_sweeps, train_sizes  # noqa: E402

PROFILE_NOTE = ("EXTRAPOLATED: counted client steps at the rate of a few timed rounds of each kind of step on this "
                "device, never run end to end")


# ----------------------------------------------------------------------------- counting

def timing_key(config) -> tuple:
    """What a client step of ``config`` costs depends on: dataset, model and its options, the batch
    (a full batch named by its mean size), whether the family fuses, the device type."""
    b = config.local.batch_size
    if b is None:
        sizes = train_sizes(config)
        b = f"full ≈ {round(statistics.fmean(sizes)):,}"
    options = json.dumps(dict(config.model_options), sort_keys=True) if config.model_options else ""
    return (config.dataset, config.model + (f" {options}" if options else ""), str(b),
            "batched" if config.batched else "unbatched")


def evaluations(config) -> int:
    """Evaluations of a run: the initial one, every ``eval_every`` rounds, and the last round."""
    return 1 + config.rounds // config.eval_every + (config.rounds % config.eval_every != 0)


def count_notebook(path: Path, profile: str, device: str) -> dict:
    """The notebook's sweeps read and counted: a part per (sweep, dataset, model, timing key)."""
    found = read_sweeps(path, profile, device)
    parts = {}
    for sweep, new in zip(found.sweeps, found.new_runs):
        for c in new:
            key = (found.notebook[:2], *timing_key(c))    # timed per notebook: its own mix of algorithms
            part = parts.setdefault((sweep.name, key), {
                "notebook": found.notebook[:2], "sweep": sweep.name, "dataset": key[1], "model": key[2], "b": key[3],
                "runs": 0, "rounds": set(), "client steps": 0.0, "evaluations": 0,
                "counted": "ESTIMATE (built from stand-in results)" if sweep.from_results else "exact",
                "key": key, "configs": []})
            part["runs"] += 1
            part["rounds"].add(c.rounds)
            part["client steps"] += c.rounds * client_steps(c)
            part["evaluations"] += evaluations(c)
            part["configs"].append(c)
    return {"read": found, "parts": list(parts.values())}


# ----------------------------------------------------------------------------- timing

def restricted(config, max_steps: float):
    """``config`` with a round's clients cut to the first ones of its pool whose steps add up to at
    most ``max_steps`` (at least one client), where its round takes more; else unchanged."""
    if client_steps(config) <= max_steps:
        return config
    sizes = train_sizes(config)
    pool = list(config.eligible_clients) if config.eligible_clients else list(range(len(sizes)))
    local, first, total = config.local, [], 0.0
    for i in pool:
        n = sizes[i]
        steps = local.steps if local.steps is not None else local.epochs * (math.ceil(n / local.batch_size)
                                                                            if local.batch_size else 1)
        if first and total + steps > max_steps:
            break
        first.append(i)
        total += steps
    try:
        return config.replace(eligible_clients=tuple(first), clients_per_round=len(first)).validate()
    except Exception:  # noqa: BLE001 - a config that cannot be cut (an attacker outside the first clients): whole
        return config


def rates_of(config) -> tuple[float, float]:
    """A run's local and server learning rates (a server rule without one: 0)."""
    server = getattr(config.algorithm, "server_lr", None)
    return float(config.local.lr), float(server) if isinstance(server, (int, float)) else 0.0


def sample(configs: list, group: int) -> list:
    """Up to ``group`` runs, dealt round robin over the algorithms (in the notebooks' order); of an
    algorithm's runs those with the smallest learning rates first (what a step costs does not depend
    on them, and a tuning grid's largest rates diverge within a few rounds)."""
    by_algorithm: dict[str, list] = {}
    for c in configs:
        by_algorithm.setdefault(c.algorithm.name, []).append(c)
    ordered = [sorted(runs, key=rates_of) for runs in by_algorithm.values()]
    dealt = [runs[i] for i in range(max(map(len, ordered))) for runs in ordered if i < len(runs)]   # round robin
    return dealt[:group]


class Diverged(Exception):
    """Runs of a timed group diverged (a tuning grid's largest rates do): they are left out and it is timed again."""

    def __init__(self, configs: list):
        super().__init__(f"{len(configs)} run(s) diverged")
        self.configs = configs


def measure(configs: list, rounds: int, device: str, batched: bool) -> dict:
    """``configs`` trained for ``rounds`` rounds, the last evaluated: as one lockstep group (a family
    that fuses, as a sweep trains it) or one by one (the reference loop, which fuses nothing). Round 0
    is warm-up; the rounds between it and the last give the seconds of a training round, the last's
    excess over them the seconds of an evaluation. Raises :class:`Diverged` naming the runs that did."""
    from fairfl.base.errors import TrainingDivergedError
    from fairfl.runs.loop import simulate_group
    timed = [c.replace(rounds=rounds, eval_every=rounds, device=device, checkpoint_every=rounds) for c in configs]
    wall0, cpu0 = time.perf_counter(), time.process_time()
    rows, diverged = [], []
    for group, originals in ([(timed, configs)] if batched else [([t], [c]) for t, c in zip(timed, configs)]):
        histories = simulate_group(group, progress=False)
        for h, c in zip(histories, originals):
            if isinstance(h, TrainingDivergedError):
                diverged.append(c)
            elif isinstance(h, BaseException):
                raise h
        if not diverged:
            rows.append(histories[0].round_time)        # a lockstep group's rounds are shared
    if diverged:
        raise Diverged(diverged)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    train = [statistics.fmean(rt[1:-1] if len(rt) > 2 else rt[:1]) for rt in rows]
    evaluated = [max(0.0, rt[-1] - t) for rt, t in zip(rows, train)]
    per_round = [client_steps(c) for c in timed]
    return {"steps": sum(per_round), "train s": sum(train), "eval s per run": sum(evaluated) / len(timed),
            "wall": wall, "cpu": cpu, "runs": timed}


def time_key(configs: list, args, device: str) -> dict:
    """A kind of client step timed on ``device`` (module docstring): client steps per second of one
    worker, seconds of one evaluation of one run, and the share of a core this process had meanwhile.

    A family that fuses is timed as a lockstep group as large as a sweep makes them (``--group``,
    default ``fairfl.runs.sweeps.MAX_GROUP``) or as ``--key-seconds`` allows, whichever is smaller: a pilot
    of two runs gives the seconds of a client step, from which the group's size (at least two) and,
    where one run's round alone would take more, its clients (:func:`restricted`) are chosen. A
    group's size changes the rate of a step (notebook 02's Adult runs, which a sweep fuses 32 at a
    time, measured here at 28,000 client steps/s in a pilot of two and 17,000 in a group of 32), so
    the group is kept as large as the budget allows (a larger group than the pilot's may also take
    longer than the budget); the reference loop is timed one run after another (``--unbatched``
    runs, rounds cut at ``--max-steps``)."""
    from fairfl.runs.sweeps import MAX_GROUP
    batched = configs[0].batched
    excluded: set[str] = set()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    t0 = time.perf_counter()
    pilot_note = ""
    for _ in range(8):
        candidates = [c for c in configs if c.key() not in excluded]
        if not candidates:
            raise RuntimeError("every run of this kind diverged when timed")
        try:
            cap = min(len(candidates), args.group or MAX_GROUP["cuda" if device.startswith("cuda") else "cpu"])
            if batched and cap > 1:
                pilot_runs = [restricted(c, args.max_steps) for c in sample(candidates, min(2, cap))]
                pilot = measure(pilot_runs, 3, device, batched)
                step_s = pilot["train s"] / pilot["steps"]
                per_run = statistics.fmean(client_steps(c) for c in candidates)
                # the steps a run may have in a timed round: all of its round where two runs fit the budget
                fits = args.key_seconds / (args.rounds * step_s)
                size = max(min(2, cap), min(cap, int(fits / per_run)))
                chosen = [restricted(c, max(1.0, fits / size)) for c in sample(candidates, size)]
                pilot_note = (f"pilot: {len(pilot_runs)} run(s), {1 / step_s:,.0f} client steps/s")
            else:           # the reference loop (or a group of one): no pilot
                chosen = [restricted(c, args.max_steps) for c in sample(candidates, cap if batched else args.unbatched)]
            m = measure(chosen, args.rounds, device, batched)
            break
        except Diverged as e:
            excluded |= {c.key() for c in e.configs}
    else:
        raise RuntimeError("runs kept diverging when timed")
    rate = m["steps"] / m["train s"]
    share = min(1.0, m["cpu"] / m["wall"]) if m["wall"] > 0 else float("nan")
    clients = sorted({c.num_sampled for c in m["runs"]})
    how = "in lockstep" if batched else "one by one"
    n = len(m["runs"])
    return {"timed": (f"{n} runs {how}" if n > 1 else "1 run") + f" × {args.rounds} rounds, "
                     f"{'/'.join(map(str, clients))} client(s) a round" + (f"; {pilot_note}" if pilot_note else ""),
            "algorithms": ", ".join(dict.fromkeys(c.algorithm.name for c in m["runs"])),
            "left out (diverged)": len(excluded), "wall s": round(time.perf_counter() - t0, 1),
            "client steps/s": rate, "s per evaluation": m["eval s per run"], "CPU share": share,
            "load average (1 min) before": round(load, 2)}


# ----------------------------------------------------------------------------- the report

def hours(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def md_table(rows: list[dict], cols: list[str]) -> list[str]:
    def cell(v):
        if isinstance(v, float):
            v = f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
        elif isinstance(v, int) and not isinstance(v, bool):
            v = f"{v:,}"
        return str(v).replace("|", "\\|")
    return (["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            + ["| " + " | ".join(cell(r.get(c, "")) for c in cols) + " |" for r in rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--profile", default="paper", help="the profile to count (default paper)")
    ap.add_argument("--notebooks", nargs="*", default=None, help="their numbers, e.g. 02 06 (default: every one)")
    ap.add_argument("--workers", type=int, default=None,
                    help="runs side by side (default: one per usable core on the CPU, 1 on a GPU)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds timed per kind of step (default 4)")
    ap.add_argument("--group", type=int, default=None,
                    help="the largest lockstep group timed, one run per algorithm first (default: a sweep's largest, "
                         "fairfl.runs.sweeps.MAX_GROUP)")
    ap.add_argument("--key-seconds", type=float, default=60,
                    help="seconds of training each kind of step is given, which bounds its group (default 60)")
    ap.add_argument("--unbatched", type=int, default=1,
                    help="runs timed one by one per kind of step of the reference loop (default 1)")
    ap.add_argument("--max-steps", type=float, default=300,
                    help="client steps a round of the reference loop, or of a pilot, has per run at most (default 300)")
    ap.add_argument("--smoke", action="store_true", help="the smoke profiles, tiny timings: seconds (CI)")
    ap.add_argument("--out", type=Path, default=None, help="write the report as JSON here")
    args = ap.parse_args()
    if args.smoke:
        args.profile = "smoke"
        args.rounds, args.group, args.unbatched, args.max_steps, args.key_seconds = 2, 1, 1, 20, 1
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("FAIRFL_OFFLINE", "1")
    scratch = Path(tempfile.mkdtemp(prefix="paper-cost-"))          # nothing lands in the repository
    os.environ.setdefault("FAIRFL_RESULTS", str(scratch / "results"))
    os.environ.setdefault("FAIRFL_FIGURES", str(scratch / "figures"))
    from fairfl.training.engine import cores, resolve_device
    device = str(resolve_device(args.device))
    cuda = device.startswith("cuda")
    workers = args.workers or (1 if cuda else cores.usable_cores())
    if not cuda:
        cores.set_threads(1)          # one worker of a pool: one thread (fairfl.training.backends)
    notebooks = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if args.notebooks:
        notebooks = [nb for nb in notebooks if nb.stem[:2] in set(args.notebooks)]
    t_start = time.perf_counter()

    counted, parts, problems = {}, [], []
    for nb in notebooks:
        c = count_notebook(nb, args.profile, "cpu")
        counted[nb.stem] = c
        parts += c["parts"]
        read = c["read"]
        problems += [f"{nb.stem}: {e}" for e in read.errors]
        print(f"read {nb.stem}: {len(read.sweeps)} sweep(s), {len(read.runs())} runs, {read.statements[0]} of "
              f"{read.statements[1]} statements executed, {read.seconds:.1f} s", flush=True)

    keys: dict[tuple, list] = {}
    for p in parts:
        keys.setdefault(p["key"], []).extend(p["configs"])
    rates = {}
    for key, configs in keys.items():
        try:
            rates[key] = time_key(configs, args, device)
        except Exception as e:  # noqa: BLE001 - reported; the counts stand
            rates[key] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            problems.append(f"timing {key}: {rates[key]['error']}")
        r = rates[key]
        print(f"timed {' / '.join(key)}: " + (r["error"] if "error" in r else
              f"{r['client steps/s']:,.1f} client steps/s, {r['s per evaluation']:.2f} s per evaluation, "
              f"{r['CPU share']:.0%} of a core ({r['timed']}; {r['wall s']} s; load {r['load average (1 min) before']})"),
              flush=True)

    # a run's time: its steps at the measured rate and its evaluations; the runs shared among the workers.
    # On the CPU also at the rate per CPU-second (what the core this process shared would give undisturbed)
    by_cpu = not cuda
    for p in parts:
        r = rates.get(p["key"], {})
        if "client steps/s" in r:
            p["extrapolated s"] = (p["client steps"] / r["client steps/s"] + p["evaluations"] * r["s per evaluation"]) \
                / workers
            p["by CPU time s"] = p["extrapolated s"] * r["CPU share"]
    measured_col = f"EXTRAPOLATED, as measured ({device}, {workers} worker{'s' * (workers > 1)})"
    cpu_col = "EXTRAPOLATED, cores to itself (by CPU time)"
    notebook_rows = []
    for stem, c in counted.items():
        mine = c["parts"]
        row = {"notebook": stem, "runs": sum(p["runs"] for p in mine),
               "client steps": round(sum(p["client steps"] for p in mine)),
               "counted": "exact" if all(p["counted"] == "exact" for p in mine) else "partly ESTIMATE"}
        if mine and all("extrapolated s" in p for p in mine):
            row["extrapolated s"] = sum(p["extrapolated s"] for p in mine)
            row["by CPU time s"] = sum(p["by CPU time s"] for p in mine)
            row[measured_col], row[cpu_col] = hours(row["extrapolated s"]), hours(row["by CPU time s"])
        else:
            row[measured_col] = row[cpu_col] = "not timed" if mine else "no sweep"
        notebook_rows.append(row)
    for p in parts:
        p["rounds"] = "/".join(str(r) for r in sorted(p["rounds"]))
        p["client steps"] = round(p["client steps"])
        r = rates.get(p["key"], {})
        p["client steps/s"] = r.get("client steps/s", "")
        p["CPU share"] = f"{r['CPU share']:.0%}" if "CPU share" in r else ""
        p[measured_col] = hours(p["extrapolated s"]) if "extrapolated s" in p else "not timed"
        p[cpu_col] = hours(p["by CPU time s"]) if "by CPU time s" in p else "not timed"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    cols = [measured_col] + ([cpu_col] if by_cpu else [])
    lines = [f"# {args.profile} profile: cost per notebook on {device}{' (smoke: numbers mean nothing)' if args.smoke else ''}",
             "", f"{PROFILE_NOTE}; {workers} run(s) side by side. Rates as this machine gave them: load average "
             f"{load:.2f} at the end on {cores.usable_cores()} usable cores"
             + ("; the timing process had the CPU share shown of its one core, and the last column divides that out "
                "(the time were the cores its own, other processes' cache and memory traffic aside)" if by_cpu else "")
             + ".", ""]
    lines += md_table(notebook_rows, ["notebook", "runs", "client steps", *cols, "counted"])
    lines += ["", "## Parts", ""]
    lines += md_table(parts, ["notebook", "sweep", "dataset", "model", "b", "runs", "rounds", "client steps",
                              "client steps/s", *(["CPU share"] if by_cpu else []), *cols, "counted"])
    lines += ["", "## Kinds of client step, timed", ""]
    lines += md_table([{"notebook": k[0], "dataset": k[1], "model": k[2], "b": k[3], "family": k[4], **v}
                       for k, v in rates.items()],
                      ["notebook", "dataset", "model", "b", "family", "client steps/s", "s per evaluation",
                       *(["CPU share"] if by_cpu else []), "timed", "algorithms", "left out (diverged)", "wall s",
                       "load average (1 min) before", "error"])
    if problems:
        lines += ["", "## Problems", ""] + [f"- {p}" for p in problems]
    total = sum(r.get("extrapolated s", 0.0) for r in notebook_rows)
    total_cpu = sum(r.get("by CPU time s", 0.0) for r in notebook_rows)
    lines += ["", f"paper_cost: {len(notebook_rows)} notebook(s), {sum(r['runs'] for r in notebook_rows):,} runs, "
              f"{sum(r['client steps'] for r in notebook_rows):,} client steps, EXTRAPOLATED {hours(total)} on {device} "
              f"with {workers} worker(s)" + (f" ({hours(total_cpu)} by CPU time)" if by_cpu else "")
              + f"; {time.perf_counter() - t_start:.0f} s to count and time"]
    text = "\n".join(lines)
    print(text, flush=True)
    if args.out:
        report = {"profile": args.profile, "device": device, "workers": workers, "note": PROFILE_NOTE,
                  "load average at the end": load, "usable cores": cores.usable_cores(), "notebooks": notebook_rows,
                  "parts": [{k: v for k, v in p.items() if k not in ("configs", "key")} for p in parts],
                  "timed": [{"key": list(k), **v} for k, v in rates.items()], "problems": problems,
                  "reader": {stem: {"sweeps": [{"name": s.name, "cell": s.cell, "asked": len(s.configs),
                                                "new runs": len(new), "from results": s.from_results}
                                               for s, new in zip(c["read"].sweeps, c["read"].new_runs)],
                                    "statements executed": c["read"].statements, "errors": c["read"].errors,
                                    "seconds": round(c["read"].seconds, 1)} for stem, c in counted.items()},
                  "markdown": text}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {args.out}")
    if problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
