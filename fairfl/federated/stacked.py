"""The forward pass of m copies of one model with different parameters (one per client), fused
into grouped convolutions and batched matrix products.

``torch.func.vmap`` does this for any model, but it cannot choose the memory layout: on a
small CPU the grouped convolutions it produces run in NCHW, and max-pooling in NCHW is slow.
Here the activations of the convolutional part are held as one tensor of shape
(b, m·C, H, W) in channels-last layout — clients side by side along the channel axis, so a
convolution with ``groups = m`` applies client k's filters to client k's channels only — and
the dense part as (m, b, F) for ``baddbmm``. Measured on the FedMGDA+ Table 3 CNN, 10 clients,
b = 10, one thread: 0.36 s per local epoch against 0.85 s with vmap
(``benchmarks/round_speed.py``).

Supported: models whose ``net`` attribute is an ``nn.Sequential`` of the layer types in
``SUPPORTED`` (every model in ``fairfl.federated.models``). :func:`supports` says whether a model
qualifies; the local-training code falls back to vmap otherwise.

Dropout in training mode draws its masks from each instance's stream key
(:func:`fairfl.base.seeding.keep_mask`), in the instance's own (batch, channel, ...) layout, so an
instance gets the same masks whichever instances share its stack (a stack's eager steps draw them
for a block of steps at once, :class:`DropoutMasks`); :func:`keyed_dropout` gives a single
``nn.Module`` the very same masks (the reference path of local training).
"""
from __future__ import annotations

import functools
import weakref
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fairfl.base.seeding import keep_mask, keep_masks

SUPPORTED = (nn.Conv2d, nn.Linear, nn.ReLU, nn.MaxPool2d, nn.Dropout, nn.Dropout2d, nn.Flatten,
             nn.LocalResponseNorm, nn.Identity)
_CL = torch.channels_last


_SUPPORTS: "weakref.WeakKeyDictionary[nn.Module, bool]" = weakref.WeakKeyDictionary()


def supports(model: nn.Module) -> bool:
    """Whether :func:`forward` can run copies of ``model``. Remembered per model: the engine asks at
    every local step, and the check walks the model's parameters. A model's layers are fixed once it
    is built; :func:`keyed_dropout`, which swaps them for a while, forgets the answer."""
    known = _SUPPORTS.get(model)
    if known is None:
        net = getattr(model, "net", None)
        known = (isinstance(net, nn.Sequential) and all(type(l) in SUPPORTED for l in net)
                 # every parameter must belong to net, in order
                 and [id(p) for p in model.parameters()] == [id(p) for p in net.parameters()])
        _SUPPORTS[model] = known
    return known


# Layers of a model whose stacked gradients :func:`dense_gradients` computes by hand
DENSE = (nn.Linear, nn.ReLU, nn.Flatten, nn.Identity)


def dense(model: nn.Module) -> bool:
    """Whether ``model`` is a stack of :data:`DENSE` layers (logistic regression, the MLPs), whose
    training gradients :func:`dense_gradients` computes without autograd."""
    return supports(model) and all(type(layer) in DENSE for layer in model.net)


