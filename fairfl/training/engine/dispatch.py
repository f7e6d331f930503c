"""Dispatch: :func:`execute` runs a list of jobs, fusing those that can share a computation — the
training jobs of one fusion key on the fused path (``fairfl.training.engine.fused``), any other on the
reference path (``fairfl.training.engine.reference``), the predictions of one architecture on the same
inputs in one stacked forward pass where that is exact (``fairfl.training.engine.exactness``).
"""
from __future__ import annotations

from typing import Sequence

import torch

from .exactness import stacks_predictions
from .fused import train_fused
from .jobs import Job, Predict, Trained, can_batch, fusion_key, predict_key, unflatten
from .predict import PREDICT_STACK, predict_one, predict_stack
from .reference import train_sequential


def execute(jobs: Sequence[Job | Predict]) -> list[Trained | torch.Tensor | BaseException]:
    """Run the jobs, fusing those that can share a computation; one result (or the exception
    that stopped it) per job, in order."""
    out: list[Trained | torch.Tensor | BaseException | None] = [None] * len(jobs)
    fused: dict[tuple, list[int]] = {}
    predictions: dict[tuple, list[int]] = {}
    for j, job in enumerate(jobs):
        if isinstance(job, Predict):
            predictions.setdefault(predict_key(job), []).append(j)
        elif len(job.starts) == 0:
            d = job.starts.shape[1] if job.starts.ndim == 2 else 0
            empty = job.starts.new_zeros(0, d)
            out[j] = Trained(empty, empty if job.sum_gradients else None,
                             job.starts.new_zeros(0) if job.loss_after else None, empty if job.first_gradient else None)
        elif job.batched and can_batch(job.model):
            fused.setdefault(fusion_key(job), []).append(j)
        else:
            out[j] = _guard(train_sequential, job)
    for members in fused.values():
        results = _guard(train_fused, [jobs[j] for j in members])
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


def _predict_jobs(jobs: Sequence[Predict]) -> list[torch.Tensor]:
    """Predictions of jobs with one key (same architecture, same inputs): stacked where that pays
    and gives each instance its own logits bit for bit, else one model at a time."""
    first = jobs[0]
    model = first.model
    was_training = model.training
    model.eval()
    try:
        if not stacks_predictions(jobs):
            return [_guard(predict_one, job) for job in jobs]       # one run's failure is its own
        template = list(model.parameters())
        out = []
        for lo in range(0, len(jobs), PREDICT_STACK):
            members = jobs[lo:lo + PREDICT_STACK]
            stacked = torch.stack([j.params for j in members])
            logits = predict_stack(model, unflatten(stacked, template), first.inputs, first.chunk)
            out += [t.clone() for t in logits.unbind(0)]        # each run's own tensor, not a view of the stack's
        return out
    finally:
        model.train(was_training)
