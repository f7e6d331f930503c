"""The switch of ``fairfl.training.engine.exactness``: ``FAIRFL_EXACT=0`` really skips the probes and the
strict modes (no probe is run, no stack is padded, MKL keeps its default mode, the weight gradient
is always taken the faster way round), and the results it gives still agree with the exact ones
to float tolerance. By default everything is exact. Each mode is a fresh process: MKL's mode is
fixed when torch first calls it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fairfl.training.engine import exactness

ROOT = Path(__file__).resolve().parent.parent

# Stacks of 1, 2 and 3 copies of one CNN instance (a stack of one or three rounds otherwise than a
# pair on this project's CPU), trained through the engine; what ran and what came out.
SCRIPT = r"""
import json, os, sys
import torch
import fairfl
from fairfl.training.client import LocalTraining, flat_params
from fairfl.training.engine import Job, Source, exactness, execute, fused
from fairfl.federated.models import build_model
from fairfl.base.seeding import Stream

torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
x, y = torch.randn(60, 1, 28, 28, generator=g), torch.randint(0, 10, (60,), generator=g)
model = build_model("cnn_fmnist", (1, 28, 28), 10, seed=0)
start = flat_params(model)
cuts, real = [], fused._chunks
fused._chunks = lambda *a: cuts.append([(len(c), n) for c, n in real(*a)]) or real(*a)
params = {}
for m in (1, 2, 3):
    job = Job(model, start.expand(m, -1).clone(), [Source(x, y, 0, 60)] * m, [Stream(3, 0, 0)] * m,
              LocalTraining(epochs=1, batch_size=20, lr=0.05), loss_after=True)
    params[m] = execute([job])[0].params
torch.save(params, sys.argv[1])
print(json.dumps({"exact": exactness.EXACT, "mkl_cbwr": os.environ.get("MKL_CBWR"),
                  "reproducible": exactness.check_reproducible(), "cuts": cuts,
                  "probed_sizes": len(exactness._EXACT_SIZES), "probes": len(exactness._PROBES),
                  "transposed_mlp": exactness.transposed_is_exact(10, 784, 200, torch.float32),
                  "transposed_probes": exactness._transposed_probe.cache_info().currsize}))
"""


def run_in_a_fresh_process(tmp_path: Path, exact: str | None) -> tuple[dict, dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "FAIRFL_EXACT")}
    if exact is not None:
        env["FAIRFL_EXACT"] = exact
    out = tmp_path / f"params_{exact}.pt"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), torch.load(out)


@pytest.mark.slow
def test_the_switch_skips_probes_and_strict_modes_and_results_stay_close(tmp_path):
    exact, exact_params = run_in_a_fresh_process(tmp_path, None)
    relaxed, relaxed_params = run_in_a_fresh_process(tmp_path, "0")
    # by default: strict MKL (the value fairfl/__init__.py sets is exactness's), probes, every stack size
    # computing a pair's bits
    assert exact["exact"] and exact["mkl_cbwr"] == exactness.MKL_CBWR and exact["probes"] >= 1
    assert exact["reproducible"] or not torch.backends.mkl.is_available()
    for m in (1, 3):
        assert torch.equal(exact_params[m][0], exact_params[2][0]), m
    # switched off: nothing probed, nothing padded, MKL in its default mode, the faster weight gradient
    assert not relaxed["exact"] and relaxed["mkl_cbwr"] is None and not relaxed["reproducible"]
    assert relaxed["probed_sizes"] == relaxed["probes"] == relaxed["transposed_probes"] == 0
    assert relaxed["transposed_mlp"] is True
    assert all(copies == 0 for cut in relaxed["cuts"] for _, copies in cut), relaxed["cuts"]
    if any(copies for cut in exact["cuts"] for _, copies in cut):      # this CPU pads some stack sizes
        assert relaxed["cuts"] != exact["cuts"]
    # ... and the results are still right to float tolerance
    for m in (1, 2, 3):
        torch.testing.assert_close(relaxed_params[m], exact_params[m].expand_as(relaxed_params[m]),
                                   rtol=1e-4, atol=1e-6)


def test_exact_is_the_default():
    assert exactness.EXACT == (os.environ.get("FAIRFL_EXACT", "1").strip() != "0")
    assert exactness.size_is_exact(None, None, None, None, None, None, None, exactness.REFERENCE_SIZE)
