"""The engine on a CUDA device (skipped on machines without one, CI included): a run of every
algorithm family on the GPU agrees with the CPU run to float tolerance (the device's type is in
the cache key because the summation orders differ), a lockstep group on the GPU is deterministic
and agrees with its runs alone, stacked predictions agree with the CPU's, dropout masks are the
same on both devices (integer hashing), checkpoints hold CPU tensors, the GPU computes in full
float32 with deterministic kernels, and a group's threads train on the caller's GPU (two GPUs)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fairfl.federated.algorithms.dqnfed import DQNFed
from fairfl.federated.algorithms.fedavg import FedAvg
from fairfl.federated.algorithms.afl import AFL
from fairfl.federated.algorithms.fedmgda import FedMGDAPlus
from fairfl.training.engine import resolve_device
from fairfl.runs.history import CHECKPOINT
from fairfl.runs.loop import simulate, simulate_group
from fairfl.base.seeding import Stream, keep_mask

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")

from test_engine import ADULT, CNN, GROUP, MLP, state  # noqa: E402  (the engine tests' small configs)


def test_a_cuda_device_computes_in_full_float32_and_deterministically():
    resolve_device("cuda")
    assert torch.backends.cuda.matmul.fp32_precision == "ieee"
    assert torch.backends.cudnn.conv.fp32_precision == "ieee"
    assert torch.backends.cudnn.rnn.fp32_precision == "ieee"
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32   # readable: no API mix
    with torch.backends.cudnn.flags(enabled=True):
        pass


def test_fednl_and_fednew_differentiate_the_lstm_twice_on_the_gpu(fairfl_env):
    # cuDNN's LSTM refuses a backward pass in eval mode, where second-order methods take their
    # Hessian-vector products; the character LSTM takes its unrolled path there (fairfl.federated.models)
    from fairfl.federated.algorithms.fednew import FedNew
    from fairfl.federated.algorithms.fednl import FedNL
    from fairfl.studies.paper import dqnfed_shakespeare_config
    for algorithm in (FedNL(mu=10.0, hessian_batch=8), FedNew(rho=100.0, hessian_batch=8, cg_iters=3)):
        config = dqnfed_shakespeare_config(algorithm, roles=2, max_samples=16, rounds=1, track_improved=False)
        cpu = simulate(config, progress=False)
        gpu = simulate(config.replace(device="cuda"), progress=False)
        np.testing.assert_allclose(gpu.train_losses(), cpu.train_losses(), rtol=1e-3, atol=1e-5)


def test_dropout_masks_are_the_same_on_cpu_and_gpu():
    keys = torch.tensor([Stream(s, 0, c).key for s in range(3) for c in range(4)])
    for counter in (0, 7, 2**20):
        cpu = keep_mask(keys, counter, (50, 64), 0.5)
        gpu = keep_mask(keys.cuda(), counter, (50, 64), 0.5)
        assert torch.equal(cpu, gpu.cpu())


@pytest.mark.parametrize("name", list(GROUP))
def test_every_family_on_the_gpu_agrees_with_the_cpu_to_float_tolerance(fmnist, name):
    # 2–3 rounds of each family of tests/test_engine.py: summation orders differ between the
    # devices, so agreement is to float tolerance (an argmax may flip: accuracies to 0.01)
    config = GROUP[name]
    cpu = simulate(config, progress=False)
    gpu = simulate(config.replace(device="cuda"), progress=False)
    assert gpu.sampled == cpu.sampled
    np.testing.assert_allclose(gpu.train_losses(), cpu.train_losses(), rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gpu.test_loss), np.asarray(cpu.test_loss), rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(gpu.mean_acc(), cpu.mean_acc(), atol=0.01)


def test_a_group_on_the_gpu_is_deterministic_and_agrees_with_its_runs_alone(fmnist, tmp_path):
    # cuBLAS chooses kernels by the stack's shape, so a run in a group agrees with the run alone
    # to float tolerance on a GPU (bit for bit on a CPU); the same group twice is bit-identical
    configs = [CNN.replace(algorithm=FedAvg(), device="cuda"),
               CNN.replace(algorithm=FedMGDAPlus(eps=0.1), device="cuda", seed=1),
               MLP.replace(algorithm=DQNFed(), device="cuda")]
    alone = [simulate(c, progress=False) for c in configs]
    dirs = [tmp_path / str(i) for i in range(len(configs))]
    simulate_group(configs, dirs, progress=False, stop_after=1)
    for d in dirs:                           # checkpoints are written as CPU tensors
        blob = torch.load(d / CHECKPOINT, weights_only=True)
        assert all(t.device.type == "cpu" for t in tensors(blob)), d
    together = ran(simulate_group(configs, dirs, progress=False))      # resumed from them
    again = ran(simulate_group(configs, progress=False))
    assert [state(h) for h in together] == [state(h) for h in again]
    for h, a in zip(together, alone):
        np.testing.assert_allclose(h.train_losses(), a.train_losses(), rtol=1e-4, atol=1e-6)


def test_stacked_predictions_on_the_gpu_agree_with_the_cpu():
    # two Adult runs in one group: their losses and evaluations are one stacked forward pass of
    # the small linear model per chunk (engine.Predict), on the GPU as on the CPU
    configs = [ADULT.replace(algorithm=AFL(lr_lambda=0.5)), ADULT.replace(algorithm=FedAvg(), seed=1)]
    cpu = ran(simulate_group(configs, progress=False))
    gpu = ran(simulate_group([c.replace(device="cuda") for c in configs], progress=False))
    for g, c in zip(gpu, cpu):
        np.testing.assert_allclose(g.train_losses(), c.train_losses(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(np.asarray(g.test_loss), np.asarray(c.test_loss), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(g.mean_acc(), c.mean_acc(), atol=0.01)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_a_group_trains_on_the_callers_current_gpu(fmnist):
    # a worker of ProcessBackend(gpus=n) is given its GPU by torch.cuda.set_device; the group's
    # runs train in threads of their own, and a new thread starts on GPU 0
    configs = [CNN.replace(algorithm=FedAvg(), device="cuda"), CNN.replace(algorithm=FedAvg(), device="cuda", seed=1)]
    before = torch.cuda.current_device()
    torch.cuda.set_device(1)
    try:
        torch.cuda.reset_peak_memory_stats(0)
        torch.cuda.reset_peak_memory_stats(1)
        ran(simulate_group(configs, progress=False))
        assert torch.cuda.max_memory_allocated(0) == torch.cuda.memory_allocated(0)    # nothing new on GPU 0
        assert torch.cuda.max_memory_allocated(1) > 0
    finally:
        torch.cuda.set_device(before)


def ran(results):
    """A group's histories; a run that failed raises its own error here."""
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from tensors(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from tensors(v)


@pytest.mark.parametrize("name", ["cnn_fedprox_momentum", "cnn_fedmgda_plus", "mlp_dqnfed", "adult_afl"])
def test_cuda_graphs_give_the_eager_bits(fmnist, name):
    # a fused step replayed from a CUDA graph runs the eager step's kernels: one config, one result
    # on a device, graphs on or off (fairfl.training.engine.graphs); and no capture fell back
    from fairfl.training.engine import graphs
    config = GROUP[name].replace(device="cuda")
    with graphs.switched(False):
        eager = simulate(config, progress=False)
    with graphs.switched(True):
        replayed = simulate(config, progress=False)
    assert not graphs.FAILED, graphs.FAILED
    assert state(replayed) == state(eager)
