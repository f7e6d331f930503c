"""The round loop: sample clients, train them, aggregate, step the server, evaluate,
checkpoint.

Determinism: every random choice of round t is drawn from a generator seeded by (seed, t, what
it is for), never from a generator carried across rounds. A resumed run therefore needs only
the model, the aggregator state and the history from its checkpoint to continue exactly as an
uninterrupted run would (tested).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .algorithms import make_algorithm
from .atomic import atomic_write, read_json_npz, write_json_npz
from .attacks import make_attack
from .config import ExperimentConfig
from .datasets import load_dataset
from .errors import TrainingDivergedError
from .local import flat_params, mean_losses, predict, set_flat_params, train_clients
from .models import build_model
from .partition import FederatedData, federate

try:
    from tqdm.auto import tqdm
except ImportError:  # pragma: no cover
    tqdm = None


# ----------------------------------------------------------------------------- history

@dataclass
class History:
    """Everything a run measured. Saved as JSON (config, per-round scalars) + NPZ (per-client
    arrays); never pickled."""

    config: dict[str, Any]
    eval_rounds: list[int] = field(default_factory=list)      # rounds completed at each evaluation
    test_acc: list[list[float]] = field(default_factory=list)  # [eval][client]
    test_loss: list[list[float]] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)      # uniform mean over all clients
    round_lr: list[float] = field(default_factory=list)        # ηₜ per round
    round_improved: list[float] = field(default_factory=list)  # share of improved participants (NaN: not tracked)
    round_time: list[float] = field(default_factory=list)      # seconds per round
    sampled: list[list[int]] = field(default_factory=list)     # client ids per round
    info: dict[str, list[float]] = field(default_factory=dict)  # aggregator scalars per round

    # -- views
    @property
    def rounds_done(self) -> int:
        return len(self.round_lr)

    def acc(self) -> np.ndarray:
        """(evaluations, clients) test accuracy."""
        return np.asarray(self.test_acc, dtype=np.float64)

    def final_acc(self) -> np.ndarray:
        return self.acc()[-1]

    def mean_acc(self) -> np.ndarray:
        return np.nanmean(self.acc(), axis=1)

    # -- (de)serialisation
    def to_state(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_state(cls, s: dict[str, Any]) -> "History":
        return cls(**s)

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        arrays = {"test_acc": self.acc(), "test_loss": np.asarray(self.test_loss, dtype=np.float64),
                  "sampled": np.asarray(self.sampled, dtype=np.int64)}
        scalars = {k: v for k, v in self.to_state().items() if k not in arrays}
        write_json_npz(folder, scalars, arrays)

    @classmethod
    def load(cls, folder: Path) -> "History":
        scalars, arrays = read_json_npz(folder)
        return cls(**scalars, **{k: v.tolist() for k, v in arrays.items()})


# ----------------------------------------------------------------------------- randomness

def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1, np.uint32)[0])


def sample_clients(seed: int, round_: int, num_clients: int, m: int,
                   eligible: tuple[int, ...] | None = None, forced: tuple[int, ...] = ()) -> np.ndarray:
    """m distinct clients from a generator of (seed, round) only, sorted: the ``forced`` ones
    (attackers that take part in every round), then the rest uniformly from ``eligible``
    (default: every client)."""
    rng = np.random.default_rng(_seed(seed, round_, 0x5A3))
    pool = np.arange(num_clients) if eligible is None else np.asarray(sorted(eligible))
    if not forced:
        return np.sort(rng.choice(pool, size=m, replace=False))
    rest = np.setdiff1d(pool, forced)
    picked = rng.choice(rest, size=m - len(forced), replace=False) if m > len(forced) else []
    return np.sort(np.concatenate([np.asarray(forced, dtype=np.int64), np.asarray(picked, dtype=np.int64)]))


# ----------------------------------------------------------------------------- evaluation

@torch.no_grad()
def evaluate(model: torch.nn.Module, fed: FederatedData) -> tuple[list[float], list[float], float]:
    """Per-client test accuracy and loss, and the uniformly averaged training loss over all
    clients, all at the current model in eval mode."""
    import torch.nn.functional as F
    model.eval()
    xs = torch.cat([c.x_test for c in fed.clients])
    ys = torch.cat([c.y_test for c in fed.clients])
    out = predict(model, xs)
    losses = F.cross_entropy(out, ys, reduction="none") if len(ys) else torch.empty(0)
    correct = (out.argmax(1) == ys).float() if len(ys) else torch.empty(0)
    sizes = [len(c.y_test) for c in fed.clients]
    acc = [float(v.mean()) if len(v) else float("nan") for v in correct.split(sizes)]
    loss = [float(v.mean()) if len(v) else float("nan") for v in losses.split(sizes)]
    train = mean_losses(model, [c.x_train for c in fed.clients], [c.y_train for c in fed.clients])
    model.train()
    return acc, loss, float(train.mean())


# ----------------------------------------------------------------------------- checkpoints

CHECKPOINT = "checkpoint.pt"


def save_checkpoint(folder: Path, config: ExperimentConfig, round_: int, params: torch.Tensor,
                    agg_state: dict, history: History, previous_params: torch.Tensor | None = None) -> None:
    blob = {"config_key": config.key(), "round": round_, "params": params, "previous_params": previous_params,
            "agg_state": agg_state, "history": history.to_state()}
    atomic_write(Path(folder) / CHECKPOINT, lambda p: torch.save(blob, p))


def load_checkpoint(folder: Path, config: ExperimentConfig) -> dict | None:
    path = Path(folder) / CHECKPOINT
    if not path.is_file():
        return None
    blob = torch.load(path, weights_only=True)  # no arbitrary unpickling
    if blob.get("config_key") != config.key():
        return None
    return blob


# ----------------------------------------------------------------------------- the loop

_FEDERATED: dict[str, FederatedData] = {}


def federated_data(config: ExperimentConfig) -> FederatedData:
    """The partitioned dataset of a config, memoised per process (a sweep of many runs on one
    partition loads and splits the data once per worker)."""
    key = json.dumps([config.dataset, dict(config.dataset_options), config.to_dict()["partition"]],
                     sort_keys=True, default=str)
    if key not in _FEDERATED:
        if len(_FEDERATED) >= 4:  # bound the memory of a long-lived worker
            _FEDERATED.pop(next(iter(_FEDERATED)))
        _FEDERATED[key] = federate(load_dataset(config.dataset, **dict(config.dataset_options)), config.partition)
    return _FEDERATED[key]


def simulate(config: ExperimentConfig, checkpoint_dir: Path | None = None, progress: bool = True,
             fed: FederatedData | None = None, stop_after: int | None = None) -> History:
    """Run ``config`` to the end (or, for tests of resuming, only up to round ``stop_after``).

    With ``checkpoint_dir`` a checkpoint is written atomically every ``checkpoint_every`` rounds
    and the run resumes from it. A NaN/Inf raises TrainingDivergedError; the last checkpoint
    stays as it was."""
    config.validate()
    algo = make_algorithm(config.algorithm, config.local, **dict(config.algorithm_options))
    attacks = [make_attack(spec) for spec in config.attacks]
    forced = tuple(sorted({a.client for a in attacks if a.every_round}))
    aggregator, local_cfg = algo.aggregator, algo.local_training(config.local)
    if fed is None:
        fed = federated_data(config)
    ds = fed.dataset
    n_clients, m = fed.num_clients, config.num_sampled
    model = build_model(config.model, ds.input_shape, ds.num_classes, seed=config.seed, **dict(config.model_options))
    w = flat_params(model)
    state = aggregator.init(w.numel(), n_clients)
    history = History(config.to_dict())
    start = 0

    w_prev = None                      # the previous global model (DQN-Fed's clients use it)
    client_cache: dict = {}            # what a client_update hook keeps between rounds (never checkpointed)
    blob = load_checkpoint(checkpoint_dir, config) if checkpoint_dir else None
    if blob is not None:
        start, w, state = blob["round"], blob["params"], blob["agg_state"]
        w_prev = blob.get("previous_params")
        history = History.from_state(blob["history"])
    else:
        set_flat_params(model, aggregator.eval_params(state, w))
        acc, loss, train = evaluate(model, fed)
        history.eval_rounds.append(0), history.test_acc.append(acc), history.test_loss.append(loss)
        history.train_loss.append(train)

    need_before = "loss_before" in aggregator.requires or config.track_improved
    end = config.rounds if stop_after is None else min(stop_after, config.rounds)
    bar = tqdm(range(start, end), initial=start, total=config.rounds, desc=config.label(),
               disable=not progress or tqdm is None, leave=False) if tqdm else range(start, end)
    for t in bar:
        t0 = time.perf_counter()
        clients = sample_clients(config.seed, t, n_clients, m, config.eligible_clients, forced)
        torch.manual_seed(_seed(config.seed, t, 0xD0))  # dropout uses the global generator
        if algo.client_update is not None:
            honest = algo.client_update(model, w, w_prev, fed.clients, clients, local_cfg, config.seed, t,
                                        config.batched, loss_before=need_before, cache=client_cache)
        else:
            honest = train_clients(model, w, fed.clients, clients, local_cfg, config.seed, t, config.batched,
                                   loss_before=need_before, loss_after="loss_after" in aggregator.requires)
        reports = honest
        for attack in attacks:  # what the server receives
            reports = attack.apply(reports)
        agg = aggregator.aggregate(reports, state, t, params=w)
        if not torch.isfinite(agg.direction).all():
            raise TrainingDivergedError(f"round {t}: {aggregator.name} produced a NaN/Inf direction; "
                                        "the last checkpoint is kept")
        lr = config.server_lr_at(t)
        w_new = w - lr * agg.direction
        improved = float("nan")
        if config.track_improved:
            set_flat_params(model, w_new)
            after = mean_losses(model, [fed.clients[k].x_train for k in clients],
                                [fed.clients[k].y_train for k in clients])
            improved = float((after <= honest.loss_before).double().mean())  # true losses, not reported ones
        w_prev, w, state = w, w_new, agg.state
        history.round_lr.append(lr)
        history.round_improved.append(improved)
        history.sampled.append([int(k) for k in clients])
        for k, v in agg.info.items():
            history.info.setdefault(k, []).append(float(v))
        done = t + 1
        if done % config.eval_every == 0 or done == config.rounds:
            set_flat_params(model, aggregator.eval_params(state, w))
            acc, loss, train = evaluate(model, fed)
            if not np.isfinite(train):
                raise TrainingDivergedError(f"round {t}: the training loss of the global model is {train}; "
                                            "the last checkpoint is kept")
            history.eval_rounds.append(done), history.test_acc.append(acc)
            history.test_loss.append(loss), history.train_loss.append(train)
            if hasattr(bar, "set_postfix") and np.isfinite(acc).any():
                bar.set_postfix(acc=f"{np.nanmean(acc):.3f}", loss=f"{train:.3f}")
        history.round_time.append(time.perf_counter() - t0)
        if checkpoint_dir and (done % config.checkpoint_every == 0 or done == end):
            save_checkpoint(checkpoint_dir, config, done, w, state, history, w_prev)
    set_flat_params(model, aggregator.eval_params(state, w))
    return history
