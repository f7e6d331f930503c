"""CUDA graphs for the fused step: on a GPU, a stack's local SGD step (forward, backward and the
update of every instance) is captured once per step shape and replayed at every later step.

Why: an eager stacked step launches a few hundred small kernels, and on an H100 that launching,
not the arithmetic, costs 2.5-6 ms a step for any stack up to ~600 instances of the papers'
models; replayed from a CUDA graph the same step took 0.07-0.4 ms at 10 instances (the project's
GPU anchors). So one run alone, 10 clients a round, is no faster on a GPU than on two CPU cores
without graphs.

How: a :class:`Runner` per stack (architecture, stack size, dtype, device and kind of update)
holds the step's state in static tensors — the parameters, momentum buffers, summed and first
gradients, the step counter that draws the dropout masks (``fairfl.base.seeding.keep_mask`` hashes it
on the device) — and the per-call inputs (stream keys, learning rates, momenta, weight decays,
proximal weights and centres) are copied into it once per call. A step *shape* is the batch size
and whether it is the first step (momentum buffers start there, the first gradient is read
there): an epoch with a short last batch has up to four graphs. Each graph is captured after two
warm-up steps on a side stream, with the state restored afterwards, then replayed: per step only
the batch is copied in.

The arithmetic is the eager step's (:func:`fairfl.training.engine.stack.sgd_stack`), operation for
operation (its update's ``torch._foreach_*`` calls are the same elementwise operations), so
a replay gives the eager bits (``tests/test_cuda.py`` checks it on a GPU; ``tests/test_graphs.py``
runs the runner's steps without capture on a CPU against the eager loop, bit for bit): one config
gives one result on a device whether graphs are on, off, or fell back. A capture that fails
(an operation that cannot be captured, too little memory) is remembered for that runner and the
stack trains eagerly from its start.

Switches: ``FAIRFL_CUDA_GRAPHS=0`` in the environment turns graphs off (read at every call);
:func:`switched` does so for a block (``benchmarks/gpu_check.py`` times both). The CPU never uses
graphs: its path is unchanged.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from contextlib import contextmanager
from typing import Callable

import torch

from fairfl.federated import stacked as stacked_forward
from .jobs import signature

ENV = "FAIRFL_CUDA_GRAPHS"
WARMUP = 2                     # eager steps on a side stream before a capture (autograd, cuBLAS handles)
MAX_RUNNERS = 4                # runners (each with its graphs' memory pool) kept per process
# A stack's single largest tensor must stay below 32-bit indexing: a grouped convolution of
# 12,000 CNN instances at b = 64 failed there (the project's GPU anchors). ``fairfl.training.engine.fused``
# cuts a stack's instance axis at INDEX_LIMIT // (batch × floats of one sample's activations).
INDEX_LIMIT = 2 ** 31 - 1

_OVERRIDE: list[bool] = []
_RUNNERS: "OrderedDict[tuple, Runner]" = OrderedDict()
FAILED: dict[tuple, str] = {}          # runner key -> why its capture failed (it trains eagerly)
_LOCK = threading.Lock()               # one capture or replay at a time in a process (a lockstep group's threads)


def enabled() -> bool:
    """Whether CUDA stacks train from graphs: :func:`switched`'s setting inside its block, else
    ``FAIRFL_CUDA_GRAPHS`` (on unless "0")."""
    if _OVERRIDE:
        return _OVERRIDE[-1]
    return os.environ.get(ENV, "1").strip() != "0"


@contextmanager
def switched(on: bool):
    """Graphs on or off inside the block, whatever the environment says."""
    _OVERRIDE.append(bool(on))
    try:
        yield
    finally:
        _OVERRIDE.pop()


def index_safe_size(per_row: int) -> int:
    """The most instances whose stacked activations (``per_row`` floats each: a batch of one
    instance through the model) stay within 32-bit indexing."""
    return max(1, INDEX_LIMIT // max(1, per_row))


def step_shapes(sizes: list[int]) -> list[tuple[int, bool]]:
    """The graphs a plan of these batch sizes needs, in the order of first use: (batch size,
    whether it is the first step)."""
    shapes = []
    for step, size in enumerate(sizes):
        shape = (size, step == 0)
        if shape not in shapes:
            shapes.append(shape)
    return shapes


class Runner:
    """The static state of one stack's local training and its graphs (module text)."""

    def __init__(self, model, names, w, hyper: dict, cfg, sum_gradients: bool, first_gradient: bool,
                 transposed_is_exact: Callable[..., bool] | None, prox: bool, losses: Callable):
        self.model, self.names, self.transposed, self.losses = model, names, transposed_is_exact, losses
        self.device, self.m = w[0].device, len(w[0])
        self.dense = stacked_forward.dense(model) and not prox
        self.prox = prox
        self.w = [torch.zeros_like(t) for t in w]
        self.bufs = [torch.zeros_like(t) for t in w] if cfg.momentum else None
        self.acc = [torch.zeros_like(t) for t in w] if sum_gradients else None
        self.first = [torch.zeros_like(t) for t in w] if first_gradient else None
        self.centre = [torch.zeros_like(t) for t in w] if prox else None
        self.hyper = {h: torch.zeros_like(v) for h, v in hyper.items()}
        self.keys = torch.zeros(self.m, dtype=torch.int64, device=self.device)
        self.step = torch.zeros((), dtype=torch.int64, device=self.device)
        self.lr, self.momentum, decay = ([v.reshape(-1, *([1] * (t.ndim - 1))) for t in self.w]
                                         for v in (self.hyper["lr"], self.hyper["momentum"], self.hyper["weight_decay"]))
        self.decay = decay if cfg.weight_decay else None
        self.graphs: dict[tuple[tuple, bool], tuple] = {}
        self.pool = None

    def load(self, w, centre, keys, hyper) -> None:
        """A call's inputs into the static state; the sums start at zero."""
        with torch.no_grad():
            for s, t in zip(self.w, w):
                s.copy_(t)
            if self.centre is not None:
                for s, t in zip(self.centre, centre):
                    s.copy_(t)
            for h, v in hyper.items():
                self.hyper[h].copy_(v)
            self.keys.copy_(keys)
            self.step.zero_()
            for group in (self.bufs, self.acc, self.first):
                for t in group or ():
                    t.zero_()

    def state(self) -> list[torch.Tensor]:
        return [*self.w, *(self.bufs or ()), *(self.acc or ()), *(self.first or ()), self.step]

    def run(self, x: torch.Tensor, y: torch.Tensor, first: bool) -> None:
        """One SGD step of the whole stack on the static state, in place: what
        ``fairfl.training.engine.stack.sgd_stack`` computes for a step, operation for operation."""
        if self.dense:
            with torch.no_grad():
                grads = stacked_forward.dense_gradients(self.model, self.w, x, y, self.transposed)
        else:
            leaves = [t.detach().requires_grad_() for t in self.w]
            loss = self.losses(self.model, self.names, leaves, x, y, (self.keys, self.step), reduction="total")
            if self.prox:     # (μₖ/2)·‖wₖ − centreₖ‖² for every instance k
                per = sum(((t - g) ** 2).reshape(len(t), -1).sum(1) for t, g in zip(leaves, self.centre))
                loss = loss + (self.hyper["half_mu"] * per).sum()
            grads = torch.autograd.grad(loss, leaves)
        with torch.no_grad():
            if first and self.first is not None:
                for f, g in zip(self.first, grads):
                    f.copy_(g)
            for i, (t, g) in enumerate(zip(self.w, grads)):
                if self.acc is not None:
                    self.acc[i].add_(g)
                if self.decay is not None:
                    g = g + self.decay[i] * t
                if self.bufs is not None:
                    if first:
                        self.bufs[i].copy_(g)
                    else:
                        self.bufs[i].mul_(self.momentum[i]).add_(g)
                    g = self.bufs[i]
                t.copy_(t - self.lr[i] * g)
            self.step.add_(1)

    def replay(self, x: torch.Tensor, y: torch.Tensor, first: bool) -> None:
        """The step from its graph, captured at its first use."""
        shape = (tuple(x.shape), first)
        if shape not in self.graphs:
            self.graphs[shape] = self._capture(x, y, first)
        graph, sx, sy = self.graphs[shape]
        sx.copy_(x)
        sy.copy_(y)
        graph.replay()

    def _capture(self, x, y, first: bool):
        sx, sy = x.clone(), y.clone()
        saved = [t.clone() for t in self.state()]
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(WARMUP):
                self.run(sx, sy, first)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            self.run(sx, sy, first)
        with torch.no_grad():                    # the warm-up steps computed on the real state: undo them
            for t, s in zip(self.state(), saved):
                t.copy_(s)
        return graph, sx, sy

    def result(self):
        copy = lambda ts: [t.clone() for t in ts] if ts is not None else None   # noqa: E731
        return copy(self.w), copy(self.acc), copy(self.first)


