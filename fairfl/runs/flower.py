"""fairfl's algorithms in a real federation with Flower (``flwr``'s Message API).

:class:`FairflStrategy` is a ``flwr.serverapp.strategy.Strategy`` whose round is the algorithm's
own: ``configure`` picks the clients (the loop's sampling of (seed, round), ``fairfl.base.seeding``)
and what they are asked to do, the algorithm's ``aggregate`` is the rule and its
``server_optimizer`` the step. :func:`client_app` is a ``flwr.clientapp.ClientApp`` whose
``train`` runs the algorithm's own ``client_update`` for the node's client, so a message carries
what the rule reads (DQN-Fed's d̃ₖ, the losses of FedFV, q-FedAvg, AFL and TERM, FMOL's
per-objective updates). No mathematics is copied here: only the wire format.

One node is one fairfl client: its id is the node's ``partition-id`` (Flower's simulation sets it;
a deployed SuperNode sets it with ``--node-config "partition-id=K"``). The strategy asks every
node for its id once (a ``query`` message) and then sends client k's work to k's node. A node
loads the experiment's federated data with fairfl's loader and trains only on its own client's
part, with that client's batch stream of (seed, round, client); so a Flower run of a config
computes the same rounds as ``fairfl.runs.loop.simulate`` on it (tested, to float tolerance: the loop
fuses a round's clients into one computation, a node trains its client alone). Evaluation runs on
the nodes, one row per client, and the strategy summarises the rows with the algorithm's own
``evaluate`` (FMOL: each objective's mean over its holders), as the loop does.

The wire format (models, plans and reports as Flower records) is ``fairfl.runs.flower_wire``'s.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from fairfl.federated.algorithms.base import Context, ParamLayout, RoundPlan, init_state
from fairfl.federated.attacks import make_attack
from fairfl.training.client import (ClientRuntime, Evaluation, evaluate_model, flat_params, merge_evaluations,
                                    set_flat_params)
from .config import ExperimentConfig
from fairfl.training.engine import resolve_device
from fairfl.base.errors import ConfigError, RunFailedError
from .history import History
from .server import record_round, server_half
from .loop import federated_data, run_threads
from .flower_wire import (RUN_KEY, decode_reports, encode_report, from_arrays, plan_config, plan_from,  # noqa: F401
                          tensor_record, tensors_of, to_arrays)
from fairfl.federated.models import build_model

try:
    from flwr.app import ArrayRecord, ConfigRecord, Context as FlowerContext, Message, MessageType, \
        MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import Strategy
except ImportError as e:  # pragma: no cover - flwr is in requirements.txt
    raise ImportError("fairfl.runs.flower needs Flower: pip install 'flwr[simulation]' (pinned in requirements.txt)") from e

CLIENT_STATE = "fairfl-client-state"


# ----------------------------------------------------------------------------- server

class FairflStrategy(Strategy):
    """A fairfl algorithm as a Flower strategy: the experiment ``config`` names the algorithm,
    the model, the federation and the sampling. Run it with ``strategy.start(grid,
    strategy.initial_arrays(), num_rounds=config.rounds)`` from a ServerApp (:func:`server_app`).
    After the run, ``params`` is the global model and ``history`` fairfl's History of it
    (evaluations from the nodes' own data; round 0 is not evaluated). ``timeout``: seconds to
    wait for the nodes to connect and for each round's replies (a run whose nodes never come, e.g.
    when the simulation's Ray failed to start, ends with an error instead of waiting forever)."""

    def __init__(self, config: ExperimentConfig, timeout: float = 600.0):
        self.config, self.algorithm, self.timeout = config, config.algorithm, timeout
        self.model = _template(config)        # the server keeps the model on the CPU, as the loop does
        num_clients = config.partition.federation_size
        attacks = [make_attack(spec) for spec in config.attacks]   # the loop's: attackers in every round
        forced = tuple(sorted({a.client for a in attacks if a.every_round}))
        self.base = Context(rounds=config.rounds, seed=config.seed, local=config.local, num_clients=num_clients,
                            num_sampled=config.num_sampled, eligible=config.eligible_clients, forced=forced,
                            layout=ParamLayout.of(self.model))
        self.params = flat_params(self.model)
        self.state = init_state(self.algorithm, self.params, num_clients, self.base.layout)
        self.optimizer = self.algorithm.server_optimizer()
        self.optimizer_state = self.optimizer.init(self.params)
        self.history = History(config.to_dict())
        self.nodes: dict[int, int] = {}        # fairfl client id -> Flower node id
        self._round: tuple[Context, RoundPlan] | None = None
        self._shown: torch.Tensor | None = None      # the model the nodes last evaluated
        self._t0 = 0.0

    @property
    def run_key(self) -> str:
        return self.config.key()

    def initial_arrays(self) -> ArrayRecord:
        return to_arrays(self.model, self.params)

    def summary(self) -> None:
        from flwr.supercore import log
        from logging import INFO
        log(INFO, "\t└──> fairfl %s, %d clients, %d per round", self.config.label(), self.base.num_clients,
            self.base.num_sampled)

    # -- which node is which client
    def discover(self, grid: Grid) -> dict[int, int]:
        """Ask every node for its fairfl client id (its ``partition-id``), once."""
        if self.nodes:
            return self.nodes
        deadline = time.monotonic() + self.timeout
        ids = list(grid.get_node_ids())
        while len(ids) < self.base.num_clients and time.monotonic() < deadline:
            if getattr(grid, "_stop", None) is not None and grid._stop.is_set():
                raise RunFailedError("the Flower simulation stopped")
            time.sleep(0.2)
            ids = list(grid.get_node_ids())
        asks = [Message(RecordDict({"config": ConfigRecord({RUN_KEY: self.run_key})}), dst_node_id=n,
                        message_type=MessageType.QUERY) for n in ids]
        nodes: dict[int, int] = {}
        for reply in grid.send_and_receive(asks, timeout=self.timeout):
            if reply.has_error():
                raise RunFailedError(f"node {reply.metadata.src_node_id} did not say its client id: {reply.error.reason}")
            k = int(reply.content["metrics"]["client-id"])
            if k in nodes:
                raise ConfigError(f"two nodes ({nodes[k]}, {reply.metadata.src_node_id}) say they are client {k}")
            nodes[k] = reply.metadata.src_node_id
        missing = sorted(set(range(self.base.num_clients)) - set(nodes))
        if missing:
            raise ConfigError(f"the federation has no node for client(s) {missing} of {self.base.num_clients}; "
                              "start one SuperNode per client with node-config partition-id")
        self.nodes = nodes
        return nodes

    # -- training round
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self.discover(grid)
        self._t0 = time.perf_counter()
        w = from_arrays(self.model, arrays)
        ctx = replace(self.base, round=server_round - 1, params=w)
        plan = self.algorithm.configure(ctx, self.state)
        self._round = (ctx, plan)
        orders, tensors = plan_config(ctx, plan, self.run_key)
        content = RecordDict({"arrays": arrays, "config": orders, "plan": tensors})
        return [Message(content, dst_node_id=self.nodes[int(k)], message_type=MessageType.TRAIN)
                for k in plan.clients]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord, MetricRecord]:
        ctx, plan = self._round
        replies = list(replies)
        failed = [f"node {r.metadata.src_node_id}: {r.error.reason}" for r in replies if r.has_error()]
        if failed:   # the rule is defined on the round's clients: a missing one is a different algorithm
            raise RunFailedError(f"round {ctx.round}: " + "; ".join(failed))
        reports = decode_reports([r.content for r in replies], plan.clients)
        step = server_half(self.algorithm, self.optimizer, reports, self.state, self.optimizer_state, ctx,
                            self.config.rounds)
        self.params, self.state, self.optimizer_state = step.params, step.state, step.optimizer
        # the share of improved participants needs the clients' losses at the new model: not measured here
        scalars = record_round(self.history, step, plan.clients, seconds=time.perf_counter() - self._t0)
        return to_arrays(self.model, self.params), MetricRecord(scalars)

    # -- evaluation on the nodes' own data
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        if server_round % self.config.eval_every and server_round != self.config.rounds:
            return []
        self._shown = self.algorithm.eval_params(self.state, self.params)
        shown = to_arrays(self.model, self._shown)
        _, plan = self._round
        _, tensors = plan_config(replace(self.base, round=server_round - 1), plan, self.run_key)
        content = RecordDict({"arrays": shown, "plan": tensors,
                              "config": ConfigRecord({RUN_KEY: self.run_key, "fairfl-round": server_round})})
        return [Message(content, dst_node_id=self.nodes[k], message_type=MessageType.EVALUATE)
                for k in sorted(self.nodes)]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        replies = list(replies)
        if not replies:
            return None
        failed = [f"node {r.metadata.src_node_id}: {r.error.reason}" for r in replies if r.has_error()]
        if failed:
            raise RunFailedError(f"evaluation after round {server_round}: " + "; ".join(failed))
        by_client = {int(r.content["metrics"]["client-id"]): r.content["metrics"] for r in replies}
        if sorted(by_client) != sorted(self.nodes):
            raise RunFailedError(f"evaluation after round {server_round}: client(s) "
                                 f"{sorted(set(self.nodes) - set(by_client))} did not report")
        rows = [Evaluation([m["test-acc"]], [m["test-loss"]], m["train-loss"], [m["train-loss"]])
                for m in (by_client[k] for k in sorted(by_client))]
        # the algorithm's own evaluate summarises the nodes' rows as the loop's does (FMOL: each
        # objective's training loss averaged over the clients that hold it, eq. (2))
        ctx, _ = self._round
        ev = self.algorithm.evaluate(replace(ctx, params=self.params), self.state, _Evaluated(rows, self._shown))
        self.history.record(server_round, ev)
        acc = np.asarray(ev.test_acc, dtype=np.float64)
        return MetricRecord({"mean-test-acc": float(np.nanmean(acc)), "train-loss": float(np.mean(ev.train_loss))})


