"""The README's "Add your own algorithm" example, taken from the README itself, defined in a
temporary module through the public API only, and run: on hand-made vectors, for two rounds of
the loop, and in a sweep whose worker processes import the module by themselves."""
from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fairfl import ConfigError, ExperimentConfig, LocalTraining, PartitionSpec, make_algorithm
from fairfl.federated.algorithms import Context
from fairfl.runs.loop import simulate
from fairfl.federated.messages import ClientUpdates

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.fixture(scope="module")
def my_algorithms(tmp_path_factory):
    blocks = re.findall(r"```python\n(# my_algorithms\.py\n.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1, "the README has one my_algorithms.py example"
    folder = tmp_path_factory.mktemp("own_algorithm")
    (folder / "my_algorithms.py").write_text(blocks[0])
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module("my_algorithms")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("my_algorithms", None)
        # and its name, which another test module registers from a module of its own (test_results_index)
        from fairfl.federated.algorithms import ALGORITHMS
        ALGORITHMS.pop("trimmed_mean", None)


def test_the_rule_on_hand_made_vectors(my_algorithms):
    g = torch.tensor([[0.0, 10.0], [1.0, -50.0], [2.0, 1.0], [100.0, 2.0]])
    r = ClientUpdates(np.arange(4), g, torch.full((4,), 5))
    agg = my_algorithms.TrimmedMean(trim=1).aggregate(r, None, Context())
    torch.testing.assert_close(agg.direction, torch.tensor([1.5, 1.5]))        # (1 + 2) / 2, (1 + 2) / 2
    assert agg.info == {"kept": 2}
    with pytest.raises(ConfigError, match=r"trimmed_mean: trim=-1 is not allowed; it must be an integer in \[0, inf\)"):
        my_algorithms.TrimmedMean(trim=-1)


CFG = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (0, 1, 2)}, model="logreg",
                       partition=PartitionSpec("iid", num_clients=6), local=LocalTraining(epochs=1, batch_size=100, lr=0.05),
                       rounds=2, clients_per_round=4,
                       eval_every=1)


def test_it_runs_on_the_loop_by_object_and_by_name(my_algorithms, fmnist):
    h = simulate(CFG.replace(algorithm=my_algorithms.TrimmedMean(trim=1)), progress=False)
    assert h.rounds_done == 2 and h.info["kept"] == [2.0, 2.0]
    assert h.train_loss[-1] < h.train_loss[0]
    by_name = simulate(ExperimentConfig.from_dict({**CFG.to_dict(), "algorithm": {"name": "trimmed_mean", "trim": 1}}),
                       progress=False)
    assert by_name.train_loss == h.train_loss
    assert isinstance(make_algorithm("trimmed_mean"), my_algorithms.TrimmedMean)
    with pytest.raises(ConfigError, match="drops every one of the 4 clients"):
        CFG.replace(algorithm=my_algorithms.TrimmedMean(trim=2)).validate()


@pytest.mark.slow
def test_worker_processes_import_the_module_by_themselves(my_algorithms, fmnist, tmp_path):
    from fairfl.runs.sweeps import ProcessBackend, run_many
    cfgs = [CFG.replace(algorithm=my_algorithms.TrimmedMean(trim=1), seed=s) for s in (0, 1)]
    with ProcessBackend(workers=2) as backend:
        out = run_many(cfgs, backend=backend, root=tmp_path, progress=False)
    assert [h.train_loss for h in out] == [simulate(c, progress=False).train_loss for c in cfgs]


# ----------------------------------------------------------------------------- the contract's extension points

from dataclasses import dataclass, fields  # noqa: E402

from fairfl.federated.algorithms import Algorithm, ParamLayout, ServerStep, option, register  # noqa: E402
from fairfl.federated.messages import Aggregate  # noqa: E402


