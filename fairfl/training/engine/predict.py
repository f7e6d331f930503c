"""Predictions: the logits of models on the clients' data, in chunks (:func:`chunked`), for a
stack of models in one forward pass per chunk (:func:`predict_stack`) or for one model
(:func:`predict_one`). Whether the predictions of several runs are stacked is decided where
they meet (``fairfl.training.engine.dispatch``), by a rule of ``fairfl.training.engine.exactness``.
"""
from __future__ import annotations

from typing import Iterator, Sequence

import torch
from torch import nn

from fairfl.federated import stacked as stacked_forward
from . import cores
from .jobs import Predict, set_flat_params, unflatten

# At most this many instances share one stacked forward pass of predictions.
PREDICT_STACK = 64


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
    chunks of :func:`chunked`, each one forward pass of the stack (``fairfl.federated.stacked``). Every
    instance sees the same chunks, so with m = 1 this is a single model's prediction."""
    m = len(params[0])

    def one(piece: torch.Tensor) -> torch.Tensor:
        x = piece.unsqueeze(0)
        return stacked_forward.forward(model, params, x if m == 1 else x.expand(m, *piece.shape))
    outs = map_chunks(one, parts, chunk)
    if not outs:
        return torch.empty(m, 0, device=parts[0].device if parts else None)
    return torch.cat(outs, 1)


def map_chunks(fn, parts: Sequence[torch.Tensor], chunk: int) -> list[torch.Tensor]:
    """``fn`` of every chunk of the concatenation of ``parts`` (:func:`chunked`), in order. On a CPU the
    chunks are computed side by side on the threads the caller may use (``fairfl.training.engine.cores``),
    each with one intra-op thread: a chunk's logits are its own, the same bits on any thread. The
    model must not change mode or parameters meanwhile (its callers set both first)."""
    pieces = list(chunked(parts, chunk))
    if len(pieces) > 1 and pieces[0].device.type == "cpu":
        return cores.parallel([lambda p=p: fn(p) for p in pieces], [len(p) for p in pieces])
    return [fn(p) for p in pieces]


# At most this many instances share one stacked forward pass of predictions.
PREDICT_STACK = 64
def chunk_rows(parts: Sequence[torch.Tensor], lo: int, hi: int) -> torch.Tensor:
    """Rows lo:hi of the concatenation of ``parts`` (a chunk as :func:`chunked` cuts it)."""
    pieces, start = [], 0
    for part in parts:
        a, b = max(lo - start, 0), min(hi - start, len(part))
        if a < b:
            pieces.append(part[a:b])
        start += len(part)
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


@torch.no_grad()
def predict_one(job: Predict) -> torch.Tensor:
    """One model's logits: the stacked forward pass where the model allows it (about twice as fast
    as its own ``forward`` in NCHW on a small CPU), else its ``forward`` at these parameters."""
    model = job.model
    was_training = model.training
    model.eval()
    try:
        if stacked_forward.supports(model):
            return predict_stack(model, unflatten(job.params[None], list(model.parameters())), job.inputs, job.chunk)[0]
        set_flat_params(model, job.params)
        outs = map_chunks(model, job.inputs, job.chunk)
        return torch.cat(outs) if outs else torch.empty(0, device=job.params.device)
    finally:
        model.train(was_training)
