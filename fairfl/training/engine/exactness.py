"""Bit-exactness: the one place for every rule that makes a run's result a function of its config.

**The invariant.** A run gives the same bits alone or in any group of runs, wherever its group's
stacks are cut, with any thread count of the calling process, on any backend (this process, a
pool of workers, Ray), and resumed from a checkpoint. The run cache holds one result per config
key, a resumed run must continue to the uninterrupted result, and a notebook's claims are checked
on results that must not move with how a sweep was scheduled. Tested bit for bit by
``tests/test_engine.py`` (groups, cuts, partners finishing first, resume), ``tests/test_determinism.py``
(threads, backends) and ``tests/test_golden.py`` (recorded results, where :func:`cpu_kernels`
match the recording's).

**The rules**, each with its probe and its process-wide memo:

* one intra-op thread per computation (:data:`RUN_THREADS`, :func:`run_threads`; the threads of
  ``fairfl.training.engine.cores`` each compute with one): some CPU kernels split their reductions by thread;
* Intel MKL in strict conditional numerical reproducibility (:data:`MKL_CBWR`, set by
  ``fairfl/__init__.py`` before torch first calls MKL; :func:`check_reproducible`): else MKL picks
  kernels by memory alignment, and a row rounds by its place in a stack;
* full float32 and deterministic kernels on CUDA (:func:`exact_cuda`);
* a stack's size is one that computes each instance's bits as a stack of two does
  (:func:`size_is_exact`, :func:`exact_stacks`: sizes that do not are padded or cut otherwise);
* a dense model's weight gradient is taken the faster way round only where it rounds the same
  (:func:`transposed_is_exact`);
* several runs' predictions are stacked only where every instance gets its own bits
  (:func:`stacks_predictions`);
* and what picks the CPU kernels, beside the config (:func:`cpu_kernels`): bit for bit holds
  between machines that agree on it.

**What it costs** (this project's 2-core AMD EPYC, busy with other work; CPU seconds of one
thread, medians of 3 fresh processes alternating exact and ``FAIRFL_EXACT=0``, in-process sweeps): on
notebook-shaped sweeps nothing measurable — notebook 02's 45 Adult runs (3 rounds) 5.6 s exact
against 5.6 s, notebook 04's MLP (8 runs, 3 rounds) 15.3 against 14.5 s, two of notebook 01's CNN
runs (10 clients, 1 round) 11.6 against 11.6 s, each within its runs' spread (±10 %). Where a rule
changes what is computed the price shows: a lone CNN instance trains beside a discarded copy (an
epoch of 600 samples at b = 10: 0.40-0.43 against 0.23-0.31 s), and each new step shape's probe is
paid once per process (about 0.2 s for the CNN); ten instances train alike either way (1.36-1.38
against 1.26-1.47 s), and so does a stack of Adult's dense model under MKL's strict mode.

**Switching it off** for a quick experiment: ``FAIRFL_EXACT=0`` in the environment before fairfl is
imported (:data:`EXACT`). Then no probe runs (every stack size is taken as it comes, predictions
stack wherever that pays, the weight gradient is always taken the faster way round), MKL keeps its
default mode and CUDA torch's defaults (TF32 convolutions, kernels not chosen for determinism).
Results then agree with the exact ones to float tolerance only: a run may differ in the last bits
between alone and in a group, and from one execution to the next, so such results do not belong
in a shared run cache (the cache key does not know the switch: point ``FAIRFL_RESULTS``
elsewhere, or ``run(config, cache=False)``). Runs keep one intra-op thread either way: parallelism
comes from running several runs at once, which on these small models is also the faster way to
use the cores. ``tests/test_exactness.py`` shows what the switch changes.
"""
from __future__ import annotations

import functools
import os
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Sequence

import torch

from fairfl.federated import stacked as stacked_forward
from .cores import RUN_THREADS, one_thread  # noqa: F401 (RUN_THREADS: the rule, read from here too)
from .jobs import Plan, Predict, Source, signature, unflatten
from .predict import PREDICT_STACK, chunk_rows, predict_stack
from .stack import Gather, Row, sgd_stack, training_losses

# The switch: ``FAIRFL_EXACT=0`` skips every probe and strict mode below (read once, at import,
# like MKL_CBWR, which must be decided before torch first calls MKL; a process pool's workers
# inherit it with the other FAIRFL_* settings). Any other value, or none, is exact.
EXACT = os.environ.get("FAIRFL_EXACT", "1").strip() != "0"


# ----------------------------------------------------------------------------- threads

