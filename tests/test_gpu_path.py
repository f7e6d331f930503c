"""The CUDA path, checked on a CPU: what a review of it found before any GPU ran it.

* ``exact_cuda`` turns off every TF32 switch torch has — the legacy ``allow_tf32`` ones and the
  per-operator ``fp32_precision`` of matrix products, cuDNN convolutions and cuDNN's LSTM — and
  leaves them readable (``cudnn.allow_tf32``, ``cudnn.flags()``); ``resolve_device("auto")``
  applies them as a named CUDA device does;
* data moved to a GPU is remembered under that GPU's index;
* the loss after training cuts a stack's instance axis within a memory budget on CUDA, each
  instance's loss unchanged;
* the character LSTM's second derivatives in eval mode (FedNL, FedNew) take a path cuDNN allows;
* a sweep for a Ray cluster with GPUs is not refused by a driver without one.

Each switch is read in a fresh interpreter: they are process-wide, and torch refuses to read a
mix of its two APIs (the very failure checked for).
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import fairfl.training.engine as engine
from fairfl import ExperimentConfig, LocalTraining
from fairfl.training.engine import stack
from fairfl.base.errors import ConfigError
from fairfl.federated.models import CharLSTM, build_model, unrolled_lstm
from fairfl.base.seeding import Stream

REPO = Path(__file__).resolve().parent.parent


def fresh(code: str, env: dict | None = None) -> dict:
    """What ``code`` (which sets ``out``) computes in a new interpreter, as JSON."""
    import os
    script = "import json\n" + textwrap.dedent(code) + "\nprint(json.dumps(out))"
    r = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


READ_SWITCHES = """
    import torch
    b = torch.backends
    out = {"matmul.allow_tf32": b.cuda.matmul.allow_tf32, "cudnn.allow_tf32": b.cudnn.allow_tf32,
           "deterministic": b.cudnn.deterministic, "benchmark": b.cudnn.benchmark}
    for name, s in (("matmul", b.cuda.matmul), ("conv", getattr(b.cudnn, "conv", None)), ("rnn", getattr(b.cudnn, "rnn", None))):
        if s is not None and hasattr(s, "fp32_precision"):
            out[name] = s.fp32_precision
    with b.cudnn.flags(enabled=False):           # raised after the old exact_cuda (a mix of the two APIs)
        out["flags"] = "entered"
