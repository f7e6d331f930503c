#!/usr/bin/env bash
# The GPU check on a lent GPU machine, in one call: install the bundled wheels, stage the bundled
# data, run benchmarks/gpu_check.py into the report folder under a hard time limit (the report is
# written after every section, so what ran comes back even if the limit strikes), keep the log.
#
# Here first, on the CPU machine:   make gpu-bundle        (fills .gpu-bundle/, prints its size)
# Then the one device call (the run tool), from the repository's root:
#   command:   bash benchmarks/gpu_run.sh "$OUT"
#   carry:     [".gpu-bundle"]
#   timeout_s: 600
# It writes $OUT/gpu_check.md, $OUT/gpu_check.json, $OUT/core_contention.md and $OUT/gpu_run.log, each
# row of the check as soon as it is done (a limit keeps what ran). At most 8 minutes, about 6.5 as measured,
# so that a second call for what failed fits in a lease of 15: the check stops at GPU_CHECK_SECONDS (470 s: its
# sections' budgets add up to 445 s). benchmarks/core_contention.py (the machine's cores side by side: why one
# run's round, 10 clients, at most 5 stacks of 2, gains less than its thread count) runs only when asked,
# CONTENTION_SECONDS=45 (widths up to the usable cores): three calls measured it alike
# (benchmarks/measured/gpu/README.md). The wheels and data take seconds. To rerun only some sections:
#   command:   GPU_CHECK_ARGS="--sections stacked round --budget stacked=200" bash benchmarks/gpu_run.sh "$OUT"
set -u
OUT=${1:-${OUT:?usage: gpu_run.sh REPORT_FOLDER}}
LIMIT=${GPU_CHECK_SECONDS:-470}
PY=${PYTHON:-python3}          # the machine's Python, with its torch
cd "$(dirname "$0")/.." || exit 1
mkdir -p "$OUT"
{
  echo "gpu_run.sh: $(date -u +%FT%TZ) on $(hostname), limit ${LIMIT} s"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"
  if ls .gpu-bundle/wheels/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .gpu-bundle/wheels/*.whl || echo "gpu_run.sh: installing the bundled wheels failed"
  else
    echo "gpu_run.sh: no .gpu-bundle/wheels (make gpu-bundle here, and carry .gpu-bundle)"
  fi
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TQDM_DISABLE=1 MPLBACKEND=Agg
  # shellcheck disable=SC2086  # GPU_CHECK_ARGS holds several arguments
  timeout -k 10 "$LIMIT" "$PY" benchmarks/gpu_check.py "$OUT" --device cuda --bundle .gpu-bundle \
    --data /tmp/fairfl-data ${GPU_CHECK_ARGS:-}
  echo "gpu_run.sh: gpu_check.py exited with $? (124: stopped at the limit; the report holds the sections done)"
  if [ "${CONTENTION_SECONDS:-0}" != 0 ]; then
    # the data gpu_check.py staged; the output as it comes (a line per repetition), so that a limit keeps
    # what was measured. Two clients a copy: one run's round of 10 clients makes at most 5 stacks of 2
    # (no smaller stack is exact on these kernels: benchmarks/README.md). Widths up to the usable cores.
    cores=$(nproc)
    widths=$(for w in 1 2 4 5 8 16; do [ "$w" -le "$cores" ] && echo "$w"; done)
    # shellcheck disable=SC2086  # one argument per width
    FAIRFL_DATA=/tmp/fairfl-data timeout -k 5 "${CONTENTION_SECONDS}" "$PY" benchmarks/core_contention.py \
      --clients 2 --reps 2 --widths $widths | tee "$OUT/core_contention.md"
    echo "gpu_run.sh: core_contention.py exited with ${PIPESTATUS[0]}"
  fi
} 2>&1 | tee "$OUT/gpu_run.log"
