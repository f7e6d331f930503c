"""The papers' models, built by name. The feed-forward ones keep their layers in one
``nn.Sequential`` called ``net``, which lets ``fairfl.federated.stacked`` train many clients' copies at
once with fused kernels; the character LSTM keeps ``nn.LSTM`` (its reference path and its
evaluations), and ``fairfl.federated.stacked_lstm`` trains many copies of it at once.
Every model outputs logits: the loss applies the softmax (a softmax layer followed by
cross-entropy is a double softmax that compresses losses and changes loss-ordered methods such
as FedFV and q-FedAvg).

Multi-task models (FMOL's two-head LeNet) are a shared ``trunk`` with one head per task; the
parameters objective s moves are the trunk's and head s's, and :func:`objective_view` gives the
single-task model of objective s (trunk + head s, sharing the parameters) that local training
uses, with :func:`objective_indices` locating its parameters in the flat vector of the whole
model.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Literal, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from fairfl.base.errors import ConfigError
from fairfl.base.validation import call_options


class CifarCNN(nn.Module):
    """FedMGDA+ Table 2 (CIFAR-10): 797,962 parameters."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 64, 5), nn.ReLU(), nn.MaxPool2d(2), nn.LocalResponseNorm(2),
            nn.Conv2d(64, 64, 5), nn.ReLU(), nn.LocalResponseNorm(2), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(1600, 384), nn.ReLU(), nn.Linear(384, 192), nn.ReLU(),
            nn.Linear(192, num_classes),
        )

    def forward(self, x):
        return self.net(x)


class FashionCNN(nn.Module):
    """FedMGDA+ Table 3 (Fashion-MNIST): 21,840 parameters. ``dropout=False`` removes both
    dropout layers (the parameter count is unchanged)."""

    def __init__(self, num_classes: int = 10, dropout: bool = True):
        super().__init__()
        drop2d = nn.Dropout2d(0.5) if dropout else nn.Identity()
        drop = nn.Dropout(0.5) if dropout else nn.Identity()
        self.net = nn.Sequential(
            nn.Conv2d(1, 10, 5), nn.MaxPool2d(2), nn.ReLU(),
            nn.Conv2d(10, 20, 5), nn.MaxPool2d(2), nn.ReLU(), drop2d,
            nn.Flatten(), nn.Linear(320, 50), nn.ReLU(), drop, nn.Linear(50, num_classes),
        )

    def forward(self, x):
        return self.net(x)


class FemnistCNN(nn.Module):
    """FedMGDA+ Table 4 (Federated EMNIST, after Reddi et al. 2020): 1,206,590 parameters.
    The table lists no activation after the first convolution; we follow it."""

    def __init__(self, num_classes: int = 62, dropout: bool = True):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, 3), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Dropout(0.25) if dropout else nn.Identity(), nn.Flatten(),
            nn.Linear(9216, 128), nn.ReLU(), nn.Dropout(0.5) if dropout else nn.Identity(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x):
        return self.net(x)