class _Evaluated:
    """The nodes' evaluations in the place of the ``clients`` an algorithm's ``evaluate`` reads
    (``ClientRuntime``'s evaluation methods), so that the strategy's History is what the loop's
    would be. Each node has already evaluated what the strategy sent it: the model ``shown``
    (``eval_params``), or, for a personalised algorithm, its client's own model, which only the
    node holds (``states`` is empty here: the server never sees a client's state)."""

    def __init__(self, rows: list[Evaluation], shown: torch.Tensor):
        self.rows, self.shown, self.states = rows, shown, {}

    @property
    def num_clients(self) -> int:
        return len(self.rows)

    @property
    def num_objectives(self) -> int:
        """S, as the nodes evaluated it: a list of values per client for a multi-task model."""
        first = self.rows[0].test_acc[0] if self.rows else None
        return len(first) if isinstance(first, (list, tuple)) else 1

    def evaluate(self, params: torch.Tensor) -> Evaluation:
        if not torch.equal(params.to(self.shown.dtype), self.shown):
            raise ConfigError("the algorithm evaluates a model other than its eval_params(state, params), "
                              "which is what the nodes were sent: make eval_params return it")
        return merge_evaluations(self.rows)

    def train_from(self, ids: Sequence[int], starts: torch.Tensor, local: Any, prox_centre: Any = None,
                   purpose: int = 0) -> torch.Tensor:
        """The models an algorithm makes at evaluation (Ditto's for a client never sampled) were made on
        the nodes, which evaluated them: here the starts stand in for them (``evaluate_each`` returns
        the nodes' rows)."""
        return starts

    def evaluate_each(self, params: Sequence[torch.Tensor]) -> Evaluation:
        if len(params) != len(self.rows):
            raise ConfigError(f"evaluate_each got {len(params)} models for {len(self.rows)} clients")
        return merge_evaluations(self.rows)