@register
@dataclass(frozen=True)
class _PerTensorMean(ServerStep, Algorithm):
    """A per-layer rule written against the layout: every parameter tensor of the mean update
    rescaled to the mean of the clients' norms of that tensor. Its state counts the tensors it was
    told about at init."""
    name = "_test_per_tensor_mean"
    floor: float = option(0.0, low=0.0)

    def init(self, params, num_clients, layout=None):
        return torch.tensor([len(layout), layout.size])

    def aggregate(self, reports, state, ctx):
        d = reports.updates.mean(0)
        for sl in ctx.layout.slices:
            target = reports.updates[:, sl].norm(dim=1).mean()
            n = d[sl].norm()
            d[sl] = d[sl] * (target / n) if n > self.floor else d[sl]
        return Aggregate(d, state, {"tensors": len(ctx.layout)})


@register
@dataclass(frozen=True)
class _OldInit(Algorithm):
    """An init written before the layout was part of the contract."""
    name = "_test_old_init"

    def init(self, params, num_clients):
        return torch.zeros(1)

    def aggregate(self, reports, state, ctx):
        return Aggregate(reports.updates.mean(0), state)


def test_the_layout_reaches_init_and_every_round(fmnist):
    """ctx.layout and init's layout are the model's tensors (logreg: weight, bias) and cover the flat
    vector; an init without the layout argument still runs."""
    from fairfl.federated.models import build_model
    model = build_model("logreg", (1, 28, 28), 3)
    layout = ParamLayout.of(model)
    assert layout == ParamLayout(("net.1.weight", "net.1.bias"), ((3, 784), (3,)))
    assert layout.size == sum(p.numel() for p in model.parameters())
    assert [t.shape for t in layout.split(torch.arange(float(layout.size)))] == [p.shape for p in model.parameters()]
    assert layout.groups("module") == (slice(0, layout.size),)
    h = simulate(CFG.replace(algorithm=_PerTensorMean()), progress=False)
    assert h.info["tensors"] == [2.0, 2.0] and h.train_loss[-1] < h.train_loss[0]
    assert simulate(CFG.replace(algorithm=_OldInit()), progress=False).rounds_done == 2


def test_server_step_options_are_declared_once_and_keep_their_place():
    """ServerStep adds server_lr and decay after a class's own options — the order the algorithms
    wrote them in by hand — so positional construction, labels and to_dict() are unchanged."""
    from fairfl.federated.algorithms.dqnfed import DQNFed
    from fairfl.federated.algorithms.fedavg import FedAvg, FedProx
    from fairfl.federated.algorithms.fedmgda import MGDAProx
    assert [f.name for f in fields(_PerTensorMean)] == ["floor", "server_lr", "decay"]
    assert [f.name for f in fields(MGDAProx)] == ["eps", "normalize", "solver", "server_lr", "decay", "mu"]
    assert [f.name for f in fields(FedProx)] == ["weighting", "server_lr", "decay", "mu"]
    assert [f.name for f in fields(DQNFed)] == ["dependence_tol", "step", "server_lr", "decay"]
    assert FedAvg("uniform", 0.5).server_lr == 0.5
    assert (FedAvg(weighting="uniform", server_lr=0.5, decay=0.5).label()
            == "fedavg(weighting=uniform, server_lr=0.5, decay=0.5)")
    assert _PerTensorMean(server_lr=0.5).to_dict() == {"name": "_test_per_tensor_mean", "floor": 0.0, "server_lr": 0.5,
                                                        "decay": 1.0}
    with pytest.raises(ConfigError, match=r"_test_per_tensor_mean: server_lr=0.0 is not allowed; "
                                          r"it must be a finite number in \(0, inf\)"):
        _PerTensorMean(server_lr=0.0)
    # every algorithm's fields are its own: a Field object is never shared between two classes
    assert fields(FedAvg)[1] is not fields(_PerTensorMean)[1]


