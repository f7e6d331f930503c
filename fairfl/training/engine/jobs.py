"""What a call of local training asks of the engine and what it gets back: a :class:`Job` (one
call's instances: their starts, their data as :class:`Source` slices of a :class:`Pool`, their
streams and batch :class:`Plan`), a :class:`Predict` (one call's logits), a :class:`Trained`; the
flat parameter layout they share (``parameters()`` order: :func:`set_flat_params`,
:func:`unflatten`); and the one rule of which instances can share a computation
(:func:`fusion_key`, of which :func:`schedule_key` is the part a sweep can read off a config).
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from fairfl.federated import stacked as stacked_forward
from fairfl.federated import stacked_lstm
from fairfl.base.seeding import Stream


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
        self.x = joined(xs).to(device)
        self.y = joined(ys).to(device)
        self._columns: dict[int, torch.Tensor] = {}

    def labels(self, column: int | None) -> torch.Tensor:
        if column is None or self.y.ndim == 1:
            return self.y
        if column not in self._columns:
            self._columns[column] = self.y[:, column].contiguous()
        return self._columns[column]

    def source(self, k: int, column: int | None = None) -> "Source":
        return Source(self.x, self.labels(column), self.offsets[k], self.sizes[k])


def joined(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(parts)``, as a view where the parts already lie back to back in one tensor's
    memory (a partition's clients are views of its blocks, ``fairfl.federated.partition``): the pool
    of a round's clients then holds no second copy of the federation's data."""
    if len(parts) == 1:
        return parts[0]
    filled = [p for p in parts if len(p)]
    if not filled:
        return torch.cat(list(parts))
    first = filled[0]
    step = math.prod(first.shape[1:]) * first.element_size()         # the bytes of one row, held contiguously
    ptr = first.data_ptr()
    for part in filled:         # an empty client (a view anywhere, or a tensor of its own) adds no rows
        if (part.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() or not part.is_contiguous()
                or part.shape[1:] != first.shape[1:] or part.dtype != first.dtype or part.data_ptr() != ptr):
            return torch.cat(list(parts))
        ptr += len(part) * step
    shape = (sum(len(p) for p in filled), *first.shape[1:])
    return torch.empty(0, dtype=first.dtype, device=first.device).set_(first.untyped_storage(),
                                                                       first.storage_offset(), shape)


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
    :class:`~fairfl.training.client.LocalTraining`): per epoch a fresh permutation cut into batches of
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


# A loss over an instance's whole training data is summed in chunks of this many samples, on both
# paths: a fixed number, so that the sum, and hence the result, does not depend on how many
# instances share it.
LOSS_CHUNK = 512


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


# Predictions are stacked only for dense models with at most this many parameters, whose forward
# pass over a chunk costs more in per-operation overhead than in arithmetic. Measured, 24 models,
# one thread: logistic regression on Fashion-MNIST (7,850 parameters) 0.12 s stacked against 0.19 s
# one at a time, on Adult (200) 19 against 42 ms; the MLP (199,210) 5 % slower stacked, the
# Table 3 CNN 1.7x slower (its grouped convolutions).
PREDICT_STACK_PARAMS = 2 ** 15


@dataclass
class Predict:
    """One call's predictions: the logits of the model at ``params`` (flat, ``parameters()``
    order), in eval mode, on the concatenation of ``inputs`` (the clients' datasets), cut into
    chunks of ``chunk`` rows (``fairfl.training.client.predict``). ``model`` is only a template of the architecture.
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
    ``fairfl.federated.stacked`` (and ``fairfl.federated.stacked_lstm`` for the character LSTM), or vmap for a model
    without recurrent layers and without dropout (vmap's dropout would draw from torch's global
    generator, shared by every instance of the stack)."""
    if stacked_forward.supports(model) or stacked_lstm.supports(model):
        return True
    return not any(isinstance(m, _NOT_VMAPPABLE) or (isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0)
                   for m in model.modules())


_SIGNATURES: dict[int, tuple[nn.Module, tuple]] = {}


def signature(model: nn.Module) -> tuple:
    """What must match for two templates to share a stack: the architecture (its printed form,
    which names every layer and its settings) and the parameters' shapes."""
    hit = _SIGNATURES.get(id(model))
    if hit is None or hit[0] is not model:
        if len(_SIGNATURES) > 256:
            _SIGNATURES.clear()
        hit = (model, (type(model).__qualname__, repr(model), tuple(tuple(p.shape) for p in model.parameters())))
        _SIGNATURES[id(model)] = hit
    return hit[1]


def schedule_key(local) -> tuple:
    """What fixes the steps of an instance's local training besides its sample count (``local``: a
    :class:`~fairfl.training.client.LocalTraining`): epochs (or K steps) and the batch size. Instances fuse
    only where these agree (:func:`fusion_key`); a sweep groups its runs by them
    (``fairfl.runs.sweeps``), so that the runs of a group have jobs that can fuse."""
    return (local.epochs if local.steps is None else None, local.batch_size, local.steps)


def fusion_key(job: Job) -> tuple:
    """Which jobs' instances can share one stack: the same architecture (:func:`signature`), the
    same steps (:func:`schedule_key`), the same kind of update (momentum, weight decay, proximal
    term on or off; their values are each instance's own), the same outputs asked, on one device
    in one dtype. The only rule of fusion: ``fairfl.runs.sweeps`` groups runs by the parts of it that
    a config names."""
    c = job.local
    return (signature(job.model), *schedule_key(c), bool(c.momentum), bool(c.weight_decay), bool(c.prox_mu),
            job.loss_after, job.sum_gradients, job.first_gradient, job.starts.device, job.starts.dtype)


def predict_key(job: Predict) -> tuple:
    """Which predictions can share a stacked forward pass: one architecture on the very same inputs."""
    return (signature(job.model), tuple(id(t) for t in job.inputs), job.chunk, job.params.device, job.params.dtype)


# ----------------------------------------------------------------------------- the flat layout

def unflatten(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """(m, d) -> per parameter (m, *shape) (or (d,) -> per parameter (*shape))."""
    out, i = [], 0
    for p in like:
        part = flat[..., i:i + p.numel()]
        out.append(part.reshape(*flat.shape[:-1], *p.shape).clone())
        i += p.numel()
    return out


def flatten(tensors: Sequence[torch.Tensor], m: int) -> torch.Tensor:
    """Per parameter (m, *shape) -> (m, d), the inverse of :func:`unflatten`."""
    return torch.cat([t.reshape(m, -1) for t in tensors], dim=1)


@torch.no_grad()
def set_flat_params(model: nn.Module, flat: torch.Tensor) -> None:
    """Copy ``flat`` into the parameters (``vector_to_parameters`` would make them views of
    ``flat``, so that training would silently overwrite the global model)."""
    i = 0
    for p in model.parameters():
        p.copy_(flat[i:i + p.numel()].view_as(p))
        i += p.numel()
