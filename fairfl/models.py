"""The papers' models, built by name. The feed-forward ones keep their layers in one
``nn.Sequential`` called ``net``, which lets ``fairfl.stacked`` train many clients' copies at
once with fused kernels; the character LSTM does not (see ``fairfl.local`` for its path).
Every model outputs logits: the loss applies the softmax
(a softmax layer followed by cross-entropy is a double softmax that compresses losses and
changes loss-ordered methods such as FedFV and q-FedAvg; REPRODUCTION.md, known traps)."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .errors import ConfigError


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


class CharLSTM(nn.Module):
    """The Shakespeare next-character model of LEAF / q-FFL / FedMGDA+ §6.1.3 (after McMahan et
    al. 2017): each input character embedded in 8 dimensions, two stacked LSTM layers of 256
    units, and one dense layer from the last time step's output to the vocabulary (logits).
    With the 81-character vocabulary of ``fairfl.shakespeare``: 820,185 parameters (embedding
    648, LSTM 272,384 + 526,336 with PyTorch's two bias vectors per layer, dense 20,817)."""

    def __init__(self, vocab_size: int, num_classes: int, embed_dim: int = 8, hidden: int = 256,
                 layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x):
        out, _ = self.lstm(self.embed(x))          # (batch, time, hidden)
        return self.head(out[:, -1])


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# name -> builder(input_shape, num_classes, **options)
MODELS: dict[str, Callable[..., nn.Module]] = {
    "cnn_cifar10": lambda shape, nc, **kw: CifarCNN(nc, **kw),
    "cnn_fmnist": lambda shape, nc, **kw: FashionCNN(nc, **kw),
    "cnn_femnist": lambda shape, nc, **kw: FemnistCNN(nc, **kw),
    "mlp2": lambda shape, nc, **kw: MLP(_numel(shape), nc, **kw),
    "logreg": lambda shape, nc, **kw: LogisticRegression(_numel(shape), nc, **kw),
    # input and output vocabularies are the same characters
    "lstm_shakespeare": lambda shape, nc, **kw: CharLSTM(nc, nc, **kw),
}

# Input shapes the image models are built for.
_EXPECTED_SHAPE = {"cnn_cifar10": (3, 32, 32), "cnn_fmnist": (1, 28, 28), "cnn_femnist": (1, 28, 28)}
# Models that read int64 token sequences of any length.
_SEQUENCE_MODELS = ("lstm_shakespeare",)


def check_model_name(name: str) -> None:
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int,
                seed: int | None = None, **options) -> nn.Module:
    """Build a model by name; with ``seed`` its initial weights depend on that seed only."""
    check_model_name(name)
    expected = _EXPECTED_SHAPE.get(name)
    if expected is not None and tuple(input_shape) != expected:
        raise ConfigError(f"model {name!r} takes inputs of shape {expected}, the data has {tuple(input_shape)}")
    if name in _SEQUENCE_MODELS and len(tuple(input_shape)) != 1:
        raise ConfigError(f"model {name!r} takes sequences of token indices, shape (length,); "
                          f"the data has {tuple(input_shape)}")
    if seed is None:
        return MODELS[name](tuple(input_shape), num_classes, **options)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MODELS[name](tuple(input_shape), num_classes, **options)


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def has_randomness(model: nn.Module) -> bool:
    """True if the model draws random numbers in training mode (dropout)."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules())
