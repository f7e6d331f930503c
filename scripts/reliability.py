"""The reliability table in one command: the probes of the issues about trustworthy results (bad
inputs, Ctrl-C, exact resume, bit-identical runs, stale data, installing, staged figures, second-order
steps, the save hook) are tests; this runs them, grouped in rows, and prints one table.

Each row is a named selection of existing tests (``ROWS`` below: node ids, or a whole file), run by
pytest in one session (one import of torch, one load of the shared data, the same environment as
``make test``: one OpenMP thread, the smoke profile, runs, figures and outputs in a temporary folder),
with a JUnit report from which each test is counted in every row that selects it.

    .venv/bin/python scripts/reliability.py                      # every row: 214 tests, 13 min on 2 cores
    .venv/bin/python scripts/reliability.py --rows cli ctrl-c    # some rows
    .venv/bin/python scripts/reliability.py --skip install       # all but some (install builds a wheel and a venv)
    .venv/bin/python scripts/reliability.py --list               # the rows and their selections, nothing run
    .venv/bin/python scripts/reliability.py --smoke              # CI, seconds: the bad API inputs alone
    .venv/bin/python scripts/reliability.py --workers 2          # pytest-xdist, whole files per worker

Prints, on standard output, a Markdown table (row | tests | passed | failed | skipped | seconds; seconds
are the row's tests' own, setup and teardown included, so a test in two rows counts in both), the
distinct tests and the wall time, then each failing node id with its row and the first line of its
error. pytest's own progress and tracebacks go to standard error. Exit status 1 if a test failed or
errored, or a selection no longer names a test (checked before anything runs: a renamed test is
named, not silently dropped from its row); 130 after a Ctrl-C, with the table of what had finished.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Row:
    title: str
    tests: tuple[str, ...]      # node ids without parameters ("file::test", every parametrisation) or a file


def _ids(path: str, *names: str) -> tuple[str, ...]:
    return tuple(f"{path}::{n}" for n in names)


BAD = "tests/test_bad_inputs.py"
CLI = "tests/test_cli.py"
CACHE = "tests/test_cache.py"
BASELINES = "tests/test_baselines.py"

# Node ids rather than -k expressions: each row says exactly which tests it holds (--list prints them),
# and a test renamed later stops the script (missing_selections) instead of leaving its row quietly
ROWS: dict[str, Row] = {
    "api": Row("bad API inputs", (
        *_ids(BAD, "test_api_rejects_bad_input_before_any_data", "test_the_probe_is_complete"),
        # what only the data can reveal, missing datasets, unknown keys: the errors of test_config_errors.py
        # (not its round trips of valid configs)
        *_ids("tests/test_config_errors.py",
              "test_errors_are_catchable_as_value_errors",
              "test_shards_that_do_not_divide_the_data_fail_before_training",
              "test_more_clients_than_samples_fail_before_training",
              "test_model_that_does_not_fit_the_data_fails_before_training",
              "test_attribute_partition_of_a_dataset_without_groups",
              "test_unknown_normalisation",
              "test_missing_fashion_mnist_says_what_to_install",
              "test_missing_adult_says_what_to_install",
              "test_missing_mnist_5k_says_what_to_install",
              "test_offline_flag_is_respected",
              "test_unknown_dataset_name_in_load_dataset",
              "test_from_dict_rejects_unknown_keys"))),
    "cli": Row("bad CLI inputs and config files", (
        *_ids(BAD, "test_cli_rejects_bad_input_with_one_error_line",
              "test_cli_rejects_bad_config_files_with_one_error_line",
              "test_cli_names_a_results_folder_that_is_a_file"),
        # a config file read through the API: its errors are the command line's
        *_ids("tests/test_config_errors.py", "test_from_yaml_hand_written", "test_from_yaml_unknown_key",
              "test_from_yaml_exponent_without_dot"),
        # the error cases of the command line end to end (each a `python -m fairfl` subprocess)
        *_ids(CLI, "test_run_rejects_bad_input_with_one_clear_message",
              "test_bad_values_are_named_before_any_data_is_read",
              "test_a_binary_config_file_and_a_file_as_results_root_are_named",
              "test_an_unknown_parameter_is_refused_before_anything_runs",
              "test_an_unknown_notebook_is_one_clear_error",
              "test_a_mistyped_flag_or_command_gets_its_commands_usage_and_a_suggestion",
              "test_a_mistyped_yaml_key_or_option_gets_a_suggestion",
              "test_a_broken_import_file_is_one_named_error",
              "test_results_says_when_a_folder_is_not_a_run_cache",
              "test_results_into_a_closed_pipe_ends_quietly",
              "test_outside_its_environment_fairfl_says_where_to_run_it"))),
    "ctrl-c": Row("Ctrl-C / interrupts", (
        *_ids(CLI, "test_ctrl_c_during_reproduce_says_one_line_and_keeps_the_last_good_notebook",
              "test_ctrl_c_in_fairfl_run_is_one_line_and_130_however_many_and_whenever",
              "test_ctrl_c_in_reproduce_is_one_line_and_130_however_many_and_whenever",
              "test_a_ctrl_c_during_torchs_import_is_held_until_it_ends"),
        *_ids("tests/test_progress.py", "test_an_interrupted_sweep_shows_one_line_in_ipython",
              "test_an_interrupted_sweep_counts_a_run_that_ended_before_the_sweep_heard_of_it_as_cached",
              "test_ctrl_c_stops_the_workers_says_what_is_kept_and_the_next_sweep_resumes"),
        *_ids("tests/test_cores.py", "test_ctrl_c_while_threads_compute_returns_once_every_task_under_way_has_ended"))),
    "resume": Row("exact resume", (
        *_ids("tests/test_loop.py", "test_resume_from_checkpoint_equals_uninterrupted_run",
              "test_checkpoint_of_another_config_is_ignored"),
        *_ids("tests/test_engine.py", "test_a_group_stopped_and_resumed_gives_the_uninterrupted_result"),
        *_ids(BASELINES, "test_a_resumed_run_equals_the_uninterrupted_one"),
        *_ids("tests/test_determinism.py", "test_one_config_one_result_whatever_the_threads_backend_or_resume"),
        *_ids("tests/test_ditto.py", "test_checkpointed_run_resumes_exactly_with_the_clients_state"),
        *_ids("tests/test_dqnfed.py", "test_dqnfed_run_resumes_exactly_with_the_previous_model"),
        *_ids("tests/test_fmgda.py", "test_fsmgda_minibatch_runs_are_deterministic_resume_exactly_and_track_stationarity"),
        *_ids("tests/test_validation.py", "test_a_group_run_and_a_resumed_run_give_a_lone_runs_validation_scores"),
        # a checkpoint that cannot be read restarts the run instead of resuming from garbage
        *_ids(CACHE, "test_a_damaged_checkpoint_restarts_the_run",
              "test_an_empty_checkpoint_restarts_the_run_and_is_replaced"))),
    "threads": Row("bit-identical across threads/backends", (
        "tests/test_determinism.py",
        *_ids("tests/test_cores.py", "test_a_lone_run_gives_the_same_bits_on_one_two_and_three_threads",
              "test_a_group_on_every_core_gives_each_run_its_lone_bits"),
        *_ids("tests/test_engine.py", "test_every_run_of_a_group_gives_its_result_alone_bit_for_bit"),
        *_ids("tests/test_loop.py", "test_process_backend_matches_serial_keeps_its_workers_and_reports_failures"),
        *_ids("tests/test_data.py", "test_normalisation_does_not_depend_on_the_number_of_threads"),
        *_ids(BASELINES, "test_second_order_runs_side_by_side_in_threads_give_their_lone_results"))),
    "old-data": Row("no silent reuse of old data", (
        *_ids(CACHE, "test_other_data_is_another_entry",
              "test_a_changed_offline_copy_is_refused_by_its_recorded_checksum",
              "test_a_cached_run_is_read_without_loading_its_data",
              "test_pointing_fairfl_data_elsewhere_in_one_process_is_other_data",
              "test_a_dataset_built_on_another_records_that_ones_files",
              "test_a_live_process_trains_on_the_data_of_now_after_its_root_switches_or_its_files_change"),
        *_ids("tests/test_shakespeare.py", "test_changed_texts_rebuild_the_cache"))),
    "install": Row("installed like a library", ("tests/test_install.py",)),
    "staged": Row("figures staged with their notebook", (
        *_ids(CLI, "test_a_failed_reproduce_leaves_the_last_good_figures_whole_and_each_exploration_its_folder",
              "test_exploring_in_a_kernel_never_touches_the_reproduced_figures"),)),
    "second-order": Row("second-order steps that cannot explode", (
        *_ids(BASELINES, "test_fednl_on_a_singular_hessian_takes_a_finite_step",
              "test_fednew_on_an_ill_conditioned_hessian_stays_finite",
              "test_fednl_and_fednew_take_no_step_from_zero_gradients",
              "test_newton_solve_is_the_solve_where_it_can_be_and_the_minimum_norm_solution_where_not",
              "test_a_near_singular_newton_system_leaves_out_what_rounding_decides_and_bounds_the_step",
              "test_a_newton_system_holding_nan_or_inf_stops_the_run_as_diverged_naming_it",
              "test_fednew_with_a_vanishing_regulariser_descends_instead_of_exploding",
              "test_a_singular_newton_system_gives_the_newton_step_in_the_loss_directions",
              "test_a_non_finite_gradient_names_its_round_and_the_servers_step"),)),
    "index-lock": Row("JupyterLab save hook vs index.lock", (
        *_ids("tests/test_newcomer.py", "test_the_save_hook_waits_for_another_git_commands_lock",
              "test_the_save_hook_says_in_the_servers_log_when_it_cannot_refresh_the_index"),)),
}
# in this process, nothing trained: 8 s on 2 busy cores. Not "cli": its 25 `python -m fairfl` subprocesses
# (each imports fairfl afresh) took 68 s there
SMOKE_ROW = "api"


def missing_selections(names: list[str]) -> list[str]:
    """Selections that name no test: a file that is gone, or a test function no longer defined in it
    (read from the source: instant, nothing imported, so every call checks every row)."""
    out = []
    for name in names:
        for sel in ROWS[name].tests:
            path, _, func = sel.partition("::")
            file = REPO / path
            if not file.is_file():
                out.append(f"{name}: {sel} (no such file)")
            elif func and not re.search(rf"^\s*(async\s+)?def {re.escape(func)}\(", file.read_text(), re.M):
                out.append(f"{name}: {sel} (no such test in {path})")
    return out


def pytest_arguments(names: list[str]) -> list[str]:
    """The union of the rows' selections, each once; a test of a file selected whole is left to the
    file (pytest would otherwise collect and run it twice)."""
    sels = list(dict.fromkeys(sel for n in names for sel in ROWS[n].tests))
    whole = {s for s in sels if "::" not in s}
    return [s for s in sels if "::" not in s or s.split("::", 1)[0] not in whole]


def _file_of(dotted: str) -> str:
    """tests.test_cli (a JUnit classname, or a collection error's name) -> tests/test_cli.py; a class
    inside the module (tests.test_x.TestY) drops back to its module."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        path = "/".join(parts[:k]) + ".py"
        if (REPO / path).is_file():
            return path
    return "/".join(parts) + ".py"


def read_junit(path: Path) -> dict[str, dict]:
    """node id -> {"outcome": passed | failed | skipped, "seconds", "message"} from pytest's JUnit XML.
    An error (in setup or teardown, or the module failing to collect) counts as failed; a node id
    reported twice (a failing call and a failing teardown) keeps its worst outcome."""
    results: dict[str, dict] = {}
    rank = {"passed": 0, "skipped": 1, "failed": 2}
    for case in ET.parse(path).getroot().iter("testcase"):
        cls, name = case.get("classname", ""), case.get("name", "")
        if not name:        # the test a Ctrl-C stopped: pytest writes a bare <testcase/> for it
            continue
        # a module that failed to collect: classname "", name "tests.test_x"
        node = f"{_file_of(cls)}::{name}" if cls else f"{_file_of(name)}"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            outcome = "failed"
            message = (bad.get("message") or (bad.text or "").strip() or bad.tag).strip().splitlines()
            message = message[0] if message else bad.tag
        elif case.find("skipped") is not None:
            outcome, message = "skipped", (case.find("skipped").get("message") or "").splitlines()[:1]
            message = message[0] if message else ""
        else:
            outcome, message = "passed", ""
        seconds = float(case.get("time") or 0.0)
        old = results.get(node)
        if old is None or rank[outcome] > rank[old["outcome"]]:
            results[node] = {"outcome": outcome, "seconds": seconds + (old["seconds"] if old else 0.0),
                             "message": message}
        else:
            old["seconds"] += seconds
    return results


def in_row(node: str, row: Row) -> bool:
    path, _, rest = node.partition("::")
    func = rest.split("[", 1)[0]
    # a whole file's node, or "file::test" for any of its parametrisations; a module that failed
    # to collect (node = its path) fails every row that selects from it
    return any(sel == path or sel == f"{path}::{func}" or (not rest and sel.startswith(path + "::"))
               for sel in row.tests)


def table(names: list[str], skipped_rows: list[str],
          results: dict[str, dict]) -> tuple[list[str], list[tuple], list[str]]:
    """The Markdown lines, the failing tests (node id, row, first line of the error) and the rows run
    that hold no test of the report."""
    lines = ["| row | tests | passed | failed | skipped | seconds |", "|---|---:|---:|---:|---:|---:|"]
    failing, empty = [], []
    for name in ROWS:
        row = ROWS[name]
        if name in skipped_rows:
            lines.append(f"| {row.title} (`{name}`) | – | – | – | – | not run (--skip) |")
            continue
        if name not in names:
            continue
        mine = {n: r for n, r in results.items() if in_row(n, row)}
        count = {o: sum(r["outcome"] == o for r in mine.values()) for o in ("passed", "failed", "skipped")}
        seconds = sum(r["seconds"] for r in mine.values())
        lines.append(f"| {row.title} (`{name}`) | {len(mine)} | {count['passed']} | {count['failed']} | "
                     f"{count['skipped']} | {seconds:.1f} |")
        failing += [(n, name, r["message"]) for n, r in mine.items() if r["outcome"] == "failed"]
        if not mine:
            empty.append(name)
    return lines, failing, empty


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="+", choices=list(ROWS), metavar="NAME",
                    help=f"run these rows only ({', '.join(ROWS)})")
    ap.add_argument("--skip", nargs="+", choices=list(ROWS), metavar="NAME", default=[],
                    help="run every row but these")
    ap.add_argument("--list", action="store_true", help="print the rows and their selections, run nothing")
    ap.add_argument("--smoke", action="store_true", help=f"CI, seconds: the {SMOKE_ROW!r} row alone")
    ap.add_argument("--workers", type=int, default=1,
                    help="pytest-xdist workers (default 1: one process, the seconds of a row are its own)")
    args = ap.parse_args()
    if args.smoke and (args.rows or args.skip):
        ap.error("--smoke runs its own row: leave out --rows and --skip")
    if args.workers < 1:
        ap.error("--workers must be >= 1")
    names = [SMOKE_ROW] if args.smoke else [n for n in (args.rows or ROWS) if n not in args.skip]
    skipped_rows = [n for n in ROWS if n in args.skip and (not args.rows or n in args.rows)]

    # every row, whichever run: it costs nothing, and --smoke in CI then catches a test renamed in any row
    missing = missing_selections(list(ROWS))
    if args.list:
        for name, row in ROWS.items():
            print(f"{name}: {row.title} ({len(row.tests)} selection(s))")
            for sel in row.tests:
                print(f"    {sel}")
    if missing:
        print("selections that name no test (renamed or removed? update ROWS in scripts/reliability.py):",
              *missing, sep="\n  ", file=sys.stderr)
        return 1
    if args.list:
        return 0
    if not names:
        ap.error("every row is skipped: nothing to run")

    with tempfile.TemporaryDirectory(prefix="fairfl-reliability-") as tmp:
        junit = Path(tmp) / "junit.xml"
        # as `make test` runs the suite: nothing lands in the repository, one OpenMP thread per process
        # (two on two cores oversubscribe them), notebooks at their smoke size, no progress bars.
        # PYTEST_XDIST_* / PYTEST_CURRENT_TEST: set when this script itself runs under pytest
        # (tests/test_scripts.py); the inner session is not a worker of the outer one
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT_TEST"))}
        env.update(OMP_NUM_THREADS="1", FAIRFL_PROFILE="smoke", TQDM_DISABLE="1", MPLBACKEND="Agg",
                   FAIRFL_RESULTS=f"{tmp}/results", FAIRFL_FIGURES=f"{tmp}/figures", FAIRFL_OUTPUTS=f"{tmp}/outputs")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
               *(["-n", str(args.workers), "--dist", "loadfile"] if args.workers > 1 else []),
               *pytest_arguments(names)]
        print(f"reliability: {len(names)} row(s) ({', '.join(names)}): {' '.join(cmd[1:])}",
              file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        interrupted = False
        # pytest's progress and tracebacks on stderr: stdout holds the table alone (`> table.md`)
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=sys.stderr)
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            # the terminal's Ctrl-C reached pytest too (same process group): it stops the test under
            # way, writes the report of what finished and ends; wait for that, then show it
            interrupted = True
            try:
                code = proc.wait(timeout=60)
            except (KeyboardInterrupt, subprocess.TimeoutExpired):
                proc.kill()
                code = proc.wait()
        wall = time.perf_counter() - t0
        try:
            results = read_junit(junit) if junit.is_file() else {}
        except ET.ParseError:       # pytest killed while writing it
            results = {}

    if not results and not interrupted:
        # 2: interrupted, 3: internal error, 4: usage error (a node id pytest could not find), 5: nothing collected
        print(f"pytest exited with status {code} without a test report (its output is above, on stderr)")
        return 1
    lines, failing, empty = table(names, skipped_rows, results)
    print("\n".join(lines))
    print(f"\n{len(results)} distinct test(s), {wall:.0f} s wall, pytest exit status {code}"
          + (" — INTERRUPTED: the rows count only what finished" if interrupted else ""))
    if failing:
        print(f"\nfailing ({len(failing)}):")
        for node, name, message in failing:
            print(f"- `{node}` ({name}): {message}")
    if empty and not interrupted:
        # every selection names a test (checked above), so a row without one lost its tests elsewhere
        # (deselected by a -m or -k from PYTEST_ADDOPTS, say): not a pass
        print(f"\nrows that ran no test: {', '.join(empty)}")
    if interrupted:
        return 130
    # pytest failing without a failed test in the report (an error at session end): still a failure
    return 1 if failing or empty or code != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
