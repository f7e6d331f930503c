"""The stacked character LSTM (``fairfl.federated.stacked_lstm``): a stack of instances computes what each
instance computes through ``nn.LSTM`` (to float tolerance: outputs, losses, gradients, parameters
after SGD steps, evaluation), and obeys ``fairfl.training.engine.exactness`` as every model does — each
instance's bits whatever its stack's size, partners and cut, a stack size that rounds otherwise is
padded, the CUDA-graph runner's steps are the eager bits — and the configs it changes get new cache
keys, no others. Runs on the real Shakespeare data (groups, threads, resume): tests/test_engine.py,
tests/test_cores.py, tests/test_determinism.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.federated import stacked_lstm
from fairfl.training import engine
from fairfl.training.client import flat_params
from fairfl.training.engine import cores, exactness, fused, graphs, stack
from fairfl.training.engine.jobs import Source, batch_plan, can_batch, unflatten
from fairfl.federated.models import CharLSTM, build_model
from fairfl.base.seeding import Stream

V, T = 81, 80                  # the Shakespeare vocabulary and window

# How far the stack may be from nn.LSTM: max |stacked − nn.LSTM| ≤ TOLERANCE · max |nn.LSTM| per tensor.
# Both compute the same function in float32 (ε = 1.2e-7) with the sums in other orders — on a CPU
# nn.LSTM is oneDNN's fused cell (both biases added first, its own blocking of the 256- and
# 1,024-term dot products), the stack adds x·W_ihᵀ + biases, then h·W_hhᵀ, in MKL's batched products
# — so they differ by rounding carried through 80 steps. Measured on the real model (3 instances,
# 3 SGD steps at lr 0.5): at most 1.3e-6 of a tensor's scale (the embedding's gradient; logits 1.9e-7,
# parameters 2.6e-7). TOLERANCE, 1e-5, is about 80 ulps of the scale: 8× above the largest deviation
# measured, and far below what a wrong equation gives (a mismatched instance: order 1, checked below).
TOLERANCE = 1e-5


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=0, atol=TOLERANCE * float(want.abs().max()))


def tokens(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed))


def stacked_params(models) -> list[torch.Tensor]:
    return [torch.stack(ps).detach().clone() for ps in zip(*[[p.detach() for p in m.parameters()] for m in models])]


def test_the_character_lstm_is_supported_and_nothing_else():
    model = build_model("lstm_shakespeare", (T,), V, seed=0)
    assert stacked_lstm.supports(model) and can_batch(model)
    assert not stacked_lstm.supports(build_model("mlp2", (1, 28, 28), 10))
    bidirectional = CharLSTM(V, V)
    bidirectional.lstm = torch.nn.LSTM(8, 256, num_layers=2, batch_first=True, bidirectional=True)
    assert not stacked_lstm.supports(bidirectional)

    class Pooled(CharLSTM):                  # its own forward: the stack would compute something else
        def forward(self, x):
            return self.head(self.lstm(self.embed(x))[0].mean(1))
    assert not stacked_lstm.supports(Pooled(V, V))


def test_a_stack_is_each_instance_through_nn_lstm():
    """Three instances with their own weights and inputs, stacked, against each through its own
    ``nn.Module`` and ``torch.optim.SGD``: logits, losses and gradients at three SGD steps, the
    parameters after them, and the logits without gradients (the evaluation's path)."""
    m, b, lr = 3, 4, 0.5
    models = [build_model("lstm_shakespeare", (T,), V, seed=s) for s in range(m)]
    xs, ys = tokens(3, m, b, T, seed=1), tokens(3, m, b, seed=2)
    w = stacked_params(models)
    optimisers = [torch.optim.SGD(model.parameters(), lr=lr) for model in models]
    for step in range(3):
        leaves = [t.requires_grad_() for t in w]
        logits = stacked_lstm.forward(models[0], leaves, xs[step])
        losses = F.cross_entropy(logits.reshape(m * b, -1), ys[step].reshape(-1), reduction="none").reshape(m, b).mean(1)
        grads = torch.autograd.grad(losses.sum(), leaves)
        for k, model in enumerate(models):
            optimisers[k].zero_grad()
            out = model(xs[step, k])
            loss = F.cross_entropy(out, ys[step, k])
            loss.backward()
            close(logits[k].detach(), out.detach())
            close(losses[k].detach(), loss.detach())
            for p, g in zip(model.parameters(), grads):
                close(g[k], p.grad)
            optimisers[k].step()
        with torch.no_grad():
            w = [t - lr * g for t, g in zip(leaves, grads)]
    for k, model in enumerate(models):
        for p, t in zip(model.parameters(), w):
            close(t[k], p.detach())
    x = tokens(m, 7, T, seed=3)                          # another batch size, no gradients
    with torch.no_grad():
        stacked = stacked_lstm.forward(models[0], w, x)
        for k, model in enumerate(models):
            close(stacked[k], model.eval()(x[k]))
        # the comparison can fail: instance 0's logits are not instance 1's model's
        assert (stacked[0] - models[1](x[0])).abs().max() > 100 * TOLERANCE * models[1](x[0]).abs().max()


def test_token_indices_outside_the_vocabulary_are_refused():
    model = build_model("lstm_shakespeare", (T,), V, seed=0)
    w = stacked_params([model])
    with pytest.raises(IndexError, match=r"\[0, 81\)"):
        stacked_lstm.forward(model, w, torch.full((1, 2, T), V))


@pytest.fixture
def one_thread():
    """Stacks are cut for one thread (with more, the engine cuts them further: tests/test_cores.py)."""
    cores.set_threads(1)
    yield
    cores.set_threads(None)


def lstm_sizes() -> dict[int, bool]:
    """The stack sizes the exactness probe has judged for the character LSTM in this process."""
    return {m: ok for (key, m), ok in exactness._EXACT_SIZES.items() if key[0][0] == "CharLSTM"}


def job(model, starts, sources, streams, local, **flags):
    return engine.Job(model, starts, sources, streams, local, loss_after=True, sum_gradients=True,
                      first_gradient=True, **flags)


def test_every_stack_size_gives_an_instance_the_bits_of_a_pair(one_thread):
    """The same instance (start, data, stream) stacked with 1..5 copies of itself through the engine,
    one stack each (the budget admits them): every copy computes what it computes in a pair —
    parameters, summed and first gradients, loss after training. And the stack sizes trained are
    ones the exactness probe accepted."""
    model = build_model("lstm_shakespeare", (T,), V, seed=0)
    start = flat_params(model)
    source = Source(tokens(25, T, seed=4), tokens(25, seed=5), 0, 25)      # batches of 10, 10 and 5
    local = LocalTraining(epochs=1, batch_size=10, lr=0.5, momentum=0.5)
    results, cuts = {}, []
    real = fused._chunks
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(fused.FUSED_FLOATS, "cpu", 2 ** 40)
        mp.setattr(fused, "_chunks", lambda *a: cuts.append([(len(c), n) for c, n in real(*a)]) or real(*a))
        for m in range(1, 6):
            results[m] = engine.execute([job(model, start.expand(m, -1).clone(), [source] * m, [Stream(3, 0, 0)] * m,
                                             local)])[0]
    assert [c for c in cuts if c] == [[(m, 0)] for m in range(1, 6)], cuts       # one stack each, unpadded here
    pair = results[2]
    for m, got in results.items():
        for k in range(m):
            for field in ("params", "grad_sum", "loss_after", "first_grad"):
                assert torch.equal(getattr(got, field)[k], getattr(pair, field)[0]), (m, k, field)
    assert not torch.equal(pair.params[0], start)
    judged = lstm_sizes()
    assert all(judged.get(m, m == exactness.REFERENCE_SIZE) for m in range(1, 6)), judged


def test_an_instances_bits_do_not_depend_on_its_partners_or_the_cut(one_thread):
    """Four different instances (starts, data, streams, learning rates), trained alone, together in
    one job, as two jobs fused into one stack, and cut into stacks of 3 and 1: each instance's bits
    are the same every way."""
    model = build_model("lstm_shakespeare", (T,), V, seed=0)
    base = flat_params(model)
    starts = torch.stack([base + 0.01 * k for k in range(4)])
    sources = [Source(tokens(20, T, seed=10 + k), tokens(20, seed=20 + k), 0, 20) for k in range(4)]
    streams = [Stream(1, 2, k) for k in range(4)]
    locals_ = [LocalTraining(epochs=1, batch_size=10, lr=lr, momentum=0.5) for lr in (0.5, 0.5, 0.2, 0.2)]

    cuts = []
    real = fused._chunks

    def train(groups, budget=2 ** 40):
        with pytest.MonkeyPatch.context() as mp:
            mp.setitem(fused.FUSED_FLOATS, "cpu", budget)
            mp.setattr(fused, "_chunks", lambda *a: cuts.append([(len(c), n) for c, n in real(*a)]) or real(*a))
            out = engine.execute([job(model, starts[g].clone(), [sources[k] for k in g], [streams[k] for k in g],
                                      locals_[g[0]]) for g in groups])
        return {k: (r.params[i], r.grad_sum[i], r.loss_after[i]) for g, r in zip(groups, out) for i, k in enumerate(g)}
    alone = train([[0], [1], [2], [3]])
    per_instance = 3 * 10 * stack.floats_per_sample(model, sources[0].x)       # what fused._chunks counts
    for groups, budget, cut in (([[0, 1], [2, 3]], 2 ** 40, [(4, 0)]), ([[1, 0], [3, 2]], 2 ** 40, [(4, 0)]),
                                ([[0, 1], [2, 3]], 3 * per_instance, [(3, 0), (1, 0)])):
        ways = train(groups, budget)
        assert cuts[-1] == cut, cuts
        for k in range(4):
            assert all(torch.equal(a, b) for a, b in zip(ways[k], alone[k])), (groups, budget, k)
    assert not torch.equal(alone[0][0], alone[1][0])


def test_a_stack_size_that_rounds_otherwise_is_padded(monkeypatch, one_thread):
    """Where a batched product of three instances rounded otherwise than a pair's (simulated: the
    input projection of a stack of three moved by one ulp), the probe finds it, the engine pads a
    stack of three with a discarded copy, and every instance gets its pair's bits."""
    real = stacked_lstm._projection

    def rounding_otherwise(x, *args):
        out = real(x, *args)
        return torch.nextafter(out, torch.full_like(out, float("inf"))) if len(x) == 3 else out
    monkeypatch.setattr(stacked_lstm, "_projection", rounding_otherwise)
    monkeypatch.setattr(exactness, "_EXACT_SIZES", {})
    monkeypatch.setattr(exactness, "_PROBES", {})
    monkeypatch.setitem(fused.FUSED_FLOATS, "cpu", 2 ** 40)
    cuts = []
    chunks = fused._chunks
    monkeypatch.setattr(fused, "_chunks", lambda *a: cuts.append([(len(c), n) for c, n in chunks(*a)]) or chunks(*a))
    model = build_model("lstm_shakespeare", (T,), V, seed=0)
    start = flat_params(model)
    source = Source(tokens(20, T, seed=6), tokens(20, seed=7), 0, 20)
    local = LocalTraining(epochs=1, batch_size=10, lr=0.5)
    pair, three = (engine.execute([job(model, start.expand(m, -1).clone(), [source] * m, [Stream(0, 0, 0)] * m, local)])[0]
                   for m in (2, 3))
    assert cuts[-1] == [(3, 1)], cuts                              # three, padded to four
    assert lstm_sizes() == {3: False, 4: True}
    for k in range(3):
        assert torch.equal(three.params[k], pair.params[0]) and torch.equal(three.loss_after[k], pair.loss_after[0])


def test_the_graph_runners_steps_give_the_eager_bits():
    """What a CUDA graph captures (``fairfl.training.engine.graphs``' runner), run eagerly on a CPU: the
    stacked LSTM's steps with momentum, weight decay and a proximal term give the eager loop's bits."""
    model = build_model("lstm_shakespeare", (T,), V, seed=0)
    names = [n for n, _ in model.named_parameters()]
    template = list(model.parameters())
    local = LocalTraining(epochs=1, batch_size=10, lr=0.3, momentum=0.9, weight_decay=1e-3)
    source = Source(tokens(25, T, seed=8), tokens(25, seed=9), 0, 25)
    rows = [stack.Row(0, k, source, Stream(4, 0, k), batch_plan(25, local, Stream(4, 0, k).generator())) for k in range(2)]
    base = flat_params(model)
    starts, centres = torch.stack([base, base + 0.01]), torch.stack([base - 0.02, base])
    hyper = {"lr": torch.tensor([0.3, 0.2]), "momentum": torch.full((2,), 0.9), "weight_decay": torch.full((2,), 1e-3),
             "half_mu": torch.full((2,), 0.05)}

    class Cfg:
        momentum, weight_decay, prox_mu = 0.9, 1e-3, 0.1
    keys = torch.tensor([r.stream.key for r in rows])
    args = (len(rows[0].plan), keys, hyper, Cfg(), True, True, exactness.transposed_is_exact)
    eager = stack.sgd_stack(model, names, unflatten(starts.clone(), template), unflatten(centres.clone(), template),
                            stack.Gather(rows, torch.device("cpu")), *args)
    replayed = graphs.train(model, names, unflatten(starts.clone(), template), unflatten(centres.clone(), template),
                            stack.Gather(rows, torch.device("cpu")), *args, stack.stacked_losses, capture=False)
    for got, want in zip(replayed, eager):
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_the_cache_key_changes_for_the_stacked_lstm_only():
    """A batched LSTM config computes otherwise now (ExperimentConfig.engine_revision): its key is not
    the one it had (pinned, computed before the change); the reference path's LSTM config and every
    other model keep theirs, so their cached results are still read. Broken variants caught: the
    change without a key change, a CACHE_VERSION bump."""
    text = ExperimentConfig(dataset="shakespeare", dataset_options={"max_samples": 60}, model="lstm_shakespeare",
                            partition=PartitionSpec("natural", num_clients=2),
                            local=LocalTraining(epochs=1, batch_size=16, lr=0.8), rounds=2, participation=1.0,
                            eval_every=1, track_improved=False, batched=False)
    assert text.key() == "e4c5aa109429b9f6"
    assert text.replace(batched=True).key() != "a76742362de9b9e5"
    mlp = text.replace(model="mlp2", dataset="fashion_mnist", dataset_options={}, partition=PartitionSpec("iid", num_clients=2))
    assert mlp.key() == "f1115d1f48d487d2" and mlp.replace(batched=True).engine_revision() == 0
    back = ExperimentConfig.from_dict(text.replace(batched=True).to_dict())
    assert back.key() == text.replace(batched=True).key()