class _StoppableGrid:
    """A Grid whose waits for replies also end when ``stop`` is set: when the Simulation Runtime
    crashes (Ray failed to start) Flower's call returns with an error but leaves the ServerApp's
    thread waiting, which would keep the process alive until the timeout."""

    def __init__(self, grid: Grid, stop: threading.Event):
        self._grid, self._stop = grid, stop

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        waiting = set(self._grid.push_messages(messages))        # Grid.send_and_receive's loop, stoppable
        end = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while waiting and (end is None or time.monotonic() < end):
            if self._stop.is_set():
                raise RunFailedError("the Flower simulation stopped")
            got = list(self._grid.pull_messages(waiting))
            replies.extend(got)
            waiting -= {m.metadata.reply_to_message_id for m in got}
            if waiting:
                time.sleep(0.05)
        return replies


def server_app(*strategies: FairflStrategy, stop: threading.Event | None = None) -> ServerApp:
    """A ServerApp that runs each strategy's experiment to its end, one after the other, on the
    same federation (its nodes must serve every experiment: :func:`client_app` of the same configs).
    Setting ``stop`` ends the run at its next wait for replies."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: FlowerContext) -> None:
        if stop is not None:
            grid = _StoppableGrid(grid, stop)
        for strategy in strategies:
            strategy.start(grid, strategy.initial_arrays(), num_rounds=strategy.config.rounds,
                           timeout=strategy.timeout)

    return app


# ----------------------------------------------------------------------------- client

def _template(config: ExperimentConfig) -> torch.nn.Module:
    """The experiment's model at its initial parameters (the loop's build, same seed), on the CPU."""
    from fairfl.federated.data import load_dataset
    ds = load_dataset(config.dataset, **dict(config.dataset_options))
    return build_model(config.model, ds.input_shape, ds.num_classes, seed=config.seed, tasks=ds.num_tasks,
                       **dict(config.model_options))


def client_id(context: FlowerContext) -> int:
    """The node's fairfl client: its ``partition-id``."""
    if "partition-id" not in context.node_config:
        raise ConfigError("this SuperNode has no partition-id in its node config: start it with "
                          "--node-config \"partition-id=K\" (K: its fairfl client id)")
    return int(context.node_config["partition-id"])