class MLP(nn.Module):
    """Fully connected ReLU network (FedFV / DQN-Fed's "2-hidden-layer MLP" with the default
    ``hidden=(200, 200)``)."""

    def __init__(self, in_features: int, num_classes: int, hidden: tuple[int, ...] = (200, 200)):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: one linear layer on the flattened input."""

    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_features, num_classes))

    def forward(self, x):
        return self.net(x)


class MultiTaskNet(nn.Module):
    """A shared ``trunk`` and one ``heads[s]`` per task; ``forward(x)`` returns (b, S, classes)
    logits (every task's head on one trunk pass), ``forward(x, task)`` task ``task``'s."""

    def __init__(self, trunk: nn.Sequential, heads: list[nn.Sequential]):
        super().__init__()
        if len(heads) < 1:
            raise ConfigError("a multi-task model needs at least one head")
        self.trunk = trunk
        self.heads = nn.ModuleList(heads)

    @property
    def num_tasks(self) -> int:
        return len(self.heads)

    def forward(self, x, task: int | None = None):
        z = self.trunk(x)
        if task is not None:
            return self.heads[task](z)
        return torch.stack([head(z) for head in self.heads], dim=1)


class ObjectiveView(nn.Module):
    """Objective s of a :class:`MultiTaskNet` as a single-task model: ``net`` = trunk then head
    s, holding the very same parameter tensors (so ``fairfl.federated.stacked`` can fuse it)."""

    def __init__(self, model: MultiTaskNet, task: int):
        super().__init__()
        self.net = nn.Sequential(*model.trunk, *model.heads[task])

    def forward(self, x):
        return self.net(x)


INITS = ("default", "xavier", "kaiming")
Init = Literal["default", "xavier", "kaiming"]


def reinitialise(model: nn.Module, init: str) -> nn.Module:
    """Re-draw the weights of every convolution and linear layer of ``model`` (in module order,
    from the global generator, which :func:`build_model` seeds) and zero their biases.

    ``"default"`` leaves PyTorch's initialisation (weights and biases uniform on ±1/√fan_in,
    the one Sener & Koltun's and FedCMOO's MultiMNIST LeNets use: neither code re-initialises,
    isl-org/MultiObjectiveOptimization ``multi_task/models/multi_lenet.py`` l.6–46 and
    ``model_selector.py`` l.11–27, askinb/FedCMOO ``experiments/MultiMNIST/MultiMNIST.py``
    l.366–375). ``"xavier"``: Glorot & Bengio 2010's uniform, bound √(6/(fan_in + fan_out)).
    ``"kaiming"``: He et al. 2015's uniform for ReLU layers, bound √(6/fan_in) (gain √2,
    fan_in mode; the output layer is drawn the same way). Both papers start biases at zero, and
    so do we: PyTorch's default bias draw (±1/√fan_in) belongs to its default weight scheme,
    and keeping it would mix two initialisations. These two are *probe* readings (they change how
    fast the LeNet trains), not a reading of any released FMOL-related code."""
    if init not in INITS:
        raise ConfigError(f"init={init!r} is not one of {INITS}")
    if init == "default":
        return model
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            if init == "xavier":
                nn.init.xavier_uniform_(module.weight)
            else:
                nn.init.kaiming_uniform_(module.weight, nonlinearity="relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    return model


def multi_lenet(num_tasks: int = 2, num_classes: int = 10, in_channels: int = 1,
                image_size: int = 28, init: str = "default") -> MultiTaskNet:
    """FMOL's MultiMNIST model. The FMOL paper names no architecture (App. D); we use the
    LeNet-style trunk usual for MultiMNIST in the MTL-as-MOO work FMOL cites ([1], Sener &
    Koltun 2018), with one two-layer head per task:

        trunk: Conv(1→10, 5×5) → MaxPool 2 → ReLU → Conv(10→20, 5×5) → MaxPool 2 → ReLU
               → Flatten (320) → Linear(320→50) → ReLU
        head s: Linear(50→50) → ReLU → Linear(50→10)          (logits)

    For 2 tasks and 28×28 inputs: a 21,330-parameter trunk and two 3,060-parameter heads
    (27,450 in all). ``init``: PyTorch's default initialisation (weights and biases uniform on
    ±1/√fan_in; ``"default"``), or the ``"xavier"`` / ``"kaiming"`` probes (:func:`reinitialise`)."""
    if num_tasks < 1 or num_classes < 2:
        raise ConfigError(f"multi_lenet needs num_tasks >= 1 and num_classes >= 2, got {num_tasks}, {num_classes}")
    side = ((image_size - 4) // 2 - 4) // 2
    if side < 1:
        raise ConfigError(f"multi_lenet needs images of at least 16×16 pixels, got {image_size}")
    trunk = nn.Sequential(
        nn.Conv2d(in_channels, 10, 5), nn.MaxPool2d(2), nn.ReLU(),
        nn.Conv2d(10, 20, 5), nn.MaxPool2d(2), nn.ReLU(),
        nn.Flatten(), nn.Linear(20 * side * side, 50), nn.ReLU())
    heads = [nn.Sequential(nn.Linear(50, 50), nn.ReLU(), nn.Linear(50, num_classes)) for _ in range(num_tasks)]
    return reinitialise(MultiTaskNet(trunk, heads), init)


def num_tasks(model: nn.Module) -> int:
    """Heads of a multi-task model; 1 for every other model."""
    return model.num_tasks if isinstance(model, MultiTaskNet) else 1


def objective_view(model: nn.Module, task: int) -> nn.Module:
    """The single-task model that objective ``task`` trains: the model itself when it has one
    task, else trunk + head ``task`` (an :class:`ObjectiveView`)."""
    if not isinstance(model, MultiTaskNet):
        if task != 0:
            raise ConfigError(f"{type(model).__name__} has one task; objective {task} does not exist")
        return model
    return ObjectiveView(model, task)


def objective_indices(model: nn.Module, task: int) -> torch.Tensor:
    """Positions in the flat parameter vector (``parameters()`` order) of the parameters of
    :func:`objective_view` ``(model, task)``, in the view's own order."""
    sizes = [p.numel() for p in model.parameters()]
    offsets = [0]
    for n in sizes:
        offsets.append(offsets[-1] + n)
    if not isinstance(model, MultiTaskNet):
        return torch.arange(offsets[-1])
    position = {id(p): k for k, p in enumerate(model.parameters())}
    wanted = [position[id(p)] for p in objective_view(model, task).parameters()]
    return torch.cat([torch.arange(offsets[k], offsets[k + 1]) for k in wanted])


