"""What a client does in a round: E epochs (or K steps) of minibatch SGD from a starting model,
optionally with momentum, weight decay and a proximal term, reporting the pseudo-gradient
g = w_start − w_local (or the sum of its gradients) and its mean training loss before and after.

The unit of work is an *instance*: one model copy trained on one dataset from one start. A
round's clients are instances (start = the global model); Ditto's personal models are instances
too (start = the client's own model, proximal centre = the global one), and so are FMOL's
(client, objective) pairs (the objective's view of a multi-task model, on one label column).
``fairfl.training.engine`` trains them: by default fused into stacks (every instance of a round, and of
every run trained alongside, in one computation), or one ``nn.Module`` at a time on the
reference path (``batched=False``, and recurrent models other than the character LSTM, which
``fairfl.federated.stacked_lstm`` stacks). Both paths draw each instance's batch order and dropout masks
from its :class:`~fairfl.base.seeding.Stream` (a client's: of (seed, round, client)), so they agree to
float tolerance (tested).

:class:`ClientRuntime` is what an algorithm sees of the clients. It trains and evaluates on the
run's device and hands back CPU tensors, so that server rules never meet a device.

The modules: :mod:`~fairfl.training.client.training` (LocalTraining, instances, the clients' round,
gradients, per-objective training), :mod:`~fairfl.training.client.forward` (flat parameters, logits, mean
losses), :mod:`~fairfl.training.client.evaluation` (Evaluation), :mod:`~fairfl.training.client.second_order`
(Hessian-vector products, Hessians); here, :class:`ClientRuntime`. Every name is importable from
``fairfl.training.client``.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..engine import Immediate, Job, Predict, Trainer, predict_one, set_flat_params  # noqa: F401
from fairfl.federated.messages import ClientUpdates
from fairfl.federated.models import num_tasks
from fairfl.federated.partition import Client
from fairfl.base.seeding import BATCHES, Stream
from .evaluation import Evaluation, evaluate_model, evaluation_of, merge_evaluations  # noqa: F401
from .forward import (device_of, flat_params, labels_of, losses_of, mean_losses, objective_losses,  # noqa: F401
                      predict)
from .second_order import FORWARD_AD, SECOND_ORDER_CHUNK, hessian_vector_products, hessians  # noqa: F401
from .training import (GRADIENT, LOCAL_TRAINING, LocalTraining, check_finite, gradients, pool_of,  # noqa: F401
                       run_job, train_clients, train_instances, train_objectives)


# ----------------------------------------------------------------------------- the simulated clients

class ClientRuntime:
    """The clients of one run as the simulation holds them — their data, a model (only a
    template for shapes; every call sets the parameters it uses), the run's seed and the
    training path — and what an algorithm can ask of them. The round loop makes one per run,
    sets ``round`` before each round, and hands it to the algorithm's ``client_update`` and
    ``evaluate``. Model and data live on the run's device; every method takes and returns CPU
    tensors. ``trainer`` is how this run's local training meets other runs' (``fairfl.training.engine``).

    ``states`` holds each client's algorithm state (Ditto's personal model), saved in
    checkpoints; ``cache`` is scratch that an algorithm may keep between rounds to avoid
    recomputing something, never checkpointed, so it must never change a result."""

    def __init__(self, model: nn.Module, data: Sequence[Client], seed: int, batched: bool = True,
                 trainer: Trainer | None = None):
        self.model, self.data, self.seed, self.batched = model, data, seed, batched
        self.trainer = trainer or Immediate()
        self.device = device_of(model)
        self.round = 0
        self.validation = False     # evaluations also score the validation splits (config.track_validation)
        self.states: dict[int, object] = {}
        self.cache: dict = {}
        self._losses: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def num_clients(self) -> int:
        return len(self.data)

    @property
    def num_objectives(self) -> int:
        """S: the model's tasks (1 for a single-task model)."""
        return num_tasks(self.model)

    def num_samples(self, ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor([self.data[k].num_train for k in ids])

    def train(self, ids: Sequence[int], params: torch.Tensor, local: LocalTraining, *, loss_before: bool = False,
              loss_after: bool = False, batch_round: int | None = None) -> ClientUpdates:
        """Local training of clients ``ids`` from the global model ``params`` (pseudo-gradients,
        :func:`train_clients`). ``batch_round`` replaces the round in the clients' streams (an
        algorithm that trains one round in several calls gives each its own stream)."""
        out = train_clients(self.model, params, self.data, ids, local, self.seed,
                            self.round if batch_round is None else batch_round, self.batched, False, loss_after,
                            self.trainer)
        return out.replace(loss_before=self.losses(params, ids)) if loss_before else out

    def train_from(self, ids: Sequence[int], starts: torch.Tensor, local: LocalTraining,
                   prox_centre: torch.Tensor | None = None, purpose: int = BATCHES) -> torch.Tensor:
        """(m, d) local models of clients ``ids`` trained from their own ``starts`` (m, d), the
        proximal term of ``local.prox_mu`` pulling towards ``prox_centre`` (Ditto's personal
        models). ``purpose`` separates these streams from the round's ordinary ones."""
        pool = pool_of(self.data, self.device)
        centre = None if prox_centre is None else prox_centre.to(self.device)
        trained = run_job(Job(self.model, starts.to(self.device), [pool.source(int(k)) for k in ids],
                           [Stream(self.seed, self.round, int(k), purpose) for k in ids], local, centre, self.batched),
                       self.trainer)
        params = trained.params.cpu()
        check_finite(params, None, ids, self.round)
        return params

    def train_objectives(self, ids: Sequence[int], params: torch.Tensor, held: torch.Tensor, local: LocalTraining,
                         loss_before: bool = True, first_gradients: bool = False) -> ClientUpdates:
        """Per-objective local training of a multi-task model (:func:`train_objectives`)."""
        out = train_objectives(self.model, params, self.data, ids, held, local, self.seed, self.round,
                               self.batched, False, first_gradients, self.trainer)
        if not loss_before:
            return out
        before = self.losses(params, ids)
        return out.replace(loss_before=torch.where(held, before, torch.full_like(before, float("nan"))))

    def objective_gradients(self, point: torch.Tensor, ids: Sequence[int], held: torch.Tensor) -> torch.Tensor:
        """(m, S, d) full-batch gradients ∇f_{s,i}(point) of each held objective (one full-batch
        step, its gradient summed exactly)."""
        step = LocalTraining(steps=1, batch_size=None, lr=1.0)
        return train_objectives(self.model, point, self.data, ids, held, step, self.seed, self.round, self.batched,
                                loss_before=False, trainer=self.trainer).updates

    def gradients(self, point: torch.Tensor, ids: Sequence[int]) -> torch.Tensor:
        """(m, d) full-batch gradients of clients ``ids`` at ``point`` (:func:`gradients`)."""
        return gradients(self.model, point, self.data, ids, self.batched, self.trainer, self.round)

    def hvp(self, point: torch.Tensor, ids: Sequence[int], v: torch.Tensor,
            dtype: torch.dtype | None = None, rows: Sequence[torch.Tensor | None] | None = None) -> torch.Tensor:
        """∇²fₖ(point)·v on each client's whole training data (or on ``rows[r]`` of it: a subsampled
        Hessian), eval mode (:func:`hessian_vector_products`): ``point`` (d,) or (m, d), ``v`` (d,),
        (m, d) or (m, s, d). The client computation of a second-order method (FedNL's Hutchinson
        probes, FedNew's conjugate gradients)."""
        return hessian_vector_products(self.model, point, self.data, ids, v, dtype, rows=rows)

    def hessian(self, point: torch.Tensor, ids: Sequence[int],
                dtype: torch.dtype | None = torch.float64) -> torch.Tensor:
        """(m, d, d) dense Hessians ∇²fₖ(point), eval mode, float64 by default (:func:`hessians`); for
        a small model (d² numbers per client)."""
        return hessians(self.model, point, self.data, ids, dtype)

    def losses(self, params: torch.Tensor, ids: Sequence[int]) -> torch.Tensor:
        """Mean training loss of clients ``ids`` at ``params`` (eval mode); (m, S) per objective
        for a multi-task model.

        A run asks for the same losses several times — the losses after round t's step (the
        improved share), the losses before round t + 1's training at the same global model
        (q-FedAvg's Fₖ, FedFV's order, AFL, TERM, DQN-Fed) and the evaluation's training loss — each
        a forward pass over the clients' whole training data. The last few answers are kept, keyed
        by the clients and compared with the parameters' exact values, and returned instead of
        computing them again: the same call on the same inputs, so the same numbers bit for bit."""
        key = tuple(int(k) for k in ids)
        hit = self._losses.get(key)
        if hit is not None and hit[0].dtype == params.dtype and torch.equal(hit[0], params.cpu()):
            return hit[1].clone()
        xs, ys = [self.data[k].x_train for k in ids], [self.data[k].y_train for k in ids]
        if self.num_objectives == 1:
            out = losses_of(self.predict(params, xs), ys).cpu()
        else:
            set_flat_params(self.model, params.to(self.device))
            out = objective_losses(self.model, xs, ys).cpu()
        if len(self._losses) >= 4:
            self._losses.pop(next(iter(self._losses)))
        self._losses.pop(key, None)
        self._losses[key] = (params.detach().cpu().clone(), out.clone())
        return out

    def predict(self, params: torch.Tensor, xs: Sequence[torch.Tensor]) -> torch.Tensor:
        """Logits (on the run's device) of the single-task model at ``params``, eval mode, on the
        concatenation of ``xs`` (:func:`predict`). A small dense model's go through the trainer:
        the runs of a lockstep group that predict on the same data at once share one stacked
        forward pass (``fairfl.training.engine.Predict``)."""
        job = Predict(self.model, params.to(device=self.device, dtype=next(self.model.parameters()).dtype), tuple(xs))
        return self.trainer(job) if job.stackable else predict_one(job)

    def evaluate(self, params: torch.Tensor) -> Evaluation:
        """Every client evaluated at the global model ``params`` (and on its validation split where
        the run asks for it: ``validation``)."""
        if self.num_objectives == 1:
            train = self.losses(params, range(self.num_clients))
            val = self.predict(params, [c.x_val for c in self.data]) if self.validation else None
            return evaluation_of(self.predict(params, [c.x_test for c in self.data]), self.data, train, val)
        set_flat_params(self.model, params.to(self.device))
        return evaluate_model(self.model, self.data, self.validation)

    def evaluate_each(self, params: Sequence[torch.Tensor]) -> Evaluation:
        """Client k evaluated at its own model ``params[k]`` (a personalised algorithm)."""
        parts = []
        for k, p in enumerate(params):
            set_flat_params(self.model, p.to(self.device))
            parts.append(evaluate_model(self.model, [self.data[k]], self.validation))
        return merge_evaluations(parts)
