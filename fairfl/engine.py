"""The engine of local training: it trains *instances* — one model copy on one client's data
from one start (``fairfl.client`` explains what an instance is) — and fuses the instances of
many calls, of one run or of many runs trained side by side, into one computation.

A call of the client runtime becomes a :class:`Job`: its instances, their data (slices of a
:class:`Pool`), their streams (batch order and dropout masks, ``fairfl.seeding.Stream``) and the
local-training settings. :func:`execute` runs a list of jobs:

* jobs whose instances can share a computation — same architecture, same batch shape and number
  of steps, same kind of update (momentum, weight decay, proximal term on or off) — are fused:
  their instances' parameters are stacked along one leading axis and every local step is one
  forward and backward pass of the whole stack (``fairfl.stacked``'s grouped convolutions and
  batched products, or ``torch.func.vmap``), with each instance's own learning rate, momentum,
  weight decay and proximal weight. Instances with other sample counts take other steps, so
  they form their own stacks; a stack too large for memory is cut along the instance axis.
* any other job (a recurrent model, a config with ``batched=False``) runs on the reference path:
  one ``nn.Module`` and one ``torch.optim.SGD`` per instance.

An instance's arithmetic never depends on the other instances of its stack — the losses share no
parameters, so the gradient of their sum is each instance's own gradient exactly, and its
batches and dropout masks come from its own stream — so a run gives the same result trained
alone or fused with other runs (tested bit for bit on the papers' models).

:class:`Lockstep` is how runs come to share computations: each run of a group advances in its
own thread, and a call of local training blocks until every other run of the group is blocked
too (or finished); then all their jobs are executed together and every run goes on. The runs
keep their own clients, algorithm state, checkpoints and cache entries. A tiny model's losses and
evaluations (:class:`Predict`: logits on the clients' data) meet the same way, one stacked forward
pass per chunk for every run that asks at once.
"""
from __future__ import annotations

import functools
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from . import stacked as stacked_forward
from .errors import ConfigError
from .seeding import Stream


# ----------------------------------------------------------------------------- devices

def resolve_device(spec: str) -> torch.device:
    """``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; a
    CUDA device that this machine does not have is a ConfigError, raised before any training.
    Resolving a CUDA device sets torch's CUDA switches for exact, repeatable runs (:func:`_exact_cuda`)."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device={spec!r} is not a device; use 'auto', 'cpu', 'cuda' or 'cuda:N'") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ConfigError(f"device={spec!r} is not supported; use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if not torch.cuda.is_available():
        raise ConfigError(f"device={spec!r}, but this machine has no CUDA device that torch can use "
                          f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}); use device='cpu' or 'auto'")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"device={spec!r}, but this machine has {torch.cuda.device_count()} CUDA device(s)")
    _exact_cuda()
    return device


def _exact_cuda() -> None:
    """Full float32 and deterministic kernels on CUDA (process-wide torch switches), set before
    the first run uses the GPU. A run must be a function of its config: the cache holds one result
    per key, a checkpointed run must resume to the uninterrupted result, and the key leaves out
    which GPU ran it. cuDNN's default TF32 convolutions (a 10-bit mantissa on Ampere and later
    GPUs) would tie the result to the GPU model; its benchmark mode may pick other kernels at each
    start; some of its backward kernels are not deterministic unless asked; and cuBLAS needs a
    fixed workspace configuration to be deterministic (PyTorch's notes on reproducibility).
    The price is small: TF32 was measured at no gain for the Fashion-MNIST CNN and at most 1.3x
    elsewhere (the project's GPU anchors)."""
    import os
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")   # read when cuBLAS starts
    try:                       # torch >= 2.9 (the older allow_tf32 switches are not to be mixed with these)
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.fp32_precision = "ieee"      # convolutions and recurrent layers
    except AttributeError:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


# ----------------------------------------------------------------------------- data

class Pool:
    """The training data of many clients back to back on one device: client k's samples are
    ``x[offsets[k]:offsets[k] + sizes[k]]``. A fused step gathers every instance's batch from a
    pool in one indexing operation. Label columns of multi-task data (``labels(s)``) are kept
    contiguous."""

    def __init__(self, xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor], device: torch.device):
        self.sizes = [len(y) for y in ys]
        self.offsets = [0]
        for n in self.sizes[:-1]:
            self.offsets.append(self.offsets[-1] + n)
        self.x = torch.cat(list(xs)).to(device) if len(xs) > 1 else xs[0].to(device)
        self.y = torch.cat(list(ys)).to(device) if len(ys) > 1 else ys[0].to(device)
        self._columns: dict[int, torch.Tensor] = {}

    def labels(self, column: int | None) -> torch.Tensor:
        if column is None or self.y.ndim == 1:
            return self.y
        if column not in self._columns:
            self._columns[column] = self.y[:, column].contiguous()
        return self._columns[column]

    def source(self, k: int, column: int | None = None) -> "Source":
        return Source(self.x, self.labels(column), self.offsets[k], self.sizes[k])


@dataclass(frozen=True)
class Source:
    """One instance's training data: ``x[start:start + size]`` and its labels."""

    x: torch.Tensor
    y: torch.Tensor
    start: int
    size: int

    @staticmethod
    def of(x: torch.Tensor, y: torch.Tensor) -> "Source":
        return Source(x, y, 0, len(y))

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[self.start:self.start + self.size], self.y[self.start:self.start + self.size]


# ----------------------------------------------------------------------------- jobs

class Plan:
    """The index batches of one instance's local training: ``plan[i]`` is step i's batch, and
    ``len(plan)`` the number of steps. Held as one tensor, the batches one after another
    (``order``), and their ``sizes``: an epoch of a tiny model has thousands of batches (Adult's
    26,000 rows at b = 10), and a list of that many tensors cost more to build than the fused steps
    that use them (measured: 11 % of the Adult sweep), which gather from ``order`` directly."""

    __slots__ = ("order", "sizes")

    def __init__(self, order: torch.Tensor, sizes: Sequence[int]):
        self.order, self.sizes = order, list(sizes)

    def __len__(self) -> int:
        return len(self.sizes)

    def __iter__(self) -> Iterator[torch.Tensor]:
        lo = 0
        for size in self.sizes:
            yield self.order[lo:lo + size]
            lo += size

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]                       # negative indices; IndexError past the end
        lo = sum(self.sizes[:i])
        return self.order[lo:lo + self.sizes[i]]


