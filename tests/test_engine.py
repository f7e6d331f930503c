"""The run-batched engine (``fairfl.training.engine``): runs trained side by side in one lockstep group
give exactly the histories they give alone — every algorithm family, dropout, attacks, FMOL's
per-objective steps, DQN-Fed's client hook, Ditto's personal models, clients of unequal size,
the reference path mixed in, checkpoint and resume — and their local training really is fused.
Dropout masks come from each client's stream: the same in a stack and on the reference path.
And the device setting: named errors for devices that do not exist, the device's type in the key."""
from __future__ import annotations

import json

import pytest
import torch

import fairfl.training.engine as engine
import fairfl.training.engine.predict as predictions
from fairfl.training.engine import dispatch, exactness, fused
from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.federated import stacked
from fairfl.federated.algorithms.afl import AFL
from fairfl.federated.algorithms.ditto import Ditto
from fairfl.federated.algorithms.dqnfed import DQNFed
from fairfl.federated.algorithms.fedavg import FedAvg, FedProx
from fairfl.federated.algorithms.fedfv import FedFV
from fairfl.federated.algorithms.fedmgda import FedMGDAPlus
from fairfl.federated.algorithms.fmgda import FMGDA
from fairfl.federated.algorithms.qffl import QFedAvg
from fairfl.federated.algorithms.term import TERM
from fairfl.base.errors import ConfigError
from fairfl.runs.history import load_checkpoint
from fairfl.runs.loop import simulate, simulate_group
from fairfl.federated.models import build_model
from fairfl.studies.paper import fmol_config
from fairfl.base import seeding
from fairfl.base.seeding import Stream, keep_mask

CNN = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (0, 1, 2)},
                       partition=PartitionSpec("shards", num_clients=20, shards_per_client=2), model="cnn_fmnist",
                       local=LocalTraining(epochs=1, batch_size=20, lr=0.05), rounds=2, clients_per_round=3,
                       eval_every=1, track_improved=True, checkpoint_every=1)
MLP = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (6, 2, 0), "normalize": "per_feature"},
                       model="mlp2", partition=PartitionSpec("one_class", num_clients=3, classes=(0, 1, 2), split=None),
                       local=LocalTraining(epochs=1, batch_size=None, lr=0.1), rounds=3, participation=1.0,
                       eval_every=1, track_improved=True, checkpoint_every=1)
ADULT = ExperimentConfig(dataset="adult", model="logreg",
                         partition=PartitionSpec("attribute", num_clients=2, attribute_values=(0, 1), split=None),
                         local=LocalTraining(epochs=1, batch_size=200, lr=0.01), rounds=2, clients_per_round=2,
                         eval_every=1, track_improved=False, checkpoint_every=1)
BIAS = ({"kind": "bias", "client": 1, "bias": 1000.0, "target": "total"},)

GROUP = {
    # the CNN with dropout: several learning rates, momentum, proximal weights, an attack, in one stack
    "cnn_fedavg": CNN.replace(algorithm=FedAvg()),
    "cnn_fedavg_other_lr": CNN.replace(algorithm=FedAvg(), local=LocalTraining(epochs=1, batch_size=20, lr=0.02), seed=1),
    "cnn_fedprox_momentum": CNN.replace(algorithm=FedProx(mu=0.5), local=LocalTraining(epochs=1, batch_size=20, lr=0.05,
                                                                                        momentum=0.5, weight_decay=1e-3)),
    "cnn_fedprox_other_mu": CNN.replace(algorithm=FedProx(mu=0.05), local=LocalTraining(epochs=1, batch_size=20, lr=0.05,
                                                                                         momentum=0.9, weight_decay=1e-4)),
    "cnn_fedmgda_plus": CNN.replace(algorithm=FedMGDAPlus(eps=0.1, server_lr=1.0, decay=0.1), seed=2),
    "cnn_scaling_attack": CNN.replace(algorithm=FedAvg(), attacks=({"kind": "scaling", "client": 3, "factor": 10.0},)),
    "cnn_sequential": CNN.replace(algorithm=FedAvg(), batched=False),
    # three clients of an MLP, full batch: the client hook of DQN-Fed, Ditto's personal models
    "mlp_dqnfed": MLP.replace(algorithm=DQNFed(), local=LocalTraining(epochs=2, batch_size=None, lr=0.1)),
    "mlp_dqnfed_alg1": MLP.replace(algorithm=DQNFed(step="algorithm1", server_lr=0.1, decay=0.1)),
    "mlp_fedfv": MLP.replace(algorithm=FedFV(alpha=1 / 3, order="random"), seed=2),
    "mlp_term": MLP.replace(algorithm=TERM(t=1.0)),
    "mlp_ditto": MLP.replace(algorithm=Ditto(lam=1.0)),
    "mlp_afl": MLP.replace(algorithm=AFL(lr_lambda=0.5)),
    # Adult: two clients of unequal size, an attack, one client only
    "adult_qfedavg_bias": ADULT.replace(algorithm=QFedAvg(q=5.0, L=0.1), attacks=BIAS),
    "adult_afl": ADULT.replace(algorithm=AFL(lr_lambda=0.5), seed=1),
    "adult_phd_only": ADULT.replace(algorithm=FedAvg(), eligible_clients=(1,), clients_per_round=1),
    # FMOL: per-objective local steps (full batch and minibatch) on a multi-task model
    "fmol_fmgda": fmol_config(K=2, n=32, clients=3, rounds=2),
    "fmol_fsmgda": fmol_config(K=2, b=8, n=32, clients=3, rounds=2, seed=1),
}