def shared_mask(model: nn.Module) -> torch.Tensor:
    """Flat boolean mask of the parameters every objective moves (a multi-task model's trunk;
    every parameter of a single-task model)."""
    if not isinstance(model, MultiTaskNet):
        return torch.ones(sum(p.numel() for p in model.parameters()), dtype=torch.bool)
    trunk = {id(p) for p in model.trunk.parameters()}
    return torch.cat([torch.full((p.numel(),), id(p) in trunk, dtype=torch.bool) for p in model.parameters()])


class CharLSTM(nn.Module):
    """The Shakespeare next-character model of LEAF / q-FFL / FedMGDA+ §6.1.3 (after McMahan et
    al. 2017): each input character embedded in 8 dimensions, two stacked LSTM layers of 256
    units, and one dense layer from the last time step's output to the vocabulary (logits).
    With the 81-character vocabulary of ``fairfl.federated.data.shakespeare``: 820,185 parameters (embedding
    648, LSTM 272,384 + 526,336 with PyTorch's two bias vectors per layer, dense 20,817)."""

    def __init__(self, vocab_size: int, num_classes: int, embed_dim: int = 8, hidden: int = 256,
                 layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x):
        h = self.embed(x)
        if h.is_cuda and not self.training and torch.is_grad_enabled():
            # cuDNN's LSTM takes no backward pass in eval mode ("cudnn RNN backward can only be called
            # in training mode"), and a second-order method's Hessian-vector products (FedNL, FedNew)
            # differentiate the eval-mode loss twice. The same function, step by step (cuDNN cannot be
            # switched off for one call: its switch is process-wide, and other runs' threads use it).
            return self.head(unrolled_lstm(self.lstm, h)[:, -1])
        out, _ = self.lstm(h)          # (batch, time, hidden)
        return self.head(out[:, -1])


def unrolled_lstm(lstm: nn.LSTM, x: torch.Tensor) -> torch.Tensor:
    """``lstm(x)[0]`` for a unidirectional, batch-first ``nn.LSTM`` without projections or dropout,
    computed one time step at a time from its parameters (PyTorch's equations: gates i, f, g, o in
    that order; c' = f·c + i·g, h' = o·tanh(c')), with ordinary operations that can be
    differentiated any number of times. Equal to ``lstm(x)[0]`` to float tolerance (a different
    order of additions)."""
    if not lstm.batch_first or lstm.bidirectional or lstm.proj_size or (lstm.dropout and lstm.training):
        raise ValueError("unrolled_lstm: only batch-first, unidirectional LSTMs without projections or dropout")
    out = x
    for layer in range(lstm.num_layers):
        w_ih, w_hh = getattr(lstm, f"weight_ih_l{layer}"), getattr(lstm, f"weight_hh_l{layer}")
        bias = getattr(lstm, f"bias_ih_l{layer}") + getattr(lstm, f"bias_hh_l{layer}") if lstm.bias else None
        inputs = F.linear(out, w_ih, bias)           # every step's input projection at once: (batch, time, 4·hidden)
        h = c = out.new_zeros(out.shape[0], lstm.hidden_size)
        steps = []
        for x_t in inputs.unbind(1):                 # unbind: no full-size zero gradient per step (GPU anchors)
            i, f, g, o = (x_t + F.linear(h, w_hh)).chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            steps.append(h)
        out = torch.stack(steps, 1)
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# name -> builder(input_shape, num_classes, *, tasks, <the model's options, typed>): the options
# a config's model_options may set (checked, and their defaults filled in, by model_options()).
def _multi_lenet(shape, nc, *, tasks: int = 2, init: Init = "default") -> nn.Module:
    return multi_lenet(tasks, nc, shape[0], shape[-1], init)     # one head per label column of the data


