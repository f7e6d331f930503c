"""CUDA graphs for the fused step (``fairfl.training.engine.graphs``), checked on a CPU: the runner's
steps — what a graph captures — compute the eager loop's bits (dropout drawn from a step counter
on the device, momentum, weight decay, the proximal term, summed and first gradients, a short
last batch, the dense models' hand-written gradients); the step shapes a plan needs; stacks cut
below 32-bit indexing; and a capture that fails leaves the stack to the eager path, untouched.
The capture and replay themselves run on a GPU only (``tests/test_cuda.py``)."""
from __future__ import annotations

import pytest
import torch

from fairfl import LocalTraining
from fairfl.training.client import flat_params
from fairfl.training.engine import exactness, fused, graphs, stack
from fairfl.training.engine.jobs import Source, batch_plan, unflatten
from fairfl.federated.models import build_model
from fairfl.base.seeding import Stream


def rows_of(fmnist, m: int, n: int, local):
    """m instances on two data pools (n samples each), each with its own stream and plan."""
    pools = [Source(fmnist.x_train[:n].clone(), fmnist.y_train[:n].clone(), 0, n),
             Source(fmnist.x_train[n:2 * n].clone(), fmnist.y_train[n:2 * n].clone(), 0, n)]
    rows = []
    for k in range(m):
        s = Stream(7, 1, k)
        rows.append(stack.Row(0, k, pools[k % 2], s, batch_plan(n, local, s.generator())))
    rows.sort(key=lambda r: id(r.source.x))
    return rows


def inputs(model, m, local, prox_mu):
    template = list(model.parameters())
    start = flat_params(model)
    starts = torch.stack([start + 0.01 * k for k in range(m)])
    centres = torch.stack([start - 0.02 * k for k in range(m)])
    hyper = {"lr": torch.tensor([local.lr * (1 + 0.1 * k) for k in range(m)]),
             "momentum": torch.full((m,), local.momentum), "weight_decay": torch.full((m,), local.weight_decay),
             "half_mu": torch.full((m,), prox_mu / 2)}
    return template, starts, centres, hyper


class Cfg:
    def __init__(self, local, prox_mu):
        self.momentum, self.weight_decay, self.prox_mu = local.momentum, local.weight_decay, prox_mu


@pytest.mark.parametrize("name, momentum, decay, prox", [
    ("cnn_fmnist", 0.9, 1e-3, 0.5),        # dropout from the step counter, autograd, proximal term
    ("cnn_fmnist", 0.0, 0.0, 0.0),
    ("mlp2", 0.5, 1e-4, 0.0),              # the dense models' gradients by hand
    ("mlp2", 0.0, 0.0, 0.1),               # ... or, with a proximal term, by autograd
])
def test_the_runners_steps_give_the_eager_bits(fmnist, name, momentum, decay, prox):
    model = build_model(name, (1, 28, 28), 10, seed=0)
    names = [n for n, _ in model.named_parameters()]
    local = LocalTraining(epochs=1, batch_size=20, lr=0.05, momentum=momentum, weight_decay=decay)
    m, n = 3, 50                                          # batches of 20, 20 and 10: three step shapes
    rows = rows_of(fmnist, m, n, local)
    template, starts, centres, hyper = inputs(model, m, local, prox)
    keys = torch.tensor([r.stream.key for r in rows])
    cfg = Cfg(local, prox)
    steps = len(rows[0].plan)
    assert graphs.step_shapes(rows[0].plan.sizes) == [(20, True), (20, False), (10, False)]

    def w():
        return unflatten(starts.clone(), template), unflatten(centres.clone(), template)
    args = (steps, keys, hyper, cfg, True, True, exactness.transposed_is_exact)
    eager = stack.sgd_stack(model, names, *w(), stack.Gather(rows, torch.device("cpu")), *args)
    start, centre = w()
    replayed = graphs.train(model, names, start, centre, stack.Gather(rows, torch.device("cpu")), *args,
                            stack.stacked_losses, capture=False)
    for got, want in zip(replayed, eager):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
    again = graphs.train(model, names, *w(), stack.Gather(rows, torch.device("cpu")), *args, stack.stacked_losses,
                         capture=False)
    assert all(torch.equal(a, b) for a, b in zip(again[0], replayed[0]))      # a reused runner starts afresh
    assert all(torch.equal(a, b) for a, b in zip(start, unflatten(starts, template)))   # inputs untouched


def test_step_shapes():
    assert graphs.step_shapes([10] * 5) == [(10, True), (10, False)]
    assert graphs.step_shapes([64]) == [(64, True)]
    assert graphs.step_shapes([10, 10, 4, 10, 10, 4]) == [(10, True), (10, False), (4, False)]


def test_cuda_stacks_are_cut_below_32_bit_indexing(monkeypatch):
    # with a budget that no longer bounds it (2^60 floats), a CUDA stack is still cut so that its
    # largest activation has fewer than 2^31 elements (the CNN at b = 64 failed at 12,000 instances)
    monkeypatch.setitem(fused.FUSED_FLOATS, "cuda", 2 ** 60)
    per_row = 64 * 30_000
    cut = fused._chunks(list(range(12_000)), per_row, torch.device("cuda"), lambda m: True)
    assert max(len(c) for c, _ in cut) == graphs.index_safe_size(per_row) == (2 ** 31 - 1) // per_row
    assert all(len(c) * per_row < 2 ** 31 for c, _ in cut) and sum(len(c) for c, _ in cut) == 12_000
    # the CPU's cut is its budget's, as before
    cpu = fused._chunks(list(range(100)), per_row, torch.device("cpu"), lambda m: True)
    assert [len(c) for c, _ in cpu] == [1] * 100


def test_a_failed_capture_leaves_the_stack_to_the_eager_path(fmnist, monkeypatch):
    # On a CPU every capture fails (no CUDA stream): train() remembers why and answers None, so
    # sgd_stack trains the stack eagerly from the start it was given, which is untouched
    model = build_model("mlp2", (1, 28, 28), 10, seed=0)
    names = [n for n, _ in model.named_parameters()]
    local = LocalTraining(epochs=1, batch_size=25, lr=0.05)
    rows = rows_of(fmnist, 2, 50, local)
    template, starts, centres, hyper = inputs(model, 2, local, 0.0)
    w = unflatten(starts.clone(), template)
    args = (len(rows[0].plan), torch.tensor([r.stream.key for r in rows]), hyper, Cfg(local, 0.0), False, False,
            exactness.transposed_is_exact)
    monkeypatch.setattr(graphs, "FAILED", {})
    with graphs.switched(True):
        assert graphs.train(model, names, w, w, stack.Gather(rows, torch.device("cpu")), *args) is None
    assert len(graphs.FAILED) == 1
    assert all(torch.equal(a, b) for a, b in zip(w, unflatten(starts, template)))
    with graphs.switched(True):        # remembered: not tried again
        assert graphs.train(model, names, w, w, stack.Gather(rows, torch.device("cpu")), *args) is None
    assert len(graphs.FAILED) == 1


def test_graphs_can_be_switched_off(monkeypatch):
    monkeypatch.setenv(graphs.ENV, "0")
    assert not graphs.enabled()
    with graphs.switched(True):
        assert graphs.enabled()
    monkeypatch.setenv(graphs.ENV, "1")
    assert graphs.enabled()
    with graphs.switched(False):
        assert not graphs.enabled()
        assert graphs.train(None, [], [torch.zeros(1)], None, None, 3, None, {}, None, False, False, None) is None