@dataclass
class _Node:
    config: ExperimentConfig
    model: torch.nn.Module
    fed: Any


_NODES: dict[str, _Node] = {}


def _node(configs: dict[str, ExperimentConfig], content: RecordDict) -> _Node:
    key = str(content["config"][RUN_KEY])
    if key not in configs:
        raise ConfigError(f"this ClientApp does not serve experiment {key}; it serves {sorted(configs)}")
    if key not in _NODES:      # per process: Flower's simulation reuses its workers across nodes and rounds
        config = configs[key]
        fed = federated_data(config, config.device)
        _NODES[key] = _Node(config, _template(config).to(fed.clients[0].x_train.device), fed)
    return _NODES[key]


def _load_state(algorithm, context: FlowerContext, key: str) -> dict[int, Any]:
    record = context.state.get(f"{CLIENT_STATE}.{key}")
    if algorithm.ClientState is None or record is None:
        return {}
    return {client_id(context): algorithm.ClientState(**tensors_of(record))}


def _save_state(states: dict[int, Any], context: FlowerContext, key: str, k: int) -> None:
    if k in states:
        context.state[f"{CLIENT_STATE}.{key}"] = tensor_record(dataclasses.asdict(states[k]))


def client_app(*configs: ExperimentConfig) -> ClientApp:
    """A ClientApp serving the experiments ``configs``: ``train`` runs the algorithm's
    ``client_update`` for the node's client (and the config's attacks on it, as a malicious node
    would), ``evaluate`` evaluates the model it is sent (a personalised algorithm: the node's own
    model) on the node's data."""
    by_key = {c.key(): c for c in configs}
    app = ClientApp()

    @app.query()
    def who(msg: Message, context: FlowerContext) -> Message:
        return Message(RecordDict({"metrics": MetricRecord({"client-id": client_id(context)})}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: FlowerContext) -> Message:
        node, k = _node(by_key, msg.content), client_id(context)
        key, config = str(msg.content["config"][RUN_KEY]), node.config
        algorithm = config.algorithm
        round_, plan = plan_from(msg.content, k)
        with run_threads():
            w = from_arrays(node.model, msg.content["arrays"])
            ctx = Context(round=round_, rounds=config.rounds, seed=config.seed, params=w, local=config.local,
                          num_clients=node.fed.num_clients, num_sampled=config.num_sampled,
                          eligible=config.eligible_clients, layout=ParamLayout.of(node.model))
            clients = ClientRuntime(node.model, node.fed.clients, config.seed, config.batched)
            clients.round = round_
            clients.states = _load_state(algorithm, context, key)
            reports = algorithm.client_update(ctx, plan, clients)
            for spec in config.attacks:   # a malicious node changes what it sends (attacks touch their own row only)
                reports = make_attack(spec).apply(reports)
            _save_state(clients.states, context, key, k)
        return Message(encode_report(reports), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: FlowerContext) -> Message:
        node, k = _node(by_key, msg.content), client_id(context)
        key = str(msg.content["config"][RUN_KEY])
        with run_threads():
            w = from_arrays(node.model, msg.content["arrays"])
            own = _load_state(node.config.algorithm, context, key).get(k)
            if node.config.algorithm.personal and own is not None:
                w = own.personal          # a personalised algorithm (Ditto) evaluates the client's own model
            elif node.config.algorithm.personal:
                # before the client's first round it has none: Ditto trains one for FedAvg-FT's budget from the
                # global model (or, λ = 0, from the w⁰ the rule sends with its plan), on the loop's round and stream
                initial = tensors_of(msg.content.get("plan")).get("initial", w)
                clients = ClientRuntime(node.model, node.fed.clients, node.config.seed, node.config.batched)
                clients.round = int(msg.content["config"]["fairfl-round"]) - 1
                w = node.config.algorithm.untrained(clients, [k], w, initial, node.config.local)[0]
            set_flat_params(node.model, w.to(next(node.model.parameters()).device))
            ev = evaluate_model(node.model, [node.fed.clients[k]])
        metrics = {"client-id": k, "test-acc": _metric(ev.test_acc[0]), "test-loss": _metric(ev.test_loss[0]),
                   "train-loss": _metric(ev.client_train_loss[0]), "num-examples": len(node.fed.clients[k].y_test)}
        return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)

    return app


