"""The fused path of local training: the instances of jobs with one fusion key
(``fairfl.training.engine.jobs.fusion_key``), grouped by sample count (which fixes the batch sizes of
every step), cut into stacks within a memory budget and of sizes that compute each instance's own
bits (``fairfl.training.engine.exactness``), each stack trained as one computation
(``fairfl.training.engine.stack``).
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import torch

from . import cores
from .exactness import exact_stacks, size_is_exact, transposed_is_exact
from .graphs import index_safe_size
from .jobs import Job, Trained, flatten, signature, unflatten
from .stack import Gather, Row, floats_per_sample, sgd_stack, training_losses


# Memory of one fused step: the instance axis is cut so that a chunk's activations (estimated from
# one sample's forward pass, ×3 for the backward pass) stay below this many floats. On a CPU the
# bound is about a last-level cache (32 MB here), not the memory: a stack of the Table 3 CNN at
# b = 10 runs fastest per instance at 20-30 instances (0.84 ms an instance-step, against 1.01 ms at
# 120 and 0.92 at one run's 10; medians of 4, one thread), and sweep (a) went 101 -> 93 s with it
# (benchmarks/README). Chunks never change a result (tests/test_engine.py).
FUSED_FLOATS = {"cpu": 2 ** 23, "cuda": 2 ** 28}
_floats_per_sample = floats_per_sample      # the name the engine's tests read


def _chunks(rows: list, per_row: int, device: torch.device, exact: Callable[[int], bool],
            pieces: int = 1) -> list[tuple[list, int]]:
    """``rows`` cut into stacks within the budget of :data:`FUSED_FLOATS`, and into at least ``pieces``
    stacks where there are rows enough (one per thread that computes them), each as (its rows, how
    many discarded copies of its first row pad it), of sizes that ``exact``
    (``fairfl.training.engine.exactness.size_is_exact``) accepts: ``exactness.exact_stacks`` says how."""
    budget = FUSED_FLOATS["cuda" if device.type == "cuda" else "cpu"]
    # and below 32-bit indexing (graphs.index_safe_size), which the budgets imply today: the bound
    # stays if a budget is raised
    size = min(len(rows), max(1, budget // max(1, 3 * per_row)), index_safe_size(per_row),
               -(-len(rows) // max(1, pieces)))
    return exact_stacks(rows, size, exact)


def train_fused(jobs: Sequence[Job]) -> list[Trained]:
    """Jobs with one fusion key: their instances, grouped by sample count (which fixes the batch
    sizes of every step), train as stacks. On a CPU the stacks are cut so that every thread the
    process may use (``fairfl.training.engine.cores``) gets work, and computed side by side, each with one
    intra-op thread: the bits are those of one thread (tested), since an instance's result does
    not depend on its stack (``exactness.exact_stacks``). The model's train / eval mode is set for
    all stacks at once, never by a stack while another computes."""
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
    by_size: dict[int, list[Row]] = {}
    for j, job in enumerate(jobs):
        for k in range(len(job.starts)):
            by_size.setdefault(job.sources[k].size, []).append(Row(j, k, job.sources[k], job.streams[k], job.plans[k]))
    architecture = signature(model)
    width = cores.threads() if device.type == "cpu" else 1        # a GPU computes on the calling thread
    was_training = model.training
    try:
        with cores.one_thread():       # the probes of exact sizes, like the stacks, on one intra-op thread
            stacks = []                # (rows, copies, work)
            total = sum(len(rows) * len(rows[0].plan) for rows in by_size.values()) or 1
            for n, rows in by_size.items():
                rows.sort(key=lambda r: (id(r.source.x), id(r.source.y)))     # one gather per data pool
                batch = rows[0].plan.sizes[0] if len(rows[0].plan) else n
                per_row = batch * _floats_per_sample(model, rows[0].source.x, architecture)
                @functools.cache           # asked several times per cut; its key walks the whole plan
                def exact(m: int, row: Row = rows[0]) -> bool:
                    return size_is_exact(model, names, template, row, cfg, device, dtype, m)
                # this size's part of the threads, by its share of the instance-steps
                pieces = max(1, round(width * len(rows) * len(rows[0].plan) / total)) if width > 1 else 1
                stacks += [(chunk, copies, (len(chunk) + copies) * max(1, len(rows[0].plan)) * per_row)
                           for chunk, copies in _chunks(rows, per_row, device, exact, pieces)]

        def train(chunk: list[Row], copies: int):
            # A stack of some sizes is computed by other kernels than a stack of two, and rounds
            # otherwise (exactness.size_is_exact): a run alone would differ from the same run in a group,
            # or from itself where its partners finished first. There the stack is padded with
            # copies of its first instance, which are discarded.
            rows, chunk = chunk, chunk + chunk[:1] * copies
            m = len(chunk)
            starts = torch.stack([jobs[r.job].starts[r.k] for r in chunk])
            centres = torch.stack([starts[i] if jobs[r.job].prox_centre is None else jobs[r.job].prox_centre
                                   for i, r in enumerate(chunk)])
            hyper = {name: torch.tensor([getattr(jobs[r.job].local, name) for r in chunk], dtype=dtype, device=device)
                     for name in ("lr", "momentum", "weight_decay")}
            hyper["half_mu"] = torch.tensor([jobs[r.job].local.prox_mu / 2 for r in chunk], dtype=dtype, device=device)
            keys = torch.tensor([r.stream.key for r in chunk], dtype=torch.int64, device=device)
            gather = Gather(chunk, device)
            flags = jobs[chunk[0].job]
            w, acc, grad0 = sgd_stack(model, names, unflatten(starts, template), unflatten(centres, template),
                                      gather, len(chunk[0].plan), keys, hyper, cfg, flags.sum_gradients,
                                      flags.first_gradient, transposed_is_exact)
            # each instance's result straight into its job's tensors (its own rows: threads never share one):
            # kept as the stack's tensors until every stack ended, they broke up the freed memory the next
            # stack's batches would have taken (a group's peak grew with its runs; engine.cores: memory)
            params, sums = flatten(w, m), flatten(acc, m) if acc is not None else None
            firsts = flatten(grad0, m) if grad0 is not None else None
            for i, r in enumerate(rows):
                out = results[r.job]
                out.params[r.k] = params[i]
                if sums is not None:
                    out.grad_sum[r.k] = sums[i]
                if firsts is not None:
                    out.first_grad[r.k] = firsts[i]
            return (w, gather) if first.loss_after else None

        costs = [work for _, _, work in stacks]
        model.train()
        trained = cores.parallel([functools.partial(train, chunk, copies) for chunk, copies, _ in stacks], costs, width)
        if first.loss_after:
            model.eval()
            afters = cores.parallel([functools.partial(training_losses, model, names, w, gather)
                                     for w, gather in trained], costs, width)
            for (chunk, _, _), after in zip(stacks, afters):
                for i, r in enumerate(chunk):
                    results[r.job].loss_after[r.k] = after[i]
    finally:
        model.train(was_training)
    return results