# On the CPU, some kernels reduce in an order that depends on the number of intra-op threads (the
# CNN's bias gradient by ~5e-9 between one and two threads, tests/test_determinism.py). So every
# computation of a run uses :data:`RUN_THREADS` = 1 intra-op thread; a run's cores come from
# computing independent pieces side by side (``fairfl.training.engine.cores``, which holds the rule, below
# this module: its threads are what this module's probes must also see).


@contextmanager
def run_threads():
    """Compute with :data:`RUN_THREADS` intra-op threads inside the block (MKL switched to strict
    mode first, :func:`check_reproducible`); restore afterwards."""
    check_reproducible()
    with one_thread():
        yield


# ----------------------------------------------------------------------------- Intel MKL

# What ``fairfl/__init__.py`` sets ``MKL_CBWR`` to (unless ``FAIRFL_EXACT=0``), before torch first
# calls MKL: MKL picks its kernels by memory alignment unless told not to, so rows of a fused stack
# were rounded differently depending on where they sat (1 ulp in the training loss of 4 of 45 Adult
# runs trained in a group vs alone; measured), and one config would not give one result. Intel
# MKL's strict conditional numerical reproducibility removes this; its AUTO branch is the CPU's own.
# The assignment stays in ``fairfl/__init__.py``, which must not import torch to make it.
MKL_CBWR = "AUTO,STRICT"
_MKL_CBWR_STRICT = 0x10000          # the STRICT bit of mkl_serv_cbwr_get's answer


def check_reproducible() -> bool:
    """Switch MKL to strict reproducibility if it is not yet (possible only before its first
    call); warn once where that failed, e.g. torch computed before fairfl was imported. Returns
    whether results are independent of memory alignment (True where torch has no MKL). With
    ``FAIRFL_EXACT=0`` nothing is switched and nothing warned: False."""
    global _REPRODUCIBLE
    if not EXACT:
        return False
    with _REPRODUCIBLE_LOCK:          # the runs of a group start in threads: switch once, before any computes
        if _REPRODUCIBLE is None:
            _REPRODUCIBLE = _switch_mkl_strict()
    return _REPRODUCIBLE


def _mkl_library():
    """torch's CPU library, through which its statically linked MKL's service functions are called."""
    import ctypes
    return ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))


def _switch_mkl_strict() -> bool:
    reproducible = True
    if torch.backends.mkl.is_available():
        try:
            lib = _mkl_library()
            if not lib.mkl_serv_cbwr_get(-1) & _MKL_CBWR_STRICT:
                lib.mkl_serv_cbwr_set(2 | _MKL_CBWR_STRICT)          # MKL_CBWR_AUTO | STRICT
                reproducible = bool(lib.mkl_serv_cbwr_get(-1) & _MKL_CBWR_STRICT)
        except (OSError, AttributeError):
            pass                              # another build of torch: nothing known to switch
        if not reproducible:
            warnings.warn("Intel MKL was started before fairfl was imported, without MKL_CBWR=AUTO,STRICT: runs "
                          "trained together may differ from runs trained alone in the last bit. Import fairfl "
                          "first, or set MKL_CBWR=AUTO,STRICT in the environment.", stacklevel=4)
    return reproducible


_REPRODUCIBLE: bool | None = None
_REPRODUCIBLE_LOCK = threading.Lock()

# The instruction sets oneDNN (torch's convolutions) picks its kernels by, as /proc/cpuinfo names them
_KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
                 "avx_vnni", "amx_tile", "amx_bf16")