"""


def assert_exact(switches: dict) -> None:
    assert switches["matmul.allow_tf32"] is False and switches["cudnn.allow_tf32"] is False, switches
    assert switches["deterministic"] is True and switches["benchmark"] is False, switches
    for name in ("matmul", "conv", "rnn"):           # torch >= 2.9: each its own switch, each set
        assert switches.get(name, "ieee") == "ieee", switches
    assert switches["flags"] == "entered"


def test_exact_cuda_turns_every_tf32_switch_off_readably():
    # The old exact_cuda set only the parent cudnn.fp32_precision: on torch 2.11 cudnn.conv and
    # cudnn.rnn still read tf32, and on 2.11-2.14 cudnn.allow_tf32 and cudnn.flags() then raised
    switches = fresh("from fairfl.training.engine.exactness import exact_cuda\nexact_cuda()\n" + textwrap.dedent(READ_SWITCHES))
    assert_exact(switches)


def test_exact_off_leaves_torchs_defaults():
    switches = fresh("from fairfl.training.engine.exactness import exact_cuda\nexact_cuda()\n" + textwrap.dedent(READ_SWITCHES),
                     env={"FAIRFL_EXACT": "0"})
    assert switches["cudnn.allow_tf32"] is True and switches["deterministic"] is False


def test_auto_applies_the_exactness_switches_when_it_chooses_cuda():
    # torch is told it has one GPU (this machine has none): "auto" must take the path of "cuda"
    switches = fresh(textwrap.dedent("""
        import torch
        torch.cuda.is_available = lambda: True
        torch.cuda.device_count = lambda: 1
        from fairfl.training.engine import resolve_device
        assert resolve_device("auto").type == "cuda"
    """) + textwrap.dedent(READ_SWITCHES))
    assert_exact(switches)


def test_data_moved_to_a_gpu_is_remembered_under_its_index(monkeypatch):
    # "cuda" is the thread's current GPU: a run on GPU 1 must not get the copy made for GPU 0
    from fairfl.runs.loop import memo_device
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert memo_device("cuda") == memo_device(torch.device("cuda")) == "cuda:1"
    assert memo_device("cuda:0") == "cuda:0" and memo_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert memo_device("cuda") == "cuda:0"


def test_loss_spans_cut_the_instance_axis_within_the_budget():
    assert stack.loss_spans(10, 512, 100, None) == [(0, 10)]
    assert stack.loss_spans(10, 512, 100, 3 * 512 * 100) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert stack.loss_spans(4, 512, 100, 1) == [(0, 1), (1, 2), (2, 3), (3, 4)]        # at least one instance
    assert stack.loss_spans(0, 512, 100, 1) == [(0, 0)]
    # the CUDA budget: a stack of the CNN as FUSED_FLOATS cuts it at b = 10 takes its loss in pieces
    model = build_model("cnn_fmnist", (1, 28, 28), 10)
    per = stack.floats_per_sample(model, torch.zeros(1, 1, 28, 28))
    m = engine.fused.FUSED_FLOATS["cuda"] // (3 * 10 * per)
    spans = stack.loss_spans(m, 512, per, stack.LOSS_FLOATS["cuda"])
    assert len(spans) > 1 and all((hi - lo) * 512 * per <= stack.LOSS_FLOATS["cuda"] for lo, hi in spans)


def test_the_loss_after_training_in_pieces_is_each_instances_own(fmnist, monkeypatch):
    # Seven MLP instances on two data pools (rows of two pools interleave in the pieces), their
    # losses after training taken in pieces of three instances: the same bits as in one piece
    # (a dense model computes alike at every stack size). Pieces are CUDA's; here forced on the CPU.
    model = build_model("mlp2", (1, 28, 28), 10, seed=0)
    from fairfl.training.client import flat_params
    start = flat_params(model)
    pools = [engine.Source(fmnist.x_train[:700].clone(), fmnist.y_train[:700].clone(), 0, 700),
             engine.Source(fmnist.x_train[700:1400].clone(), fmnist.y_train[700:1400].clone(), 0, 700)]
    sources = [pools[k % 2] for k in range(7)]
    local = LocalTraining(epochs=1, batch_size=100, lr=0.05)

    def losses():
        job = engine.Job(model, start.expand(7, -1).clone(), sources, [Stream(k, 0, k) for k in range(7)], local,
                         loss_after=True)
        return engine.execute([job])[0].loss_after

    whole = losses()
    per = stack.floats_per_sample(model, fmnist.x_train[:1])
    monkeypatch.setitem(stack.LOSS_FLOATS, "cpu", 3 * 512 * per)
    calls = []
    real = stack.stacked_losses
    monkeypatch.setattr(stack, "stacked_losses", lambda m, n, w, *a, **k: calls.append(len(w[0])) or real(m, n, w, *a, **k))
    pieces = losses()
    assert calls and max(calls) == 3, calls                     # the loss was taken in pieces of at most 3
    assert torch.equal(pieces, whole), (pieces, whole)


def test_the_unrolled_lstm_is_the_lstm():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(8, 16, num_layers=2, batch_first=True)
    x = torch.randn(3, 11, 8)
    torch.testing.assert_close(unrolled_lstm(lstm, x), lstm(x)[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="batch-first"):
        unrolled_lstm(torch.nn.LSTM(8, 16), x)


def test_the_char_lstms_hessian_products_through_the_unrolled_path_agree():
    # What FedNL/FedNew ask of the model on a GPU (where cuDNN's LSTM refuses a backward pass in
    # eval mode): the Hessian-vector product of the eval-mode loss through the unrolled LSTM equals
    # nn.LSTM's (on the CPU, where both run). On the CPU the model itself keeps nn.LSTM's bits.
    torch.manual_seed(0)
    model = CharLSTM(81, 81, hidden=32).eval()
    x, y = torch.randint(0, 81, (4, 20)), torch.randint(0, 81, (4,))
    with torch.no_grad():
        assert torch.equal(model(x), model.head(model.lstm(model.embed(x))[0][:, -1]))
    params = list(model.parameters())
    v = [torch.randn_like(p) for p in params]

    def hvp(forward):
        loss = torch.nn.functional.cross_entropy(forward(x), y)
        g = torch.autograd.grad(loss, params, create_graph=True)
        return torch.autograd.grad(sum((a * b).sum() for a, b in zip(g, v)), params)
    ours = hvp(lambda t: model.head(unrolled_lstm(model.lstm, model.embed(t))[:, -1]))
    theirs = hvp(model)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_driver_without_a_gpu_sends_cuda_runs_to_a_ray_cluster_with_gpus():
    # Decided: the devices are checked where the runs train. A Ray backend trains on its cluster's
    # nodes, so the driver checks the device names only, and the backend must ask the cluster for
    # GPUs (RayBackend(device="cuda") names a cluster without any before training). A backend on
    # this machine still names a GPU this machine lacks. (Nothing here starts Ray.)
    from fairfl.runs.sweeps import ProcessBackend, RayBackend, SerialBackend, check_devices
    configs = [ExperimentConfig(device="cuda"), ExperimentConfig(device="cuda:1"), ExperimentConfig()]
    check_devices(configs, RayBackend(device="cuda"))
    with pytest.raises(ConfigError, match=r"RayBackend\(device='cpu'\) gives its tasks no GPU"):
        check_devices(configs, RayBackend(device="cpu"))
    check_devices([ExperimentConfig()], RayBackend(device="cpu"))
    if not torch.cuda.is_available():
        for here in (SerialBackend(), ProcessBackend(workers=1), None):
            with pytest.raises(ConfigError, match="no CUDA device"):
                check_devices(configs, here)
