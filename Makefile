# The two commands of the README:
#   make figures   set up, then regenerate every figure with the quick profile
#   make test      set up, then run the unit tests and every notebook (smoke profile) under nbval
# and make lab [ARGS=...]: set up, then open the notebooks in JupyterLab
PY := .venv/bin/python
PROFILE ?= quick

.PHONY: setup figures test lab unit notebooks benchmark pfl-env pfl-bench clean-results gpu-bundle
setup:
	bash scripts/setup.sh

figures: setup
	$(PY) -m fairfl reproduce --profile $(PROFILE)

# Unit tests and notebooks in one pytest session (2 workers). The notebooks run as stored with
# FAIRFL_PROFILE=smoke; runs and figures of the test session go to a temporary folder. One OpenMP
# thread per process: a notebook kernel with two torch threads beside a busy test worker
# oversubscribes the two cores, and its many tiny steps then ran 5-10x slower (measured).
# pfl-env: tests/test_scripts.py runs benchmarks/pfl_round.py at smoke size against real pfl.
# Notebook 06 is not under nbval: tests/test_notebooks.py executes it in the smoke profile through
# `fairfl reproduce` and checks its CSVs (one execution of its two minutes, not two).
test: setup pfl-env
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	OMP_NUM_THREADS=1 FAIRFL_PROFILE=smoke FAIRFL_RESULTS=$$tmp/results FAIRFL_FIGURES=$$tmp/figures TQDM_DISABLE=1 \
	$(PY) -m pytest -n 2 --dist loadfile --durations=25 --nbval-lax \
	  --ignore=notebooks/06_one_protocol.ipynb tests notebooks

# JupyterLab at the repository root, so that its file browser reaches outputs/ and figures/ beside
# notebooks/, where it opens. ARGS go to jupyter lab as they are, e.g. on a remote machine
#   make lab ARGS="--no-browser --ip=0.0.0.0 --port=8888"
# jupyter lab refuses to run as root unless told: CI containers and fresh machines often are root
ARGS ?=
# The post-save hook keeps `git status` clean after Run All and save (fairfl.studies.notebook.refresh_git_index).
lab: setup
	.venv/bin/jupyter lab --ServerApp.root_dir="$(CURDIR)" --LabApp.default_url=/lab/tree/notebooks \
	  --FileContentsManager.post_save_hook=fairfl.studies.notebook.refresh_git_index \
	  $$([ "$$(id -u)" = 0 ] && echo --allow-root) $(ARGS)

unit: setup pfl-env
	$(PY) -m pytest -n 2 tests

benchmark: setup
	$(PY) benchmarks/round_speed.py

# What a bare GPU machine lacks for benchmarks/gpu_check.py (wheels for Python 3.12, the data),
# in the git-ignored .gpu-bundle/ that travels with the repository: README, "On a GPU"
gpu-bundle: setup
	$(PY) benchmarks/gpu_bundle.py .gpu-bundle

# pfl-research (pfl 0.6.0) in .pfl/, beside .venv, which it leaves as it is (about 7 s the first time, then nothing)
pfl-env: setup
	bash benchmarks/pfl_setup.sh

# fairfl's reference round (one run, 1 and 2 threads) and pfl's (2 processes), alternating; run it on an
# otherwise idle machine. PFL_ARGS="--compare 9 --rounds 8" for more turns.
PFL_ARGS ?= --compare 5
pfl-bench: pfl-env
	$(PY) benchmarks/pfl_round.py $(PFL_ARGS)

clean-results:
	rm -rf results outputs
