"""Which device a run trains on."""
from __future__ import annotations

import torch

from fairfl.base.errors import ConfigError
from .exactness import exact_cuda


def parse_device(spec: str) -> torch.device | None:
    """The device ``spec`` names, checked for its form only (not whether this machine has it):
    ``"auto"`` gives None (decided where the run trains), ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` their
    device; anything else is a ConfigError."""
    if spec == "auto":
        return None
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device={spec!r} is not a device; use 'auto', 'cpu', 'cuda' or 'cuda:N'") from None
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"device={spec!r} is not supported; use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    return device


def resolve_device(spec: str) -> torch.device:
    """``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; a
    CUDA device that this machine does not have is a ConfigError, raised before any training.
    Resolving a CUDA device sets torch's CUDA switches for exact, repeatable runs
    (``fairfl.training.engine.exactness.exact_cuda``), whether it was named or chosen by ``"auto"``."""
    device = parse_device(spec)
    if device is None:           # "auto", on through the same checks and switches
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        return device
    if not torch.cuda.is_available():
        raise ConfigError(f"device={spec!r}, but this machine has no CUDA device that torch can use "
                          f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}); use device='cpu' or 'auto'")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"device={spec!r}, but this machine has {torch.cuda.device_count()} CUDA device(s)")
    exact_cuda()
    return device