def cpu_kernels() -> dict[str, str]:
    """What picks the CPU kernels a run computes with, beside its config: the last bits of every
    result depend on it. MKL runs another code branch on an Intel CPU than on an AMD one (its
    ``AUTO`` branch), oneDNN generates its convolutions for the instruction sets it finds, and
    torch's own kernels reduce in vectors of its capability's width. So one config gives one result
    bit for bit on machines that agree on all of this, and results equal to float tolerance
    elsewhere (a last-bit difference grows over training; ``tests/test_golden.py`` measures by how
    much). Fields: torch's version, its kernels' capability, MKL's version and branch, the CPU's
    vendor and its relevant instruction sets, and a hash of a few of these kernels' results on
    fixed inputs (one thread), which catches what the names do not (a library's blocking)."""
    import ctypes
    import hashlib
    import platform
    flags, vendor = set(), platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "vendor_id":
                vendor = value.strip()
            elif name.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass                                   # not Linux: the probe below still tells kernels apart
    mkl = "none"
    if torch.backends.mkl.is_available():
        check_reproducible()                   # the mode runs are computed in, set before MKL's first call
        try:
            lib = _mkl_library()
            text = ctypes.create_string_buffer(256)
            lib.MKL_Get_Version_String(text, 256)
            mkl = (f"{text.value.decode(errors='replace')}; mode {lib.mkl_serv_cbwr_get(-1):#x}; "
                   f"branch {lib.mkl_serv_cbwr_get_auto_branch()}")
        except (OSError, AttributeError):
            mkl = "available, branch unknown"
    with run_threads():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(40, 784, generator=g)
        w = torch.randn(784, 200, generator=g, requires_grad=True)
        images = torch.randn(10, 4, 12, 12, generator=g)
        kernel = torch.randn(8, 2, 5, 5, generator=g, requires_grad=True)     # 2 groups, as a stack of 2
        hidden = torch.relu(x @ w)                                              # MKL sgemm
        batched = torch.bmm(hidden.view(4, 10, 200), w[:200, :99].unsqueeze(0).expand(4, -1, -1))
        conv = torch.nn.functional.max_pool2d(torch.nn.functional.conv2d(images, kernel, groups=2), 2)
        loss = (torch.log_softmax(batched, -1).sum() + conv.square().mean())
        loss.backward()
        parts = [hidden, batched, conv, w.grad, kernel.grad, (x.double() @ w.detach().double()).sum(0)]
        digest = hashlib.sha256(b"".join(p.detach().contiguous().numpy().tobytes() for p in parts)).hexdigest()
    return {"torch": torch.__version__, "capability": torch.backends.cpu.get_cpu_capability(), "mkl": mkl,
            "cpu": f"{vendor}: {' '.join(f for f in _KERNEL_FLAGS if f in flags) or 'none of ' + '/'.join(_KERNEL_FLAGS)}",
            "probe": digest[:16]}


# ----------------------------------------------------------------------------- CUDA

def exact_cuda() -> None:
    """Full float32 and deterministic kernels on CUDA (process-wide torch switches), set before
    the first run uses the GPU (``fairfl.training.engine.device.resolve_device``). A run must be a function
    of its config: the cache holds one result per key, a checkpointed run must resume to the
    uninterrupted result, and the key leaves out which GPU ran it. cuDNN's default TF32
    convolutions (a 10-bit mantissa on Ampere and later GPUs) would tie the result to the GPU
    model; its benchmark mode may pick other kernels at each start; some of its backward kernels
    are not deterministic unless asked; and cuBLAS needs a fixed workspace configuration to be
    deterministic (PyTorch's notes on reproducibility). The price is small: TF32 was measured at
    no gain for the Fashion-MNIST CNN and at most 1.3x elsewhere (the project's GPU anchors).
    With ``FAIRFL_EXACT=0`` torch's defaults stay."""
    if not EXACT:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")   # read when cuBLAS starts
    # Legacy switches first, then each per-operator one (torch >= 2.9): the parent cudnn switch alone
    # left conv and rnn in TF32 on torch 2.11, and a mix of the APIs made cudnn.flags() raise (2.11-2.14)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    for switch in (torch.backends.cuda.matmul, getattr(torch.backends.cudnn, "conv", None),
                   getattr(torch.backends.cudnn, "rnn", None)):
        if hasattr(switch, "fp32_precision"):
            switch.fp32_precision = "ieee"
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


# ----------------------------------------------------------------------------- a dense model's weight gradient

def transposed_is_exact(b: int, fan_in: int, fan_out: int, dtype: torch.dtype) -> bool:
    """Whether ``fairfl.federated.stacked.dense_gradients`` may take a weight gradient as gradᵀ·inp instead
    of autograd's (inpᵀ·grad)ᵀ for stacked matrices of this shape on the CPU: where the two round
    the same (:func:`_transposed_probe`), or always with ``FAIRFL_EXACT=0`` (it is the faster form:
    7 against 36 µs for Adult's linear model, 21 instances at b = 10)."""
    return not EXACT or _transposed_probe(b, fan_in, fan_out, dtype)


