"""One stack of instances and its local training: the rows of the stack (:class:`Row`), their
batches gathered from their data pools (:class:`Gather`), their losses through the fused forward
pass (``fairfl.federated.stacked``, or ``torch.func.vmap``), and SGD on all of them at once
(:func:`sgd_stack`), each instance with its own learning rate, momentum, weight decay and
proximal weight. ``fairfl.training.engine.fused`` cuts jobs into such stacks; ``fairfl.training.engine.exactness``
trains probe stacks here to find out which stack sizes compute each instance's own bits.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fairfl.federated import stacked as stacked_forward
from fairfl.federated import stacked_lstm
from fairfl.base.seeding import Stream
from . import graphs
from .jobs import LOSS_CHUNK, Plan, Source, signature

# A fused training loop gathers its batches in blocks of consecutive steps of at most this many
# floats (a few MB: well inside a cache, and a block's steps are used at once).
GATHER_FLOATS = 2 ** 20

# The loss after training (:func:`training_losses`) takes LOSS_CHUNK samples of every instance of a
# stack at once. On CUDA the stack's instance axis is cut there too, so that one piece's inputs and
# activations stay below this many floats: CUDA stacks are cut for a training step's batch of b
# samples (``fairfl.training.engine.fused.FUSED_FLOATS``), and 512 samples of each of their instances at once
# came to about 2.2e9 floats for the CNN and for logistic regression at b = 10. On the CPU (None) a
# stack's loss is one piece, as it always was: its stacks are cut for a cache-sized budget already,
# and its results are recorded bit for bit (tests/test_golden.py).
LOSS_FLOATS: dict[str, int | None] = {"cpu": None, "cuda": 2 ** 28}
_ACTIVATIONS: dict[tuple, int] = {}


def floats_per_sample(model, x: torch.Tensor, architecture: tuple | None = None) -> int:
    """Floats of one sample's activations through ``model.net`` (its input included), or what a
    stacked step of the character LSTM holds for it (``stacked_lstm.activation_floats``); for
    another architecture a generous guess (16 × the input)."""
    x_shape = tuple(x.shape[1:])
    key = (architecture if architecture is not None else signature(model), x_shape, x.dtype)
    if key not in _ACTIVATIONS:
        total = int(torch.Size(x_shape).numel())
        net = getattr(model, "net", None)
        if stacked_lstm.supports(model):
            total = stacked_lstm.activation_floats(model, x_shape[-1])
        elif isinstance(net, torch.nn.Sequential):
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


def loss_spans(m: int, samples: int, per_sample: int, budget: int | None) -> list[tuple[int, int]]:
    """The pieces (lo, hi) of a stack of m instances whose losses are taken together, each piece's
    ``samples`` samples per instance of ``per_sample`` floats within ``budget`` (None: one piece)."""
    if budget is None or m == 0:
        return [(0, m)]
    span = max(1, budget // max(1, samples * per_sample))
    return [(lo, min(m, lo + span)) for lo in range(0, m, span)]


@dataclass
class Row:
    """One instance of a stack: instance ``k`` of job ``job``, its data, stream and batch plan."""

    job: int
    k: int
    source: Source
    stream: Stream
    plan: Plan


class Gather:
    """The samples of a chunk's instances: each instance's batches, gathered from its data pool
    (one indexing operation per pool and block of steps, :meth:`batches`), and its samples at
    given indices (:meth:`take`)."""

    def __init__(self, rows: Sequence[Row], device: torch.device):
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
        a CPU cannot change a result (MKL runs in strict mode, ``fairfl.training.engine.exactness``)."""
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

    def take(self, idx: torch.Tensor, lo: int = 0, hi: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(m, b) indices into each instance's data -> its samples (m, b, ...) and labels (m, b);
        with ``lo``/``hi``, of instances lo..hi - 1 only, ``idx`` then (hi - lo, b)."""
        if lo == 0 and hi is None:
            return self._select([(x, y, idx[rows] + offsets) for x, y, rows, offsets in self.groups])
        hi = len(self.rows) if hi is None else hi
        parts = []
        for x, y, rows, offsets in self.groups:
            a, b = max(rows.start, lo), min(rows.stop, hi)
            if a < b:
                parts.append((x, y, idx[a - lo:b - lo] + offsets[a - rows.start:b - rows.start]))
        return self._select(parts)

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


def stacked_losses(model, names, stacked: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                    dropout: tuple[torch.Tensor, int] | None = None, reduction: str = "mean") -> torch.Tensor:
    """Per-instance losses (mean, or sum with ``reduction="sum"``) of stacked models on (m, b, ...)
    inputs: fused kernels for the papers' Sequential models (``fairfl.federated.stacked``) and the character
    LSTM (``fairfl.federated.stacked_lstm``), ``torch.func.vmap`` for any other model (which then has no dropout, :func:`can_batch`).
    ``reduction="total"``: the sum over instances of their mean losses, as one scalar — what a
    training step differentiates."""
    if stacked_forward.supports(model):
        logits = stacked_forward.forward(model, stacked, x, dropout)
    elif stacked_lstm.supports(model):
        logits = stacked_lstm.forward(model, stacked, x)
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
def training_losses(model, names, w: list[torch.Tensor], gather: Gather) -> torch.Tensor:
    """Each local model's mean loss on its own training data, eval mode. A model already in eval
    mode is left alone: stacks computing side by side (``fairfl.training.engine.fused``) share the module,
    whose mode one of them must not switch while another computes."""
    switch = model.training
    if switch:
        model.eval()
    n, m = gather.size, len(gather.rows)
    total = torch.zeros(m, device=gather.device)
    budget = LOSS_FLOATS.get(gather.device.type)
    spans = (loss_spans(m, min(n, LOSS_CHUNK), floats_per_sample(model, gather.rows[0].source.x), budget)
             if budget is not None else [(0, m)])
    for i in range(0, n, LOSS_CHUNK):
        if len(spans) == 1:
            idx = torch.arange(i, min(n, i + LOSS_CHUNK), device=gather.device).expand(m, -1)
            x, y = gather.take(idx)
            total += stacked_losses(model, names, w, x, y, reduction="sum")
            continue
        for lo, hi in spans:
            idx = torch.arange(i, min(n, i + LOSS_CHUNK), device=gather.device).expand(hi - lo, -1)
            x, y = gather.take(idx, lo, hi)
            total[lo:hi] += stacked_losses(model, names, [t[lo:hi] for t in w], x, y, reduction="sum")
    if switch:
        model.train()
    return total / n


def _view(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-instance scalar (m,) shaped to broadcast against a stacked tensor (m, ...)."""
    return v.reshape(-1, *([1] * (like.ndim - 1)))


def sgd_stack(model, names, w, centre, gather: Gather, steps: int, keys: torch.Tensor, hyper: dict, cfg,
              sum_gradients: bool, first_gradient: bool, transposed_is_exact: Callable[..., bool] | None):
    """SGD on a stack of instances: ``torch.optim.SGD``'s update rule (dampening 0, no Nesterov)
    with each instance's own learning rate, momentum, weight decay and proximal weight.
    ``transposed_is_exact``: where a dense model's weight gradient may be taken the faster way
    round (``fairfl.training.engine.exactness.transposed_is_exact``; ``stacked.dense_gradients``). On a GPU
    the steps are replayed from CUDA graphs where they can be (``fairfl.training.engine.graphs``: the same
    arithmetic); the CPU path is below."""
    if w[0].is_cuda:
        done = graphs.train(model, names, w, centre, gather, steps, keys, hyper, cfg, sum_gradients, first_gradient,
                            transposed_is_exact, stacked_losses)
        if done is not None:
            return done
    bufs = [torch.zeros_like(t) for t in w] if cfg.momentum else None
    acc = [torch.zeros_like(t) for t in w] if sum_gradients else None
    first = None
    # each instance's hyper-parameters shaped once per parameter tensor, not once per step
    lr, momentum, decay = ([_view(hyper[h], t) for t in w] for h in ("lr", "momentum", "weight_decay"))
    decay = decay if cfg.weight_decay else None
    model.train()

    def update(step: int, leaves: list[torch.Tensor], grads) -> list[torch.Tensor]:
        # per parameter tensor t with gradient g: g ← g + decay·t; buf ← g (first step) or
        # momentum·buf + g; t ← t − lr·buf. Each line one torch._foreach_* call over the tensors:
        # the same elementwise operations on the same operands (bits unchanged), without a Python
        # operation per tensor, which a small model's step pays (and stacks side by side take turns for)
        if acc is not None:
            torch._foreach_add_(acc, grads)
        if decay is not None:
            grads = torch._foreach_add(grads, torch._foreach_mul(decay, leaves))
        if bufs is not None:
            if step == 0:
                bufs[:] = [g.clone() for g in grads]
            else:
                torch._foreach_mul_(bufs, momentum)
                torch._foreach_add_(bufs, grads)
            grads = bufs
        return torch._foreach_sub(leaves, torch._foreach_mul(lr, grads))

    if stacked_forward.dense(model) and not cfg.prox_mu:
        # the same gradients by hand (stacked.dense_gradients): no autograd anywhere in the loop, which
        # tiny models pay per step (Adult's linear model: the grad-mode switches alone were ~4 µs of ~85)
        with torch.no_grad():
            for step, (x, y) in zip(range(steps), gather.batches()):
                grads = stacked_forward.dense_gradients(model, w, x, y, transposed_is_exact)
                if first_gradient and step == 0:
                    first = grads
                w = update(step, w, grads)
        return w, acc, first
    masks = stacked_forward.DropoutMasks(keys, gather.sizes)
    for step, (x, y) in zip(range(steps), gather.batches()):
        leaves = [t.requires_grad_() for t in w]
        loss = stacked_losses(model, names, leaves, x, y, (masks, step), reduction="total")
        if cfg.prox_mu:     # (μₖ/2)·‖wₖ − centreₖ‖² for every instance k
            per = sum(((t - g) ** 2).reshape(len(t), -1).sum(1) for t, g in zip(leaves, centre))
            loss = loss + (hyper["half_mu"] * per).sum()
        grads = torch.autograd.grad(loss, leaves)
        if first_gradient and step == 0:
            first = grads
        with torch.no_grad():
            w = update(step, [t.detach() for t in leaves], grads)
    return w, acc, first