def dense_gradients(model: nn.Module, params: Sequence[torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                    transposed_is_exact: Callable[[int, int, int, torch.dtype], bool] | None = None) -> list[torch.Tensor]:
    """The gradients, per parameter of ``model.parameters()`` (stacked, (m, ...)), of
    Σₖ meanᵢ CE(fₖ(xₖᵢ), yₖᵢ) — the loss a training step of m stacked :func:`dense` models
    differentiates — on inputs (m, b, ...) and labels (m, b).

    Why by hand: a step of Adult's logistic regression at b = 10 is a handful of tiny kernels, and
    autograd's graph and engine cost as much again (measured: 250 against 140 µs a step for 23
    stacked models). The backward below calls the kernels autograd calls for :func:`forward`'s
    layers, on the same operands in the same layouts (PyTorch's derivatives.yaml: baddbmm's
    ``batch1ᵀ·grad`` and ``grad·batch2ᵀ``, ``sum_to`` for the broadcast bias, ``threshold_backward``
    for ReLU, ``nll_loss_backward`` and ``_log_softmax_backward_data`` for the loss, the root
    gradient 1 divided by b), so the gradients are the same bit for bit (``tests/test_client.py``).
    One exception: a weight gradient is taken the other way round where ``transposed_is_exact``
    (the engine passes ``fairfl.training.engine.exactness.transposed_is_exact``, a probe) says that it rounds
    the same, as it is faster (:func:`_weight_gradient`); None keeps autograd's form everywhere."""
    m, b = y.shape
    it = iter(params)
    h = x.reshape(m, b, -1)                            # Flatten of the input, as _to_flat does
    tape: list[tuple] = []
    for layer, has_bias in _dense_layers(model):
        if layer is None:
            w = next(it)
            bias = next(it) if has_bias else None
            tape.append((h, w, has_bias))
            h = _linear(h, w, bias)
        else:
            h = layer(h)
            tape.append((h, None, False))
    logits = h.reshape(m * b, -1)
    log_p = torch.log_softmax(logits, 1)
    root, total_weight = _loss_roots(b, logits.dtype, logits.device)
    grad = _NLL_BACKWARD(root, log_p, y.reshape(-1), None, 2, -100, total_weight)  # 2: "sum"
    grad = _LOG_SOFTMAX_BACKWARD(grad, log_p, 1, logits.dtype).reshape(m, b, -1)
    grads: list[torch.Tensor] = []
    for i in range(len(tape) - 1, -1, -1):
        inp, w, has_bias = tape[i]
        if w is None:                                   # a ReLU, its output on the tape
            grad = _THRESHOLD_BACKWARD(grad, inp, 0)
            continue
        if has_bias:
            grads.insert(0, grad.sum(1))            # the same reduction as sum(1, keepdim=True)
        grads.insert(0, _weight_gradient(inp, grad, transposed_is_exact))
        if i > 0:                                       # the input of the first layer needs none
            grad = torch.bmm(grad, w)
    return grads


# The backward kernels autograd calls, resolved once (an operator packet resolves its overload per call).
_NLL_BACKWARD = torch.ops.aten.nll_loss_backward.default
_LOG_SOFTMAX_BACKWARD = torch.ops.aten._log_softmax_backward_data.default
_THRESHOLD_BACKWARD = torch.ops.aten.threshold_backward.default

_DENSE_LAYERS: "weakref.WeakKeyDictionary[nn.Module, list]" = weakref.WeakKeyDictionary()


def _dense_layers(model: nn.Module) -> list[tuple[nn.Module | None, bool]]:
    """A :func:`dense` model's layers as its backward walks them: (None, has_bias) for a Linear,
    (the layer, False) for a ReLU; Flatten and Identity need nothing. Made once per model."""
    known = _DENSE_LAYERS.get(model)
    if known is None:
        known = [(None, layer.bias is not None) if isinstance(layer, nn.Linear) else (layer, False)
                 for layer in model.net if isinstance(layer, (nn.Linear, nn.ReLU))]
        _DENSE_LAYERS[model] = known
    return known


def _weight_gradient(inp: torch.Tensor, grad: torch.Tensor,
                     transposed_is_exact: Callable[[int, int, int, torch.dtype], bool] | None) -> torch.Tensor:
    """(m, out, in): each instance's weight gradient gradᵀ·inp of a linear layer with inputs
    ``inp`` (m, b, in) and output gradients ``grad`` (m, b, out).

    Autograd computes it as (inpᵀ·grad)ᵀ (baddbmm's ``batch1ᵀ·grad``, then the transpose of
    ``w.transpose(1, 2)``). Where the product taken the other way round, gradᵀ·inp, rounds the same
    — the same products summed over the b samples in the same order, which depends on the BLAS
    kernel the shape selects — it is used instead: for Adult's linear model at b = 10 it costs 7
    against 36 µs for 21 instances (a quarter of a training step). ``transposed_is_exact`` says
    where (``fairfl.training.engine.exactness`` finds out once per shape); the MLPs' shapes (measured) keep
    autograd's form."""
    # CPU only: the gain is a CPU measurement, and a GPU's batched kernels are chosen by the stack's
    # size and the operands' alignment too, which a probe on fresh tensors would not stand for.
    if (transposed_is_exact is not None and inp.device.type == "cpu"
            and transposed_is_exact(inp.shape[1], inp.shape[2], grad.shape[2], inp.dtype)):
        return torch.bmm(grad.transpose(1, 2), inp)
    return torch.bmm(inp.transpose(1, 2), grad).transpose(1, 2)


@functools.lru_cache(maxsize=64)
def _loss_roots(b: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The root gradient d(Σ CE / b) / d(Σ CE) = 1 / b, divided as autograd divides it (a float
    division of the tensor 1 by b, not 1.0 / b rounded from a double), and nll_loss's total weight
    1: made once, not twice per step of a tiny model. Read-only."""
    one = torch.ones((), dtype=dtype, device=device)
    return one / b, one


# One step of an instance draws its masks of dropout layer j (in the model's order) at counter
# step · DROPOUT_LAYERS + j.
DROPOUT_LAYERS = 64


def forward(model: nn.Module, params: Sequence[torch.Tensor], x: torch.Tensor,
            dropout: tuple[torch.Tensor, int] | None = None) -> torch.Tensor:
    """Logits (m, b, classes) of m stacked models on inputs x of shape (m, b, ...).
    ``params`` are the model's parameters in ``model.parameters()`` order, each with a leading
    client axis of size m. Train / eval behaviour (dropout) follows ``model.training``; in
    training mode a model with dropout needs ``dropout`` = (the instances' stream keys (m,), the
    local step)."""
    m, b = x.shape[:2]
    it = iter(params)
    h, kind = x, "input"                      # kind: input (m,b,...), conv (b,m*C,H,W), flat (m,b,F)
    ordinal = 0
    for layer in model.net:
        if isinstance(layer, nn.Conv2d):
            if kind == "input":
                h = h.transpose(0, 1).reshape(b, m * h.shape[2], *h.shape[3:]).contiguous(memory_format=_CL)
            elif kind != "conv":
                raise ValueError("a Conv2d after a Flatten is not supported")
            w = next(it)
            bias = next(it) if layer.bias is not None else None
            h = F.conv2d(h, w.reshape(m * w.shape[1], *w.shape[2:]).contiguous(memory_format=_CL),
                         None if bias is None else bias.reshape(-1), layer.stride, layer.padding,
                         layer.dilation, groups=m * layer.groups)
            kind = "conv"
        elif isinstance(layer, nn.Linear):
            h = _to_flat(h, kind, m, b)
            kind = "flat"
            w = next(it)
            h = _linear(h, w, next(it) if layer.bias is not None else None)
        elif isinstance(layer, nn.MaxPool2d):
            h = _max_pool(h, layer)
        elif isinstance(layer, nn.LocalResponseNorm):
            # normalises across neighbouring channels: per client, never across two clients
            _, mc, hh, ww = h.shape
            h = layer(h.contiguous().reshape(b * m, mc // m, hh, ww)).reshape(b, mc, hh, ww)
        elif isinstance(layer, nn.Flatten):
            h = _to_flat(h, kind, m, b)
            kind = "flat"
        elif isinstance(layer, (nn.Dropout, nn.Dropout2d)):
            if model.training and layer.p > 0:
                if dropout is None:
                    raise ValueError("a model with dropout in training mode needs the instances' stream keys")
                keys, step = dropout
                h = h * (keys.mask(layer, kind, h, ordinal, step) if isinstance(keys, DropoutMasks)
                         else _stacked_mask(layer, kind, h, keys, step * DROPOUT_LAYERS + ordinal, m, b))
            ordinal += 1
        elif isinstance(layer, nn.ReLU):
            # elementwise: the same on any layout; its kernel called directly, not through the module's
            # __call__ (hooks, which a stacked step would not honour anyway): ~1 % of a Table 3 CNN step
            h = torch.relu_(h) if layer.inplace else torch.relu(h)
        elif isinstance(layer, nn.Identity):
            pass
        else:  # pragma: no cover - guarded by supports()
            raise TypeError(f"unsupported layer {type(layer).__name__}")
    return _to_flat(h, kind, m, b)


def _scale(keep: torch.Tensor, p: float, dtype: torch.dtype) -> torch.Tensor:
    """Inverted dropout: kept elements are scaled by 1 / (1 − p), as ``nn.Dropout`` does."""
    return keep.to(dtype) * (1.0 / (1.0 - p))


def _mask_shape(layer, kind: str, h: torch.Tensor, m: int) -> tuple[int, ...]:
    """The shape of one instance's mask, in its own layout: (b, C[, H, W]) after a convolution
    (channelwise: (b, C)), else (b, F)."""
    if kind == "conv":
        b, mc, hh, ww = h.shape
        return (b, mc // m) if isinstance(layer, nn.Dropout2d) else (b, mc // m, hh, ww)
    if isinstance(layer, nn.Dropout2d):
        raise ValueError("Dropout2d is only supported on convolutional activations")
    return tuple(h.shape[1:])


def _stacked_mask(layer, kind: str, h: torch.Tensor, keys: torch.Tensor, counter, m: int, b: int) -> torch.Tensor:
    """The mask of m instances in the stack's layout, drawn in each instance's own layout (one step:
    the step counter of a captured CUDA graph, ``fairfl.training.engine.graphs``; the eager steps draw
    theirs by blocks, :class:`DropoutMasks`)."""
    shape = _mask_shape(layer, kind, h, m)
    keep = keep_mask(keys, counter, shape, layer.p)                         # (m, b, C[, H, W])
    if kind == "conv":
        _, mc, hh, ww = h.shape
        keep = keep.transpose(0, 1).reshape(b, mc, *((1, 1) if len(shape) == 2 else (hh, ww)))
        return _scale(keep, layer.p, h.dtype).contiguous(memory_format=_CL)
    return _scale(keep, layer.p, h.dtype)


# A stack's masks of one dropout layer are drawn for a block of consecutive steps at once, of at most
# this many elements (the hash's int64 intermediates: 8 MB): the Table 3 CNN's 48 steps of 10
# instances at b = 10 are one block of each layer (240,000 elements); large activations get fewer
# steps a block (the convolutional dropout of FEMNIST's CNN one, from 57 instance-samples a step).
MASK_BLOCK = 2 ** 20


class DropoutMasks:
    """The dropout masks of a stack's local steps (``forward(..., dropout=(masks, step))``): the
    masks of :func:`_stacked_mask`, bit for bit and in its strides (tested: the layout of ``h *
    mask`` decides the layout, and so the kernels, of the layers after it), but each layer's
    drawn for a block of consecutive steps of one batch size in one go
    (:func:`fairfl.base.seeding.keep_masks`). The hash is some 25 tensor operations per layer and step,
    and a fused CPU step pays per operation (the Table 3 CNN at b = 10: about 60 of the step's
    operations, which two stacks computing side by side also take turns for). One object serves
    one stack's steps (``fairfl.training.engine.stack.sgd_stack``); a block is used only for activations of
    the shape and dtype it was drawn for."""

    def __init__(self, keys: torch.Tensor, sizes: Sequence[int]):
        self.keys, self.sizes = keys, list(sizes)            # the stack's stream keys; each step's batch size
        # layer ordinal -> (first step, the block's masks, the activations' shape and dtype)
        self._blocks: dict[int, tuple[int, torch.Tensor, torch.Size, torch.dtype]] = {}

    def mask(self, layer: nn.Module, kind: str, h: torch.Tensor, ordinal: int, step: int) -> torch.Tensor:
        hit = self._blocks.get(ordinal)
        if hit is None or not hit[0] <= step < hit[0] + len(hit[1]) or hit[2] != h.shape or hit[3] != h.dtype:
            hit = (step, self._draw(layer, kind, h, ordinal, step), h.shape, h.dtype)
            self._blocks[ordinal] = hit
        return hit[1][step - hit[0]]

    def _draw(self, layer, kind: str, h: torch.Tensor, ordinal: int, step: int) -> torch.Tensor:
        m = len(self.keys)
        shape = _mask_shape(layer, kind, h, m)
        per_step = m * int(torch.Size(shape).numel())
        n = 1
        while (step + n < len(self.sizes) and self.sizes[step + n] == self.sizes[step]
               and (n + 1) * per_step <= MASK_BLOCK):
            n += 1
        counters = torch.arange(step, step + n, dtype=torch.int64, device=self.keys.device) * DROPOUT_LAYERS + ordinal
        keep = keep_masks(self.keys, counters, shape, layer.p)              # (n, m, b, C[, H, W])
        if kind == "conv":               # each step's (b, m·C, H, W), or (b, m·C, 1, 1) channelwise
            b, c = shape[:2]
            keep = keep.transpose(1, 2).reshape(n, b, m * c, *(shape[2:] or (1, 1)))
        block = _scale(keep, layer.p, h.dtype)
        # each step's mask in the strides _stacked_mask gives it (channels-last, and its choice of
        # strides on dimensions of size 1), read off the first step's
        first = _stacked_mask(layer, kind, h, self.keys, step * DROPOUT_LAYERS + ordinal, m, h.shape[0] if
                              kind == "conv" else h.shape[1])
        if block[0].stride() != first.stride():
            block = torch.empty_strided((n, *first.shape), (first.numel(), *first.stride()), dtype=block.dtype,
                                        device=block.device).copy_(block)
        return block


class _KeyedDropout(nn.Module):
    """A dropout layer of one instance that draws the masks :func:`forward` would give it."""

    def __init__(self, layer: nn.Module, ordinal: int, state: dict):
        super().__init__()
        self.layer, self.ordinal, self.state = layer, ordinal, state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.layer.p == 0:
            return x
        channelwise = isinstance(self.layer, nn.Dropout2d)
        if channelwise and x.ndim != 4:
            raise ValueError("Dropout2d is only supported on convolutional activations")
        shape = tuple(x.shape[:2]) if channelwise else tuple(x.shape)
        keys = torch.tensor([self.state["key"]], device=x.device)
        keep = keep_mask(keys, self.state["step"] * DROPOUT_LAYERS + self.ordinal, shape, self.layer.p)[0]
        if channelwise:
            keep = keep.reshape(*shape, 1, 1)
        return x * _scale(keep, self.layer.p, x.dtype)


@contextmanager
def keyed_dropout(model: nn.Module) -> Iterator[dict]:
    """Within the block, the model's dropout layers draw from ``state["key"]`` at local step
    ``state["step"]`` (set both in the yielded dict before each forward pass), with the masks
    that :func:`forward` gives the same instance in a stack."""
    state: dict = {"key": 0, "step": 0}
    _SUPPORTS.pop(model, None)          # its layers change inside the block and back after it
    swapped = []
    ordinal = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.modules.dropout._DropoutNd):
                if not isinstance(child, (nn.Dropout, nn.Dropout2d)):
                    raise TypeError(f"{type(child).__name__} is not supported; use nn.Dropout or nn.Dropout2d")
                setattr(parent, name, _KeyedDropout(child, ordinal, state))
                swapped.append((parent, name, child))
                ordinal += 1
    try:
        yield state
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)
        _SUPPORTS.pop(model, None)


def _max_pool(h: torch.Tensor, layer: nn.MaxPool2d) -> torch.Tensor:
    """Max-pooling. Without autograd (evaluation) a 2×2, stride-2 pool is taken as the maximum of
    four strided views, about 4× faster than ``max_pool2d`` on a small CPU and exactly equal (a
    maximum is exact); with autograd, ``max_pool2d`` keeps PyTorch's tie-breaking in the backward."""
    plain_2x2 = (layer.kernel_size in (2, (2, 2)) and layer.stride in (2, (2, 2)) and layer.padding in (0, (0, 0))
                 and layer.dilation in (1, (1, 1)) and not layer.ceil_mode)
    if plain_2x2 and not torch.is_grad_enabled():
        h = h[..., : h.shape[-2] // 2 * 2, : h.shape[-1] // 2 * 2]   # floor mode drops an odd last row/column
        return torch.maximum(torch.maximum(h[..., 0::2, 0::2], h[..., 0::2, 1::2]),
                             torch.maximum(h[..., 1::2, 0::2], h[..., 1::2, 1::2]))
    return F.max_pool2d(h.contiguous(memory_format=_CL), layer.kernel_size, layer.stride, layer.padding,
                        layer.dilation, layer.ceil_mode)


def _linear(h: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """m stacked linear layers on (m, b, F): one batched product (with the bias added by it).
    :func:`forward` and :func:`dense_gradients` share it: the hand-written backward is exact only
    for these operands in these layouts."""
    return torch.bmm(h, w.transpose(1, 2)) if bias is None else torch.baddbmm(bias.unsqueeze(1), h, w.transpose(1, 2))


def _to_flat(h: torch.Tensor, kind: str, m: int, b: int) -> torch.Tensor:
    if kind == "flat":
        return h
    if kind == "input":
        return h.reshape(m, b, -1)
    # (b, m*C, H, W) -> per client (C, H, W) flattened in nn.Flatten's order -> (m, b, C*H*W)
    return h.contiguous().reshape(b, m, -1).transpose(0, 1)