@functools.lru_cache(maxsize=256)
def _transposed_probe(b: int, fan_in: int, fan_out: int, dtype: torch.dtype) -> bool:
    """Whether, on the CPU, gradᵀ·inp gives (inpᵀ·grad)ᵀ bit for bit for stacked matrices of this
    shape: tried on three random draws (a differing summation order or fused multiply-add would
    show in some of the b·in·out entries). Kernels are picked by shape and layout, not by the
    values, so the answer holds for every input of this shape; torch multiplies a stack's
    matrices one at a time on a CPU, so a stack of 2 stands for any."""
    g = torch.Generator().manual_seed(b * 7919 + fan_in * 31 + fan_out)
    for scale in (1.0, 1e-3, 1e4):
        inp = (torch.randn(2, b, fan_in, generator=g) * scale).to(dtype=dtype)
        grad = (torch.randn(2, b, fan_out, generator=g) / b).to(dtype=dtype)
        if not torch.equal(torch.bmm(grad.transpose(1, 2), inp), torch.bmm(inp.transpose(1, 2), grad).transpose(1, 2)):
            return False
    return True


# ----------------------------------------------------------------------------- stack sizes

# A stack of two is the reference: an instance's result is the one it gets beside one other instance.
REFERENCE_SIZE = 2
_PROBES: dict[tuple, tuple] = {}          # step shapes -> (probe row, start, settings, a pair's outcome)
_EXACT_SIZES: dict[tuple, bool] = {}      # (step shapes, stack size) -> exact


def size_is_exact(model, names, template, row: Row, cfg, device, dtype, m: int) -> bool:
    """Whether m stacked instances of this model compute, at this row's step shapes, each the bits
    it computes in a stack of two. Kernels are picked by shape, and the stack's size is part of
    the shape: on this project's CPU a stack of one of the Table 3 CNN or FMOL's LeNet runs a plain
    convolution where larger stacks run a grouped one, and a stack of three computes the first
    convolution's weight gradient otherwise (oneDNN takes 3 input channels, one per instance, for
    an image's colour channels), each differing in the last bits; the dense models (1-40) and the
    character LSTM (1-7) compute alike at every size measured. A stack that is not exact is padded
    with discarded copies or cut otherwise (:func:`exact_stacks`), so that a run gets the same bits
    alone, in any group, and wherever its group's stacks are cut. Found out once per process, step
    shapes and size, by copies of one instance taking one step per distinct batch size on its
    client's first samples, then the loss over the client's data; the same instance, start and
    settings for every size.
    Kernels do not depend on the values, so the answer holds for every step of those shapes.
    With ``FAIRFL_EXACT=0`` every size is taken as exact, unprobed."""
    if m == REFERENCE_SIZE or not EXACT:
        return True
    sizes = tuple(dict.fromkeys(row.plan.sizes))          # each distinct batch size, in order
    # the client's size fixes the shapes of the loss after training (chunks of LOSS_CHUNK), and the
    # thread count can change a kernel's reduction
    key = (signature(model), sizes, row.source.size, tuple(row.source.x.shape[1:]), row.source.x.dtype, dtype,
           str(device), torch.get_num_threads(), stacked_forward.dense(model), bool(cfg.prox_mu), bool(cfg.momentum),
           bool(cfg.weight_decay))
    if (key, m) not in _EXACT_SIZES:
        probe = _PROBES.get(key)
        if probe is None:
            # the probe's own copy of the client's data, of the start and of the settings: every size is
            # compared with the pair on the very same inputs
            n = row.source.size
            data = Source(*(t[row.source.start:row.source.start + n].clone() for t in (row.source.x, row.source.y)), 0, n)
            steps = Plan(torch.cat([torch.arange(min(s, n)) for s in sizes]), [min(s, n) for s in sizes])
            start = torch.cat([t.detach().reshape(-1) for t in template]).to(device=device, dtype=dtype)
            inputs = (Row(row.job, row.k, data, row.stream, steps), start, cfg)
            probe = _PROBES[key] = (*inputs, _probe_step(model, names, template, *inputs, device, dtype, REFERENCE_SIZE)[0])
        *inputs, reference = probe
        _EXACT_SIZES[(key, m)] = all(all(_same_bits(a, b) for a, b in zip(reference, outcome))
                                     for outcome in _probe_step(model, names, template, *inputs, device, dtype, m))
    return _EXACT_SIZES[(key, m)]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit: NaN where the other has the same NaN (a client without samples has a NaN
    loss), and −0.0 apart from 0.0."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.detach().reshape(-1).contiguous().view(torch.uint8), b.detach().reshape(-1).contiguous().view(torch.uint8))


