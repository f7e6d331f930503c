"""Multi-task models for FMOL: a shared trunk with one head per task, and the flat-vector view
of their parameters that FMOL's server works on.

``MultiTaskNet(trunk, heads)`` computes task s's logits as ``heads[s](trunk(x))``. FMOL's
objectives f_s (FMOL §3.2) are then the cross-entropy of head s; a client's local model for
objective s (Algorithm 1, step 2) only ever moves the trunk and head s, so the update Δ_s it
returns is zero on every other head.

:func:`multi_lenet` is the model of notebook 05. The FMOL paper names no architecture for
MultiMNIST (App. D); we use a LeNet-style trunk, the usual choice for MultiMNIST in the
MTL-as-MOO line of work FMOL cites ([1], Sener & Koltun 2018):

    trunk: Conv(1→10, 5×5) → MaxPool 2 → ReLU → Conv(10→20, 5×5) → MaxPool 2 → ReLU
           → Flatten (320) → Linear(320→50) → ReLU
    head s: Linear(50→50) → ReLU → Linear(50→10)          (logits; cross-entropy applies the softmax)

:class:`ParamLayout` maps the model's parameters (in ``named_parameters()`` order) to one flat
vector θ and back, and says which coordinates are the shared trunk and which belong to head s
(FMOL's ``qp_params`` choice, :mod:`fairfl.fmol`).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from .errors import ConfigError


class MultiTaskNet(nn.Module):
    """A shared ``trunk`` and one ``heads[s]`` per task; ``forward(x, task)`` returns task
    ``task``'s logits, ``forward_all(x)`` every task's logits from one trunk pass."""

    def __init__(self, trunk: nn.Module, heads: Sequence[nn.Module]):
        super().__init__()
        if len(heads) < 1:
            raise ConfigError("a multi-task model needs at least one head")
        self.trunk = trunk
        self.heads = nn.ModuleList(heads)

    @property
    def num_tasks(self) -> int:
        return len(self.heads)

    def forward(self, x: torch.Tensor, task: int) -> torch.Tensor:
        return self.heads[task](self.trunk(x))

    def forward_all(self, x: torch.Tensor) -> list[torch.Tensor]:
        z = self.trunk(x)
        return [head(z) for head in self.heads]


def multi_lenet(num_tasks: int = 2, num_classes: int = 10, in_channels: int = 1,
                image_size: int = 28) -> MultiTaskNet:
    """The LeNet-style network above: for 2 tasks and 28×28 inputs, a 21,330-parameter trunk
    and two 3,060-parameter heads (27,450 in all; :func:`count`)."""
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
    return MultiTaskNet(trunk, heads)


@torch.no_grad()
def init_parameters(model: nn.Module, generator: torch.Generator) -> None:
    """PyTorch's default initialisation of Conv/Linear layers — weight and bias uniform on
    ±1/√fan_in (``kaiming_uniform_(a=√5)`` gives the same bound) — drawn from an explicit
    generator, so that one seed gives one initial point without touching the global RNG.
    FMOL App. D: "All algorithms use the same randomly generated initial point"."""
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            fan_in = module.weight[0].numel()
            bound = 1.0 / math.sqrt(fan_in)
            for p in (module.weight, module.bias):
                if p is not None:
                    u = torch.rand(p.shape, generator=generator, dtype=torch.float64)
                    p.copy_((2 * u - 1) * bound)
        elif any(True for _ in module.parameters(recurse=False)):
            raise ConfigError(f"init_parameters does not know how to initialise {type(module).__name__}")


class ParamLayout:
    """The model's parameters as one flat vector θ (``named_parameters()`` order, each
    parameter in its logical, row-major order whatever its memory format), with boolean masks of
    the shared trunk's coordinates and of each head's."""

    def __init__(self, model: MultiTaskNet):
        self.names: list[str] = []
        self.shapes: list[torch.Size] = []
        self.slices: list[slice] = []
        offset = 0
        for name, p in model.named_parameters():
            self.names.append(name)
            self.shapes.append(p.shape)
            self.slices.append(slice(offset, offset + p.numel()))
            offset += p.numel()
        self.size = offset
        self.num_tasks = model.num_tasks
        self.shared = torch.zeros(offset, dtype=torch.bool)
        self.heads = [torch.zeros(offset, dtype=torch.bool) for _ in range(model.num_tasks)]
        for name, sl in zip(self.names, self.slices):
            if name.startswith("trunk."):
                self.shared[sl] = True
            else:
                parts = name.split(".")
                if parts[0] != "heads":
                    raise ConfigError(f"parameter {name!r} is neither in the trunk nor in a head")
                self.heads[int(parts[1])][sl] = True

    def task_mask(self, task: int) -> torch.Tensor:
        """Coordinates objective ``task`` can move: the trunk and head ``task``."""
        return self.shared | self.heads[task]

    def flatten(self, model: nn.Module) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    @torch.no_grad()
    def load(self, model: nn.Module, theta: torch.Tensor) -> None:
        """Copy θ into the model's parameters (in place; their memory format is kept)."""
        if theta.shape != (self.size,):
            raise ConfigError(f"θ has shape {tuple(theta.shape)}, the model has {self.size} parameters")
        for p, sl, shape in zip(model.parameters(), self.slices, self.shapes):
            p.copy_(theta[sl].view(shape))

    def scatter(self, parts: Sequence[torch.Tensor | None], dtype: torch.dtype) -> torch.Tensor:
        """A flat vector from per-parameter tensors (None = zeros), in parameter order."""
        out = torch.zeros(self.size, dtype=dtype)
        for t, sl in zip(parts, self.slices):
            if t is not None:
                out[sl] = t.reshape(-1)
        return out


def count(model: nn.Module) -> dict[str, int]:
    """Parameters of the trunk, of each head, and in total."""
    layout = ParamLayout(model)  # type: ignore[arg-type]
    out = {"trunk": int(layout.shared.sum())}
    out.update({f"head {s}": int(m.sum()) for s, m in enumerate(layout.heads)})
    out["total"] = layout.size
    return out
