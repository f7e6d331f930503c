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
``SUPPORTED`` (every model in ``fairfl.models``). :func:`supports` says whether a model
qualifies; the local-training code falls back to vmap otherwise.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

SUPPORTED = (nn.Conv2d, nn.Linear, nn.ReLU, nn.MaxPool2d, nn.Dropout, nn.Dropout2d, nn.Flatten,
             nn.LocalResponseNorm, nn.Identity)
_CL = torch.channels_last


def supports(model: nn.Module) -> bool:
    net = getattr(model, "net", None)
    if not isinstance(net, nn.Sequential) or any(type(l) not in SUPPORTED for l in net):
        return False
    # every parameter must belong to net, in order
    return [id(p) for p in model.parameters()] == [id(p) for p in net.parameters()]


def forward(model: nn.Module, params: Sequence[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Logits (m, b, classes) of m stacked models on inputs x of shape (m, b, ...).
    ``params`` are the model's parameters in ``model.parameters()`` order, each with a leading
    client axis of size m. Train / eval behaviour (dropout) follows ``model.training``."""
    m, b = x.shape[:2]
    it = iter(params)
    h, kind = x, "input"                      # kind: input (m,b,...), conv (b,m*C,H,W), flat (m,b,F)
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
            bias = next(it) if layer.bias is not None else None
            h = torch.bmm(h, w.transpose(1, 2)) if bias is None else torch.baddbmm(bias.unsqueeze(1), h, w.transpose(1, 2))
        elif isinstance(layer, nn.MaxPool2d):
            h = _max_pool(h, layer)
        elif isinstance(layer, nn.LocalResponseNorm):
            # normalises across neighbouring channels: per client, never across two clients
            _, mc, hh, ww = h.shape
            h = layer(h.contiguous().reshape(b * m, mc // m, hh, ww)).reshape(b, mc, hh, ww)
        elif isinstance(layer, nn.Flatten):
            h = _to_flat(h, kind, m, b)
            kind = "flat"
        elif isinstance(layer, (nn.ReLU, nn.Dropout, nn.Dropout2d, nn.Identity)):
            h = layer(h)  # elementwise, or per (sample, channel): the same on any layout
        else:  # pragma: no cover - guarded by supports()
            raise TypeError(f"unsupported layer {type(layer).__name__}")
    return _to_flat(h, kind, m, b)


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


def _to_flat(h: torch.Tensor, kind: str, m: int, b: int) -> torch.Tensor:
    if kind == "flat":
        return h
    if kind == "input":
        return h.reshape(m, b, -1)
    # (b, m*C, H, W) -> per client (C, H, W) flattened in nn.Flatten's order -> (m, b, C*H*W)
    return h.contiguous().reshape(b, m, -1).transpose(0, 1)