def state(h) -> str:
    """Everything a run recorded but its wall-clock times, as text (NaN equals NaN)."""
    s = h.to_state()
    s.pop("round_time")
    return json.dumps(s, sort_keys=True)


@pytest.fixture(scope="module")
def alone(fmnist):
    return {name: state(simulate(c, progress=False)) for name, c in GROUP.items()}


@pytest.mark.slow
def test_every_run_of_a_group_gives_its_result_alone_bit_for_bit(alone, monkeypatch):
    calls = []
    real = dispatch.execute

    def counting(jobs):                   # the real engine, counted
        calls.append(len(jobs))
        return real(jobs)
    monkeypatch.setattr(dispatch, "execute", counting)
    names = list(GROUP)
    results = simulate_group([GROUP[n] for n in names], progress=False)
    for name, h in zip(names, results):
        assert not isinstance(h, BaseException), f"{name}: {h!r}"
        assert state(h) == alone[name], name
    assert max(calls) > 1, "no two runs' jobs were ever executed together"
    assert sum(calls) >= 2 * len(calls), f"runs were fused too rarely: {calls}"


@pytest.mark.slow
def test_a_group_stopped_and_resumed_gives_the_uninterrupted_result(alone, tmp_path):
    names = ["cnn_fedavg", "cnn_fedprox_momentum", "mlp_ditto", "mlp_dqnfed", "adult_qfedavg_bias", "fmol_fsmgda"]
    configs = [GROUP[n] for n in names]
    dirs = [tmp_path / n for n in names]
    first = simulate_group(configs, dirs, progress=False, stop_after=1)
    assert all(h.rounds_done == 1 for h in first)
    assert all(load_checkpoint(d, c).round == 1 for d, c in zip(dirs, configs))
    resumed = simulate_group(configs, dirs, progress=False)
    for name, h in zip(names, resumed):
        assert state(h) == alone[name], name


def test_a_failing_run_does_not_stop_its_group(fmnist):
    bad = CNN.replace(local=LocalTraining(epochs=1, batch_size=20, lr=1e30), rounds=2)    # diverges in round 0
    good = CNN.replace(algorithm=FedAvg(), rounds=1)
    results = simulate_group([bad, good], progress=False)
    assert type(results[0]).__name__ == "TrainingDivergedError"
    assert state(results[1]) == state(simulate(good, progress=False))


# ----------------------------------------------------------------------------- dropout

