"""``benchmarks/gpu_check.py`` brings back a complete report from its one call on a GPU machine,
checked here on the CPU (its smoke size, ``--device cpu``):

* where a GPU's kernels make only pairs exact (every other stack size padded or cut), the stacked
  section still reaches every model inside a small budget (breadth first, each item capped);
* stopped from outside in the middle of a section, the report on disk holds every row done, the
  section under way included;
* a rerun of some sections (``--sections stacked``) sets the device's exactness switches first,
  as the environment section does;
* the families' CPU half is taken from the bundle when it was computed from this code, and
  computed again otherwise.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_check  # noqa: E402

MODELS = {name for name, _, _ in gpu_check.stacked_items(smoke=True)}


def _main(monkeypatch, *argv: str) -> None:
    """gpu_check's main() in this process, its changes to the environment undone after it (as a
    script it sets MPLBACKEND=Agg, TQDM_DISABLE, FAIRFL_* for itself and its children; left in
    this test worker, MPLBACKEND=Agg reached a later test's JupyterLab kernel, which then showed
    no figure)."""
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", *argv])
    before = dict(os.environ)
    try:
        gpu_check.main()
    finally:
        os.environ.clear()
        os.environ.update(before)


def test_the_stacked_section_reaches_every_model_where_only_pairs_are_exact(tmp_path, monkeypatch):
    import fairfl.training.engine.fused as fused
    asked = []

    def pairs_only(model, names, template, row, cfg, device, dtype, m):
        asked.append(m)
        return m == 2
    monkeypatch.setattr(fused, "size_is_exact", pairs_only)     # as a GPU whose kernels change with every stack size
    monkeypatch.setenv("FAIRFL_RESULTS", str(tmp_path / "results"))
    _main(monkeypatch, str(tmp_path / "out"), "--smoke", "--device", "cpu", "--sections", "stacked",
          "--stacked-budget", "20")
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    (section,) = report["sections"]
    rows = section["result"]["rows"]
    assert {r["model"] for r in rows} == MODELS
    assert all(isinstance(r["eager"], int) and r["eager"] > 0 for r in rows), rows
    assert any(m != 2 for m in asked)                             # stacks other than pairs were asked for, refused


def test_a_check_stopped_mid_section_leaves_the_rows_it_did(tmp_path):
    """Stopped (SIGTERM, as `timeout` does) as soon as the stacked section has printed its second
    row: the report on disk already holds both rows, marked as a section under way."""
    out = tmp_path / "out"
    env = {**os.environ, "FAIRFL_RESULTS": str(tmp_path / "results"), "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1",
           "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "benchmarks/gpu_check.py", str(out), "--smoke", "--device", "cpu",
                             "--sections", "env", "stacked", "round"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    said = []
    try:
        for line in proc.stdout:
            said.append(line)
            if sum(" b=" in ln and " N=" in ln for ln in said) == 2:
                proc.terminate()
                break
        proc.wait(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode not in (0, None), "".join(said)
    report = json.loads((out / "gpu_check.json").read_text())
    env_section, stacked = report["sections"]
    assert env_section["ok"] and env_section["seconds"] >= 0
    assert "seconds" not in stacked and stacked["incomplete"].startswith("under way")
    assert len(stacked["result"]["rows"]) >= 2
    assert "under way" in (out / "gpu_check.md").read_text()


def test_a_rerun_of_some_sections_sets_the_device_switches_first(tmp_path, monkeypatch):
    import fairfl.training.engine
    seen = []
    real = fairfl.training.engine.resolve_device

    def recording(spec):
        seen.append((spec, [s["name"] for s in ctx_sections]))
        return real(spec)
    ctx_sections: list = []
    real_run_section = gpu_check.run_section

    def run_section(ctx, name, budget):
        ctx_sections.append({"name": name})
        return real_run_section(ctx, name, budget)
    monkeypatch.setattr(fairfl.training.engine, "resolve_device", recording)
    monkeypatch.setattr(gpu_check, "run_section", run_section)
    monkeypatch.setenv("FAIRFL_RESULTS", str(tmp_path / "results"))
    _main(monkeypatch, str(tmp_path / "out"), "--smoke", "--device", "cpu", "--sections", "stacked",
          "--items", "mlp2:10")
    assert seen and seen[0] == ("cpu", [])                      # before the first section
    assert [s["name"] for s in ctx_sections] == ["stacked"]


@pytest.mark.slow
def test_the_families_cpu_half_comes_from_the_bundle_only_when_computed_from_this_code(tmp_path, monkeypatch):
    monkeypatch.setenv("FAIRFL_RESULTS", str(tmp_path / "results"))
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    reference = gpu_check.cpu_reference(smoke=True)
    assert set(reference["families"]) == set(gpu_check.family_configs(smoke=True))
    assert all("kernel spread" in row for row in reference["families"].values()), reference
    for name in reference["families"]:                            # a marked CPU half: where it is used, it shows
        reference["families"][name]["cpu s"] = 123.0
    (bundle / "families_cpu.json").write_text(json.dumps(reference))
    _main(monkeypatch, str(tmp_path / "a"), "--smoke", "--device", "cpu", "--sections", "tests", "--bundle", str(bundle))
    tests = json.loads((tmp_path / "a" / "gpu_check.json").read_text())["sections"][0]["result"]
    assert tests["families"]["CPU half"].startswith("the CPU half from the bundle")
    assert all(row["cpu s"] == "123.0 (bundled)" and row["ok"] for row in tests["families"]["rows"].values())
    reference["code"] = "other code"
    (bundle / "families_cpu.json").write_text(json.dumps(reference))
    _main(monkeypatch, str(tmp_path / "b"), "--smoke", "--device", "cpu", "--sections", "tests", "--bundle", str(bundle))
    tests = json.loads((tmp_path / "b" / "gpu_check.json").read_text())["sections"][0]["result"]
    assert "of other code" in tests["families"]["CPU half"]
    assert all(isinstance(row["cpu s"], float) for row in tests["families"]["rows"].values())


def test_a_second_call_gives_a_section_another_budget_and_a_bad_one_fails_before_any(tmp_path, monkeypatch):
    """``--budget profiles=215``: a second call on a lent GPU reruns one section with the time the first
    call's budget cut short (the profiles section read 3 of 7 notebooks in 60 s on an H200)."""
    budgets = []
    monkeypatch.setattr(gpu_check, "run_section", lambda ctx, name, budget: budgets.append((name, budget)))
    _main(monkeypatch, str(tmp_path / "out"), "--device", "cpu", "--sections", "round", "profiles",
          "--budget", "profiles=215")
    assert budgets == [("round", gpu_check.BUDGETS["round"]), ("profiles", 215.0)]
    for bad in ("profile=20", "profiles=0", "profiles=soon", "profiles"):
        with pytest.raises(SystemExit) as exit_:
            _main(monkeypatch, str(tmp_path / "bad"), "--device", "cpu", "--budget", bad)
        assert exit_.value.code == 2
    assert len(budgets) == 2 and not (tmp_path / "bad").exists()