def _cnn_cifar10(shape, nc, *, tasks: int = 1) -> nn.Module:
    return CifarCNN(nc)


def _cnn_fmnist(shape, nc, *, tasks: int = 1, dropout: bool = True) -> nn.Module:
    return FashionCNN(nc, dropout)


def _cnn_femnist(shape, nc, *, tasks: int = 1, dropout: bool = True) -> nn.Module:
    return FemnistCNN(nc, dropout)


def _mlp2(shape, nc, *, tasks: int = 1, hidden: tuple[int, ...] = (200, 200)) -> nn.Module:
    return MLP(_numel(shape), nc, tuple(hidden))


def _logreg(shape, nc, *, tasks: int = 1) -> nn.Module:
    return LogisticRegression(_numel(shape), nc)


def _lstm_shakespeare(shape, nc, *, tasks: int = 1, embed_dim: int = 8, hidden: int = 256, layers: int = 2) -> nn.Module:
    return CharLSTM(nc, nc, embed_dim, hidden, layers)     # input and output vocabularies are the same characters


MODELS: dict[str, Callable[..., nn.Module]] = {
    "multi_lenet": _multi_lenet, "cnn_cifar10": _cnn_cifar10, "cnn_fmnist": _cnn_fmnist,
    "cnn_femnist": _cnn_femnist, "mlp2": _mlp2, "logreg": _logreg, "lstm_shakespeare": _lstm_shakespeare,
}

# Input shapes the image models are built for.
_EXPECTED_SHAPE = {"cnn_cifar10": (3, 32, 32), "cnn_fmnist": (1, 28, 28), "cnn_femnist": (1, 28, 28)}
# Models that read int64 token sequences of any length.
_SEQUENCE_MODELS = ("lstm_shakespeare",)


def check_model_name(name: str) -> None:
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")


def model_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options of model ``name`` in canonical form (each in its type, those equal to their
    default left out): unknown names and values of the wrong type are a ConfigError naming them."""
    check_model_name(name)
    return call_options(MODELS[name], options, f"model_options of {name!r}", skip=("shape", "nc", "tasks"))


MULTI_TASK_MODELS = ("multi_lenet",)


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int,
                seed: int | None = None, tasks: int = 1, **options) -> nn.Module:
    """Build a model by name; with ``seed`` its initial weights depend on that seed only.
    ``tasks`` is the number of label columns of the data: a multi-task model gets one head per
    task, any other model needs ``tasks == 1``."""
    options = model_options(name, options)
    if name not in MULTI_TASK_MODELS and tasks != 1:
        raise ConfigError(f"model {name!r} has one output head, the data has {tasks} tasks; "
                          f"use a multi-task model ({', '.join(MULTI_TASK_MODELS)})")
    expected = _EXPECTED_SHAPE.get(name)
    if expected is not None and tuple(input_shape) != expected:
        raise ConfigError(f"model {name!r} takes inputs of shape {expected}, the data has {tuple(input_shape)}")
    if name in _SEQUENCE_MODELS and len(tuple(input_shape)) != 1:
        raise ConfigError(f"model {name!r} takes sequences of token indices, shape (length,); "
                          f"the data has {tuple(input_shape)}")
    if seed is None:
        return MODELS[name](tuple(input_shape), num_classes, tasks=tasks, **options)
    # PyTorch's initialisers draw from the global generator: seeded here, and locked, since the runs of
    # a lockstep group (``fairfl.training.engine``) build their models in parallel threads
    with _BUILD_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MODELS[name](tuple(input_shape), num_classes, tasks=tasks, **options)


_BUILD_LOCK = threading.Lock()


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def has_randomness(model: nn.Module) -> bool:
    """True if the model draws random numbers in training mode (dropout)."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules())