def test_a_client_half_computes_hessian_vector_products_through_the_runtime():
    """ClientRuntime.hvp and .hessian (what a second-order algorithm's client half calls) agree with
    each other and with central differences of ClientRuntime.gradients."""
    from torch import nn
    from fairfl.training.client import ClientRuntime, flat_params
    from fairfl.federated.partition import Client
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))

    def client(n):
        x, y = torch.randn(n, 3), torch.randint(0, 2, (n,))
        return Client(x, y, x[:0], y[:0], x[:1], y[:1])
    clients = ClientRuntime(model, [client(7), client(30)], seed=0)
    w = flat_params(model)
    v = torch.randn(w.numel(), dtype=torch.float64)
    H = clients.hessian(w, [0, 1])
    hv = clients.hvp(w, [0, 1], v, dtype=torch.float64)
    torch.testing.assert_close(hv, H @ v, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(H, H.transpose(1, 2))
    e = 1e-2
    fd = (clients.gradients(w + e * v.float(), [0, 1]) - clients.gradients(w - e * v.float(), [0, 1])).double()
    fd = fd / (2 * e)
    torch.testing.assert_close(fd, hv, rtol=0, atol=2e-3)
    many = clients.hvp(w, [0, 1], torch.stack([v, 2 * v]).expand(2, 2, -1), dtype=torch.float64)
    torch.testing.assert_close(many[:, 1], 2 * hv)


# ----------------------------------------------------------------------------- an algorithm in a notebook cell

NOTEBOOK_CELLS = [
    # the README's TrimmedMean, typed into a cell: its class lives in the kernel's __main__
    None,
    "import os\n"
    "from fairfl import ExperimentConfig, LocalTraining, PartitionSpec\n"
    "from fairfl.runs.sweeps import SerialBackend, run_many\n"
    "cfg = ExperimentConfig(dataset='adult', model='logreg', algorithm=TrimmedMean(trim=1), rounds=3,\n"
    "                       partition=PartitionSpec('iid', num_clients=6), local=LocalTraining(batch_size=500),\n"
    "                       clients_per_round=4)\n"
    "configs = [cfg.replace(seed=s) for s in (0, 1)]\n"
    "print('module', type(cfg.algorithm).__module__)",
    # the default backend: two runs to train is a pool of worker processes, which cannot import __main__
    "histories = run_many(configs)\n"
    "print('trained', [h.rounds_done for h in histories])",
    # cached now: nothing trains, nothing is said
    "again = run_many(configs)\n"
    "print('same', [a.train_loss == h.train_loss for a, h in zip(again, histories)])",
    # the documented route, on new seeds
    "more = run_many([cfg.replace(seed=s) for s in (2, 3)], backend=SerialBackend())\n"
    "print('serial', [h.rounds_done for h in more])",
]


@pytest.mark.slow
def test_an_algorithm_defined_in_a_notebook_cell_sweeps_in_the_kernel(tmp_path):
    """A real notebook, executed by a real kernel (nbclient), defines an algorithm in a cell and
    sweeps it with two seeds: through the default backend (a process pool on this machine, which
    cannot import the kernel's ``__main__``) it trains in the kernel, saying so in one line, with
    its progress bar and its cache entries; a second sweep loads them; ``SerialBackend()`` works
    too. (Before, both raised RunFailedError: '... defined in __main__ ... or use SerialBackend()'.)"""
    import os

    import nbformat
    from nbclient import NotebookClient
    block = re.findall(r"```python\n# my_algorithms\.py\n(.*?)```", README.read_text(), flags=re.S)[0]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(block if src is None else src) for src in NOTEBOOK_CELLS]
    results = tmp_path / "results"
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    env.update(FAIRFL_RESULTS=str(results), FAIRFL_PROGRESS="text", FAIRFL_BACKEND="")
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute(env=env)

    def text(i):
        return "".join(o.get("text", "") for o in nb.cells[i].outputs if o.output_type == "stream")
    assert "module __main__" in text(1)
    said = [line for line in text(2).replace("\r", "\n").splitlines() if "__main__" in line]
    assert said == ["trimmed_mean: defined in this notebook or script (__main__), which worker processes cannot "
                    "import, so this sweep trains in this process (put it in a module to use the workers)"], text(2)
    bars = [line for line in text(2).replace("\r", "\n").splitlines() if "%|" in line]
    assert bars and bars[-1].startswith("2 runs: 100%") and "6/6" in bars[-1], bars     # 2 runs × 3 rounds
    assert "trained [3, 3]" in text(2)
    assert text(3).strip() == "same [True, True]"                   # loaded from the cache: no bar, no line
    assert "serial [3, 3]" in text(4) and "__main__" not in text(4)
    assert len([d for d in results.iterdir() if (d / "history.json").is_file()]) == 4