def test_dropout_keeps_each_element_with_probability_one_minus_p():
    keys = torch.tensor([Stream(0, 0, k).key for k in range(64)])
    for p in (0.25, 0.5):
        mask = keep_mask(keys, 7, (100, 50), p)
        n = mask.numel()
        assert abs(mask.float().mean().item() - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5
    a, b = keep_mask(keys, 7, (100, 50), 0.5).float(), keep_mask(keys, 8, (100, 50), 0.5).float()
    assert abs((a == b).float().mean().item() - 0.5) < 0.01           # another step: independent masks
    flat = a.reshape(64, -1) - 0.5
    assert abs((flat[:, 1:] * flat[:, :-1]).mean().item()) < 0.01     # neighbours uncorrelated
    assert abs((flat[1:] * flat[:-1]).mean().item()) < 0.01           # clients uncorrelated


def test_an_instances_masks_do_not_depend_on_its_stack():
    keys = torch.tensor([Stream(3, 1, k).key for k in (4, 9, 2)])
    stack = keep_mask(keys, 5, (10, 20, 4, 4), 0.5)
    for i in range(3):
        assert torch.equal(keep_mask(keys[i:i + 1], 5, (10, 20, 4, 4), 0.5)[0], stack[i])


def test_masks_drawn_by_blocks_of_steps_are_each_steps_own_bits_and_layout(monkeypatch):
    """A fused step's masks come in blocks of steps (``stacked.DropoutMasks``): each step's is the
    mask drawn for that step alone (``keep_mask`` at its counter), in the same strides (the layout
    of ``h * mask`` picks the kernels of the layers after it), across a change of batch size, across
    block boundaries (forced by a small budget), and for the shapes whose strides are ambiguous: one
    instance, one sample in the last batch, one channel, 1 × 1 activations (FEMNIST's CNN)."""
    keys = torch.tensor([Stream(5, 2, k).key for k in (7, 1, 3)])
    counters = torch.tensor([0, 3, 64, 2 ** 40 + 5])
    many = seeding.keep_masks(keys, counters, (6, 5), 0.25)
    assert many.shape == (4, 3, 6, 5)
    for i, c in enumerate(counters.tolist()):
        assert torch.equal(many[i], keep_mask(keys, c, (6, 5), 0.25))
    sizes = [4, 4, 4, 4, 4, 1]                     # an epoch of 21 samples at b = 4: the last batch is one sample
    for m, c, hw in ((3, 20, (4, 4)), (1, 64, (12, 12)), (2, 1, (1, 1)), (3, 1, (2, 3)), (2, 3, (1, 1))):
        layers = [(torch.nn.Dropout2d(0.5), "conv"), (torch.nn.Dropout(0.5), "conv"), (torch.nn.Dropout(0.25), "flat")]
        small = 2 * m * 4 * c * hw[0] * hw[1]                  # two steps of layer 1 a block
        for budget in (stacked.MASK_BLOCK, small):
            monkeypatch.setattr(stacked, "MASK_BLOCK", budget)
            masks = stacked.DropoutMasks(keys[:m], sizes)
            for step, b in enumerate(sizes):
                for ordinal, (layer, kind) in enumerate(layers):
                    h = (torch.zeros(b, m * c, *hw).contiguous(memory_format=torch.channels_last) if kind == "conv"
                         else torch.zeros(m, b, 50))
                    got = masks.mask(layer, kind, h, ordinal, step)
                    want = stacked._stacked_mask(layer, kind, h, keys[:m], step * stacked.DROPOUT_LAYERS + ordinal, m, b)
                    assert torch.equal(got, want) and got.stride() == want.stride(), (m, c, hw, budget, step, ordinal)
                    if step == 0 and ordinal == 1:       # the first block: every step of one batch size, or two
                        assert len(masks._blocks[1][1]) == (2 if budget == small else 5)
            monkeypatch.undo()
    # a block serves only activations of the shape and dtype it was drawn for
    masks = stacked.DropoutMasks(keys, [4, 4])
    h = torch.zeros(3, 4, 50)
    first = masks.mask(torch.nn.Dropout(0.5), "flat", h, 0, 0)
    again = masks.mask(torch.nn.Dropout(0.5), "flat", h.double(), 0, 1)
    assert first.dtype == torch.float32 and again.dtype == torch.float64


def test_the_reference_path_draws_the_stacks_dropout_masks(fmnist):
    """The fused forward of three CNN copies in training mode and one ``nn.Module`` per copy with
    the stream's masks agree to float tolerance — with masks drawn differently they would differ
    by the size of the activations."""
    model = build_model("cnn_fmnist", (1, 28, 28), 10, seed=0)
    model.train()
    x = fmnist.x_train[:30].reshape(3, 10, 1, 28, 28)
    params = [torch.stack([p.detach() + 0.01 * k for k in range(3)]) for p in model.parameters()]
    keys = torch.tensor([Stream(0, 2, k).key for k in range(3)])
    fused = stacked.forward(model, params, x, (keys, 4))
    with stacked.keyed_dropout(model) as dropout:
        for k in range(3):
            with torch.no_grad():
                for p, stackp in zip(model.parameters(), params):
                    p.copy_(stackp[k])
            dropout["key"], dropout["step"] = int(keys[k]), 4
            single = model(x[k])
            torch.testing.assert_close(single, fused[k], rtol=1e-4, atol=1e-5)
    assert any(isinstance(m, torch.nn.Dropout2d) for m in model.modules())     # the swap was undone


def test_dropout_makes_training_mode_differ_and_eval_mode_not(fmnist):
    model = build_model("cnn_fmnist", (1, 28, 28), 10, seed=0)
    params = [p.detach().unsqueeze(0) for p in model.parameters()]
    x = fmnist.x_train[:10].unsqueeze(0)
    keys = torch.tensor([Stream(0, 0, 0).key])
    model.train()
    assert not torch.equal(stacked.forward(model, params, x, (keys, 0)), stacked.forward(model, params, x, (keys, 1)))
    with pytest.raises(ValueError, match="stream keys"):
        stacked.forward(model, params, x)
    model.eval()
    assert torch.equal(stacked.forward(model, params, x), stacked.forward(model, params, x, (keys, 3)))


# ----------------------------------------------------------------------------- devices

def test_device_settings_are_checked_and_keyed():
    assert ExperimentConfig(device="auto").device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert ExperimentConfig(device="CUDA:1").device == "cuda:1"
    for bad in ("gpu", "cuda:x", "cpu:0", "", 3):
        with pytest.raises(ConfigError, match="device"):
            ExperimentConfig(device=bad)
    base = ExperimentConfig()
    assert base.replace(device="cuda:0").key() == base.replace(device="cuda:1").key() == base.replace(device="cuda").key()
    assert base.replace(device="cuda").key() != base.key()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_fails_before_any_data_is_read(monkeypatch):
    import fairfl.runs.loop as loop
    monkeypatch.setattr(loop, "federated_data", lambda *a, **k: pytest.fail("data was read"))
    with pytest.raises(ConfigError, match=r"device='cuda', but this machine has no CUDA device"):
        simulate(MLP.replace(device="cuda"), progress=False)
    with pytest.raises(ConfigError, match=r"device='cuda:1'"):
        simulate_group([MLP, MLP.replace(device="cuda:1")], progress=False)


@pytest.mark.slow
def test_a_large_group_of_unequal_clients_gives_each_run_its_result_alone(fairfl_env):
    # 23 Adult runs in one group (one worker's share of notebook 02's grid): before MKL's strict
    # reproducibility was switched on (fairfl/__init__.py), 2 of them ended 1 ulp away from their
    # results alone, and the same group twice differed (rows rounded by their place in the stack)
    bias = [({"kind": "bias", "client": 1, "bias": b, "target": "total"},) if b else () for b in (0.0, 1000.0, 5000.0, 1e4)]
    configs = [ADULT.replace(algorithm=QFedAvg(q=5.0, L=0.1), attacks=a, seed=s, eval_every=2) for a in bias for s in (0, 1, 2)]
    configs += [ADULT.replace(algorithm=AFL(lr_lambda=0.5), attacks=({"kind": "bias", "client": 1, "bias": b},) if b else (),
                              seed=s, eval_every=2) for b in (0.0, 0.1, 1.0) for s in (0, 1, 2)]
    configs += [ADULT.replace(algorithm=FedMGDAPlus(eps=0.1, server_lr=1.0, decay=1 / 3), seed=s) for s in (0, 1)]
    group = simulate_group(configs, progress=False)
    assert [state(h) for h in simulate_group(configs, progress=False)] == [state(h) for h in group]
    for c, h in zip(configs, group):
        assert state(h) == state(simulate(c, progress=False)), c


@pytest.mark.slow
@pytest.mark.parametrize("budget, clients", [(5, 4), (5, 3), (0.5, 3)])
def test_a_stack_cut_into_chunks_gives_each_run_its_result_alone(fmnist, monkeypatch, budget, clients):
    # A stack too large for the memory budget is cut along the instance axis, and where it is cut
    # depends on how many runs share it: 3 runs x 4 clients in chunks of at most 5 put the runs'
    # clients beside other runs' clients and split a run over two chunks, where each run alone is
    # one stack of 4. With 3 clients, a run alone is a stack of three, which computes the CNN's first
    # weight gradient with other kernels than a pair on this project's CPU (exactness.size_is_exact);
    # a budget below one instance (notebook 02's CNN at b = 400) cuts pairs. Every instance must get
    # the same bits whichever stack it is in, and every stack trained must have a size that computes
    # as a pair does.
    per_instance = 3 * CNN.local.batch_size * fused._floats_per_sample(
        build_model("cnn_fmnist", (1, 28, 28), 3), torch.zeros(1, 1, 28, 28), ())
    monkeypatch.setitem(fused.FUSED_FLOATS, "cpu", int(budget * per_instance))
    configs = [CNN.replace(algorithm=FedAvg(), clients_per_round=clients, seed=s) for s in (0, 1, 2)]
    cuts = []
    real = fused._chunks
    monkeypatch.setattr(fused, "_chunks", lambda *a: cuts.append([(len(c), n) for c, n in real(*a)]) or real(*a))
    group = simulate_group(configs, progress=False)
    assert any(len(cut) > 1 and sum(c for c, _ in cut) == 3 * clients for cut in cuts), cuts   # one stack, cut
    for c, h in zip(configs, group):
        assert state(h) == state(simulate(c, progress=False)), c.seed
    trained = {c + n for cut in cuts for c, n in cut}
    exact = {m for (_, m), ok in exactness._EXACT_SIZES.items() if ok} | {exactness.REFERENCE_SIZE}
    assert trained <= exact, (trained, exactness._EXACT_SIZES)


# The character LSTM stacked (fairfl.federated.stacked_lstm): three roles of at most 40 windows (32 to train on:
# batches of 10, 10, 10 and 2)
TEXT = ExperimentConfig(dataset="shakespeare", dataset_options={"max_samples": 40}, model="lstm_shakespeare",
                        partition=PartitionSpec("natural", num_clients=3), local=LocalTraining(epochs=1, batch_size=10, lr=0.8),
                        rounds=2, participation=1.0, eval_every=1, track_improved=True, checkpoint_every=1)


@pytest.mark.slow
def test_the_stacked_lstms_runs_give_their_results_alone_in_a_group_and_wherever_cut(monkeypatch):
    # Four runs of the LSTM, three of one fusion key (their clients share stacks) and a FedProx run
    # with momentum beside them: in one lockstep group, and in a group whose stacks are cut at two
    # instances (a run's clients beside another run's, a run over two stacks), every run gives its
    # history alone bit for bit; and its stacks were really shared.
    fedavg = TEXT.replace(algorithm=FedAvg())
    configs = [fedavg, fedavg.replace(seed=1, local=LocalTraining(epochs=1, batch_size=10, lr=0.5)),
               TEXT.replace(algorithm=QFedAvg(q=1.0), seed=2),
               TEXT.replace(algorithm=FedProx(mu=0.1), local=LocalTraining(epochs=1, batch_size=10, lr=0.5, momentum=0.5))]
    monkeypatch.setattr(engine.cores, "threads", lambda: 1)       # cuts made for one thread, as the budget says
    alone = [state(simulate(c, progress=False)) for c in configs]
    cuts = []
    real = fused._chunks
    monkeypatch.setattr(fused, "_chunks", lambda *a: cuts.append([(len(c), n) for c, n in real(*a)]) or real(*a))
    monkeypatch.setitem(fused.FUSED_FLOATS, "cpu", 2 ** 40)
    assert [state(h) for h in simulate_group(configs, progress=False)] == alone
    assert max(c + n for cut in cuts for c, n in cut) == 9, cuts          # 3 runs × 3 clients in one stack
    per_instance = 3 * 10 * fused._floats_per_sample(build_model("lstm_shakespeare", (80,), 81), torch.zeros(1, 80,
                                                                                                         dtype=torch.long))
    monkeypatch.setitem(fused.FUSED_FLOATS, "cpu", 2 * per_instance)
    cuts.clear()
    assert [state(h) for h in simulate_group(configs, progress=False)] == alone
    # pairs, and a last one alone (or beside a discarded copy, where a stack of one rounds otherwise)
    assert max(c for cut in cuts for c, _ in cut) == 2 and max(c + n for cut in cuts for c, n in cut) == 2, cuts


def test_stacks_are_cut_to_sizes_that_compute_as_pairs():
    device = torch.device("cpu")

    def cut(rows, per_row, inexact=(), only_pairs=False):
        exact = (lambda m: m == 2) if only_pairs else (lambda m: m not in inexact)
        return [(len(c), n) for c, n in fused._chunks(list(range(rows)), per_row, device, exact)]
    big = fused.FUSED_FLOATS["cpu"]                        # one row alone is over the budget
    cnn = (1, 3)                                            # the sizes that round otherwise for the CNN here
    assert cut(5, big) == [(1, 0)] * 5                      # every size computes alike (the dense models)
    assert cut(5, big, cnn) == [(2, 0), (2, 0), (1, 1)]     # pairs; a last one can join neither: a copy
    assert cut(5, big, (1,)) == [(2, 0), (3, 0)]            # ... or it joins the pair before it
    assert cut(1, big, cnn) == [(1, 1)] and cut(2, big, cnn) == [(2, 0)]
    four = big // (3 * 4)                                   # four rows fit
    assert cut(3, four, cnn) == [(3, 1)]                    # a run of three clients alone: padded to four
    assert cut(9, four, cnn) == [(4, 0), (5, 0)] and cut(9, four) == [(4, 0), (4, 0), (1, 0)]
    assert cut(7, four, cnn) == [(7, 0)]
    assert cut(8, big // (3 * 3), cnn) == [(4, 0), (4, 0)]  # a budget of three stacks: raised to four
    assert cut(7, four, only_pairs=True) == [(2, 0), (2, 0), (2, 0), (1, 1)]   # no size near but 2: pairs


def test_every_stack_size_gives_an_instance_the_bits_of_a_pair(fmnist):
    # The same instance (start, data, stream) stacked with 1..6 copies of itself through the engine:
    # every copy of every stack computes what it computes in a pair. Fails where a stack of one or
    # three of the CNN is trained as it is (other kernels, exactness.size_is_exact).
    from fairfl.training.client import flat_params
    model = build_model("cnn_fmnist", (1, 28, 28), 10, seed=0)
    start = flat_params(model)
    source = engine.Source(fmnist.x_train[:60], fmnist.y_train[:60], 0, 60)
    local = LocalTraining(epochs=1, batch_size=20, lr=0.05)
    results = {}
    for m in range(1, 7):
        job = engine.Job(model, start.expand(m, -1).clone(), [source] * m, [Stream(3, 0, 0)] * m, local,
                         loss_after=True, sum_gradients=True)
        results[m] = engine.execute([job])[0]
    pair = results[2]
    for m, got in results.items():
        for k in range(m):
            assert torch.equal(got.params[k], pair.params[0]) and torch.equal(got.grad_sum[k], pair.grad_sum[0]), (m, k)
            assert torch.equal(got.loss_after[k], pair.loss_after[0]), (m, k)


@pytest.mark.slow
def test_a_run_whose_partners_finish_first_gives_its_result_alone(fmnist):
    # One client per round: alone, each stack holds one instance; in the group, the long run shares
    # round 0's stack with the short one and is alone in the rounds after. A stack of one computes
    # with other kernels (a plain convolution, not a grouped one; vmap likewise for FMOL's LeNet),
    # so it is trained beside a copy of itself; a dense model's stack of one computes as a larger
    # stack does (exactness.size_is_exact finds out), so it trains alone. Either way the long run
    # gets its result alone.
    exactness._EXACT_SIZES.clear()
    cnn = CNN.replace(algorithm=FedAvg(), clients_per_round=1, eval_every=3)
    mgd = fmol_config(K=1, n=32, clients=3, rounds=3, centralised=True)        # pooled data: one instance
    mlp = MLP.replace(algorithm=FedAvg(), clients_per_round=1, eval_every=3)                  # full batch
    for long, short in ((cnn.replace(rounds=3), cnn.replace(rounds=1, seed=1)),
                        (mgd, fmol_config(K=1, n=32, clients=3, rounds=1, centralised=True, seed=1)),
                        (mlp.replace(rounds=3), mlp.replace(rounds=1, seed=1))):
        grouped = simulate_group([long, short], progress=False)
        assert state(grouped[0]) == state(simulate(long, progress=False)), long.model
        assert state(grouped[1]) == state(simulate(short, progress=False)), short.model
    # both ways were taken: a copy for the CNN (and the LeNet), none for the MLP, on this machine
    alone = {k: ok for (k, m), ok in exactness._EXACT_SIZES.items() if m == 1}
    assert set(alone.values()) == {True, False}, alone


# ----------------------------------------------------------------------------- predictions

@pytest.mark.parametrize("name", ["logreg", "mlp2", "cnn_fmnist"])
def test_predictions_of_several_models_on_the_same_data_are_each_models_own(fmnist, name):
    """Predict jobs on the same inputs (the losses and evaluations of a lockstep group) give each
    model the logits it gets alone bit for bit: stacked for a small dense model (where it pays and
    is exact), one model at a time for the MLP and the CNN (where a stack is slower)."""
    from fairfl.training.client import flat_params, predict
    exactness._PREDICT_EXACT.clear()
    x = fmnist.x_test[:1100].reshape(1100, -1) if name == "logreg" else fmnist.x_test[:1100]
    parts = (x[:300], x[300:1099], x[1099:])                    # chunks across parts, a last short one
    models = [build_model(name, tuple(x.shape[1:]), 10, seed=s) for s in range(3)]
    jobs = [engine.Predict(models[0], flat_params(m), parts) for m in models]
    stacked_calls = []
    real = predictions.predict_stack
    with pytest.MonkeyPatch.context() as mp:
        for where in (dispatch, predictions):        # stacked where they meet, one model at a time
            mp.setattr(where, "predict_stack", lambda model, params, *a: stacked_calls.append(len(params[0])) or real(model, params, *a))
        got = engine.execute(jobs)
    for model, logits in zip(models, got):
        assert torch.equal(logits, predict(model.eval(), list(parts))), name
    assert not torch.equal(got[0], got[1])
    if name == "logreg":
        assert 3 in stacked_calls and exactness._PREDICT_EXACT and all(exactness._PREDICT_EXACT.values())
    else:                                # too large to gain from a stack: one model at a time
        assert max(stacked_calls) == 1 and not exactness._PREDICT_EXACT
    empty = engine.execute([engine.Predict(models[0], flat_params(m), (x[:0], x[:0])) for m in models])
    assert all(isinstance(e, torch.Tensor) and e.numel() == 0 for e in empty), empty


@pytest.mark.slow
def test_runs_that_predict_between_rounds_still_train_together(fairfl_env):
    """AFL asks for its clients' losses before each round, FedAvg does not: the predictions are
    executed first, and every round's training is still one fused execution of every run."""
    base = ADULT.replace(rounds=3, eval_every=3)        # AFL's losses are not those of an evaluation just made
    configs = [base.replace(algorithm=AFL(lr_lambda=0.5)), base.replace(algorithm=FedAvg()),
               base.replace(algorithm=AFL(lr_lambda=0.5), seed=1)]
    flushes = []
    real = dispatch.execute

    def recording(jobs):
        flushes.append(sorted(type(j).__name__ for j in jobs))
        return real(jobs)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dispatch, "execute", recording)
        group = simulate_group(configs, progress=False)
    training = [f for f in flushes if "Job" in f]
    assert training == [["Job"] * 3] * 3, flushes                 # one per round, all three runs, nothing else
    assert ["Predict"] * 2 in flushes and ["Predict"] * 3 in flushes, flushes   # AFL's losses; the evaluations
    for c, h in zip(configs, group):
        assert state(h) == state(simulate(c, progress=False)), c.algorithm


def test_an_error_of_the_engine_itself_reaches_every_run_of_its_batch(fmnist, monkeypatch):
    """An exception raised by the execution of a batch (not by one job) wakes every run that
    waited for it, with that exception: none waits forever."""
    import threading

    def broken(jobs):
        raise RuntimeError("the engine broke")
    monkeypatch.setattr(dispatch, "execute", broken)
    out: dict = {}
    configs = [MLP.replace(algorithm=FedAvg(), rounds=1), MLP.replace(algorithm=FedAvg(), rounds=1, seed=1)]
    worker = threading.Thread(target=lambda: out.update(results=simulate_group(configs, progress=False)), daemon=True)
    worker.start()
    worker.join(120)
    assert not worker.is_alive(), "a run waited forever for a batch whose execution failed"
    assert [type(r).__name__ for r in out["results"]] == ["RuntimeError"] * 2, out
    assert all("the engine broke" in str(r) for r in out["results"])