def batch_plan(num_samples: int, local, generator: torch.Generator) -> Plan:
    """The index batches of one instance's local training (``local``: a
    :class:`~fairfl.client.LocalTraining`): per epoch a fresh permutation cut into batches of
    ``batch_size`` (the last one may be smaller; nothing is dropped), or with ``local.steps`` one
    independent draw without replacement per step."""
    b = local.batch_size or num_samples
    if local.steps is not None:
        if b >= num_samples:
            return Plan(torch.arange(num_samples).repeat(local.steps), [num_samples] * local.steps)
        return Plan(torch.cat([torch.randperm(num_samples, generator=generator)[:b] for _ in range(local.steps)]),
                    [b] * local.steps)
    # as Tensor.split cuts a permutation (one empty batch where there are no samples)
    per_epoch = [b] * (num_samples // b) + ([num_samples % b] if num_samples % b else []) if num_samples else [0]
    perms = [torch.randperm(num_samples, generator=generator) for _ in range(local.epochs)]
    return Plan(perms[0] if len(perms) == 1 else torch.cat(perms), per_epoch * local.epochs)


@dataclass
class Trained:
    """What a job gives back, one row per instance (on the job's device)."""

    params: torch.Tensor                 # (m, d) the local models
    grad_sum: torch.Tensor | None        # (m, d) Σ of the local loss's gradients at the iterates
    loss_after: torch.Tensor | None      # (m,) mean training loss of each local model (eval mode)
    first_grad: torch.Tensor | None = None   # (m, d) the gradient of the first step (at the start)


@dataclass
class Job:
    """One call's instances: instance k starts at ``starts[k]`` (flat, ``parameters()`` order)
    and trains on ``sources[k]`` with the batches and dropout masks of ``streams[k]``; the
    proximal term of ``local.prox_mu`` pulls towards ``prox_centre`` (flat; None: each instance's
    start). ``model`` is only a template of the architecture."""

    model: nn.Module
    starts: torch.Tensor
    sources: Sequence[Source]
    streams: Sequence[Stream]
    local: Any
    prox_centre: torch.Tensor | None = None
    batched: bool = True
    loss_after: bool = False
    sum_gradients: bool = False
    first_gradient: bool = False
    plans: list = field(default_factory=list)

    def __post_init__(self) -> None:
        # drawn here, in the calling run's thread: a pure function of the instance's stream
        self.plans = [batch_plan(s.size, self.local, st.generator()) for s, st in zip(self.sources, self.streams)]


@dataclass
class Predict:
    """One call's predictions: the logits of the model at ``params`` (flat, ``parameters()``
    order), in eval mode, on the concatenation of ``inputs`` (the clients' datasets), cut into
    chunks of ``chunk`` rows (``fairfl.client.predict``). ``model`` is only a template of the architecture.
    Runs that ask for predictions on the same inputs at once (the losses and evaluations of a
    lockstep group, all on one partition) share one stacked forward pass per chunk."""

    model: nn.Module
    params: torch.Tensor
    inputs: Sequence[torch.Tensor]
    chunk: int = 512

    @property
    def stackable(self) -> bool:
        """Whether stacking this model's predictions with other runs' can pay (a small dense model,
        :data:`PREDICT_STACK_PARAMS`); the others are best computed at once, in the run's thread."""
        return stacked_forward.dense(self.model) and self.params.numel() <= PREDICT_STACK_PARAMS


# Modules whose forward torch.func.vmap cannot batch: aten::lstm / gru / rnn have no batching
# rule and no fallback ("Batching rule not implemented for aten::lstm.input", torch 2.x).
_NOT_VMAPPABLE = (nn.RNNBase,)


def can_batch(model: nn.Module) -> bool:
    """Whether copies of ``model`` can train as one stack: the fused kernels of
    ``fairfl.stacked``, or vmap for a model without recurrent layers and without dropout (vmap's
    dropout would draw from torch's global generator, shared by every instance of the stack)."""
    if stacked_forward.supports(model):
        return True
    return not any(isinstance(m, _NOT_VMAPPABLE) or (isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0)
                   for m in model.modules())


_SIGNATURES: dict[int, tuple[nn.Module, tuple]] = {}


def _signature(model: nn.Module) -> tuple:
    """What must match for two templates to share a stack: the architecture (its printed form,
    which names every layer and its settings) and the parameters' shapes."""
    hit = _SIGNATURES.get(id(model))
    if hit is None or hit[0] is not model:
        if len(_SIGNATURES) > 256:
            _SIGNATURES.clear()
        hit = (model, (type(model).__qualname__, repr(model), tuple(tuple(p.shape) for p in model.parameters())))
        _SIGNATURES[id(model)] = hit
    return hit[1]


def _fusion_key(job: Job) -> tuple:
    c = job.local
    return (_signature(job.model), c.epochs if c.steps is None else None, c.batch_size, c.steps, bool(c.momentum),
            bool(c.weight_decay), bool(c.prox_mu), job.loss_after, job.sum_gradients, job.first_gradient,
            job.starts.device, job.starts.dtype)


def execute(jobs: Sequence[Job | Predict]) -> list[Trained | torch.Tensor | BaseException]:
    """Run the jobs, fusing those that can share a computation; one result (or the exception
    that stopped it) per job, in order."""
    out: list[Trained | torch.Tensor | BaseException | None] = [None] * len(jobs)
    fused: dict[tuple, list[int]] = {}
    predictions: dict[tuple, list[int]] = {}
    for j, job in enumerate(jobs):
        if isinstance(job, Predict):
            predictions.setdefault(_predict_key(job), []).append(j)
        elif len(job.starts) == 0:
            d = job.starts.shape[1] if job.starts.ndim == 2 else 0
            empty = job.starts.new_zeros(0, d)
            out[j] = Trained(empty, empty if job.sum_gradients else None,
                             job.starts.new_zeros(0) if job.loss_after else None, empty if job.first_gradient else None)
        elif job.batched and can_batch(job.model):
            fused.setdefault(_fusion_key(job), []).append(j)
        else:
            out[j] = _guard(_train_sequential, job)
    for members in fused.values():
        results = _guard(_train_fused, [jobs[j] for j in members])
        for i, j in enumerate(members):
            out[j] = results if isinstance(results, BaseException) else results[i]
    for members in predictions.values():
        results = _guard(_predict_jobs, [jobs[j] for j in members])
        for i, j in enumerate(members):
            out[j] = results if isinstance(results, BaseException) else results[i]
    return out


def _guard(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - handed to the job's run, which raises it
        return e


# ----------------------------------------------------------------------------- predictions

def chunked(parts: Sequence[torch.Tensor], chunk: int) -> Iterator[torch.Tensor]:
    """The concatenation of ``parts`` cut into pieces of ``chunk`` rows (the last may be shorter),
    without building it: a piece inside one part is a view of it, only a piece across two parts
    is copied."""
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 row, got {chunk}")
    pending: list[torch.Tensor] = []
    have = 0
    for part in parts:
        i = 0
        while i < len(part):
            take = min(chunk - have, len(part) - i)
            pending.append(part[i:i + take])
            have += take
            i += take
            if have == chunk:
                yield pending[0] if len(pending) == 1 else torch.cat(pending)
                pending, have = [], 0
    if have:
        yield pending[0] if len(pending) == 1 else torch.cat(pending)


@torch.no_grad()
def predict_stack(model: nn.Module, params: Sequence[torch.Tensor], parts: Sequence[torch.Tensor],
                  chunk: int = 512) -> torch.Tensor:
    """Logits (m, n, classes) of m stacked copies of ``model`` (``params``: per parameter, (m, ...))
    on the concatenation of ``parts`` (n rows), at the model's current train / eval mode: in the
    chunks of :func:`chunked`, each one forward pass of the stack (``fairfl.stacked``). Every
    instance sees the same chunks, so with m = 1 this is a single model's prediction."""
    m = len(params[0])
    outs = []
    for piece in chunked(parts, chunk):
        x = piece.unsqueeze(0)
        outs.append(stacked_forward.forward(model, params, x if m == 1 else x.expand(m, *piece.shape)))
    if not outs:
        return torch.empty(m, 0, device=parts[0].device if parts else None)
    return torch.cat(outs, 1)


# At most this many instances share one stacked forward pass of predictions.
PREDICT_STACK = 64
# Predictions are stacked only for dense models with at most this many parameters, whose forward
# pass over a chunk costs more in per-operation overhead than in arithmetic. Measured, 24 models,
# one thread: logistic regression on Fashion-MNIST (7,850 parameters) 0.12 s stacked against 0.19 s
# one at a time, on Adult (200) 19 against 42 ms; the MLP (199,210) 5 % slower stacked, the
# Table 3 CNN 1.7x slower (its grouped convolutions).
PREDICT_STACK_PARAMS = 2 ** 15

_PREDICT_EXACT: dict[tuple, bool] = {}


def _predict_key(job: Predict) -> tuple:
    return (_signature(job.model), tuple(id(t) for t in job.inputs), job.chunk, job.params.device, job.params.dtype)


def _stacks_predictions(jobs: Sequence[Predict]) -> bool:
    """Whether these jobs' predictions are stacked: a small dense model (where stacking pays), and
    every instance's logits the same bits in this stack as alone, for every chunk shape of the
    inputs (the full chunks and the last one) — found out once per process, chunk shape and stack
    size, on the first chunk of that shape, for every instance of the stack. Kernels are picked by
    shape, not by the values, so the answer holds for every chunk of that shape."""
    model = jobs[0].model
    if len(jobs) < 2 or not jobs[0].stackable:
        return False
    template = list(model.parameters())
    parts, chunk = jobs[0].inputs, jobs[0].chunk
    n = sum(len(p) for p in parts)
    if n == 0:
        return False
    spans = [(0, min(chunk, n))]                              # the first full chunk, and a shorter last one
    if n > chunk and n % chunk:
        spans.append((n - n % chunk, n))
    first = parts[0]
    for lo in range(0, len(jobs), PREDICT_STACK):
        members = jobs[lo:lo + PREDICT_STACK]
        if len(members) < 2:
            continue
        for a, b in spans:
            key = (_signature(model), (b - a, *first.shape[1:]), len(members), first.dtype, str(first.device))
            if key not in _PREDICT_EXACT:          # only then is the chunk cut (a copy across two datasets)
                piece = _rows(parts, a, b)
                stack = predict_stack(model, _unflatten(torch.stack([j.params for j in members]), template), [piece], b - a)
                _PREDICT_EXACT[key] = all(
                    torch.equal(stack[i], predict_stack(model, _unflatten(j.params[None], template), [piece], b - a)[0])
                    for i, j in enumerate(members))
            if not _PREDICT_EXACT[key]:
                return False
    return True


def _rows(parts: Sequence[torch.Tensor], lo: int, hi: int) -> torch.Tensor:
    """Rows lo:hi of the concatenation of ``parts`` (a chunk as :func:`chunked` cuts it)."""
    pieces, start = [], 0
    for part in parts:
        a, b = max(lo - start, 0), min(hi - start, len(part))
        if a < b:
            pieces.append(part[a:b])
        start += len(part)
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


def _predict_jobs(jobs: Sequence[Predict]) -> list[torch.Tensor]:
    """Predictions of jobs with one key (same architecture, same inputs): stacked where that pays
    and gives each instance its own logits bit for bit, else one model at a time."""
    first = jobs[0]
    model = first.model
    was_training = model.training
    model.eval()
    try:
        if not _stacks_predictions(jobs):
            return [_guard(predict_one, job) for job in jobs]       # one run's failure is its own
        template = list(model.parameters())
        out = []
        for lo in range(0, len(jobs), PREDICT_STACK):
            members = jobs[lo:lo + PREDICT_STACK]
            stacked = torch.stack([j.params for j in members])
            logits = predict_stack(model, _unflatten(stacked, template), first.inputs, first.chunk)
            out += [t.clone() for t in logits.unbind(0)]        # each run's own tensor, not a view of the stack's
        return out
    finally:
        model.train(was_training)


@torch.no_grad()
def predict_one(job: Predict) -> torch.Tensor:
    """One model's logits: the stacked forward pass where the model allows it (about twice as fast
    as its own ``forward`` in NCHW on a small CPU), else its ``forward`` at these parameters."""
    model = job.model
    was_training = model.training
    model.eval()
    try:
        if stacked_forward.supports(model):
            return predict_stack(model, _unflatten(job.params[None], list(model.parameters())), job.inputs, job.chunk)[0]
        _set(model, job.params)
        outs = [model(piece) for piece in chunked(job.inputs, job.chunk)]
        return torch.cat(outs) if outs else torch.empty(0, device=job.params.device)
    finally:
        model.train(was_training)


# ----------------------------------------------------------------------------- the reference path

def _unflatten(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """(m, d) -> per parameter (m, *shape) (or (d,) -> per parameter (*shape))."""
    out, i = [], 0
    for p in like:
        part = flat[..., i:i + p.numel()]
        out.append(part.reshape(*flat.shape[:-1], *p.shape).clone())
        i += p.numel()
    return out


def _flatten(tensors: Sequence[torch.Tensor], m: int) -> torch.Tensor:
    return torch.cat([t.reshape(m, -1) for t in tensors], dim=1)


@torch.no_grad()
def _set(model: nn.Module, flat: torch.Tensor) -> None:
    i = 0
    for p in model.parameters():
        p.copy_(flat[i:i + p.numel()].view_as(p))
        i += p.numel()


def _train_sequential(job: Job) -> Trained:
    """One instance after another, each an ``nn.Module`` with ``torch.optim.SGD``; dropout draws
    the masks of the instance's stream (``fairfl.stacked.keyed_dropout``)."""
    model, cfg = job.model, job.local
    saved = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    params, sums, after, firsts = [], [], [], []
    try:
        with stacked_forward.keyed_dropout(model) as dropout:
            for k, (source, stream, plan) in enumerate(zip(job.sources, job.streams, job.plans)):
                _set(model, job.starts[k])
                centre = ([t.detach().clone() for t in model.parameters()] if job.prox_centre is None
                          else _unflatten(job.prox_centre, list(model.parameters())))
                model.train()
                opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
                acc = [torch.zeros_like(p) for p in model.parameters()] if job.sum_gradients else None
                x, y = source.data()
                dropout["key"] = stream.key
                for step, idx in enumerate(plan):
                    dropout["step"] = step
                    idx = idx.to(x.device)
                    opt.zero_grad(set_to_none=True)
                    loss = F.cross_entropy(model(x[idx]), y[idx])
                    if cfg.prox_mu:
                        loss = loss + cfg.prox_mu / 2 * sum(((p - g) ** 2).sum() for p, g in zip(model.parameters(), centre))
                    loss.backward()
                    if acc is not None:
                        for a, p in zip(acc, model.parameters()):
                            a.add_(p.grad)
                    if job.first_gradient and step == 0:
                        firsts.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
                    opt.step()
                if job.loss_after:
                    model.eval()
                    with torch.no_grad():
                        after.append(_sequential_loss(model, x, y))
                    model.train()
                params.append(torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone())
                if acc is not None:
                    sums.append(torch.cat([a.reshape(-1) for a in acc]))
    finally:
        _set(model, saved)
    return Trained(torch.stack(params), torch.stack(sums) if job.sum_gradients else None,
                   torch.stack(after) if job.loss_after else None, torch.stack(firsts) if job.first_gradient else None)


def _sequential_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    total = sum(F.cross_entropy(model(x[i:i + LOSS_CHUNK]), y[i:i + LOSS_CHUNK], reduction="sum")
                for i in range(0, len(y), LOSS_CHUNK))
    return total / len(y)


# ----------------------------------------------------------------------------- the fused path

# Memory of one fused step: the instance axis is cut so that a chunk's activations (estimated from
# one sample's forward pass, ×3 for the backward pass) stay below this many floats. On a CPU the
# bound is about a last-level cache (32 MB here), not the memory: a stack of the Table 3 CNN at
# b = 10 runs fastest per instance at 20-30 instances (0.84 ms an instance-step, against 1.01 ms at
# 120 and 0.92 at one run's 10; medians of 4, one thread), and sweep (a) went 101 -> 93 s with it
# (benchmarks/README). Chunks never change a result (tests/test_engine.py).
FUSED_FLOATS = {"cpu": 2 ** 23, "cuda": 2 ** 28}
# A loss over an instance's whole training data is summed in chunks of this many samples: a fixed
# number, so that the sum, and hence the result, does not depend on how many instances share it.
LOSS_CHUNK = 512
# A fused training loop gathers its batches in blocks of consecutive steps of at most this many
# floats (a few MB: well inside a cache, and a block's steps are used at once).
GATHER_FLOATS = 2 ** 20

_ACTIVATIONS: dict[tuple, int] = {}


def _floats_per_sample(model: nn.Module, x: torch.Tensor, signature: tuple) -> int:
    """Floats of one sample's activations through ``model.net`` (its input included)."""
    x_shape = tuple(x.shape[1:])
    key = (signature, x_shape, x.dtype)
    if key not in _ACTIVATIONS:
        total = int(torch.Size(x_shape).numel())
        net = getattr(model, "net", None)
        if isinstance(net, nn.Sequential):
            was = model.training
            model.eval()
            with torch.no_grad():
                h = torch.zeros(1, *x_shape, dtype=x.dtype, device=x.device)
                for layer in net:
                    h = layer(h)
                    total += h.numel()
            model.train(was)
        else:
            total *= 16        # an unknown architecture: a generous guess
        _ACTIVATIONS[key] = total
    return _ACTIVATIONS[key]


def _chunks(rows: list, per_row: int, device: torch.device, exact: Callable[[int], bool]) -> list[tuple[list, int]]:
    """``rows`` cut into stacks within the budget of :data:`FUSED_FLOATS`, each as (its rows, how
    many discarded copies of its first row pad it): every stack's size is one that
    :func:`_size_is_exact` (``exact``, asked only for the sizes met) finds to compute each instance's
    bits as a pair does. A chunk size that does not is raised to the next that does (a budget that
    fits one instance of notebook 02's CNN at b = 400 gets pairs, not stacks of one that would each
    need a copy); a short last stack that does not joins the one before it where that size does, and
    is padded otherwise. Which stack an instance is in never changes its result, only how much is
    computed (tests/test_engine.py)."""
    budget = FUSED_FLOATS["cuda" if device.type == "cuda" else "cpu"]
    size = _exact_size(min(len(rows), max(1, budget // max(1, 3 * per_row))), exact)
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


# A stack of two is the reference: an instance's result is the one it gets beside one other instance.
_REFERENCE_SIZE = 2
_PROBES: dict[tuple, tuple] = {}          # step shapes -> (probe row, start, settings, a pair's outcome)
_EXACT_SIZES: dict[tuple, bool] = {}      # (step shapes, stack size) -> exact


def _size_is_exact(model, names, template, row: "_Row", cfg, device, dtype, m: int) -> bool:
    """Whether m stacked instances of this model compute, at this row's step shapes, each the bits
    it computes in a stack of two. Kernels are picked by shape, and the stack's size is part of
    the shape: on this project's CPU a stack of one of the Table 3 CNN or FMOL's LeNet runs a plain
    convolution where larger stacks run a grouped one, and a stack of three computes the first
    convolution's weight gradient otherwise (oneDNN takes 3 input channels, one per instance, for
    an image's colour channels), each differing in the last bits; the dense models compute alike
    at every size (measured, 1-40). A stack that is not exact is padded with discarded copies or
    cut otherwise (:func:`_chunks`), so that a run gets the same bits alone, in any group, and
    wherever its group's stacks are cut. Found out once per process, step shapes and size, by
    copies of one instance taking one step per distinct batch size on its client's first samples,
    then the loss over the client's data; the same instance, start and settings for every size.
    Kernels do not depend on the values, so the answer holds for every step of those shapes."""
    if m == _REFERENCE_SIZE:
        return True
    sizes = tuple(dict.fromkeys(row.plan.sizes))          # each distinct batch size, in order
    # the client's size fixes the shapes of the loss after training (chunks of LOSS_CHUNK), and the
    # thread count can change a kernel's reduction
    key = (_signature(model), sizes, row.source.size, tuple(row.source.x.shape[1:]), row.source.x.dtype, dtype,
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
            inputs = (_Row(row.job, row.k, data, row.stream, steps), start, cfg)
            probe = _PROBES[key] = (*inputs, _probe_step(model, names, template, *inputs, device, dtype, _REFERENCE_SIZE)[0])
        *inputs, reference = probe
        _EXACT_SIZES[(key, m)] = all(all(_same_bits(a, b) for a, b in zip(reference, outcome))
                                     for outcome in _probe_step(model, names, template, *inputs, device, dtype, m))
    return _EXACT_SIZES[(key, m)]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit: NaN where the other has the same NaN (a client without samples has a NaN
    loss), and −0.0 apart from 0.0."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.detach().reshape(-1).contiguous().view(torch.uint8), b.detach().reshape(-1).contiguous().view(torch.uint8))


def _probe_step(model, names, template, probe: "_Row", start: torch.Tensor, cfg, device, dtype, m: int) -> list[list[torch.Tensor]]:
    """Per instance, what a stack of m copies of ``probe``'s instance computes from ``start`` in the
    steps of its plan: parameters, summed and first gradients, the loss after them."""
    w = _unflatten(start.expand(m, -1).clone(), template)
    hyper = {h: torch.full((m,), v, dtype=dtype, device=device) for h, v in
             (("lr", cfg.lr), ("momentum", cfg.momentum), ("weight_decay", cfg.weight_decay), ("half_mu", cfg.prox_mu / 2))}
    gather = _Gather([probe] * m, device)
    keys = torch.full((m,), probe.stream.key, dtype=torch.int64, device=device)
    w, acc, first = _sgd_stack(model, names, w, w, gather, len(probe.plan), keys, hyper, cfg, True, True)
    after = _stacked_training_losses(model, names, w, gather)
    return [[t[i] for t in (*w, *acc, *first)] + [after[i]] for i in range(m)]


@dataclass
class _Row:
    job: int
    k: int
    source: Source
    stream: Stream
    plan: list


def _train_fused(jobs: Sequence[Job]) -> list[Trained]:
    """Jobs with one fusion key: their instances, grouped by sample count (which fixes the batch
    sizes of every step), train as stacks."""
    first = jobs[0]
    model, cfg = first.model, first.local
    names = [n for n, _ in model.named_parameters()]
    template = list(model.parameters())
    device, dtype = first.starts.device, first.starts.dtype
    results = []
    for job in jobs:
        m = len(job.starts)
        results.append(Trained(torch.empty_like(job.starts), torch.empty_like(job.starts) if job.sum_gradients else None,
                               torch.empty(m, device=device) if job.loss_after else None,
                               torch.empty_like(job.starts) if job.first_gradient else None))
    by_size: dict[int, list[_Row]] = {}
    for j, job in enumerate(jobs):
        for k in range(len(job.starts)):
            by_size.setdefault(job.sources[k].size, []).append(_Row(j, k, job.sources[k], job.streams[k], job.plans[k]))
    signature = _signature(model)
    was_training = model.training
    try:
        for n, rows in by_size.items():
            rows.sort(key=lambda r: (id(r.source.x), id(r.source.y)))     # one gather per data pool
            batch = rows[0].plan.sizes[0] if len(rows[0].plan) else n
            per_row = batch * _floats_per_sample(model, rows[0].source.x, signature)
            @functools.cache           # asked several times per cut; its key walks the whole plan
            def exact(m: int, row: _Row = rows[0]) -> bool:
                return _size_is_exact(model, names, template, row, cfg, device, dtype, m)
            for chunk, copies in _chunks(rows, per_row, device, exact):
                # A stack of some sizes is computed by other kernels than a stack of two, and rounds
                # otherwise (_size_is_exact): a run alone would differ from the same run in a group,
                # or from itself where its partners finished first. There the stack is padded with
                # copies of its first instance, which are discarded.
                kept = len(chunk)
                chunk = chunk + chunk[:1] * copies
                m = len(chunk)
                starts = torch.stack([jobs[r.job].starts[r.k] for r in chunk])
                centres = torch.stack([starts[i] if jobs[r.job].prox_centre is None else jobs[r.job].prox_centre
                                       for i, r in enumerate(chunk)])
                hyper = {name: torch.tensor([getattr(jobs[r.job].local, name) for r in chunk], dtype=dtype, device=device)
                         for name in ("lr", "momentum", "weight_decay")}
                hyper["half_mu"] = torch.tensor([jobs[r.job].local.prox_mu / 2 for r in chunk], dtype=dtype, device=device)
                keys = torch.tensor([r.stream.key for r in chunk], dtype=torch.int64, device=device)
                gather = _Gather(chunk, device)
                flags = jobs[chunk[0].job]
                w, acc, grad0 = _sgd_stack(model, names, _unflatten(starts, template), _unflatten(centres, template),
                                           gather, len(chunk[0].plan), keys, hyper, cfg, flags.sum_gradients,
                                           flags.first_gradient)
                params = _flatten(w, m)
                sums = _flatten(acc, m) if acc is not None else None
                firsts = _flatten(grad0, m) if grad0 is not None else None
                after = _stacked_training_losses(model, names, w, gather) if flags.loss_after else None
                for i, r in enumerate(chunk[:kept]):
                    out = results[r.job]
                    out.params[r.k] = params[i]
                    if sums is not None:
                        out.grad_sum[r.k] = sums[i]
                    if firsts is not None:
                        out.first_grad[r.k] = firsts[i]
                    if after is not None:
                        out.loss_after[r.k] = after[i]
    finally:
        model.train(was_training)
    return results


class _Gather:
    """The samples of a chunk's instances: each instance's batches, gathered from its data pool
    (one indexing operation per pool and block of steps, :meth:`batches`), and its samples at
    given indices (:meth:`take`)."""

    def __init__(self, rows: Sequence[_Row], device: torch.device):
        self.rows = rows
        self.device = device
        self.groups: list[tuple[torch.Tensor, torch.Tensor, slice, torch.Tensor]] = []   # (x, y, rows, offsets)
        i = 0
        while i < len(rows):
            j = i
            while j < len(rows) and rows[j].source.x is rows[i].source.x and rows[j].source.y is rows[i].source.y:
                j += 1
            offsets = torch.tensor([r.source.start for r in rows[i:j]], device=device)[:, None]
            self.groups.append((rows[i].source.x, rows[i].source.y, slice(i, j), offsets))
            i = j
        # every step's batch indices, all instances, moved to the device at once
        self.steps = len(rows[0].plan)
        self.sizes = rows[0].plan.sizes
        self.plan = (torch.stack([r.plan.order for r in rows]).to(device) if self.steps
                     else torch.empty(len(rows), 0, dtype=torch.long, device=device))
        self.bounds = [0]
        for s in self.sizes:
            self.bounds.append(self.bounds[-1] + s)
        # the plan as indices into each pool, computed once: a tiny model's step pays per operation
        self.absolute = [(x, y, self.plan[rows] + offsets) for x, y, rows, offsets in self.groups]

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Every step's batch in order: samples (m, b, ...) and labels (m, b). Runs of steps of one
        size are gathered in blocks of up to :data:`GATHER_FLOATS` floats, one indexing operation
        per pool and block, laid out (step, instance, sample) so that each step's batch is a
        contiguous slice of its block: a step of a tiny model pays per operation (Adult's linear
        model at b = 10, 21 instances: 16 against 7 µs a step, measured). The same samples as one
        gather per step; a batch now starts inside its block, not at a fresh allocation, which on
        a CPU cannot change a result (MKL runs in strict mode, ``loop.check_reproducible``)."""
        step = 0
        per_sample = max(1, int(torch.Size(self.absolute[0][0].shape[1:]).numel())) if self.absolute else 1
        while step < self.steps:
            size = self.sizes[step]
            end = step + 1
            most = max(1, GATHER_FLOATS // max(1, size * len(self.rows) * per_sample))
            while end < self.steps and self.sizes[end] == size and end - step < most:
                end += 1
            lo, hi, k = self.bounds[step], self.bounds[end], end - step
            xs, ys = self._select([(x, y, plan[:, lo:hi].reshape(len(plan), k, size).transpose(0, 1))
                                   for x, y, plan in self.absolute], axis=1)
            for i in range(k):
                yield xs[i], ys[i]
            step = end

    def take(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(m, b) indices into each instance's data -> its samples (m, b, ...) and labels (m, b)."""
        return self._select([(x, y, idx[rows] + offsets) for x, y, rows, offsets in self.groups])

    @staticmethod
    def _select(parts, axis: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Per pool, the samples and labels at indices ``g``, shaped like ``g``; the pools' parts
        joined along ``axis`` (the instance axis of ``g``)."""
        xs, ys = [], []
        for x, y, g in parts:
            # index_select on the flattened indices, not x[g]: the same copy, 2-3x faster per step on a
            # CPU (measured: 9 vs 21 us for an Adult batch of 23 x 10 rows), which tiny models pay every step
            flat = g.reshape(-1)
            xs.append(x.index_select(0, flat).reshape(*g.shape, *x.shape[1:]))
            ys.append(y.index_select(0, flat).reshape(*g.shape, *y.shape[1:]))
        if len(xs) == 1:
            return xs[0], ys[0]
        return torch.cat(xs, axis), torch.cat(ys, axis)

    @property
    def size(self) -> int:
        return self.rows[0].source.size


def _stacked_losses(model, names, stacked: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                    dropout: tuple[torch.Tensor, int] | None = None, reduction: str = "mean") -> torch.Tensor:
    """Per-instance losses (mean, or sum with ``reduction="sum"``) of stacked models on (m, b, ...)
    inputs: fused kernels for the papers' Sequential models (``fairfl.stacked``),
    ``torch.func.vmap`` for any other model (which then has no dropout, :func:`can_batch`).
    ``reduction="total"``: the sum over instances of their mean losses, as one scalar — what a
    training step differentiates."""
    if stacked_forward.supports(model):
        logits = stacked_forward.forward(model, stacked, x, dropout)
    else:
        def one(params, xb):
            return functional_call(model, dict(zip(names, params)), (xb,))
        logits = torch.func.vmap(one, randomness="error")(stacked, x)   # (m, b, classes)
    m, b = y.shape
    if reduction == "total":
        # Σₖ meanᵢ ℓₖᵢ = (Σₖᵢ ℓₖᵢ) / b: one reduction instead of three (reshape, mean, sum) per step, which
        # tiny models pay (Adult's linear model: ~0.5 ms a step). The gradient is bit-identical: every
        # sample's loss receives exactly 1/b either way; only the unused loss value rounds differently.
        return F.cross_entropy(logits.reshape(m * b, -1), y.reshape(-1), reduction="sum") / b
    per_sample = F.cross_entropy(logits.reshape(m * b, -1), y.reshape(-1), reduction="none").reshape(m, b)
    return per_sample.sum(1) if reduction == "sum" else per_sample.mean(1)


@torch.no_grad()
def _stacked_training_losses(model, names, w: list[torch.Tensor], gather: _Gather) -> torch.Tensor:
    """Each local model's mean loss on its own training data, eval mode."""
    model.eval()
    n = gather.size
    total = torch.zeros(len(gather.rows), device=gather.device)
    for i in range(0, n, LOSS_CHUNK):
        idx = torch.arange(i, min(n, i + LOSS_CHUNK), device=gather.device).expand(len(gather.rows), -1)
        x, y = gather.take(idx)
        total += _stacked_losses(model, names, w, x, y, reduction="sum")
    model.train()
    return total / n


def _view(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-instance scalar (m,) shaped to broadcast against a stacked tensor (m, ...)."""
    return v.reshape(-1, *([1] * (like.ndim - 1)))


def _sgd_stack(model, names, w, centre, gather: _Gather, steps: int, keys: torch.Tensor, hyper: dict, cfg,
               sum_gradients: bool, first_gradient: bool):
    """SGD on a stack of instances: ``torch.optim.SGD``'s update rule (dampening 0, no Nesterov)
    with each instance's own learning rate, momentum, weight decay and proximal weight."""
    bufs = [torch.zeros_like(t) for t in w] if cfg.momentum else None
    acc = [torch.zeros_like(t) for t in w] if sum_gradients else None
    first = None
    # each instance's hyper-parameters shaped once per parameter tensor, not once per step
    lr, momentum, decay = ([_view(hyper[h], t) for t in w] for h in ("lr", "momentum", "weight_decay"))
    decay = decay if cfg.weight_decay else None
    model.train()

    def update(step: int, leaves: list[torch.Tensor], grads) -> list[torch.Tensor]:
        new_w = []
        for i, (t, g) in enumerate(zip(leaves, grads)):
            if acc is not None:
                acc[i].add_(g)
            if decay is not None:
                g = g + decay[i] * t
            if bufs is not None:
                bufs[i] = g.clone() if step == 0 else bufs[i].mul_(momentum[i]).add_(g)
                g = bufs[i]
            new_w.append(t - lr[i] * g)
        return new_w

    if stacked_forward.dense(model) and not cfg.prox_mu:
        # the same gradients by hand (stacked.dense_gradients): no autograd anywhere in the loop, which
        # tiny models pay per step (Adult's linear model: the grad-mode switches alone were ~4 µs of ~85)
        with torch.no_grad():
            for step, (x, y) in zip(range(steps), gather.batches()):
                grads = stacked_forward.dense_gradients(model, w, x, y)
                if first_gradient and step == 0:
                    first = grads
                w = update(step, w, grads)
        return w, acc, first
    for step, (x, y) in zip(range(steps), gather.batches()):
        leaves = [t.requires_grad_() for t in w]
        loss = _stacked_losses(model, names, leaves, x, y, (keys, step), reduction="total")
        if cfg.prox_mu:     # (μₖ/2)·‖wₖ − centreₖ‖² for every instance k
            per = sum(((t - g) ** 2).reshape(len(t), -1).sum(1) for t, g in zip(leaves, centre))
            loss = loss + (hyper["half_mu"] * per).sum()
        grads = torch.autograd.grad(loss, leaves)
        if first_gradient and step == 0:
            first = grads
        with torch.no_grad():
            w = update(step, [t.detach() for t in leaves], grads)
    return w, acc, first


# ----------------------------------------------------------------------------- how runs share the engine

class Immediate:
    """A lone run's trainer: each job runs at once."""

    def __call__(self, job: Job | Predict) -> Trained | torch.Tensor:
        (result,) = execute([job])
        if isinstance(result, BaseException):
            raise result
        return result


class Lockstep:
    """The trainer of a group of runs, each in its own thread: a job waits until every run of the
    group that has not finished is waiting too, then all waiting jobs run together
    (:func:`execute`). The run whose call completes the group executes them; the others sleep.
    ``enter()`` once per run before any run starts, ``bind(i)`` in run i's thread, ``leave()`` when
    a run ends (however it ends).

    The waiting jobs are executed in the order of their runs' indices, not in the order the threads
    arrived: which rows share a fused kernel, and where, then never depends on thread timing (it
    did: the same group gave results one ulp apart from one execution to the next).

    A small dense model's predictions (its losses and evaluations, :class:`Predict`) meet the same
    way, and go first: when every run waits, some with predictions and some with training, only
    the predictions are executed; the training waits for the predicting runs' training to join it.

    Between fused steps each run does its own work (aggregation, other evaluations) in its thread. At most
    ``slots`` runs compute at once (:meth:`turn`): each run computes with one intra-op thread, so
    a group of 12 runs in a one-core worker would otherwise run 12 compute threads on that core
    (measured: the CNN sweep ran 10 % slower fused than one run at a time, with evaluation threads
    contending). A run gives its turn up while it waits for a fused step; the fused step itself
    takes a turn. Which thread computes when never changes a result, only how busy the cores are."""

    def __init__(self, slots: int = 1) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._rank: dict[int, int] = {}
        self._waiting: list[tuple[int, Job | Predict, dict]] = []
        self._turns = threading.BoundedSemaphore(max(1, slots))
        self._holding: set[int] = set()
        self.aborted: BaseException | None = None
        self.flushes = 0            # how many fused executions (for the benchmark's report)

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Compute inside the block only while holding one of the group's ``slots``."""
        me = threading.get_ident()
        self._turns.acquire()
        self._holding.add(me)
        try:
            yield
        finally:
            if me in self._holding:
                self._holding.discard(me)
                self._turns.release()

    def _give_up_turn(self) -> bool:
        me = threading.get_ident()
        if me in self._holding:
            self._holding.discard(me)
            self._turns.release()
            return True
        return False

    def _take_turn(self) -> None:
        self._turns.acquire()
        self._holding.add(threading.get_ident())

    def enter(self) -> None:
        with self._cond:
            self._active += 1

    def bind(self, rank: int) -> None:
        """Declare the calling thread to be run ``rank`` of the group."""
        with self._cond:
            self._rank[threading.get_ident()] = rank

    def leave(self) -> None:
        with self._cond:
            self._active -= 1
            batch = self._take()
        self._run(batch)

    def abort(self, error: BaseException) -> None:
        """Make every waiting and future job of the group raise ``error`` (an interrupt)."""
        with self._cond:
            self.aborted = error
            for _, _, slot in self._waiting:
                slot["result"] = error
            self._waiting = []
            self._cond.notify_all()

    def _take(self) -> list[tuple[int, Job | Predict, dict]]:
        """The jobs to execute now: none until every active run waits; then the predictions alone
        if some runs wait with predictions and others with training (the predicting runs train
        next, and their training should meet the others'), else everything."""
        if not self._waiting or len(self._waiting) < self._active:
            return []
        ordered = sorted(self._waiting, key=lambda w: w[0])
        predictions = [w for w in ordered if isinstance(w[1], Predict)]
        if predictions and len(predictions) < len(ordered):
            self._waiting = [w for w in ordered if not isinstance(w[1], Predict)]
            return predictions
        self._waiting = []
        return ordered

    def _run(self, batch: list[tuple[int, Job | Predict, dict]]) -> None:
        if not batch:
            return
        try:
            with self._turns:
                results = execute([job for _, job, _ in batch])
        except BaseException as e:  # noqa: BLE001 - every run of the batch must wake up, with the error
            results = [e] * len(batch)
        with self._cond:
            self.flushes += 1
            for (_, _, slot), result in zip(batch, results):
                slot["result"] = result
            self._cond.notify_all()

    def __call__(self, job: Job | Predict) -> Trained | torch.Tensor:
        slot: dict = {}
        with self._cond:
            if self.aborted is not None:
                raise self.aborted
            self._waiting.append((self._rank.get(threading.get_ident(), 0), job, slot))
            batch = self._take()
        held = self._give_up_turn()
        try:
            self._run(batch)
            with self._cond:
                while "result" not in slot:
                    self._cond.wait()
        finally:
            if held:
                self._take_turn()
        result = slot["result"]
        if isinstance(result, BaseException):
            raise result
        return result


Trainer = Callable[[Job | Predict], Trained | torch.Tensor]
