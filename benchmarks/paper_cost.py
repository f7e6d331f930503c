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
batch size (a full batch by its size), whether the family fuses (``batched``). Each group is timed
once on ``--device``: a lockstep group (``fairfl.loop.simulate_group``, as a sweep trains it) of
its runs, one per algorithm first (up to ``--group``; the reference loop, which fuses nothing: up
to ``--unbatched`` runs one after the other), each for ``--rounds`` rounds with its last round
evaluated, a round capped at ``--max-steps`` client steps per run (the first clients of its pool
only: the rate of a step, not of a round, is what is measured). The first round is left out
(warm-up); the other rounds without an evaluation give the group's client steps per second, the
evaluated round's excess over them the seconds of one evaluation. A run is then extrapolated as
rounds × its client steps per round / rate + evaluations × seconds per evaluation, and a notebook's
time is the sum over its runs divided by the workers that run them side by side (on the CPU one
one-thread worker per core, as ``fairfl.backends.default_backend`` makes them, timed here as one
such worker with one thread; on a GPU one process). A real sweep fuses up to 32 runs a group on the
CPU (``fairfl.sweeps.MAX_GROUP``), more than the group timed here, so for families that fuse the
estimate errs long. On a shared machine the rates are what the machine gave at the time: the
load average is printed beside them.
"""
from __future__ import annotations

import argparse
import dataclasses
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
            key = timing_key(c)
            part = parts.setdefault((sweep.name, key), {
                "notebook": found.notebook[:2], "sweep": sweep.name, "dataset": key[0], "model": key[1], "b": key[2],
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


def sample(configs: list, group: int) -> list:
    """Up to ``group`` runs: one per algorithm first (in the notebooks' order), then others."""
    first, rest, seen = [], [], set()
    for c in configs:
        (rest if c.algorithm.name in seen else first).append(c)
        seen.add(c.algorithm.name)
    return (first + rest)[:group]


def time_key(configs: list, args, device: str) -> dict:
    """A kind of client step timed on ``device`` (module docstring): client steps per second of one
    worker, seconds of one evaluation of one run."""
    from fairfl.loop import simulate_group
    batched = configs[0].batched
    chosen = sample(configs, args.group if batched else args.unbatched)
    rounds = args.rounds
    timed = [restricted(c, args.max_steps).replace(rounds=rounds, eval_every=rounds, device=device,
                                                   checkpoint_every=rounds) for c in chosen]
    per_round = [client_steps(c) for c in timed]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    t0 = time.perf_counter()
    # a lockstep group as a sweep trains it; the reference loop fuses nothing: its runs one by one
    batches = [timed] if batched else [[c] for c in timed]
    rows = []
    for part in batches:
        histories = simulate_group(part, progress=False)
        for h in histories:
            if isinstance(h, BaseException):
                raise h
        rows.append(histories[0].round_time)      # shared by the group
    wall = time.perf_counter() - t0
    # round 0: warm-up; the rounds before the last: training; the last: training and one evaluation
    train = [statistics.fmean(rt[1:-1] if len(rt) > 2 else rt[:1]) for rt in rows]
    evaluated = [rt[-1] for rt in rows]
    if batched:
        rate = sum(per_round) / train[0]
        eval_s = max(0.0, evaluated[0] - train[0]) / len(timed)
    else:
        rate = sum(per_round) / sum(train)
        eval_s = statistics.fmean(max(0.0, e - t) for e, t in zip(evaluated, train))
    clients = sorted({c.num_sampled for c in timed})
    how = "in lockstep" if batched else "one by one"
    return {"timed": (f"{len(timed)} runs {how}" if len(timed) > 1 else "1 run") + f" × {rounds} rounds, "
                     f"{'/'.join(map(str, clients))} client(s) a round",
            "algorithms": ", ".join(dict.fromkeys(c.algorithm.name for c in timed)),
            "wall s": round(wall, 1), "client steps/s": rate, "s per evaluation": eval_s,
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
    ap.add_argument("--group", type=int, default=8,
                    help="runs timed in lockstep per kind of step, one per algorithm first (default 8)")
    ap.add_argument("--unbatched", type=int, default=2,
                    help="runs timed one by one per kind of step of the reference loop (default 2)")
    ap.add_argument("--max-steps", type=float, default=600, help="client steps a timed round has per run at most")
    ap.add_argument("--smoke", action="store_true", help="the smoke profiles, tiny timings: seconds (CI)")
    ap.add_argument("--out", type=Path, default=None, help="write the report as JSON here")
    args = ap.parse_args()
    if args.smoke:
        args.profile = "smoke"
        args.rounds, args.group, args.unbatched, args.max_steps = 2, 1, 1, 20
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("FAIRFL_OFFLINE", "1")
    scratch = Path(tempfile.mkdtemp(prefix="paper-cost-"))          # nothing lands in the repository
    os.environ.setdefault("FAIRFL_RESULTS", str(scratch / "results"))
    os.environ.setdefault("FAIRFL_FIGURES", str(scratch / "figures"))
    from fairfl.engine import cores, resolve_device
    device = str(resolve_device(args.device))
    cuda = device.startswith("cuda")
    workers = args.workers or (1 if cuda else cores.usable_cores())
    if not cuda:
        cores.set_threads(1)          # one worker of a pool: one thread (fairfl.backends)
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
              f"{r['client steps/s']:,.0f} client steps/s, {r['s per evaluation']:.2f} s per evaluation "
              f"({r['timed']}; {r['wall s']} s; load {r['load average (1 min) before']})"), flush=True)

    for p in parts:
        r = rates.get(p["key"], {})
        if "client steps/s" in r:
            p["extrapolated s"] = (p["client steps"] / r["client steps/s"] + p["evaluations"] * r["s per evaluation"]) \
                / workers
    notebook_rows = []
    for stem, c in counted.items():
        mine = c["parts"]
        row = {"notebook": stem, "runs": sum(p["runs"] for p in mine),
               "client steps": round(sum(p["client steps"] for p in mine)),
               "counted": "exact" if all(p["counted"] == "exact" for p in mine) else "partly ESTIMATE"}
        if mine and all("extrapolated s" in p for p in mine):
            row["extrapolated s"] = sum(p["extrapolated s"] for p in mine)
            row[f"EXTRAPOLATED ({device}, {workers} worker{'s' * (workers > 1)})"] = hours(row["extrapolated s"])
        else:
            row[f"EXTRAPOLATED ({device}, {workers} worker{'s' * (workers > 1)})"] = "not timed" if mine else "no sweep"
        notebook_rows.append(row)
    for p in parts:
        p["rounds"] = "/".join(str(r) for r in sorted(p["rounds"]))
        p["client steps"] = round(p["client steps"])
        r = rates.get(p["key"], {})
        p["client steps/s"] = r.get("client steps/s", "")
        p["EXTRAPOLATED"] = hours(p["extrapolated s"]) if "extrapolated s" in p else "not timed"
    time_col = f"EXTRAPOLATED ({device}, {workers} worker{'s' * (workers > 1)})"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [f"# {args.profile} profile: cost per notebook on {device}{' (smoke: numbers mean nothing)' if args.smoke else ''}",
             "", f"{PROFILE_NOTE}; {workers} run(s) side by side. Rates as this machine gave them "
             f"(load average {load:.2f} at the end; a shared machine's rates vary).", ""]
    lines += md_table(notebook_rows, ["notebook", "runs", "client steps", time_col, "counted"])
    lines += ["", "## Parts", ""]
    lines += md_table(parts, ["notebook", "sweep", "dataset", "model", "b", "runs", "rounds", "client steps",
                              "client steps/s", "EXTRAPOLATED", "counted"])
    lines += ["", "## Kinds of client step, timed", ""]
    lines += md_table([{"dataset": k[0], "model": k[1], "b": k[2], "family": k[3], **v} for k, v in rates.items()],
                      ["dataset", "model", "b", "family", "client steps/s", "s per evaluation", "timed", "algorithms",
                       "wall s", "load average (1 min) before", "error"])
    if problems:
        lines += ["", "## Problems", ""] + [f"- {p}" for p in problems]
    total = sum(r.get("extrapolated s", 0.0) for r in notebook_rows)
    lines += ["", f"paper_cost: {len(notebook_rows)} notebook(s), {sum(r['runs'] for r in notebook_rows):,} runs, "
              f"{sum(r['client steps'] for r in notebook_rows):,} client steps, EXTRAPOLATED {hours(total)} on {device} "
              f"with {workers} worker(s) ({time.perf_counter() - t_start:.0f} s to count and time)"]
    text = "\n".join(lines)
    print(text, flush=True)
    if args.out:
        report = {"profile": args.profile, "device": device, "workers": workers, "note": PROFILE_NOTE,
                  "load average at the end": load, "notebooks": notebook_rows,
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
