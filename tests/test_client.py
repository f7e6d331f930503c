"""Client training: the batched path equals the reference loop, g = w_global − w_local, NaN guard."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fairfl.federated import stacked
from fairfl.base.errors import ConfigError, TrainingDivergedError
from fairfl.training.client import LocalTraining, flat_params, mean_losses, predict, set_flat_params, train_clients
from fairfl.training.engine import batch_plan, chunked
from fairfl.federated.models import MODELS, build_model
from fairfl.federated.partition import PartitionSpec, federate
from fairfl.base.seeding import Stream


def train_clients_batched(*args, **kwargs):
    return train_clients(*args, batched=True, **kwargs)


def train_clients_sequential(*args, **kwargs):
    return train_clients(*args, batched=False, **kwargs)


@pytest.fixture(scope="module")
def shards_fed(fmnist):
    """100 label-shard clients of 600 training samples each (no val / test split)."""
    return federate(fmnist, PartitionSpec("shards", num_clients=100, shards_per_client=2, seed=0,
                                          split=(1.0, 0.0, 0.0)))


@pytest.fixture(scope="module")
def uneven_fed(fmnist):
    """iid partition of 60000 into 97 clients: 54 clients of 619 samples, 43 of 618."""
    return federate(fmnist, PartitionSpec("iid", num_clients=97, seed=1, split=(1.0, 0.0, 0.0)))


def _model(name, fmnist, seed=0):
    opts = {"dropout": False} if name == "cnn_fmnist" else {}
    return build_model(name, fmnist.input_shape, fmnist.num_classes, seed=seed, **opts)


def assert_same_updates(a, b):
    scale = float(b.updates.abs().max())
    assert scale > 1e-3, "training did not move the model; the comparison would be vacuous"
    torch.testing.assert_close(a.updates, b.updates, rtol=1e-4, atol=1e-4 * scale)
    torch.testing.assert_close(a.loss_before, b.loss_before, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.loss_after, b.loss_after, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(a.clients, b.clients)
    torch.testing.assert_close(a.num_samples, b.num_samples, rtol=0, atol=0)


CFG = LocalTraining(epochs=2, batch_size=10, lr=0.01, momentum=0.5, prox_mu=0.01)


# ----------------------------------------------------------------------------- equivalence

@pytest.mark.parametrize("name", ["cnn_fmnist", "mlp2"])
def test_batched_equals_sequential_same_sizes(fmnist, shards_fed, name):
    model = _model(name, fmnist)
    w = flat_params(model)
    clients = [3, 17, 42, 88]
    assert len({shards_fed.clients[k].num_train for k in clients}) == 1
    a = train_clients_batched(model, w, shards_fed.clients, clients, CFG, seed=5, round_=2)
    b = train_clients_sequential(model, w, shards_fed.clients, clients, CFG, seed=5, round_=2)
    assert_same_updates(a, b)
    # local training lowered each client's own loss
    assert (b.loss_after < b.loss_before).all()


@pytest.mark.parametrize("name", ["mlp2", "logreg"])
def test_batched_equals_sequential_different_sizes(fmnist, uneven_fed, name):
    sizes = [c.num_train for c in uneven_fed.clients]
    big = [k for k, s in enumerate(sizes) if s == 619]
    small = [k for k, s in enumerate(sizes) if s == 618]
    clients = [small[0], big[0], small[5], big[7], big[3]]  # unsorted, interleaved sizes
    model = _model(name, fmnist)
    w = flat_params(model)
    cfg = LocalTraining(epochs=1, batch_size=32, lr=0.05, momentum=0.5, prox_mu=0.01, weight_decay=1e-3)
    a = train_clients_batched(model, w, uneven_fed.clients, clients, cfg, seed=0, round_=0)
    b = train_clients_sequential(model, w, uneven_fed.clients, clients, cfg, seed=0, round_=0)
    assert_same_updates(a, b)
    assert a.num_samples.tolist() == [618, 619, 618, 619, 619]


def test_batched_row_k_is_client_k(fmnist, shards_fed):
    """Training a set of clients together gives each the update it gets when trained alone."""
    model = _model("mlp2", fmnist)
    w = flat_params(model)
    cfg = LocalTraining(epochs=1, batch_size=20, lr=0.05)
    both = train_clients_batched(model, w, shards_fed.clients, [9, 4], cfg, seed=1, round_=3)
    alone = train_clients_batched(model, w, shards_fed.clients, [4], cfg, seed=1, round_=3)
    torch.testing.assert_close(both.updates[1], alone.updates[0], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(both.updates[0], both.updates[1])


def test_dispatch_and_seed_dependence(fmnist, shards_fed):
    model = _model("logreg", fmnist)
    w = flat_params(model)
    cfg = LocalTraining(epochs=1, batch_size=50, lr=0.1)
    a = train_clients(model, w, shards_fed.clients, [1, 2], cfg, 0, 0, batched=True)
    b = train_clients(model, w, shards_fed.clients, [1, 2], cfg, 0, 0, batched=False)
    c = train_clients(model, w, shards_fed.clients, [1, 2], cfg, 0, 1, batched=True)   # other round
    torch.testing.assert_close(a.updates, b.updates, rtol=1e-4, atol=1e-6)
    assert not torch.allclose(a.updates, c.updates, atol=1e-6)  # other batch order


def test_losses_only_when_asked(fmnist, shards_fed):
    model = _model("logreg", fmnist)
    w = flat_params(model)
    for fn in (train_clients_batched, train_clients_sequential):
        r = fn(model, w, shards_fed.clients, [0, 1], LocalTraining(), 0, 0, loss_before=False, loss_after=False)
        assert r.loss_before is None and r.loss_after is None
        assert r.updates.shape == (2, w.numel())


# ----------------------------------------------------------------------------- sign convention

@pytest.mark.parametrize("fn", [train_clients_batched, train_clients_sequential])
def test_one_full_batch_step_is_lr_times_gradient(fmnist, shards_fed, fn):
    model = _model("logreg", fmnist, seed=3)
    w = flat_params(model)
    lr, wd = 0.3, 0.01
    c = shards_fed.clients[7]
    # reference gradient at w_global by autograd
    ref = _model("logreg", fmnist, seed=3)
    loss = F.cross_entropy(ref(c.x_train), c.y_train)
    grad = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(ref.parameters()))])
    assert grad.norm() > 1e-2

    cfg = LocalTraining(epochs=1, batch_size=None, lr=lr, momentum=0.9, prox_mu=0.5)
    r = fn(model, w, shards_fed.clients, [7], cfg, seed=0, round_=0)
    # g = w_global − w_local = +lr·∇L (momentum and the proximal term vanish on the first step)
    torch.testing.assert_close(r.updates[0], lr * grad, rtol=1e-4, atol=1e-6)

    cfg = LocalTraining(epochs=1, batch_size=None, lr=lr, weight_decay=wd)
    r = fn(model, w, shards_fed.clients, [7], cfg, seed=0, round_=0)
    torch.testing.assert_close(r.updates[0], lr * (grad + wd * w), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("fn", [train_clients_batched, train_clients_sequential])
def test_two_full_batch_steps_with_momentum(fmnist, shards_fed, fn):
    """torch.optim.SGD's rule: b1 = g1, b2 = μ·b1 + g2; w2 = w0 − η(b1 + b2)."""
    model = _model("logreg", fmnist, seed=4)
    w = flat_params(model)
    c = shards_fed.clients[11]
    lr, mu = 0.5, 0.9
    ref = _model("logreg", fmnist, seed=4)
    params = list(ref.parameters())

    def grad_at(flat):
        set_flat_params(ref, flat)
        loss = F.cross_entropy(ref(c.x_train), c.y_train)
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)])

    g1 = grad_at(w)
    w1 = w - lr * g1
    b2 = mu * g1 + grad_at(w1)
    w2 = w1 - lr * b2
    r = fn(model, w, [c], [0], LocalTraining(epochs=2, batch_size=None, lr=lr, momentum=mu), seed=0, round_=0)
    torch.testing.assert_close(r.updates[0], w - w2, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("fn", [train_clients_batched, train_clients_sequential])
def test_global_params_are_not_modified(fmnist, shards_fed, fn):
    model = _model("mlp2", fmnist)
    w = flat_params(model)
    w_copy = w.clone()
    r = fn(model, w, shards_fed.clients, [0, 5], LocalTraining(lr=0.1, momentum=0.5, prox_mu=0.1), 0, 0)
    assert r.updates.abs().max() > 1e-3
    assert torch.equal(w, w_copy)
    assert torch.equal(flat_params(model), w_copy)   # the model is left at the global weights


def test_set_flat_params_copies():
    model = build_model("logreg", (4,), 3, seed=0)
    flat = torch.arange(15, dtype=torch.float32)
    set_flat_params(model, flat)
    assert torch.equal(flat_params(model), flat)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert torch.equal(flat, torch.arange(15, dtype=torch.float32))


# ----------------------------------------------------------------------------- batches

def test_batch_plan_covers_every_sample_each_epoch():
    cfg = LocalTraining(epochs=3, batch_size=4)
    plan = batch_plan(10, cfg, torch.Generator().manual_seed(0))
    assert [len(b) for b in plan] == [4, 4, 2] * 3
    for e in range(3):
        assert sorted(torch.cat(plan[3 * e:3 * e + 3]).tolist()) == list(range(10))
    assert not torch.equal(torch.cat(plan[0:3]), torch.cat(plan[3:6]))  # fresh permutation
    full = batch_plan(10, LocalTraining(epochs=2, batch_size=None), torch.Generator().manual_seed(0))
    assert [len(b) for b in full] == [10, 10]


@pytest.mark.parametrize("n,epochs,b", [(26, 2, 10), (10, 1, None), (0, 2, 5), (7, 3, 7)])
def test_batch_plan_is_each_epochs_permutation_cut_into_batches(n, epochs, b):
    """The plan, held as one tensor, gives the batches that cutting each epoch's permutation with
    Tensor.split gives (the definition; it was a list of those pieces), by index, slice and iteration."""
    plan = batch_plan(n, LocalTraining(epochs=epochs, batch_size=b), torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(1)
    want = [piece for _ in range(epochs) for piece in torch.randperm(n, generator=g).split(b or n)]
    assert len(plan) == len(want) and plan.sizes == [len(w) for w in want]
    assert all(torch.equal(a, w) for a, w in zip(plan, want))
    assert all(torch.equal(plan[i], want[i]) for i in range(-len(want), len(want)))
    assert all(torch.equal(a, w) for a, w in zip(plan[1:], want[1:]))
    with pytest.raises(IndexError):
        plan[len(want)]


@pytest.mark.parametrize("block_floats", [1, 2 * 4 * 3 * 4, 2 ** 20])    # a step: 4 samples × 3 rows × 4 floats
def test_fused_batches_are_each_steps_samples_gathered_alone(monkeypatch, block_floats):
    """The fused loop's batches, gathered in blocks of steps (engine.stack.Gather.batches), are each
    step's samples and labels as indexing each instance's data by its plan gives them: over two
    data pools, an offset source, an uneven last batch, and blocks of one step, two steps, or a
    whole epoch's equal steps."""
    from fairfl.training import engine
    from fairfl.training.engine import stack
    monkeypatch.setattr(stack, "GATHER_FLOATS", block_floats)
    g = torch.Generator().manual_seed(3)
    pool_a = (torch.randn(40, 2, 2, generator=g), torch.randint(0, 5, (40,), generator=g))
    pool_b = (torch.randn(30, 2, 2, generator=g), torch.randint(0, 5, (30,), generator=g))
    sources = [engine.Source(*pool_a, 0, 23), engine.Source(*pool_a, 17, 23), engine.Source(*pool_b, 5, 23)]
    local = LocalTraining(epochs=2, batch_size=4)                          # 23 = 5 × 4 + 3: 6 steps an epoch
    rows = [stack.Row(0, k, src, Stream(0, 1, k), batch_plan(src.size, local, Stream(0, 1, k).generator()))
            for k, src in enumerate(sources)]
    got = list(stack.Gather(rows, torch.device("cpu")).batches())
    assert len(got) == 12
    for step, (x, y) in enumerate(got):
        for i, r in enumerate(rows):
            idx = r.source.start + r.plan[step]
            assert x[i].is_contiguous() and torch.equal(x[i], r.source.x[idx]) and torch.equal(y[i], r.source.y[idx])


def test_fused_batches_of_an_empty_client_are_one_empty_batch():
    """A client without samples has one empty batch (batch_plan), which the fused loop gathers as
    (1, 0, ...) samples and (1, 0) labels; it must not index a sample that is not there."""
    from fairfl.training import engine
    from fairfl.training.engine import stack
    x, y = torch.randn(5, 2, 2), torch.arange(5)
    empty = engine.Source(x, y, 3, 0)
    plan = batch_plan(0, LocalTraining(epochs=1, batch_size=4), torch.Generator().manual_seed(0))
    for pool in ((x, y), (x[:0], y[:0])):
        src = engine.Source(*pool, 0, 0) if len(pool[1]) == 0 else empty
        (got_x, got_y), = stack.Gather([stack.Row(0, 0, src, Stream(0, 1, 0), plan)], torch.device("cpu")).batches()
        assert got_x.shape == (1, 0, 2, 2) and got_y.shape == (1, 0)


def test_client_generator_is_a_function_of_seed_round_client():
    draw = lambda *a: torch.randperm(50, generator=Stream(*a).generator())
    assert torch.equal(draw(0, 1, 2), draw(0, 1, 2))
    assert not torch.equal(draw(0, 1, 2), draw(0, 1, 3))
    assert not torch.equal(draw(0, 1, 2), draw(0, 2, 2))
    assert not torch.equal(draw(0, 1, 2), draw(1, 1, 2))


# ----------------------------------------------------------------------------- divergence

@pytest.mark.parametrize("fn", [train_clients_batched, train_clients_sequential])
def test_inf_in_one_clients_data_names_that_client(fmnist, shards_fed, fn):
    clients = list(shards_fed.clients)
    x = clients[42].x_train.clone()
    x[5] = float("inf")
    clients[42] = dataclasses.replace(clients[42], x_train=x)
    model = _model("mlp2", fmnist)
    with pytest.raises(TrainingDivergedError, match=r"round 4: .*client\(s\) \[42\]"):
        fn(model, flat_params(model), clients, [3, 42, 17], LocalTraining(), 0, 4)


@pytest.mark.parametrize("fn", [train_clients_batched, train_clients_sequential])
def test_huge_lr_diverges(fmnist, shards_fed, fn):
    model = _model("mlp2", fmnist)
    with pytest.raises(TrainingDivergedError, match=r"client\(s\) \[8, 30\]"):
        fn(model, flat_params(model), shards_fed.clients, [8, 30], LocalTraining(lr=1e6), 0, 0)


@pytest.mark.parametrize("changes, match", [
    ({"epochs": 0}, "epochs"),
    ({"batch_size": 0}, "batch_size"),
    ({"lr": 0.0}, "lr"),
    ({"lr": -0.1}, "lr"),
    ({"lr": float("nan")}, "lr"),
    ({"momentum": 1.0}, "momentum"),
    ({"momentum": -0.1}, "momentum"),
    ({"weight_decay": -1e-4}, "weight_decay"),
    ({"prox_mu": -0.01}, "prox_mu"),
])
def test_local_training_validate(changes, match):
    with pytest.raises(ConfigError, match=match):
        LocalTraining(**changes).validate()


def test_local_training_accepts_good_values_in_their_canonical_types():
    a = LocalTraining(epochs=5, batch_size=None, lr=1, momentum=0, weight_decay=0, prox_mu=0)
    assert a == LocalTraining(epochs=5, batch_size=None, lr=1.0, momentum=0.0, weight_decay=0.0, prox_mu=0.0)
    assert isinstance(a.lr, float) and isinstance(LocalTraining(batch_size=1, momentum=0.99).batch_size, int)


# ----------------------------------------------------------------------------- fused forward

_SHAPES = {"cnn_cifar10": (3, 32, 32), "cnn_fmnist": (1, 28, 28), "cnn_femnist": (1, 28, 28),
           "mlp2": (1, 28, 28), "logreg": (7,)}


def test_every_feed_forward_model_has_a_fused_forward():
    # the character LSTM cannot be stacked; it trains client by client (tests/test_shakespeare.py);
    # the two-head LeNet trains through its objectives' views, which are fused (tests/test_fmgda.py)
    assert set(MODELS) - set(_SHAPES) == {"lstm_shakespeare", "multi_lenet"}


@pytest.mark.parametrize("name", sorted(_SHAPES))
def test_stacked_forward_equals_each_model(name):
    """m clients' copies of a model in one fused pass give each copy's own logits (LRN, pooling
    and flattening never mix two clients)."""
    m, b, shape = 3, 4, _SHAPES[name]
    models = [build_model(name, shape, 10, seed=s).eval() for s in range(m)]
    assert stacked.supports(models[0])
    params = [torch.stack(ps) for ps in zip(*(list(mod.parameters()) for mod in models))]
    x = torch.randn(m, b, *shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fused = stacked.forward(models[0], params, x)
        each = torch.stack([mod(x[k]) for k, mod in enumerate(models)])
    assert fused.shape == (m, b, 10)
    torch.testing.assert_close(fused, each, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(each[0], each[1])  # the copies really differ


def test_predict_and_mean_losses_in_chunks(fmnist):
    model = _model("cnn_fmnist", fmnist).eval()
    x, y = fmnist.x_test[:1100], fmnist.y_test[:1100]          # more than two chunks of 512
    with torch.no_grad():
        ref = model(x)
    torch.testing.assert_close(predict(model, x), ref, rtol=1e-4, atol=1e-5)
    losses = mean_losses(model, [x[:700], x[700:], x[:0]], [y[:700], y[700:], y[:0]])
    torch.testing.assert_close(losses[:2], torch.stack([F.cross_entropy(ref[:700], y[:700]),
                                                        F.cross_entropy(ref[700:], y[700:])]), rtol=1e-4, atol=1e-5)
    assert torch.isnan(losses[2])


@pytest.mark.parametrize("cuts", [(700,), (100, 612, 1024, 1024), (0, 512, 1024), (300, 300, 1099), (200, 300, 400)])
def test_predict_on_datasets_is_predict_on_their_concatenation(fmnist, cuts):
    """Several datasets are predicted in the chunks of their concatenation, without building it:
    the same logits bit for bit, for cuts inside a chunk, on chunk boundaries, and empty datasets."""
    model = _model("cnn_fmnist", fmnist).eval()
    x = fmnist.x_test[:1100]
    bounds = (0, *cuts, len(x))
    parts = [x[a:b] for a, b in zip(bounds, bounds[1:])]
    pieces = list(chunked(parts, 512))               # the concatenation's own chunks, whatever the kernels
    assert [len(p) for p in pieces] == [512, 512, 76]
    assert all(torch.equal(p, x[i * 512:(i + 1) * 512]) for i, p in enumerate(pieces))
    assert torch.equal(predict(model, parts), predict(model, x))
    assert predict(model, []).numel() == 0 and predict(model, [x[:0], x[:0]]).numel() == 0
    with pytest.raises(ValueError, match="chunk"):
        predict(model, parts, chunk=0)


class _TwoBranch(torch.nn.Module):
    """Not an ``nn.Sequential`` called ``net``: the batched path must fall back to vmap."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(784, 16)
        self.b = torch.nn.Linear(784, 16)
        self.out = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = x.flatten(1)
        return self.out(torch.relu(self.a(x)) * torch.tanh(self.b(x)))


def test_batched_equals_sequential_for_other_models(shards_fed):
    torch.manual_seed(0)
    model = _TwoBranch()
    assert not stacked.supports(model)
    w = flat_params(model)
    a = train_clients_batched(model, w, shards_fed.clients, [2, 50, 61], CFG, seed=0, round_=0)
    b = train_clients_sequential(model, w, shards_fed.clients, [2, 50, 61], CFG, seed=0, round_=0)
    assert_same_updates(a, b)


@pytest.mark.parametrize("hw", [(8, 8), (7, 9)])
def test_evaluation_max_pool_equals_max_pool2d(hw):
    """The no-grad 2×2 pool of the fused forward (strided maxima) equals max_pool2d exactly,
    odd sizes included (floor mode drops the last row/column)."""
    h = torch.randn(3, 4, *hw, generator=torch.Generator().manual_seed(1))
    layer = torch.nn.MaxPool2d(2)
    with torch.no_grad():
        assert torch.equal(stacked._max_pool(h, layer), F.max_pool2d(h, 2))
    assert torch.equal(stacked._max_pool(h, layer), F.max_pool2d(h, 2))   # autograd path


def _autograd_gradients(model, params, x, y):
    """What the engine's autograd step differentiates: Σₖ meanᵢ CE, through stacked.forward."""
    from fairfl.training.engine.stack import stacked_losses
    leaves = [p.detach().clone().requires_grad_() for p in params]
    names = [n for n, _ in model.named_parameters()]
    return torch.autograd.grad(stacked_losses(model, names, leaves, x, y, reduction="total"), leaves)


class _NoBias(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 5, bias=False), torch.nn.ReLU(),
                                       torch.nn.Identity(), torch.nn.Linear(5, 3))


@pytest.mark.parametrize("model_name,m,b,scale", [
    ("logreg", 23, 10, 1.0), ("logreg", 1, 1, 1.0), ("logreg", 2, 7, 1e4), ("mlp2", 3, 10, 1.0),
    ("mlp2", 2, 1, 0.0), ("mlp2", 4, 33, 1e-6), ("no_bias", 5, 4, 1.0)])
def test_dense_gradients_equal_autograds_bit_for_bit(model_name, m, b, scale):
    """The hand-written backward of stacked dense models gives autograd's gradients exactly —
    ordinary, one instance of one sample, huge, tiny and all-zero inputs, a model without some biases."""
    g = torch.Generator().manual_seed(m * 100 + b)
    if model_name == "no_bias":
        model, shape, classes = _NoBias(), (6,), 3
    else:
        shape, classes = ((99,), 2) if model_name == "logreg" else ((1, 28, 28), 10)
        model = build_model(model_name, shape, classes, seed=0)
    assert stacked.dense(model)
    params = [torch.randn(m, *p.shape, generator=g) * 0.1 for p in model.parameters()]
    x = torch.randn(m, b, *shape, generator=g) * scale
    y = torch.randint(0, classes, (m, b), generator=g)
    want = _autograd_gradients(model, params, x, y)
    from fairfl.training.engine.exactness import transposed_is_exact
    got = stacked.dense_gradients(model, params, x, y, transposed_is_exact)     # as the engine calls it
    assert len(got) == len(want)
    for a, w in zip(got, want):
        assert a.shape == w.shape and torch.equal(a, w)
    assert any(bool(w.abs().sum() > 0) for w in want)        # a gradient that is all zero would prove nothing


def test_only_dense_models_take_the_hand_written_backward():
    assert stacked.dense(build_model("logreg", (99,), 2, seed=0))
    assert stacked.dense(build_model("mlp2", (1, 28, 28), 10, seed=0))
    assert not stacked.dense(build_model("cnn_fmnist", (1, 28, 28), 10, seed=0))
    assert not stacked.dense(_TwoBranch())