def _metric(v: Any) -> float | list[float]:
    """A MetricRecord value: a float, or a list of floats (one per objective)."""
    return [float(x) for x in v] if isinstance(v, (list, tuple)) else float(v)


# ----------------------------------------------------------------------------- Flower's and Ray's output

def _coloured(stream: Any) -> bool:
    """Whether log lines may carry ANSI colours: on a terminal only, and not when ``NO_COLOR`` is
    set (https://no-color.org). A notebook, a pipe or a log file gets plain text, not escape codes."""
    if os.environ.get("NO_COLOR"):
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):      # no stream, or a closed one
        return False


class _Routine(logging.Filter):
    """Drops two of Flower's log records that are no news to a fairfl user: that
    ``flwr.simulation.run_simulation`` is deprecated (fairfl calls it on purpose: see
    :func:`run_simulation`), and "Manually terminating ClientAppActor", which each node's Ray actor
    logs when a simulation ends normally. Every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "Manually terminating %s":
            return False
        return not (isinstance(record.msg, str) and record.msg.startswith("DEPRECATED FEATURE")
                    and "`run_simulation` function is deprecated" in record.getMessage())


def _node_logging() -> None:
    """Ray's ``worker_process_setup_hook`` for the simulation's workers (run as each starts):
    Flower's console handler there writes to the worker's log file, which Ray forwards to this
    process's output, so it gets plain text and leaves out the routine records (:class:`_Routine`)."""
    from flwr.common.logger import FLOWER_LOGGER, update_console_handler
    update_console_handler(colored=_coloured(sys.stderr))
    if not any(isinstance(f, _Routine) for f in FLOWER_LOGGER.filters):
        FLOWER_LOGGER.addFilter(_Routine())


@contextmanager
def _plain_output(verbose: bool):
    """Flower's and Ray's output in this process during one simulation, restored afterwards:
    Flower's console handler (its own switch, ``colored``) and Ray's prefix of forwarded worker
    lines (``RAY_COLOR_PREFIX=0``, unless set) colour only a terminal; Flower's routine records
    are dropped (:class:`_Routine`); ``verbose`` shows Flower's DEBUG records with timestamps
    (Flower's ``verbose_logging`` would switch colours back on)."""
    from flwr.common.logger import FLOWER_LOGGER, ConsoleHandler
    handlers = [h for h in FLOWER_LOGGER.handlers if isinstance(h, ConsoleHandler)]
    saved = [(h, h.colored, h.level, h.timestamps) for h in handlers]
    prefix = os.environ.get("RAY_COLOR_PREFIX")
    routine = _Routine()
    FLOWER_LOGGER.addFilter(routine)
    try:
        for h in handlers:
            h.colored = _coloured(h.stream)
            if verbose:
                h.setLevel(logging.DEBUG)
                h.timestamps = True
        if prefix is None and not _coloured(sys.stdout):
            os.environ["RAY_COLOR_PREFIX"] = "0"      # read by Ray's driver as it prints each forwarded line
        yield
    finally:
        FLOWER_LOGGER.removeFilter(routine)
        for h, colored, level, timestamps in saved:
            h.colored, h.timestamps = colored, timestamps
            h.setLevel(level)
        if prefix is None:
            os.environ.pop("RAY_COLOR_PREFIX", None)


def _start_ray(num_cpus: int | None) -> None:
    """Start the simulation's local Ray instance here rather than in Flower's runtime thread (Flower
    uses a Ray already started): with fairfl's retry of a node that starts too slowly
    (``RayBackend.start``: one clear error instead of Flower's tracebacks), and the
    ``worker_process_setup_hook`` that makes the nodes' own log lines plain (:func:`_node_logging`).
    The rest is what Flower's own start passes: no dashboard, Ray's log level WARNING, the workers'
    output forwarded here, this process's ``sys.path`` as the workers' PYTHONPATH."""
    import ray
    from fairfl.training.backends import RayBackend
    if ray.is_initialized():
        return
    pythonpath = os.pathsep.join([*sys.path, *filter(None, [os.environ.get("PYTHONPATH")])])
    options: dict[str, Any] = {
        "include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": True,
        "runtime_env": {"env_vars": {"PYTHONPATH": pythonpath},
                        "worker_process_setup_hook": f"{__name__}._node_logging"}}
    if num_cpus is not None:
        options["num_cpus"] = num_cpus
    RayBackend.start(None, **options)