def _key(model, w, cfg, sum_gradients, first_gradient) -> tuple:
    return (signature(model), tuple(t.shape for t in w), w[0].dtype, str(w[0].device), bool(cfg.momentum),
            bool(cfg.weight_decay), bool(cfg.prox_mu), sum_gradients, first_gradient, model.training)


def train(model, names, w, centre, gather, steps: int, keys, hyper: dict, cfg, sum_gradients: bool,
          first_gradient: bool, transposed_is_exact: Callable[..., bool] | None, losses: Callable | None = None,
          capture: bool = True):
    """``fairfl.training.engine.stack.sgd_stack`` through a :class:`Runner`: its steps replayed from CUDA
    graphs (``capture=False``: run as they would be captured, on any device; the tests' way on a
    CPU). ``losses``: ``stack.stacked_losses``, handed down by its caller (this room sits below
    ``stack``). Returns (parameters, summed gradients, first gradients), or None where graphs are off or
    their capture failed for this stack (then the caller trains eagerly from the same start)."""
    if not steps or (capture and not enabled()):
        return None
    model.train()
    key = _key(model, w, cfg, sum_gradients, first_gradient)
    if capture and key in FAILED:
        return None
    with _LOCK:
        runner = _RUNNERS.pop(key, None)
        if runner is None:
            runner = Runner(model, names, w, hyper, cfg, sum_gradients, first_gradient, transposed_is_exact,
                            bool(cfg.prox_mu), losses)
        _RUNNERS[key] = runner                   # most recently used last
        while len(_RUNNERS) > MAX_RUNNERS:
            _RUNNERS.popitem(last=False)
        runner.load(w, centre, keys, hyper)
        try:
            for step, (x, y) in zip(range(steps), gather.batches()):
                if capture:
                    runner.replay(x, y, step == 0)
                else:
                    runner.run(x, y, step == 0)
        except Exception as e:  # noqa: BLE001 - any capture failure: this stack trains eagerly, from its start
            if not capture:
                raise
            FAILED[key] = f"{type(e).__name__}: {e}"
            _RUNNERS.pop(key, None)
            return None
        return runner.result()
