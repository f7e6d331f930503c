"""The one seeding scheme: every random draw is a pure function of (seed, round, purpose), with
the client id added where each client draws on its own. No generator is carried from one round
to the next and no global random state is read, so a run is deterministic for its seed and a
run resumed from a checkpoint draws exactly what an uninterrupted one would (tested).

An algorithm asks its :class:`~fairfl.federated.algorithms.base.Context` for ``ctx.rng(purpose)`` (a
``numpy.random.Generator`` of (seed, round, purpose)); pick a purpose tag of your own that no
other stream of the round uses. The loop's own streams are listed below. Their derivations
differ in form (an integer seed for sampling, the client id before the purpose for
batch orders) because results cached by earlier versions were drawn that way; each is still a
function of (seed, round, purpose[, client]) only. No draw reads torch's or numpy's global state,
so runs trained side by side in threads (``fairfl.training.engine``) cannot disturb one another.

The partition has its own seed (``PartitionSpec.seed``), independent of the training seed, so
that one seed gives one partition whatever the run (a known trap of the papers' public code).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# The largest seed (training or partition): a signed 64-bit integer, the widest that every consumer
# of a seed takes (torch's generators refuse 2**64, JSON readers and int64 arrays past 2**63 - 1).
# Checked when a config is validated, so a bad seed is named before any data is read.
MAX_SEED = 2**63 - 1

# Purposes of the round loop's streams (any integer; fixed forever, since changing one changes results).
SAMPLING = 0x5A3        # which clients take part in a round
BATCHES = 0xC11         # a client's batch order and dropout masks in a round
PARTITION = 0xFA1       # the partition (seeded by PartitionSpec.seed, no round)
SPLIT = 0x5B1           # each client's train / val / test split (likewise)
FINETUNE = 0xF17        # a client's batches when it fine-tunes the global model before it is scored (FedAvg-FT)
TEST_FILE = 0x7F1       # the standard test file's rows a client is tested on (PartitionSpec.test_source="file")


def rng(seed: int, round_: int, purpose: int, *ids: int) -> np.random.Generator:
    """The generator of one purpose in one round (and, with ``ids``, of one client or item)."""
    return np.random.default_rng([seed, round_, purpose, *ids])


def _int_seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1, np.uint32)[0])


def sampling_rng(seed: int, round_: int) -> np.random.Generator:
    """The generator that samples round ``round_``'s clients."""
    return np.random.default_rng(_int_seed(seed, round_, SAMPLING))


@dataclass(frozen=True)
class Stream:
    """The random draws of one client's local training in one round: its batch order
    (:meth:`generator`) and its dropout masks (:attr:`key`, for :func:`keep_mask`). Both training
    paths, a run trained alone or fused with other runs, and a resumed run draw the same from it.
    Another ``purpose`` gives a second, independent stream (Ditto's personal model trains on its
    own batches)."""

    seed: int
    round: int
    client: int
    purpose: int = BATCHES

    def _state(self) -> np.ndarray:
        return np.random.SeedSequence([self.seed, self.round, self.client, self.purpose]).generate_state(2, np.uint64)

    def generator(self) -> torch.Generator:
        """A fresh CPU generator of the batch order (on any device: batches are drawn on the CPU)."""
        return torch.Generator().manual_seed(int(self._state()[0] >> np.uint64(1)))

    @property
    def key(self) -> int:
        """The dropout stream: a 31-bit integer."""
        return int(self._state()[1] & np.uint64(_M31))


# ----------------------------------------------------------------------------- dropout masks
# Dropout draws from a counter-based hash, not from a torch generator: the mask of an element is a
# pure function of (the instance's stream key, the step and layer, the element's index in the
# instance's own (batch, channel, ...) layout). So a client's masks do not depend on which other
# clients or runs share its fused computation, on the order in which they were drawn, nor on the
# device (the integer arithmetic below is exact everywhere). Every intermediate value stays below
# 2^62, so no int64 product overflows.
_M31 = 0x7FFFFFFF
_MULT = 0x45D9F3B        # odd multiplier of a 32-bit integer hash (two multiply–xorshift rounds)


def _mix(h):
    """The hash of an int64 tensor, elementwise, or of a Python int (the same arithmetic)."""
    h = h ^ (h >> 16)
    h = (h * _MULT) & _M31
    h = h ^ (h >> 16)
    h = (h * _MULT) & _M31
    return h ^ (h >> 16)


def keep_mask(keys: torch.Tensor, counter, shape: tuple[int, ...], p: float) -> torch.Tensor:
    """(m, *shape) boolean: which elements dropout of rate ``p`` keeps, for m instances with
    stream ``keys`` (m,) int64, at ``counter`` (the step and layer: a Python int, or a 0-d int64
    tensor where a captured CUDA graph counts the steps). Each element is kept with probability
    1 − p (to 2⁻³¹), independently across elements, keys and counters."""
    # a Python int counter is hashed as one: the same value as an int64 tensor's hash (no product
    # reaches 2^63), with no tensor to copy to a GPU at every dropout layer of every step
    base = _mix((keys.to(torch.int64) + _mix(counter & _M31)) & _M31)
    return _keep(base, shape, p)


def keep_masks(keys: torch.Tensor, counters: torch.Tensor, shape: tuple[int, ...], p: float) -> torch.Tensor:
    """(n, m, *shape) boolean: :func:`keep_mask` at each of ``counters`` (n,) int64 at once, the same
    bits (tested): a fused CPU step pays per operation, and the hash is some 25 of them per
    dropout layer and step (``fairfl.federated.stacked.DropoutMasks`` draws a block of steps in one go)."""
    base = _mix((keys.to(torch.int64)[None, :] + _mix(counters.to(torch.int64) & _M31)[:, None]) & _M31)
    return _keep(base.reshape(-1), shape, p).reshape(len(counters), len(keys), *shape)


def _keep(base: torch.Tensor, shape: tuple[int, ...], p: float) -> torch.Tensor:
    """(len(base), *shape): element i of row r kept where the hash of base[r] + i is below 1 − p."""
    numel = int(np.prod(shape)) if shape else 1
    if numel >= 2 ** 31:
        raise ValueError(f"a dropout layer of {numel} elements per instance is beyond the mask's index range")
    idx = torch.arange(numel, dtype=torch.int64, device=base.device)
    h = _mix((base[:, None] + idx) & _M31)
    return (h < int((1.0 - p) * 2 ** 31)).reshape(len(base), *shape)


def partition_rng(seed: int, purpose: int) -> np.random.Generator:
    """The generator of a partition (``PARTITION``), of the clients' splits (``SPLIT``) or of their
    rows of the test file (``TEST_FILE``)."""
    return np.random.default_rng(np.random.SeedSequence([seed, purpose]))