# ----------------------------------------------------------------------------- one call

@dataclass
class FlowerRun:
    """What a Flower run of one config gives back: the global model and the History."""

    params: torch.Tensor
    history: History


def run_simulation(*configs: ExperimentConfig, num_cpus: int | None = None, client_cpus: float = 1.0,
                   timeout: float = 600.0, verbose: bool = False) -> list[FlowerRun]:
    """Run ``configs`` through Flower's Simulation Runtime on its Ray backend, one node per
    client, one experiment after the other. Node k is client k of every experiment and loads each
    experiment's data for it, so the configs need the same number of clients, not the same data
    (a multi-task FMOL experiment can share the nodes of single-task ones).
    ``num_cpus``: the local Ray instance's CPUs (default: all); ``client_cpus``: CPUs per node;
    ``timeout``: seconds to wait for the nodes and for each round's replies; ``verbose``: Flower's
    DEBUG log.

    Flower 1.41 calls ``flwr.simulation.run_simulation`` deprecated in favour of ``flwr run``,
    which runs the ServerApp and ClientApps of a Flower App *project* (a pyproject.toml naming
    them by module path) in processes of their own; here the apps are built from configs in
    memory and the strategies' History is read back in this process, which ``flwr run`` cannot
    do. So this calls ``run_simulation`` and leaves its deprecation notice out (with the other
    noise: Ray's FutureWarning, ANSI colours off a terminal, the actors' "Manually terminating"
    lines; see :func:`_plain_output`); Flower's own log of the rounds is kept."""
    from flwr.simulation import run_simulation as flwr_run_simulation
    if not configs:
        raise ConfigError("run_simulation needs at least one config")
    first = configs[0]
    for c in configs:
        if resolve_device(c.device).type != "cpu":
            # Flower's Ray backend hides every GPU from a node that asks for none, and nodes that
            # share GPUs by fractions are not what this path was built or tested for
            raise ConfigError(f"{c.label()}: device={c.device!r}, but the Flower simulation trains on the CPU; run "
                              f"it with device='cpu', or on a GPU with fairfl.simulate / fairfl.sweep")
        if c.track_validation:
            raise ConfigError(f"{c.label()}: track_validation=True, but Flower's evaluation does not carry the "
                              "validation scores yet; run it with fairfl.simulate / fairfl.sweep")
        algorithm = c.algorithm
        kept = dataclasses.is_dataclass(algorithm.ClientState) and any(
            f.name == "personal" for f in dataclasses.fields(algorithm.ClientState))
        if algorithm.personal and not kept:
            # a node scores a personalised algorithm at the model it keeps (ClientState.personal, Ditto's);
            # one that makes its personal models at evaluation (FedAvg-FT's fine-tuning) has none to score
            raise ConfigError(f"{c.label()}: {algorithm.name} makes each client's model when it is evaluated, which "
                              "the Flower nodes do not do; run it with fairfl.simulate / fairfl.sweep")
        if c.partition.federation_size != first.partition.federation_size:
            raise ConfigError(f"one Flower simulation has one node per client: every config needs the same number "
                              f"of clients ({first.label()}: {first.partition.federation_size}, "
                              f"{c.label()}: {c.partition.federation_size})")
    strategies = [FairflStrategy(c, timeout) for c in configs]
    backend = {"client_resources": {"num_cpus": client_cpus, "num_gpus": 0.0}}
    stop = threading.Event()
    with _plain_output(verbose):
        _start_ray(num_cpus)
        try:
            flwr_run_simulation(server_app(*strategies, stop=stop), client_app(*configs),
                                first.partition.federation_size, backend_name="ray", backend_config=backend)
        finally:
            stop.set()       # a crashed runtime leaves the ServerApp's thread waiting: end it
    for s in strategies:
        if s.history.rounds_done != s.config.rounds:
            raise RunFailedError(f"the Flower run of {s.config.label()} stopped after {s.history.rounds_done} of "
                                 f"{s.config.rounds} rounds (see Flower's log above)")
    return [FlowerRun(s.params, s.history) for s in strategies]