def _probe_step(model, names, template, probe: Row, start: torch.Tensor, cfg, device, dtype, m: int) -> list[list[torch.Tensor]]:
    """Per instance, what a stack of m copies of ``probe``'s instance computes from ``start`` in the
    steps of its plan: parameters, summed and first gradients, the loss after them."""
    w = unflatten(start.expand(m, -1).clone(), template)
    hyper = {h: torch.full((m,), v, dtype=dtype, device=device) for h, v in
             (("lr", cfg.lr), ("momentum", cfg.momentum), ("weight_decay", cfg.weight_decay), ("half_mu", cfg.prox_mu / 2))}
    gather = Gather([probe] * m, device)
    keys = torch.full((m,), probe.stream.key, dtype=torch.int64, device=device)
    w, acc, first = sgd_stack(model, names, w, w, gather, len(probe.plan), keys, hyper, cfg, True, True,
                               transposed_is_exact)
    after = training_losses(model, names, w, gather)
    return [[t[i] for t in (*w, *acc, *first)] + [after[i]] for i in range(m)]


def exact_stacks(rows: list, size: int, exact: Callable[[int], bool]) -> list[tuple[list, int]]:
    """``rows`` cut into stacks of about ``size`` (what the memory budget allows,
    ``fairfl.training.engine.fused``), each as (its rows, how many discarded copies of its first row pad it):
    every stack's size is one that :func:`size_is_exact` (``exact``, asked only for the sizes met)
    finds to compute each instance's bits as a pair does. A size that does not is raised to the next
    that does (a budget that fits one instance of notebook 02's CNN at b = 400 gets pairs, not
    stacks of one that would each need a copy); a short last stack that does not joins the one
    before it where that size does, and is padded otherwise. Which stack an instance is in never
    changes its result, only how much is computed (tests/test_engine.py)."""
    size = _exact_size(size, exact)
    cut = [rows[i:i + size] for i in range(0, len(rows), size)]
    if len(cut) > 1 and not exact(len(cut[-1])) and exact(size + len(cut[-1])):
        cut[-2:] = [cut[-2] + cut[-1]]
    out = []
    for chunk in cut:
        padded = _exact_size(len(chunk), exact)
        if padded < len(chunk):            # no size near it is exact: pairs, which are by definition
            out += [(chunk[i:i + 2], 2 - len(chunk[i:i + 2])) for i in range(0, len(chunk), 2)]
        else:
            out.append((chunk, padded - len(chunk)))
    return out


def _exact_size(m: int, exact: Callable[[int], bool], reach: int = 8) -> int:
    """The smallest stack size from m to m + ``reach`` that is exact, or 2 (a pair) where none is."""
    return next((k for k in range(max(1, m), m + reach + 1) if exact(k)), 2)


# ----------------------------------------------------------------------------- predictions

_PREDICT_EXACT: dict[tuple, bool] = {}    # (architecture, chunk shape, stack size, dtype, device) -> exact


def stacks_predictions(jobs: Sequence[Predict]) -> bool:
    """Whether these jobs' predictions are stacked: a small dense model (where stacking pays), and
    every instance's logits the same bits in this stack as alone, for every chunk shape of the
    inputs (the full chunks and the last one) — found out once per process, chunk shape and stack
    size, on the first chunk of that shape, for every instance of the stack. Kernels are picked by
    shape, not by the values, so the answer holds for every chunk of that shape. With
    ``FAIRFL_EXACT=0``: wherever stacking pays, unprobed."""
    model = jobs[0].model
    if len(jobs) < 2 or not jobs[0].stackable:
        return False
    template = list(model.parameters())
    parts, chunk = jobs[0].inputs, jobs[0].chunk
    n = sum(len(p) for p in parts)
    if n == 0:
        return False
    if not EXACT:
        return True
    spans = [(0, min(chunk, n))]                              # the first full chunk, and a shorter last one
    if n > chunk and n % chunk:
        spans.append((n - n % chunk, n))
    first = parts[0]
    for lo in range(0, len(jobs), PREDICT_STACK):
        members = jobs[lo:lo + PREDICT_STACK]
        if len(members) < 2:
            continue
        for a, b in spans:
            key = (signature(model), (b - a, *first.shape[1:]), len(members), first.dtype, str(first.device))
            if key not in _PREDICT_EXACT:          # only then is the chunk cut (a copy across two datasets)
                piece = chunk_rows(parts, a, b)
                stack = predict_stack(model, unflatten(torch.stack([j.params for j in members]), template), [piece], b - a)
                _PREDICT_EXACT[key] = all(
                    torch.equal(stack[i], predict_stack(model, unflatten(j.params[None], template), [piece], b - a)[0])
                    for i, j in enumerate(members))
            if not _PREDICT_EXACT[key]:
                return False
    return True
