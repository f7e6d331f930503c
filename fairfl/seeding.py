"""The one seeding scheme: every random draw is a pure function of (seed, round, purpose), with
the client id added where each client draws on its own. No generator is carried from one round
to the next and no global random state is read, so a run is deterministic for its seed and a
run resumed from a checkpoint draws exactly what an uninterrupted one would (tested).

An algorithm asks its :class:`~fairfl.algorithms.base.Context` for ``ctx.rng(purpose)`` (a
``numpy.random.Generator`` of (seed, round, purpose)); pick a purpose tag of your own that no
other stream of the round uses. The loop's own streams are listed below. Their derivations
differ in form (an integer seed for sampling and dropout, the client id before the purpose for
batch orders) because results cached by earlier versions were drawn that way; each is still a
function of (seed, round, purpose[, client]) only.

The partition has its own seed (``PartitionSpec.seed``), independent of the training seed, so
that one seed gives one partition whatever the run (a known trap of the papers' public code).
"""
from __future__ import annotations

import numpy as np
import torch

# Purposes of the round loop's streams (any integer; fixed forever, since changing one changes results).
SAMPLING = 0x5A3        # which clients take part in a round
DROPOUT = 0xD0          # the global torch generator, seeded per round (dropout inside vmap reads it)
BATCHES = 0xC11         # a client's batch order in a round
PARTITION = 0xFA1       # the partition (seeded by PartitionSpec.seed, no round)
SPLIT = 0x5B1           # each client's train / val / test split (likewise)


def rng(seed: int, round_: int, purpose: int, *ids: int) -> np.random.Generator:
    """The generator of one purpose in one round (and, with ``ids``, of one client or item)."""
    return np.random.default_rng([seed, round_, purpose, *ids])


def _int_seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1, np.uint32)[0])


def sampling_rng(seed: int, round_: int) -> np.random.Generator:
    """The generator that samples round ``round_``'s clients."""
    return np.random.default_rng(_int_seed(seed, round_, SAMPLING))


def dropout_seed(seed: int, round_: int) -> int:
    """The seed of torch's global generator during round ``round_``: dropout inside
    ``torch.func.vmap`` can only draw from it."""
    return _int_seed(seed, round_, DROPOUT)


def batch_generator(seed: int, round_: int, client: int, purpose: int = BATCHES) -> torch.Generator:
    """The generator of one client's batch order in one round: both training paths, and a resumed
    run, draw the same batches from it. Another ``purpose`` gives a second, independent order
    (Ditto's personal model trains on its own batches)."""
    s = np.random.SeedSequence([seed, round_, client, purpose]).generate_state(2, np.uint64)
    return torch.Generator().manual_seed(int(s[0] >> np.uint64(1)))


def partition_rng(seed: int, purpose: int) -> np.random.Generator:
    """The generator of a partition (``PARTITION``) or of the clients' splits (``SPLIT``)."""
    return np.random.default_rng(np.random.SeedSequence([seed, purpose]))
