"""The algorithm contract: an algorithm is one frozen dataclass whose fields are its options,
validated at construction, and whose methods are the whole round.

Server side (Flower's ``Strategy``: configure → aggregate, with the step of Optax's transformations):

* ``init(params, num_clients, layout=None) -> state`` — the rule's typed state (a dataclass of
  tensors, or None), saved in checkpoints (FedFV's gradient history, AFL's λ, DQN-Fed's previous
  model); ``layout`` is the model's :class:`ParamLayout` (also ``ctx.layout`` in every round). An
  ``init(params, num_clients)`` written without it still works: :func:`init_state`, which the
  loop and the Flower strategy call, passes the layout only to an ``init`` that takes it;
* ``configure(ctx, state) -> RoundPlan`` — which clients take part and what they are asked to do
  (local training settings, losses to report, anything sent with the model). Default: the
  loop's uniform sample, the experiment's local training;
* ``aggregate(reports, state, ctx) -> Aggregate(direction, state, info, weights)`` — the rule,
  on the (possibly attacked) reports; the loop then steps w ← w − step;
* ``server_optimizer() -> Transformation`` — how the direction becomes the step, with its
  schedule (``fairfl.federated.schedules``; default: a step of 1);
* ``eval_params(state, params)`` — the global model to evaluate (AFL: the averaged iterate).

Client side (the simulated clients are a :class:`~fairfl.training.client.ClientRuntime`, handed in by the
loop, so an algorithm never imports the training engine):

* ``client_update(ctx, plan, clients) -> ClientUpdates`` — what the round's clients send.
  Default: local SGD from the global model (``clients.train``). Per-client state that must
  survive rounds and checkpoints (Ditto's personal models) lives in ``clients.states``;
* ``evaluate(ctx, state, clients) -> Evaluation`` — per-client test accuracy and loss and the
  averaged training loss; a personalised algorithm (``personal = True``, Ditto) evaluates each
  client's own model, ``ClientState.personal`` (the Flower nodes read that flag, not ClientState:
  FedHEAL, FedNL and FedNew keep client state and evaluate the global model).

Client computations beyond local SGD (a second-order method's Hessian-vector products, a few
extra passes) are written in the algorithm's module, in its ``client_update``, with what the
runtime offers on each client's whole training data: ``clients.gradients(point, ids)`` (∇fₖ),
``clients.hvp(point, ids, v)`` (∇²fₖ·vₖ, double backward; ``rows=`` restricts each client to a fixed
subsample, :func:`hessian_rows`) and, for a small model,
``clients.hessian(point, ids)`` (the dense ∇²fₖ) — DQN-Fed's BFGS pairs, FedNL's learned
Hessians and FedNew's local Newton systems are built this way, and the engine never changes.
Per-layer rules read the flat vector's :class:`ParamLayout` (``ctx.layout``: one slice per
parameter tensor).

``check(config)`` rejects, before any data is loaded, experiments the algorithm cannot run.
Randomness comes from the loop: ``ctx.rng(purpose)`` is a generator of (seed, round, purpose)
(``fairfl.base.seeding``). Register an algorithm with :func:`register`; ``ExperimentConfig(algorithm=
MyAlgorithm(...))`` or ``algorithm={"name": "my_algorithm", ...}`` then runs it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
import functools
import inspect
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
import torch

from fairfl.base import seeding
from fairfl.base.errors import ConfigError, TrainingDivergedError
from ..messages import Aggregate, ClientUpdates
from ..schedules import Transformation, constant, scale_by_schedule, step_decay
from fairfl.base.validation import did_you_mean, option, validate_options


# ----------------------------------------------------------------------------- what the loop tells a rule

def sample_clients(seed: int, round_: int, num_clients: int, m: int,
                   eligible: tuple[int, ...] | None = None, forced: tuple[int, ...] = ()) -> np.ndarray:
    """m distinct clients from a generator of (seed, round) only, sorted: the ``forced`` ones
    (attackers that take part in every round), then the rest uniformly from ``eligible``
    (default: every client)."""
    rng = seeding.sampling_rng(seed, round_)
    pool = np.arange(num_clients) if eligible is None else np.asarray(sorted(eligible))
    if not forced:
        return np.sort(rng.choice(pool, size=m, replace=False))
    rest = np.setdiff1d(pool, forced)
    picked = rng.choice(rest, size=m - len(forced), replace=False) if m > len(forced) else []
    return np.sort(np.concatenate([np.asarray(forced, dtype=np.int64), np.asarray(picked, dtype=np.int64)]))


@dataclass(frozen=True)
class ParamLayout:
    """Where each parameter tensor of the model lies in the flat parameter vector: one entry per
    tensor of ``model.parameters()``, in that order (the order of the flat vector everywhere in
    fairfl), so a weight and its bias are separate entries — FedLF's per-layer unit
    (``Module.create_Loc_reshape_list`` in its code) and FedHEAL's per-tensor norms. Buffers
    (BatchNorm statistics) are not in the flat vector. Build it with :meth:`of`; a hand-made
    ``ParamLayout(("a", "b"), ((2,), (3,)))`` is enough to test a per-layer rule."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if len(self.names) != len(self.shapes):
            raise ValueError(f"ParamLayout: {len(self.names)} names for {len(self.shapes)} shapes")
        object.__setattr__(self, "shapes", tuple(tuple(int(n) for n in s) for s in self.shapes))

    @classmethod
    def of(cls, model: torch.nn.Module) -> "ParamLayout":
        """The layout of ``model``'s flat parameter vector (``parameters()`` order)."""
        named = list(model.named_parameters())
        return cls(tuple(n for n, _ in named), tuple(tuple(p.shape) for _, p in named))

    @classmethod
    def single(cls, d: int) -> "ParamLayout":
        """One tensor of d entries: the layout to assume when none is known."""
        return cls(("params",), ((int(d),),))

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(int(np.prod(s, dtype=np.int64)) for s in self.shapes)

    @property
    def size(self) -> int:
        """d, the length of the flat vector."""
        return sum(self.sizes)

    @property
    def slices(self) -> tuple[slice, ...]:
        """One slice of the flat vector per tensor."""
        ends = np.cumsum((0,) + self.sizes)
        return tuple(slice(int(a), int(b)) for a, b in zip(ends[:-1], ends[1:]))

    def __len__(self) -> int:
        return len(self.names)

    def groups(self, by: str = "tensor") -> tuple[slice, ...]:
        """Slices of the flat vector: one per tensor (``"tensor"``), or one per module
        (``"module"``: neighbouring tensors whose names share the prefix before the last '.',
        e.g. a layer's weight and bias)."""
        if by == "tensor":
            return self.slices
        if by != "module":
            raise ValueError(f"groups by 'tensor' or 'module', not {by!r}")
        out: list[slice] = []
        owner = None
        for name, sl in zip(self.names, self.slices):
            prefix = name.rpartition(".")[0]
            if out and prefix == owner:
                out[-1] = slice(out[-1].start, sl.stop)
            else:
                out.append(sl)
            owner = prefix
        return tuple(out)

    def split(self, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The tensors of a flat vector (views, in their shapes); a leading batch axis is kept."""
        if flat.shape[-1] != self.size:
            raise ValueError(f"a flat vector of {flat.shape[-1]} entries does not fit a layout of {self.size}")
        lead = flat.shape[:-1]
        return tuple(flat[..., sl].reshape(*lead, *shape) for sl, shape in zip(self.slices, self.shapes))


@dataclass(frozen=True)
class Context:
    """What the loop tells an algorithm about the round: its index among ``rounds``, the run's
    seed, the global model x_t (flat), the experiment's local training, and the federation
    (how many clients, how many per round, who may be sampled, who always takes part).
    A hand-made ``Context(round=3)`` is enough to test a server rule."""

    round: int = 0
    rounds: int = 1
    seed: int = 0
    params: torch.Tensor | None = None
    local: Any = None                       # fairfl.training.client.LocalTraining of the experiment
    num_clients: int = 1
    num_sampled: int = 1
    eligible: tuple[int, ...] | None = None
    forced: tuple[int, ...] = ()
    layout: ParamLayout | None = None        # the flat vector's tensors (None in a hand-made Context)

    def rng(self, purpose: int, *ids: int) -> np.random.Generator:
        """A generator of (seed, round, purpose[, ids]); see ``fairfl.base.seeding``."""
        return seeding.rng(self.seed, self.round, purpose, *ids)

    def fixed_rows(self, purpose: int, client: int, n: int, size: int | None) -> torch.Tensor | None:
        """``size`` of a client's ``n`` training rows, sorted, drawn once per run from (seed, purpose,
        client) and the same in every round (None when ``size`` is None or ≥ n): the fixed
        subsample of a subsampled Hessian (Byrd, Chin, Neveitt & Nocedal 2011)."""
        if size is None or size >= n:
            return None
        chosen = seeding.rng(self.seed, 0, purpose, client).choice(n, size=size, replace=False)
        return torch.as_tensor(np.sort(chosen), dtype=torch.long)

    def sample(self) -> np.ndarray:
        """The round's clients, uniformly (the loop's default sampling)."""
        return sample_clients(self.seed, self.round, self.num_clients, self.num_sampled, self.eligible, self.forced)


# the dtypes a second-order method may take its Hessian-vector products in (its ``products`` option)
PRODUCT_DTYPES = {"float32": torch.float32, "float64": torch.float64}


# The precision of what a second-order method's systems are built from: the model's float32 parameters,
# data and gradients. An eigen-direction whose singular value is below this fraction of the largest is
# decided by rounding, not by the data (the right-hand side's own rounding, ε₃₂‖b‖, divided by it, would
# already exceed the whole well-determined step ‖b‖/σ_max), so a solve treats it as null.
NEWTON_RCOND = float(torch.finfo(torch.float32).eps)


def newton_solve(A: torch.Tensor, b: torch.Tensor, stats: dict | None = None) -> torch.Tensor:
    """A⁻¹b for a second-order method's system (FedNL's H + lI, FedNew's Hᵢ + cI), or, where A is
    singular or near-singular, the minimum-norm least-squares solution A⁺b with the directions of
    singular value at most :data:`NEWTON_RCOND` × the largest left out.

    Why: a softmax model without a regulariser has a singular Hessian (shifting every class's logits
    alike changes nothing) and a gradient orthogonal to that null space, so A⁺b is the Newton step in
    the directions the loss depends on, where a plain solve either fails (LinAlgError on a zero pivot)
    or, one rounding away from it, returns a step of norm 10¹³ (FedNL's Option 2 at round 0, where
    l = 0; seen on Adult). FedNew's code takes pinv (``newton_ADMM.m:77``). The cut-off is float32's
    precision, not float64's n·ε: the systems come from float32 models, and a direction 10⁻¹³ of
    the largest (FedNew on Adult with ρ = 0, α = 10⁻¹²) took the training loss from 0.69 to 5.8·10⁴ in
    one step, where leaving it out descends (0.69 → 0.51 in four rounds). So the step is bounded,
    ‖x‖ ≤ ‖b‖ / (NEWTON_RCOND·σ_max). A well-conditioned A is solved exactly as before, bit for bit.

    A system holding NaN or Inf is refused with :class:`~fairfl.base.errors.TrainingDivergedError` (the run
    stops as diverged, its last checkpoint kept), never solved into a NaN or an all-zero step.
    ``stats``: where given, ``stats["dropped"]`` is raised by the number of directions left out.
    ``A`` (n, n) with ``b`` (n,), or a diagonal as an (n,) vector."""
    if not (bool(torch.isfinite(A).all()) and bool(torch.isfinite(b).all())):
        where = "its matrix" if not bool(torch.isfinite(A).all()) else "its right-hand side"
        raise TrainingDivergedError(f"a Newton system holds NaN or Inf in {where} ({A.shape[-1]} unknowns): the "
                                    "Hessian or gradient it was built from is not finite. The last checkpoint is kept.")
    if A.ndim == 1:                                        # a diagonal: its pseudo-inverse entry by entry
        tol = A.abs().max() * max(A.numel() * torch.finfo(A.dtype).eps, NEWTON_RCOND)
        kept = A.abs() > tol
        if stats is not None:
            stats["dropped"] = stats.get("dropped", 0) + int((~kept).sum())
        return torch.where(kept, b / torch.where(kept, A, torch.ones_like(A)), torch.zeros_like(b))
    s = torch.linalg.svdvals(A)
    tol = s.max() * max(A.shape[-1] * torch.finfo(A.dtype).eps, NEWTON_RCOND)
    if bool(s.min() > tol):
        x, info = torch.linalg.solve_ex(A, b)
        if int(info) == 0 and bool(torch.isfinite(x).all()):
            return x
    if stats is not None:
        stats["dropped"] = stats.get("dropped", 0) + int((s <= tol).sum())
    return torch.linalg.pinv(A, atol=float(tol), rtol=0.0) @ b


def hessian_rows(clients, ids: Sequence[int], ctx: Context, purpose: int,
                 size: int | None) -> list[torch.Tensor | None] | None:
    """The fixed Hessian subsample of each client in ``ids`` (:meth:`Context.fixed_rows`), for
    ``clients.hvp(..., rows=...)``; None (all rows) when ``size`` is None."""
    if size is None:
        return None
    return [ctx.fixed_rows(purpose, int(k), int(n), size) for k, n in zip(ids, clients.num_samples(ids))]


@dataclass(frozen=True)
class RoundPlan:
    """What the server asks of a round: who takes part, their local training, which losses they
    report, and whatever is sent besides the global model (``extras``)."""

    clients: np.ndarray
    local: Any                              # fairfl.training.client.LocalTraining
    loss_before: bool = False
    loss_after: bool = False
    extras: Mapping[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------- the contract

@dataclass(frozen=True)
class Algorithm:
    """Base class of every algorithm (see the module docstring). Subclasses are frozen
    dataclasses: set ``name``, declare options with :func:`option`, implement :meth:`aggregate`."""

    name: ClassVar[str] = ""
    requires: ClassVar[frozenset[str]] = frozenset()     # "loss_before" / "loss_after": what the rule reads
    multi_objective: ClassVar[bool] = False               # clients send one update per objective (FMOL)
    State: ClassVar[type | None] = None                   # dataclass of the server state (None: stateless)
    ClientState: ClassVar[type | None] = None             # dataclass of one client's state (None: none kept)
    personal: ClassVar[bool] = False                      # evaluated at each client's ClientState.personal

    def __post_init__(self) -> None:
        validate_options(self, self.name or type(self).__name__)

    # -- server side
    def init(self, params: torch.Tensor, num_clients: int, layout: ParamLayout | None = None) -> Any:
        return None

    def configure(self, ctx: Context, state: Any) -> RoundPlan:
        return RoundPlan(ctx.sample(), ctx.local, loss_before="loss_before" in self.requires,
                         loss_after="loss_after" in self.requires)

    def aggregate(self, reports: ClientUpdates, state: Any, ctx: Context) -> Aggregate:
        raise NotImplementedError(f"{type(self).__name__} must implement aggregate()")

    def server_optimizer(self) -> Transformation:
        return scale_by_schedule(constant(1.0))

    def eval_params(self, state: Any, params: torch.Tensor) -> torch.Tensor:
        return params

    # -- client side
    def client_update(self, ctx: Context, plan: RoundPlan, clients: "ClientRuntime") -> ClientUpdates:
        return clients.train(plan.clients, ctx.params, plan.local, loss_before=plan.loss_before,
                             loss_after=plan.loss_after)

    def evaluate(self, ctx: Context, state: Any, clients: "ClientRuntime") -> "Evaluation":
        return clients.evaluate(self.eval_params(state, ctx.params))

    # -- the experiment as a whole
    def check(self, config: Any) -> None:
        """Reject an experiment this algorithm cannot run (called before any data is loaded)."""

    # -- (de)serialisation
    def options(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.init}

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.options()}

    def revision(self) -> int:
        """How many fixes since CACHE_VERSION 7 changed what *these* options compute (0: none; the
        default). A config's key holds it where it is not 0 (``ExperimentConfig.key``): a fix then
        reaches the keys of the configs it changes and no others, where a CACHE_VERSION bump would drop
        every cached result. Not an option: the canonical form (``to_dict``) is unchanged."""
        return 0

    def label(self) -> str:
        """``name(option=value, …)`` with the options that differ from their defaults."""
        changed = [f"{f.name}={getattr(self, f.name):g}" if isinstance(getattr(self, f.name), float)
                   else f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                   if f.init and getattr(self, f.name) != f.default]
        return f"{self.name}({', '.join(changed)})" if changed else self.name


def init_state(algorithm: Algorithm, params: torch.Tensor, num_clients: int, layout: ParamLayout | None) -> Any:
    """``algorithm.init(params, num_clients, layout=layout)`` — or, for an ``init`` written before
    the layout was part of the contract (``init(self, params, num_clients)``), without it."""
    if layout is not None and _init_takes_layout(type(algorithm).init):
        return algorithm.init(params, num_clients, layout=layout)
    return algorithm.init(params, num_clients)


@functools.lru_cache(maxsize=None)
def _init_takes_layout(init: Any) -> bool:
    parameters = inspect.signature(init).parameters.values()
    return any(p.name == "layout" or p.kind is p.VAR_KEYWORD for p in parameters)


def with_proximal_term(plan: RoundPlan, mu: float) -> RoundPlan:
    """The plan with FedProx's (μ/2)‖w − wₜ‖² added to every client's local loss."""
    return dataclasses.replace(plan, local=dataclasses.replace(plan.local, prox_mu=mu))


class ServerStep:
    """Mixin for rules whose paper has a server learning rate: ``server_lr`` and ``decay`` give
    FedMGDA+ §6.1.5's schedule ηₜ = η·β^⌊t/100⌋, β = decay^(100/T) (``decay = 1``: constant η).

    The two options are declared here, once (:meth:`fields`). A class that lists ``ServerStep``
    among its own bases gets them appended after the options it declares itself — where each
    algorithm used to write them by hand — so the field order, and with it positional
    construction (``FedAvg("uniform")``), labels, ``to_dict()`` and cache keys, is the same as
    if they were written there. A plain dataclass mixin would put them *first* (dataclasses
    collect base-class fields first) and change all of these. Subclasses of such a class inherit
    the fields as usual; a class may still declare either field itself (its own bounds or doc)."""

    @staticmethod
    def fields() -> dict[str, Any]:
        """Fresh ``option`` fields (a dataclass Field cannot be shared between classes)."""
        return {"server_lr": option(1.0, low=0.0, low_open=True, doc="η: the server step size"),
                "decay": option(1.0, low=0.0, high=1.0, low_open=True,
                                doc="FedMGDA+ §6.1.5: η decays by this factor over the run (1: constant)")}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if ServerStep not in cls.__bases__:
            return
        # runs when the class body is done and before @dataclass reads it: the class's own
        # annotations (never the inherited dict) get the two options at their end
        own = cls.__dict__.get("__annotations__")
        if own is None:
            own = {}
            cls.__annotations__ = own
        for name, f in ServerStep.fields().items():
            if name not in own:
                own[name] = "float"
                setattr(cls, name, f)

    def server_optimizer(self) -> Transformation:
        return scale_by_schedule(step_decay(self.server_lr, self.decay))


def _plain(x: Any) -> Any:
    if isinstance(x, (tuple, list)):
        return [_plain(v) for v in x]
    return x


# ----------------------------------------------------------------------------- the registry

ALGORITHMS: dict[str, type[Algorithm]] = {}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: make ``cls`` findable by its ``name`` (``make_algorithm``, configs, the
    CLI). Registering a different class under a taken name is an error."""
    if not cls.name:
        raise TypeError(f"{cls.__name__} has no name")
    known = ALGORITHMS.get(cls.name)
    if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"an algorithm named {cls.name!r} is already registered ({known.__module__}.{known.__qualname__})")
    ALGORITHMS[cls.name] = cls
    return cls


