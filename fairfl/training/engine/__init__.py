"""The engine of local training: it trains *instances* — one model copy on one client's data
from one start (``fairfl.training.client`` explains what an instance is) — and fuses the instances of
many calls, of one run or of many runs trained side by side, into one computation.

A call of the client runtime becomes a :class:`Job`: its instances, their data (slices of a
:class:`Pool`), their streams (batch order and dropout masks, ``fairfl.base.seeding.Stream``) and the
local-training settings. :func:`execute` runs a list of jobs:

* jobs whose instances can share a computation — same architecture, same batch shape and number
  of steps, same kind of update (momentum, weight decay, proximal term on or off) — are fused:
  their instances' parameters are stacked along one leading axis and every local step is one
  forward and backward pass of the whole stack (``fairfl.federated.stacked``'s grouped convolutions and
  batched products, ``fairfl.federated.stacked_lstm``'s batched recurrence for the character LSTM, or
  ``torch.func.vmap``), with each instance's own learning rate, momentum,
  weight decay and proximal weight. Instances with other sample counts take other steps, so
  they form their own stacks; a stack too large for memory is cut along the instance axis.
* any other job (a config with ``batched=False``, a model none of these can stack) runs on the
  reference path: one ``nn.Module`` and one ``torch.optim.SGD`` per instance.

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

The rooms: ``jobs`` (what a call asks and gets back, the flat parameter layout, the one rule of
fusion), ``dispatch`` (:func:`execute`), ``fused`` (the stacked path: cutting into stacks) and
``stack`` (one stack's steps; on a GPU replayed from CUDA graphs, ``graphs``), ``reference`` (the plain path), ``predict`` (predictions),
``lockstep`` (how runs meet), ``device`` (:func:`resolve_device`), and ``exactness``: every rule
that makes a run's bits a function of its config (probes, kernel modes, thread counts), what it
costs, and how to switch it off for a quick experiment.
"""
from .device import resolve_device
from .dispatch import execute
from .exactness import RUN_THREADS, check_reproducible, cpu_kernels, run_threads
from .jobs import (Job, Plan, Pool, Predict, Source, Trained, batch_plan, can_batch, fusion_key, schedule_key,
                   set_flat_params)
from .lockstep import Immediate, Lockstep, Trainer
from .predict import PREDICT_STACK, chunked, map_chunks, predict_one, predict_stack

__all__ = ["Immediate", "Job", "Lockstep", "PREDICT_STACK", "Plan", "Pool", "Predict", "RUN_THREADS", "Source", "Trained",
           "Trainer", "batch_plan", "can_batch", "check_reproducible", "chunked", "cpu_kernels", "map_chunks", "execute", "fusion_key",
           "predict_one", "predict_stack", "resolve_device", "run_threads", "schedule_key", "set_flat_params"]
