"""The GPU bundle (``benchmarks/gpu_bundle.py``, ``make gpu-bundle``) and what the GPU check may
import. Built here without its wheels (no package index in a test): the data part is laid out,
checked against its manifest and staged into a fresh data root, from which every loader the
check uses reads its dataset (and from nowhere else); a changed file is named. The wheels'
platform rule is checked on their names. And the check's modules, and every notebook's imports,
load with every package a bare GPU machine lacks refused."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_bundle  # noqa: E402

from fairfl.base.errors import DataError  # noqa: E402


def test_wheels_for_python_312_on_linux_x86_64_only():
    fits = ["quadprog-0.1.14-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl",
            "pytest-9.2.0-py3-none-any.whl", "sortedcontainers-2.4.0-py2.py3-none-any.whl",
            "foo-1.0-cp39-abi3-manylinux_2_17_x86_64.whl"]
    misfits = ["quadprog-0.1.14-cp311-cp311-manylinux_2_17_x86_64.whl",       # another Python
               "quadprog-0.1.14-cp312-cp312-manylinux_2_17_aarch64.whl",      # another processor
               "quadprog-0.1.14-cp312-cp312-macosx_11_0_arm64.whl", "quadprog-0.1.14.tar.gz",
               "foo-1.0-cp313-abi3-manylinux_2_17_x86_64.whl"]
    assert all(gpu_bundle.wheel_fits(w) for w in fits)
    assert not any(gpu_bundle.wheel_fits(w) for w in misfits)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bundle") / "b"
    return folder, gpu_bundle.build(folder, wheels=False)


def test_the_bundles_data_fits_and_stages_as_the_loaders_prepared_copies(bundle, tmp_path, monkeypatch):
    folder, manifest = bundle
    assert manifest["bytes"] == sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.name != "MANIFEST.json")
    assert manifest["bytes"] < gpu_bundle.LIMIT - 4 * 2 ** 20           # room for the wheels (2.1 MiB)
    stages = {e["stage"] for e in manifest["files"]}
    assert stages == {"fashion", "gunzip", "copy"}
    root = tmp_path / "root"
    staged = gpu_bundle.stage(folder, root)
    assert len(staged) == len(manifest["files"]) - 4 + 1                  # the four Fashion files as one folder
    # every dataset the check reads comes from the staged root
    monkeypatch.setenv("FAIRFL_DATA", str(root))
    monkeypatch.setenv("FAIRFL_OFFLINE", "1")
    from fairfl.federated.data import load_dataset
    from fairfl.federated.data.shakespeare import load_corpus
    for name in ("fashion_mnist", "adult", "mnist_5k"):
        ds = load_dataset(name)
        assert str(root) in ds.source, (name, ds.source)
    assert load_corpus(root)[1] == str(root / "shakespeare" / "texts")


def test_a_changed_bundle_file_is_named(bundle, tmp_path):
    folder, _ = bundle
    copy = tmp_path / "copy"
    import shutil
    shutil.copytree(folder, copy)
    target = copy / "data" / "mnist_5k" / "mnist_5k.csv.gz"
    target.write_bytes(target.read_bytes()[:-1])
    with pytest.raises(DataError, match="mnist_5k.csv.gz is missing or differs"):
        gpu_bundle.stage(copy, tmp_path / "root")


def test_the_check_imports_nothing_a_gpu_machine_lacks():
    # Every package of this environment that the GPU machine lacks (neither its own nor bundled)
    # is refused; the check's modules, and each notebook's import statements (the check reads the
    # notebooks' sweeps by running their cells), must load all the same.
    refused = sorted(gpu_bundle.refused_modules())
    assert {"cvxpy", "papermill", "nbformat", "flwr", "ray"} <= set(refused)
    assert not {"torch", "quadprog", "pytest", "hypothesis", "pandas"} & set(refused)
    notebooks = sorted(str(p) for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    code = textwrap.dedent(f"""
        import ast, json, sys
        for name in {refused!r}:      # as if absent: import raises, importlib.util.find_spec answers None
            sys.modules[name] = None
        sys.path[:0] = [{str(REPO)!r}, {str(REPO / 'benchmarks')!r}, {str(REPO / 'tests')!r}]
        import gpu_check, gpu_bundle, sweep_speed, test_engine, core_contention, round_speed
        import fairfl.federated.algorithms, fairfl.runs.loop, fairfl.runs.sweeps, fairfl.studies.paper, fairfl.studies.notebook, fairfl.studies.plotting
        import fairfl.training.engine.graphs
        for nb in {notebooks!r}:
            for cell in json.load(open(nb))["cells"]:
                if cell["cell_type"] != "code":
                    continue
                src = "\\n".join(l for l in "".join(cell["source"]).splitlines() if not l.lstrip().startswith(("%", "!")))
                tree = ast.parse(src)
                tree.body = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
                exec(compile(tree, nb, "exec"), {{}})
        print("imported", len(sys.modules))
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "MPLBACKEND": "Agg"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "imported" in r.stdout
