"""One run and many: the config, the history and checkpoints, the server half of a round, the one
round loop, the cache and its index, sweeps, and any algorithm as a Flower strategy."""