def make_algorithm(spec: Any) -> Algorithm:
    """An algorithm from an instance (returned as is), a name (default options), or a mapping
    ``{"name": ..., option: value, ...}`` (a config file's form). Unknown names and options
    raise a ConfigError naming them and what is known."""
    if isinstance(spec, Algorithm):
        return spec
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise ConfigError(f"algorithm must be an Algorithm, a name or a mapping with a 'name', got {spec!r}")
    options = dict(spec)
    name = options.pop("name")
    cls = ALGORITHMS.get(name)
    if cls is None:
        raise ConfigError(f"unknown algorithm {name!r}{did_you_mean([name], sorted(ALGORITHMS))}; known: "
                          f"{', '.join(sorted(ALGORITHMS))} (an algorithm of "
                          "your own is known once its module is imported: `python -m fairfl run --import MODULE`)")
    allowed = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(f"{name}: unknown option(s) {', '.join(unknown)}{did_you_mean(unknown, allowed)}; "
                          f"its options are: {', '.join(allowed) or 'none'}")
    options = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
               for k, v in options.items()}
    return cls(**options)


# ----------------------------------------------------------------------------- typed state <-> checkpoint

def state_to_plain(state: Any) -> Any:
    """A typed state (dataclasses of tensors and numbers, lists, dicts) as plain containers that
    ``torch.load(weights_only=True)`` accepts."""
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return {f.name: state_to_plain(getattr(state, f.name)) for f in dataclasses.fields(state)}
    if isinstance(state, (list, tuple)):
        return [state_to_plain(v) for v in state]
    if isinstance(state, dict):
        return {k: state_to_plain(v) for k, v in state.items()}
    return state


def state_from_plain(cls: Any, plain: Any) -> Any:
    """The inverse of :func:`state_to_plain` for a state of dataclass ``cls`` (None: as is)."""
    if plain is None or cls is None:
        return plain
    return cls(**plain)
